"""``netmorph moe``: the GPT trainer's mixture of experts, seen through its router.

The run is ``netmorph train``'s (:func:`netmorph.parallel.run.train`): the one GPT with a mixture of experts in
every layer's MLP (:mod:`netmorph.models.moe`, Megatron-core's ``MoELayer`` with its all-to-all dispatcher), on
Megatron's layout -- ``--expert-model-parallel-size`` ep ranks share the experts, ``--dp`` replicas of that
group make the data-parallel size ep x dp, and tp and pp compose with it. This view keeps what the router did:
per step the assignments each expert was routed and kept (drops over capacity), the load imbalance, the
load-balancing loss, the rank -> rank token matrix, and the all-to-all bytes on every link beside that matrix
x h x the element size. ``--check`` is the trainer's: the 1-rank model on the same microbatches, with every
expert, and the same routing decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from netmorph.errors import UsageError
from netmorph.mesh.layout import Layout
from netmorph.mesh.shape import ModelShape
from netmorph.models.capacity import capacity
from netmorph.models.moe import Router
from netmorph.parallel.config import TrainConfig
from netmorph.parallel.run import TrainSummary
from netmorph.parallel.run import train as run

PHASES = ("moe.dispatch", "moe.combine", "moe.dispatch.bwd", "moe.combine.bwd")


def moe_shape(
    layers: int = 2,
    hidden: int = 32,
    heads: int = 4,
    ffn: int = 64,
    vocab: int = 64,
    seq: int = 16,
    experts: int = 8,
    top_k: int = 2,
    capacity_factor: float = 1.25,
    seed: int = 0,
) -> ModelShape:
    """``netmorph moe``'s GPT: every layer's MLP ``experts`` GeLU experts ``ffn`` wide (the defaults its flags
    have)."""
    return ModelShape(
        "moe",
        layers,
        hidden,
        heads,
        seq,
        vocab,
        experts=experts,
        top_k=top_k,
        expert_ffn=ffn,
        capacity_factor=capacity_factor,
        seed=seed,
    )


@dataclass(frozen=True)
class MoEConfig:
    """A ``netmorph moe`` run: the trainer's configuration and where it runs."""

    train: TrainConfig
    backend: str = "local"
    timeout: float = 60.0

    @classmethod
    def make(
        cls,
        model: ModelShape | None = None,
        router: Router = Router(),
        split: Layout = Layout(ep=4, dp=4),
        *,
        batch: int = 4,
        steps: int = 20,
        lr: float = 3e-3,
        dtype: str = "float32",
        backend: str = "local",
        timeout: float = 60.0,
        world: int | None = None,
    ) -> MoEConfig:
        """The run on Megatron's layout: ``model`` a mixture of experts (:func:`moe_shape`; its experts, top-k,
        capacity factor, expert width and seed), ``router`` its routing (``dropless``: no capacity); ``split``'s
        degrees (its data-parallel size counts every replica, the ep ranks folded over it), ``batch`` sequences per
        rank per step in one microbatch; ``world``, when given, must be the ranks that makes."""
        model = model or moe_shape()
        tp, pp, dp, ep = split.tp, split.pp, split.dp, split.ep
        if world is not None and world != split.world:
            raise UsageError(
                f"{{world}} {world} != {{tp}} x {{pp}} x {{dp}} = {split.world}; change {{ep}}, {{dp}} or {{world}}",
                "world",
            )
        if not 0 <= model.seed < 1 << 32:
            raise UsageError(f"{{seed}} must be in 0..2**32-1, got {model.seed}", "seed")
        if not router.dropless and not 0 < model.capacity_factor <= 64:
            raise UsageError(
                f"{{capacity_factor}} must be in (0, 64], got {model.capacity_factor} (or --dropless for no capacity)",
                "capacity_factor",
            )
        if (
            min(
                ep,
                dp,
                model.experts,
                model.top_k,
                model.layers,
                model.hidden,
                model.heads,
                model.ef,
                model.vocab,
                model.seq,
                batch,
                steps,
            )
            < 1
        ):
            raise UsageError(
                "ep, dp, experts, top-k, layers, hidden, heads, ffn, vocab, seq, batch and steps must be >= 1",
                "experts",
            )
        if model.experts < 2:
            raise UsageError(f"{{experts}} must be >= 2, got {model.experts}", "experts")
        if model.experts % ep:
            raise UsageError(
                f"{{experts}} {model.experts} is not divisible by {{ep}} {ep}: each expert-parallel "
                "rank holds the same number of experts",
                "experts",
            )
        cfg = TrainConfig.make(
            model=model,
            tp=tp,
            pp=pp,
            dp=dp,
            ep=ep,
            microbatches=1,
            micro_batch_size=batch,
            steps=steps,
            lr=lr,
            dtype=dtype,
            router=router,
        )
        return cls(cfg, backend, timeout)

    # what the view prints, read off the trainer's configuration
    @property
    def world(self) -> int:
        return self.train.world

    @property
    def tokens_per_rank(self) -> int:
        return self.train.model.seq * self.train.layout.batch.micro_batch_size

    @property
    def capacity(self) -> int | None:
        m = self.train.model
        return (
            None
            if self.train.router.dropless
            else capacity(self.tokens_per_rank, m.experts, m.top_k, m.capacity_factor)
        )

    def describe(self) -> dict:
        """The run's settings under the view's names (``--json``'s and the figures')."""
        m, lay, r = self.train.model, self.train.layout, self.train.router
        return {
            "experts": m.experts,
            "ep": lay.ep,
            "dp": lay.dp // lay.ep,
            "tp": lay.tp,
            "pp": lay.pp,
            "top_k": m.top_k,
            "capacity_factor": None if r.dropless else m.capacity_factor,
            "capacity": self.capacity,
            "drop_policy": r.drop_policy,
            "pre_softmax": r.pre_softmax,
            "aux_loss_coeff": r.aux_loss_coeff,
            "z_loss_coeff": r.z_loss_coeff,
            "jitter_eps": r.jitter_eps,
            "layers": m.layers,
            "hidden": m.hidden,
            "heads": m.heads,
            "ffn": m.ef,
            "vocab": m.vocab,
            "seq": m.seq,
            "batch": lay.batch.micro_batch_size,
            "tokens_per_rank": self.tokens_per_rank,
            "steps": self.train.steps,
            "start_step": self.train.start_step,
            "dtype": self.train.dtype,
            "backend": self.backend,
            "world": self.world,
        }

    def with_router(self, **kw) -> MoEConfig:
        return replace(self, train=replace(self.train, router=replace(self.train.router, **kw)))


