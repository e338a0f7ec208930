"""How one training job is split over its ranks: the one layout type of netmorph, and every rule it must obey.

Stands in for Megatron-LM's parallel arguments (``--tensor-model-parallel-size``, ``--context-parallel-size``,
``--expert-model-parallel-size``, ``--pipeline-model-parallel-size``, ``--num-layers-per-virtual-pipeline-stage``,
``--micro-batch-size``, ``--global-batch-size``, ``--sequence-parallel``, ``--recompute-granularity``,
``--use-distributed-optimizer``) and DeepSpeed's ``zero_optimization.stage``: one frozen value that the planner
prices, the step simulator plays, the trainer runs and morph moves between. Megatron's sizes: the data-parallel
size ``dp`` counts every model replica, ``ep`` folds the experts over ``ep`` of those ``dp`` ranks (its expert
data-parallel size is dp / ep), and ``world = tp · cp · dp · pp``. :meth:`Layout.mesh` gives the rank grid in
Megatron's order, ``tp-cp-ep-dp-pp`` (tp innermost).

:meth:`Layout.check` returns every :class:`Rejection` of the layout for a model: the single source of the
divisibility rules (heads over tp, layers over stages, the batch over dp x micro-batch, experts over ep, ...).
A rule that only netmorph's own torch trainer has (it builds even stages, ZeRO-1 at most beside pp) is the
trainer's (:mod:`netmorph.parallel.limits`), not this vocabulary's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from netmorph.errors import UsageError
from netmorph.mesh.grid import Mesh
from netmorph.mesh.shape import ModelShape

RECOMPUTE = ("none", "selective", "full")
PRECISION = ("bf16", "fp8")
SCHEDULES = ("afab", "1f1b", "interleaved")
CP_COMM = ("p2p", "all_gather")   # Megatron-Core's --cp-comm-type (its a2a variants are Ulysses, not priced here)


@dataclass(frozen=True)
class Rejection:
    """Why a layout cannot run a model: a stable ``key`` (the planner tallies by it), the ``field`` and
    ``value`` at fault, the sentence, and ``flag``: what to change, in the library's parameter names as
    placeholders (``"{tp} or {heads}"``) that each command spells as its own flags
    (:meth:`netmorph.errors.UsageError.render`, :func:`netmorph.errors.spell`).

    ``soft``: a rule of thumb rather than a rule (``plan estimate`` still prices it, with a warning)."""

    key: str
    field: str
    value: object
    text: str
    flag: str = ""
    soft: bool = False

    def __str__(self) -> str:
        return self.text

    def error(self) -> UsageError:
        """The one line a command prints: the reason and what to change."""
        return UsageError(f"{self.text}; change {self.flag or '{' + self.field + '}'}", self.field)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One job's split. Defaults: one rank, one microbatch, no recomputation, Megatron's mixed precision."""

    tp: int = 1
    cp: int = 1                    # context parallel: the sequence split over cp ranks (ring attention)
    cp_comm_type: str = "p2p"      # how cp ranks get each other's K and V (Megatron's --cp-comm-type): "p2p", ring
                                   # attention passing blocks behind the attention core; "all_gather", Llama 3's
                                   # all-gather before the core and reduce-scatter of their gradients after, exposed
    ep: int = 1                    # expert parallel: the experts split over ep of the dp ranks
    expert_tp: int = 0             # Megatron's --expert-tensor-parallel-size: experts split over this many tp ranks
                                   # (0: = tp, Megatron's default; netmorph's trainer keeps them whole: 1)
    dp: int = 1
    pp: int = 1
    zero: int = 0                  # DeepSpeed ZeRO stage over the data-parallel group (3: FSDP)
    interleave: int = 1            # v: model chunks per pipeline stage (Megatron's interleaved 1F1B)
    schedule: str = ""             # afab (GPipe) | 1f1b | interleaved; "": 1f1b, or interleaved when interleave > 1
    microbatch_group: int = 0      # interleaved: microbatches a chunk runs before the next chunk (Megatron's
                                   # --microbatch-group-size-per-virtual-pipeline-stage, Llama 3's N); 0: pp
    global_batch: int = 1          # sequences per step over every replica
    micro_batch_size: int = 1
    sequence_parallel: bool = False
    sp_regather: bool = True       # under SP each rank keeps its sequence shard of the QKV and fc1 inputs and
                                   # all-gathers it again for the weight gradients (Megatron); False: the gathered
                                   # input is kept (netmorph's trainer, whose autograd saves it)
    recompute: str = "none"        # none | selective | full
    # how it overlaps and in which precision (the planner prices them; the trainer runs dp_overlap)
    dp_overlap: bool = False       # the gradient reduction overlaps the backward (DDP's buckets)
    param_gather_overlap: bool = False     # Megatron's --overlap-param-gather: the distributed optimizer's
                                           # parameter all-gather hides behind the next forward, bucket by bucket
    zero_memory: str = "paper"     # ZeRO's model states as Rajbhandari et al.'s Table 1 counts them ("paper") or
                                   # as DeepSpeed allocates them ("deepspeed": its estimate_zero2/3 functions)
    dp_bucket_mb: float = 0.0      # gradient bucket size (DDP's bucket_cap_mb, netmorph train's --bucket-mb);
                                   # 0: a bucket per layer (Megatron at scale: 40M-parameter buckets)
    tp_overlap: bool = False       # Megatron --tp-comm-overlap: TP collectives pipelined with the GEMMs
    pp_overlap: bool = False       # Megatron --overlap-p2p-communication
    precision: str = "bf16"        # bf16 | fp8 (Transformer Engine: FP8 matmuls, fp32 master weights)
    param_bytes: int = 2           # fp16/bf16 weights
    grad_bytes: int = 4            # Megatron's fp32 main gradients (2 gives ZeRO's 16 B/parameter)
    optimizer_bytes: int = 12      # mixed-precision Adam: fp32 master weights, momentum, variance
    activation_bytes: int = 2      # an activation on the wire (pipeline sends, TP collectives): 16-bit
    first_stage_layers: int = 0    # Megatron's --decoder-first/last-pipeline-num-layers (0: an even split)
    last_stage_layers: int = 0

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
        return self.global_batch // (self.dp * self.micro_batch_size)

    @property
    def pipeline_schedule(self) -> str:
        """The schedule the pipeline runs: the one named, else 1F1B (interleaved with more than one chunk)."""
        return self.schedule or ("interleaved" if self.interleave > 1 else "1f1b")

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
        return self.microbatch_group or self.pp

    def in_flight(self, stage: int) -> float:
        """Microbatches whose activations pipeline rank ``stage`` holds at its peak, in units of the stage's whole
        layers: GPipe (afab) runs every forward first, so all m; 1F1B holds the p - i its warmup starts
        (Narayanan et al. 2021); Megatron's interleaved schedule runs 2(p - i - 1) + (v - 1)·N warmup forwards
        of one chunk (1/v of the stage's layers) each, then one more before its first backward (schedules.py's
        ``num_warmup_microbatches``; N = pp is Megatron's default, Llama 3 tunes it, section 3.3.2)."""
        p, v, m, i = self.pp, self.interleave, max(self.microbatches, 1), stage
        kind = self.pipeline_schedule
        if p == 1:
            return 1.0
        if kind == "afab":
            return float(m)
        if kind == "interleaved":
            return min(2 * (p - i - 1) + (v - 1) * self.group + 1, m * v) / v
        return float(min(p - i, m))

    @property
    def stages(self) -> int:
        """Virtual pipeline stages: pp x interleave model chunks."""
        return self.pp * self.interleave

    def stage_layers(self, layers: int) -> list:
        """Layers on each pipeline stage: the fixed first/last counts, the rest as evenly as it goes (the
        extra layers on the middle stages, away from the embedding and the output layer)."""
        return list(_stage_layers(layers, self.pp, self.first_stage_layers, self.last_stage_layers))

    def chunk_layers(self, layers: int, pp_rank: int, chunk: int = 0) -> tuple[int, int]:
        """[first, last) layers of virtual stage ``chunk · pp + pp_rank`` when the layers split evenly
        over the virtual stages (netmorph's trainer)."""
        per = layers // self.stages
        vs = chunk * self.pp + pp_rank
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
        extra = [f"cp{self.cp}"] if self.cp > 1 else []
        extra += [f"ep{self.ep}"] if self.ep > 1 else []
        extra += [f"v={self.interleave}"] if self.interleave > 1 else []
        extra += [f"N={self.microbatch_group}"] if self.microbatch_group else []
        extra += ["afab"] if self.pp > 1 and self.pipeline_schedule == "afab" else []
        extra += [f"zero{self.zero}"] if self.zero else []
        extra += [f"rc={self.recompute}"] if self.recompute != "none" else []
        extra += ["sp"] if self.sequence_parallel else []
        extra += [self.precision] if self.precision != "bf16" else []
        if self.first_stage_layers or self.last_stage_layers:
            extra.append(f"stages {self.first_stage_layers or '-'}/{self.last_stage_layers or '-'}")
        return f"tp{self.tp} pp{self.pp} dp{self.dp} mb{self.micro_batch_size}" + (" " + " ".join(extra)
                                                                                   if extra else "")

    def tag(self) -> str:
        """The compact split, as morph prints and :meth:`parse` reads it: ``tp2·pp2·dp2·ep2·zero1·v2``."""
        out = f"tp{self.tp}·pp{self.pp}·dp{self.dp}" + (f"·ep{self.ep}" if self.ep > 1 else "")
        return out + (f"·zero{self.zero}" if self.zero else "") + (f"·v{self.interleave}" if self.interleave > 1
                                                                    else "")

    @classmethod
    def parse(cls, text: str, world: int) -> Layout:
        """``"tp2,pp2"``, ``"dp4,zero3"``, ``"tp2,pp2,v2"``, ``"dp4,ep2"``: a layout on ``world`` ranks (dp from the
        rest)."""
        fields = {}
        for part in text.replace(" ", "").replace("·", ",").split(","):
            key = part.rstrip("0123456789")
            num = part[len(key):]
            if key not in ("tp", "pp", "dp", "ep", "zero", "v") or not num:
                raise UsageError(f"{text!r}: write it as tpN,ppN,dpN,epN,zeroN,vN (e.g. tp2,pp2 or dp4,zero3)",
                                 "layout")
            name = "interleave" if key == "v" else key
            if name in fields:
                raise UsageError(f"{text!r}: {key} is given twice", "layout")
            fields[name] = int(num)
        tp, pp = fields.get("tp", 1), fields.get("pp", 1)
        if tp < 1 or pp < 1 or world % (tp * pp):
            raise UsageError(f"{text!r}: tp x pp must divide the {world} ranks", "layout")
        dp = fields.get("dp", world // (tp * pp))
        if tp * pp * dp != world:
            raise UsageError(f"{text!r}: tp x pp x dp = {tp * pp * dp}, not the {world} ranks", "layout")
        v = fields.get("interleave", 1)
        return cls(tp=tp, pp=pp, dp=dp, ep=fields.get("ep", 1), zero=fields.get("zero", 0), interleave=v)

    # -- rules ---------------------------------------------------------------------------------------
    def check(self, model: ModelShape | None = None, world: int | None = None) -> list:
        """Every :class:`Rejection` of this layout for ``model`` on ``world`` ranks (empty: it runs), in the
        order the planner reports them (the trainer's own limits are :func:`netmorph.parallel.limits.check`'s)."""
        out = _ranges(self)
        if out:
            return out
        if world is not None and world != self.world:
            out.append(Rejection("world", "world", world, f"tp x cp x pp x dp = {self.tp}x{self.cp}x{self.pp}x"
                                 f"{self.dp} = {self.world}, not the {world} ranks", "{tp}/{pp}/{dp}"))
        if model is not None and not model.bare:
            out += _model_rules(self, model)
        if self.global_batch % (self.dp * self.micro_batch_size):
            out.append(Rejection("batch", "global_batch", self.global_batch,
                                 f"global batch {self.global_batch} does not split into dp {self.dp} x microbatch "
                                 f"{self.micro_batch_size}", "{global_batch} or {micro_batch_size}"))
        m = self.microbatches
        if self.interleave > 1 and (self.pp == 1 or m % self.group):
            out.append(Rejection("interleave", "interleave", self.interleave,
                                 f"interleaving needs pp > 1 and microbatches ({m}) a multiple of "
                                 + (f"the microbatch group ({self.group})" if self.microbatch_group else
                                    f"pp ({self.pp})"),
                                 "{microbatches} or {interleave}"))
        if self.microbatch_group and (self.microbatch_group < self.pp or self.pipeline_schedule != "interleaved"):
            out.append(Rejection("interleave", "microbatch_group", self.microbatch_group,
                                 f"a microbatch group ({self.microbatch_group}) goes with the interleaved schedule "
                                 f"and at least pp ({self.pp}) microbatches (Megatron's dependency check)",
                                 "{microbatch_group}"))
        if self.sequence_parallel and self.tp == 1:
            out.append(Rejection("sp-needs-tp", "sequence_parallel", True, "sequence parallelism needs tp > 1",
                                 "{sequence_parallel} or {tp}"))
        return out

    def require(self, model: ModelShape | None = None, world: int | None = None) -> Layout:
        """This layout, or the :class:`~netmorph.errors.UsageError` of its first rejection."""
        bad = self.check(model, world)
        if bad:
            raise bad[0].error()
        return self


def _ranges(c: Layout) -> list:
    out = []
    if c.expert_tp and c.tp % c.expert_tp:
        out.append(Rejection("range", "expert_tp", c.expert_tp, f"expert_tp must divide tp {c.tp}, got "
                             f"{c.expert_tp}"))
    if not 0 <= c.microbatch_group <= 1 << 24:
        out.append(Rejection("range", "microbatch_group", c.microbatch_group, f"microbatch_group must be in "
                             f"0..{1 << 24:,}, got {c.microbatch_group}"))
    for k in ("tp", "cp", "ep", "dp", "pp", "interleave", "global_batch", "micro_batch_size"):
        if not 1 <= getattr(c, k) <= 1 << 24:
            out.append(Rejection("range", k, getattr(c, k), f"{k} must be in 1..{1 << 24:,}, got {getattr(c, k)}"))
    if c.zero not in (0, 1, 2, 3):
        out.append(Rejection("range", "zero", c.zero, f"zero must be 0, 1, 2 or 3, got {c.zero}"))
    for k, allowed in (("recompute", RECOMPUTE), ("precision", PRECISION), ("schedule", ("",) + SCHEDULES),
                       ("zero_memory", ("paper", "deepspeed")), ("cp_comm_type", CP_COMM)):
        if getattr(c, k) not in allowed:
            out.append(Rejection("range", k, getattr(c, k), f"{k} must be one of {', '.join(allowed)}, got "
                                 f"{getattr(c, k)!r}"))
    return out


def _model_rules(c: Layout, model: ModelShape) -> list:
    out = []
    if model.heads % c.tp or model.kv % c.tp:
        what = f"the {model.heads} heads" if model.heads % c.tp else f"the {model.kv} KV heads (query groups)"
        out.append(Rejection("heads", "tp", c.tp, f"tp {c.tp} does not divide {what}",
                             "{tp} or {heads}"))
    stages = c.stage_layers(model.layers)
    if sum(stages) != model.layers or min(stages) < 1:
        out.append(Rejection("layers", "pp", c.pp, f"{model.layers} layers do not fill pp {c.pp} stages with at "
                             f"least one each (first {c.first_stage_layers or 'even'}, last "
                             f"{c.last_stage_layers or 'even'})", "{pp} or {first_stage_layers}/{last_stage_layers}"))
    elif c.interleave > 1 and min(stages) < c.interleave:
        out.append(Rejection("layers", "interleave", c.interleave, f"interleave {c.interleave} needs at least "
                             f"{c.interleave} layers on every stage (the smallest of pp {c.pp} has {min(stages)})",
                             "{pp} or {interleave}"))
    if c.cp > 1 and model.attention != "flash":
        out.append(Rejection("cp-flash", "cp", c.cp, "context parallelism runs ring attention in a fused (flash) kernel, "
                             "as Megatron-Core's Transformer Engine path does; this model's attention is standard",
                             "{cp} or {attention}"))
    if c.cp > 1 and model.seq % (2 * c.cp):
        out.append(Rejection("cp", "cp", c.cp, f"cp {c.cp}: the sequence {model.seq} does not split into 2 x cp "
                             "chunks", "{cp}"))
    if c.ep > 1 and (not model.experts or model.experts % c.ep or c.dp % c.ep):
        out.append(Rejection("ep", "ep", c.ep, f"ep {c.ep} must divide the experts ({model.experts}) and dp "
                             f"({c.dp})", "{ep}"))
    return out


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
    free = p - bool(first) - bool(last)                 # stages whose count is not fixed
    base, extra = divmod(layers - first - last, free) if free else (0, 0)
    counts = [base] * free
    order = list(range(0 if first else 1, free - (0 if last else 1))) + ([0] if not first else []) + \
        ([free - 1] if not last else [])
    for i in order[:extra]:
        counts[i] += 1
    return tuple(([first] if first else []) + counts + ([last] if last else []))

