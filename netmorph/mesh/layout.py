"""How one training job is split over its ranks: the one layout type of netmorph.

Stands in for Megatron-LM's parallel arguments (``--tensor-model-parallel-size``, ``--context-parallel-size``,
``--expert-model-parallel-size``, ``--pipeline-model-parallel-size``, ``--num-layers-per-virtual-pipeline-stage``,
``--use-distributed-optimizer``) and DeepSpeed's ``zero_optimization.stage``, as torchtitan's ``ParallelDims``
holds them: the degrees, with the batch, the precision and the knobs beside them as values of their own
(:mod:`netmorph.mesh.settings`). One frozen value that the planner prices, the step simulator plays, the
trainer runs and morph moves between. Megatron's sizes: the data-parallel
size ``dp`` counts every model replica, ``ep`` folds the experts over ``ep`` of those ``dp`` ranks (its expert
data-parallel size is dp / ep), and ``world = tp · cp · dp · pp``. :meth:`Layout.mesh` gives the rank grid in
Megatron's order, ``tp-cp-ep-dp-pp`` (tp innermost).

:meth:`Layout.check` returns every :class:`Rejection` of the layout for a model, from the single source of the
divisibility rules, :mod:`netmorph.mesh.rules` (heads over tp, layers over stages, the batch over dp x
micro-batch, experts over ep, ...). A rule that only netmorph's own torch trainer has (it builds even stages,
ZeRO-1 at most beside pp) is the trainer's (:mod:`netmorph.parallel.limits`), not this vocabulary's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from netmorph.errors import UsageError
from netmorph.mesh.grid import Mesh
from netmorph.mesh.rejection import Rejection
from netmorph.mesh.schedules import in_flight, rank_of, stage_of, w_stash
from netmorph.mesh.settings import (
    CP_COMM,
    PRECISION,
    RECOMPUTE,
    SCHEDULES,
    SPLIT_BACKWARD,
    V_SHAPED,
    Batch,
    Knobs,
    Precision,
)
from netmorph.mesh.shape import ModelShape

__all__ = [
    "CP_COMM",
    "PRECISION",
    "RECOMPUTE",
    "SCHEDULES",
    "SPLIT_BACKWARD",
    "V_SHAPED",
    "Batch",
    "Knobs",
    "Layout",
    "Precision",
    "Rejection",
]


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One job's split: its degrees (torchtitan's ``ParallelDims``), and beside them the :class:`Batch`,
    :class:`Precision` and :class:`Knobs` it runs with. Defaults: one rank, one microbatch, no recomputation,
    Megatron's mixed precision."""

    tp: int = 1
    cp: int = 1  # context parallel: the sequence split over cp ranks (ring attention)
    ep: int = 1  # expert parallel: the experts split over ep of the dp ranks
    expert_tp: int = 0  # Megatron's --expert-tensor-parallel-size: experts split over this many tp ranks
    # (0: = tp, Megatron's default; netmorph's trainer keeps them whole: 1)
    dp: int = 1
    pp: int = 1
    zero: int = 0  # DeepSpeed ZeRO stage over the data-parallel group (3: FSDP)
    interleave: int = 1  # v: model chunks per pipeline stage (Megatron's interleaved 1F1B)
    batch: Batch = Batch()
    precision: Precision = Precision()
    knobs: Knobs = Knobs()

    def __post_init__(self):
        if self.batch.schedule in V_SHAPED and self.interleave == 1:  # torchtitan: a V schedule's two stages
            object.__setattr__(self, "interleave", 2)

    @classmethod
    def of(cls, **flat) -> Layout:
        """A layout from Megatron's flat argument names, as a command line gives them
        (``Layout.of(tp=2, dp=2, global_batch=8, recompute="full", precision="fp8")``): each name goes to the
        degrees or to the :class:`Batch`, :class:`Precision` (``precision`` is its name) or :class:`Knobs` that
        holds it; an unknown name is the constructor's TypeError."""
        return cls().replace(**flat)

    def replace(self, **flat) -> Layout:
        """This layout with the fields ``flat`` names changed, by the names :meth:`of` takes."""
        own, parts = {}, {}
        for k, v in flat.items():
            home = _HOME.get(k)
            if home is None or isinstance(v, (Batch, Precision, Knobs)):
                own[k] = v
            else:
                parts.setdefault(home, {})["name" if k == "precision" else k] = v
        for home, kw in parts.items():
            own[home] = dataclasses.replace(own.get(home, getattr(self, home)), **kw)
        return dataclasses.replace(self, **own)

    def get(self, name: str):
        """A field by the flat name :meth:`of` takes (``"recompute"``, ``"global_batch"``, ``"tp"``)."""
        home = _HOME.get(name)
        return (
            getattr(self, name)
            if home is None
            else getattr(getattr(self, home), "name" if name == "precision" else name)
        )

    # -- sizes ---------------------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def gpus(self) -> int:
        """The planner's word for :attr:`world`."""
        return self.world

    @property
    def microbatches(self) -> int:
        """m: microbatches per pipeline per step."""
        return self.batch.global_batch // (self.dp * self.batch.micro_batch_size)

    @property
    def pipeline_schedule(self) -> str:
        """The schedule the pipeline runs: the one named, else 1F1B (interleaved with more than one chunk)."""
        return self.batch.schedule or ("interleaved" if self.interleave > 1 else "1f1b")

    @property
    def sharding(self) -> int:
        """The ZeRO stage memory follows: ``zero``, except with a pipeline, where no framework re-gathers a
        stage's weights for every microbatch:

        - ZeRO-3 + pp is FSDP2 as torchtitan runs it under torch.distributed.pipelining:
          ``reshard_after_forward=False`` keeps the weights gathered and the gradients accumulate unsharded
          until the last microbatch's backward reduce-scatters them -- ZeRO-1's memory and traffic;
        - ZeRO-2 + pp is Llama 3's FSDP (Dubey et al. 2024, section 3.3.2: "shards the optimizer states and
          gradients, but for model shards we do not reshard after forward"): the weights gathered once a step,
          the gradients kept sharded -- reduce-scattered after every microbatch's backward."""
        return sharding_with(self.zero, self.pp)

    @property
    def reduce_rounds(self) -> int:
        """Gradient reductions a step: one, or with Llama 3's ZeRO-2 under a pipeline (:attr:`sharding`) one after
        every microbatch's backward."""
        return self.microbatches if self.pp > 1 and self.sharding == 2 else 1

    @property
    def group(self) -> int:
        """The interleaved schedule's microbatch group N (pp unless set)."""
        return self.batch.microbatch_group or self.pp

    def in_flight(self, stage: int) -> float:
        """Microbatches whose activations pipeline rank ``stage`` holds at its peak, in units of the stage's whole
        layers (:func:`netmorph.mesh.schedules.in_flight`)."""
        return in_flight(self.pipeline_schedule, self.pp, max(self.microbatches, 1), self.interleave, self.group, stage)

    def w_stash(self, stage: int) -> float:
        """Microbatches whose weight gradients pipeline rank ``stage`` owes at its peak (B ran, W not yet), in
        units of the stage's whole layers (:func:`netmorph.mesh.schedules.w_stash`)."""
        return w_stash(self.pipeline_schedule, self.pp, max(self.microbatches, 1), stage)

    @property
    def stages(self) -> int:
        """Virtual pipeline stages: pp x interleave model chunks."""
        return self.pp * self.interleave

    def stage_layers(self, layers: int) -> list:
        """Layers on each pipeline stage: the fixed first/last counts, the rest as evenly as it goes (the
        extra layers on the middle stages, away from the embedding and the output layer)."""
        return list(_stage_layers(layers, self.pp, self.knobs.first_stage_layers, self.knobs.last_stage_layers))

    @property
    def v_shaped(self) -> bool:
        """Two chunks a rank in a V (ZB-V, DualPipeV): the model goes down ranks 0..p-1 and back up p-1..0, so
        the first stage and the last (the loss) are both pipeline rank 0's."""
        return self.pipeline_schedule in V_SHAPED

    def virtual_stage(self, pp_rank: int, chunk: int = 0) -> int:
        """The virtual stage of ``pp_rank``'s ``chunk``: ``chunk · pp + pp_rank`` (Megatron's interleaving, a
        loop), or in a V chunk 1 is stage ``2p - 1 - pp_rank`` (torch's ``generate_stage_to_rank_mapping``
        style "v")."""
        return stage_of(pp_rank, chunk, self.pp, self.v_shaped)

    def stage_rank(self, vs: int) -> int:
        """The pipeline rank that runs virtual stage ``vs``."""
        return rank_of(vs, self.pp, self.v_shaped)

    def chunk_layers(self, layers: int, pp_rank: int, chunk: int = 0) -> tuple[int, int]:
        """[first, last) layers of :meth:`virtual_stage` ``(pp_rank, chunk)`` when the layers split evenly
        over the virtual stages (netmorph's trainer)."""
        per = layers // self.stages
        vs = self.virtual_stage(pp_rank, chunk)
        return vs * per, (vs + 1) * per

    # -- ranks ---------------------------------------------------------------------------------------
    def mesh(self, order: str = "tp-cp-ep-dp-pp") -> Mesh:
        """The rank grid; its ``dp`` dimension is the expert data-parallel one (dp / ep) when ep > 1."""
        return Mesh(self.world, tp=self.tp, pp=self.pp, dp=self.dp // self.ep, cp=self.cp, ep=self.ep, order=order)

    def coords(self, rank: int) -> dict:
        """{dim: coordinate} of ``rank`` on :meth:`mesh`, with ``dp`` the rank's whole data-parallel index."""
        c = _coords(self.tp, self.cp, self.ep, self.dp, self.pp, rank)
        return dict(c)

    # -- words ---------------------------------------------------------------------------------------
    def label(self) -> str:
        """The planner's rendering: ``tp8 pp8 dp16 mb1 zero1 rc=full``."""
        extra = (
            [f"cp{self.cp}" + (f" {self.knobs.cp_comm_type}" if self.knobs.cp_comm_type != "p2p" else "")]
            if self.cp > 1
            else []
        )
        extra += [f"ep{self.ep}"] if self.ep > 1 else []
        extra += [f"v={self.interleave}"] if self.interleave > 1 else []
        extra += [f"N={self.batch.microbatch_group}"] if self.batch.microbatch_group else []
        extra += (
            [self.pipeline_schedule] if self.pp > 1 and self.pipeline_schedule in ("afab",) + SPLIT_BACKWARD else []
        )
        extra += [f"zero{self.zero}"] if self.zero else []
        extra += [f"rc={self.knobs.recompute}"] if self.knobs.recompute != "none" else []
        extra += ["sp"] if self.knobs.sequence_parallel else []
        extra += [self.precision.name] if self.precision.name != "bf16" else []
        if self.knobs.first_stage_layers or self.knobs.last_stage_layers:
            extra.append(f"stages {self.knobs.first_stage_layers or '-'}/{self.knobs.last_stage_layers or '-'}")
        return f"tp{self.tp} pp{self.pp} dp{self.dp} mb{self.batch.micro_batch_size}" + (
            " " + " ".join(extra) if extra else ""
        )

    def tag(self) -> str:
        """The compact split, as morph prints and :meth:`parse` reads it: ``tp2·pp2·dp2·ep2·zero1·v2``, and
        under context parallelism ``tp2·cp2·pp1·dp1`` (its exchange named unless it is the ring: ``cp2·a2a``)."""
        cp = (
            f"·cp{self.cp}" + (f"·{self.knobs.cp_comm_type}" if self.knobs.cp_comm_type != "p2p" else "")
            if self.cp > 1
            else ""
        )
        out = f"tp{self.tp}{cp}·pp{self.pp}·dp{self.dp}" + (f"·ep{self.ep}" if self.ep > 1 else "")
        return (
            out + (f"·zero{self.zero}" if self.zero else "") + (f"·v{self.interleave}" if self.interleave > 1 else "")
        )

    @classmethod
    def parse(cls, text: str, world: int) -> Layout:
        """``"tp2,pp2"``, ``"dp4,zero3"``, ``"tp2,pp2,v2"``, ``"dp4,ep2"``, ``"cp2,a2a"``: a layout on ``world``
        ranks (dp from the rest)."""
        fields, comm = {}, "p2p"
        for part in text.replace(" ", "").replace("·", ",").split(","):
            if part in CP_COMM:
                comm = part
                continue
            key = part.rstrip("0123456789")
            num = part[len(key) :]
            if key not in ("tp", "cp", "pp", "dp", "ep", "zero", "v") or not num:
                raise UsageError(
                    f"{text!r}: write it as tpN,cpN,ppN,dpN,epN,zeroN,vN (e.g. tp2,pp2 or dp4,zero3; "
                    f"a cp exchange by name: cp2,a2a)",
                    "layout",
                )
            name = "interleave" if key == "v" else key
            if name in fields:
                raise UsageError(f"{text!r}: {key} is given twice", "layout")
            fields[name] = int(num)
        tp, pp, cp = fields.get("tp", 1), fields.get("pp", 1), fields.get("cp", 1)
        if tp < 1 or pp < 1 or cp < 1 or world % (tp * cp * pp):
            raise UsageError(f"{text!r}: tp x cp x pp must divide the {world} ranks", "layout")
        dp = fields.get("dp", world // (tp * cp * pp))
        if tp * cp * pp * dp != world:
            raise UsageError(f"{text!r}: tp x cp x pp x dp = {tp * cp * pp * dp}, not the {world} ranks", "layout")
        v = fields.get("interleave", 1)
        return cls(
            tp=tp,
            cp=cp,
            pp=pp,
            dp=dp,
            ep=fields.get("ep", 1),
            zero=fields.get("zero", 0),
            interleave=v,
            knobs=Knobs(cp_comm_type=comm),
        )

    # -- rules ---------------------------------------------------------------------------------------
    def check(self, model: ModelShape | None = None, world: int | None = None) -> list:
        """Every :class:`Rejection` of this layout for ``model`` on ``world`` ranks (empty: it runs), in the
        order the planner reports them (:func:`netmorph.mesh.rules.rejections`; the trainer's own limits are
        :func:`netmorph.parallel.limits.check`'s)."""
        from netmorph.mesh.rules import rejections

        return rejections(self, model, world)

    def require(self, model: ModelShape | None = None, world: int | None = None) -> Layout:
        """This layout, or the :class:`~netmorph.errors.UsageError` of its first rejection."""
        bad = self.check(model, world)
        if bad:
            raise bad[0].error()
        return self


@lru_cache(maxsize=1 << 16)
def _coords(tp, cp, ep, dp, pp, rank) -> tuple:
    m = Mesh(tp * cp * dp * pp, tp=tp, pp=pp, dp=dp // ep, cp=cp, ep=ep)
    c = m.coords(rank)
    c["edp"] = c["dp"]
    c["dp"] = c["dp"] * ep + c["ep"]
    return tuple(c.items())


@lru_cache(maxsize=4096)
def sharding_with(zero: int, pp: int) -> int:
    """:attr:`Layout.sharding` for ZeRO stage ``zero`` over ``pp`` stages (a search tries every stage on one
    layout): ZeRO-3 with a pipeline is FSDP2's reshard_after_forward=False, ZeRO-1's memory and traffic."""
    return 1 if pp > 1 and zero >= 3 else zero


def _stage_layers(layers: int, p: int, first: int, last: int) -> tuple:
    if p == 1:
        return (layers,)
    free = p - bool(first) - bool(last)  # stages whose count is not fixed
    base, extra = divmod(layers - first - last, free) if free else (0, 0)
    counts = [base] * free
    order = (
        list(range(0 if first else 1, free - (0 if last else 1)))
        + ([0] if not first else [])
        + ([free - 1] if not last else [])
    )
    for i in order[:extra]:
        counts[i] += 1
    return tuple(([first] if first else []) + counts + ([last] if last else []))


_HOME = {
    **{f.name: "batch" for f in dataclasses.fields(Batch)},
    "precision": "precision",
    **{f.name: "precision" for f in dataclasses.fields(Precision) if f.name != "name"},
    **{f.name: "knobs" for f in dataclasses.fields(Knobs)},
}