def train(cfg: MoEConfig, check: bool = False, on_progress=None) -> dict:
    """Run ``netmorph train``'s job for ``cfg``; the router's view of it, step by step."""
    out = run(cfg.train, backend=cfg.backend, timeout=cfg.timeout, check=check, on_progress=on_progress)
    return view(cfg, out)


def view(cfg: MoEConfig, out: TrainSummary) -> dict:
    """The trainer's summary read as the MoE view: per step loss (cross-entropy + load-balancing + z),
    drops, imbalance, the traffic matrix and the all-to-all bytes against it."""
    t = cfg.train
    ranks = out.experts_by_rank  # {rank: (tp, pp, dp, [per-step routing])}
    world, isz, h = cfg.world, 8 if t.dtype == "float64" else 4, t.model.hidden
    steps, kept_by_step = [], []
    for s in range(t.steps):
        per = {rank: log[s] for rank, (_, _, _, log) in ranks.items()}
        first_tp = [rank for rank, (tp, _, _, _) in ranks.items() if tp == 0]  # tp ranks route the same tokens
        routed = _by_layer(t.model, [(per[r]["layers"], per[r]["routed"]) for r in first_tp])
        kept = _by_layer(t.model, [(per[r]["layers"], per[r]["kept"]) for r in first_tp])
        kept_by_step.append(kept)
        matrix = np.zeros((world, world), dtype=np.int64)
        for rank, rec in per.items():
            matrix[rank] += np.sum(rec["send"], axis=0).astype(np.int64)
        links_exact = all(
            rec["links"].get(ph, {}).get(d, 0)
            == h * isz * int(matrix[r][d] if ph in ("moe.dispatch", "moe.combine.bwd") else matrix[d][r])
            for r, rec in per.items()
            for d in range(world)
            if d != r
            for ph in PHASES
        )
        measured = [sum(out.bytes_by_rank[r][s].get(ph, 0) for ph in PHASES) for r in range(world)]
        predicted = [
            h * isz * int(matrix[r].sum() - matrix[r][r] + matrix[:, r].sum() - matrix[r][r]) * 2 for r in range(world)
        ]
        # the load-balancing loss of every layer: summed over pipeline stages, averaged over the replicas
        aux = sum(
            np.mean([per[r]["aux"] + per[r]["z"] for r in first_tp if ranks[r][1] == p])
            for p in {ranks[r][1] for r in first_tp}
        )
        assigned = cfg.tokens_per_rank * t.model.top_k * t.layout.dp * t.model.layers
        steps.append(
            {
                "loss": out.losses[s] + aux,
                "ce": out.losses[s],
                "aux": aux,
                "drop_fraction": 1 - kept.sum() / assigned,
                "load_imbalance": float(np.max(routed.max(1) / routed.mean(1))),
                "largest_expert_batch": int(kept.max()),
                "traffic": matrix.tolist(),
                "routed_per_rank": [per[r]["routed"] for r in sorted(first_tp)],
                "a2a_bytes": measured,
                "predicted_a2a_bytes": predicted,
                "exact": None if cfg.backend == "torch-native" else measured == predicted and links_exact,
                "step_s": out.step_times_s[s],
                "a2a_s": max(rec["a2a_s"] for rec in per.values()),
            }
        )
    view_out = {"config": cfg.describe(), "capacity": cfg.capacity, "steps": steps}
    if out.reference_losses is not None:
        view_out["reference_losses"] = out.reference_losses
        view_out["max_rel_loss_diff"] = out.max_rel_loss_diff
        view_out["max_param_diff"] = out.max_abs_weight_diff
        view_out["same_routing"] = all(
            np.array_equal(kept, np.asarray(ref)) for kept, ref in zip(kept_by_step, out.reference_kept, strict=True)
        )
    return view_out


def _by_layer(model: ModelShape, parts) -> np.ndarray:
    """(MoE layers, E) counts summed over ranks from [(layer indexes, (layers, E) counts)]."""
    first = model.dense_layers
    out = np.zeros((model.layers - first, model.experts), dtype=np.int64)
    for layers, counts in parts:
        for i, c in zip(layers, counts):
            out[i - first] += np.asarray(c, dtype=np.int64)
    return out


def drops_at(cfg: MoEConfig, routed_per_rank, capacity_factor: float) -> float:
    """The fraction of assignments a capacity factor would drop from these routings (each rank's
    (L, E) routed counts): sum over ranks, layers and experts of max(0, routed - C), over all assignments.
    Any drop policy drops that many; which ones differs."""
    m = cfg.train.model
    cap = capacity(cfg.tokens_per_rank, m.experts, m.top_k, capacity_factor)
    r = np.asarray(routed_per_rank)
    return float(np.maximum(0, r - cap).sum() / (cfg.tokens_per_rank * m.top_k * r.shape[0] * r.shape[1]))
