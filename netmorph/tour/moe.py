"""Two dropless runs of the same MoE through the trainer, load-balancing loss on and off: the router's traffic,
the balance over training, and what each capacity factor would drop, beside uniform routing's exact drops."""

from __future__ import annotations

from dataclasses import dataclass

from netmorph.mesh.layout import Layout
from netmorph.models.capacity import capacity
from netmorph.moe import MoEConfig, Router, exact_drop_fraction, moe_shape, simulated_drop_fraction, train
from netmorph.moe.train import drops_at

STEPS = 2
ALPHA = 0.1
FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
LAST = 30  # the steps the balance is averaged over (all of them when the run is shorter)


@dataclass
class MoE:
    cfg: MoEConfig  # the run with the aux loss (the other differs only in its coefficient)
    on: dict  # netmorph moe's view of the run with the aux loss
    off: dict  # and without it
    drops: dict  # {aux coefficient: the trained router's dropped fraction at each of FACTORS}
    uniform: list  # uniform routing's dropped fraction at each factor: exact (Binomial)
    simulated: list  # and drawn (300 trials)
    imbalance: dict  # {aux coefficient: mean load imbalance over the last LAST steps}


def run(tick=lambda: None, quick: bool = False) -> MoE:
    """α = 0.1 (ten times Megatron's default) so the effect shows within 60 steps of a tiny model; ``quick``:
    20 steps."""
    model, base = (
        moe_shape(experts=8, top_k=2),
        dict(split=Layout(ep=4, dp=4), steps=20 if quick else 60, batch=16, lr=1e-2),
    )
    runs = {}
    for alpha in (ALPHA, 0.0):
        runs[alpha] = train(MoEConfig.make(model, Router(aux_loss_coeff=alpha, dropless=True), **base))
        tick()
    cfg = MoEConfig.make(model, Router(aux_loss_coeff=ALPHA, dropless=True), **base)
    drops = {a: [drops_at(cfg, r["steps"][-1]["routed_per_rank"], f) for f in FACTORS] for a, r in runs.items()}
    T, E, k = cfg.tokens_per_rank, cfg.train.model.experts, cfg.train.model.top_k
    caps = [capacity(T, E, k, f) for f in FACTORS]
    imbalance = {
        a: sum(s["load_imbalance"] for s in r["steps"][-LAST:]) / len(r["steps"][-LAST:]) for a, r in runs.items()
    }
    return MoE(
        cfg,
        runs[ALPHA],
        runs[0.0],
        drops,
        [exact_drop_fraction(T, E, k, c) for c in caps],
        [simulated_drop_fraction(T, E, k, c, 300) for c in caps],
        imbalance,
    )
