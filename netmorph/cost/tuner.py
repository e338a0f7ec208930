"""Pick the algorithm with the lowest predicted time, like NCCL's tuner.

NCCL's ``ncclTopoTuneModel`` / ``getAlgoInfo`` predict each (algorithm,
protocol) with a latency + size/bandwidth model and take the minimum; MPICH
switches on message-size thresholds derived from the same α-β formulas. Here
the prediction is the event simulation of each candidate's schedule, and the
reason names the winner's latency part (its rounds times α) against its
bandwidth part (bytes times β), which is what moves the choice as p and n move.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from netmorph.collectives import ALGORITHMS, build, canonical_op
from netmorph.cost.simulate import simulate
from netmorph.cost.topology import Topology
from netmorph.schedule import Counts, count
from netmorph.units import fmt_time


@dataclass
class Prediction:
    op: str
    algo: str
    world: int
    nbytes: int
    itemsize: int
    counts: Counts
    time: float
    latency_part: float = 0.0  # the same schedule with β = γ = 0
    bandwidth_part: float = 0.0  # the same schedule with α = 0


@dataclass
class Choice:
    best: Prediction
    ranking: list = field(default_factory=list)  # every candidate, fastest first
    reason: str = ""


def _latency_only(t: Topology) -> Topology:
    return replace(t, beta=0.0, gamma=0.0, beta_inter=0.0, node_bandwidth=0.0)


def _bandwidth_only(t: Topology) -> Topology:
    return replace(t, alpha=0.0, alpha_inter=0.0)


def predict(
    op: str,
    algo: str,
    world: int,
    nbytes: int,
    topo: Topology,
    itemsize: int = 4,
    placement=None,
    parts: bool = False,
    **build_kw,
) -> Prediction:
    """Build, count and time one algorithm for one size."""
    s = build(op, algo, world, nbytes // itemsize, itemsize, **build_kw)
    pred = Prediction(s.op, s.algo, world, nbytes, itemsize, count(s), simulate(s, topo, placement).time)
    if parts:
        pred.latency_part = simulate(s, _latency_only(topo), placement).time
        pred.bandwidth_part = simulate(s, _bandwidth_only(topo), placement).time
    return pred


def choose(
    op: str, world: int, nbytes: int, topo: Topology, itemsize: int = 4, placement=None, algos=None, **build_kw
) -> Choice:
    """The fastest algorithm for ``op`` at this size, world and topology, and why."""
    op = canonical_op(op)
    names = list(algos or ALGORITHMS[op])
    preds = sorted(
        (predict(op, a, world, nbytes, topo, itemsize, placement, **build_kw) for a in names),
        key=lambda x: (x.time, x.counts.rounds),
    )
    best = preds[0]
    s = build(op, best.algo, world, nbytes // itemsize, itemsize, **build_kw)
    best.latency_part = simulate(s, _latency_only(topo), placement).time
    best.bandwidth_part = simulate(s, _bandwidth_only(topo), placement).time
    return Choice(best, preds, _reason(best, preds))


@lru_cache(maxsize=512)
def auto_algo(op: str, world: int, nbytes: int, itemsize: int, topo: Topology) -> str:
    """The tuner's pick alone, cached: what ``algo="auto"`` runs on real ranks (NCCL's
    ``getAlgoInfo`` answers the same question once per call, from tables it built at init)."""
    return choose(op, world, nbytes, topo, itemsize).best.algo


def _reason(best: Prediction, preds: list) -> str:
    c = best.counts
    bound = "latency-bound" if best.latency_part >= best.bandwidth_part else "bandwidth-bound"
    text = (
        f"{best.algo}: {fmt_time(best.time)} predicted, {bound} "
        f"({c.rounds} rounds -> {fmt_time(best.latency_part)} of latency; "
        f"{c.max_bytes_sent:,} B sent per rank -> {fmt_time(best.bandwidth_part)} of transfer)"
    )
    if len(preds) > 1:
        nxt = preds[1]
        if nxt.time > 0:
            text += (
                f"; beats {nxt.algo} ({fmt_time(nxt.time)}, {nxt.counts.rounds} rounds, "
                f"{nxt.counts.max_bytes_sent:,} B/rank) by {100 * (1 - best.time / nxt.time):.2g}%"
            )
    return text
