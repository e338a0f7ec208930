"""How long a pipeline's microbatch slots take: the wave of a schedule on its stages (the bubble), with the ranks'
cores shared or not, a zero-bubble schedule's weight gradients filling its drain, and gradient buckets behind a
backward -- the pieces of :func:`netmorph.planner.timing.step_time` that are about the order work runs in, not
its cost.
"""

from __future__ import annotations

from functools import lru_cache

from netmorph.mesh.schedules import V_SHAPED, idle_of


def shared_slots(m: int, p: int, v: int = 1, sharing: float = 1.0) -> float:
    """How many microbatch slots at every-rank-busy speed a pipeline of ``p`` stages (``v`` chunks each) takes
    for ``m`` microbatches: ``m + (p - 1) / v`` on a device per rank (``sharing`` 1). Where ranks share a node's
    cores (``sharing``: how many times slower a rank computes with every rank busy than alone), a rank waiting
    in the bubble gives its core to the others: the schedule's wave of ``m·v + p - 1`` chunk steps is played
    with the ranks of the A stages active at each step sharing the cores -- a step at a rank's own speed times
    max(1, sharing·A/p), processor sharing -- from one stage at the fill through all p to one at the drain. It
    lies between the two bounds it meets at its ends: the critical path alone (``slots / sharing``) and the
    m slots of every rank's own work (``m``)."""
    slots = m + (p - 1) / v
    if sharing <= 1 or not m:
        return slots
    if p <= 1:
        return float(m)  # every step has the one stage active: m slots, every rank busy
    steps = m * v + p - 1
    busy = sum(max(1.0, sharing * min(j + 1, p, m * v, steps - j) / p) for j in range(steps))
    return busy / (sharing * v)


def zero_bubble_slots(m: int, p: int, per_mb: float, w: float, sharing: float = 1.0, name: str = "zb-h1") -> float:
    """:func:`shared_slots` of a zero-bubble schedule (Qi et al. 2024; DeepSeek's DualPipeV): each microbatch's
    backward split into B and W (``w`` seconds of the ``per_mb``), the bubble filled with W. The schedule
    ``name`` is played as the trainer runs it (:func:`idle_share`), and 1F1B's bubble of p - 1 slots scaled by
    the share of it left: ZB-H1 (p - 1)(F + B - W) instead of 1F1B's (p - 1)(F + B + W), at 1F1B's activations."""
    slots = shared_slots(m, p, 1, sharing)
    ratio = w / per_mb if per_mb > 0 else 0.0
    return m + (slots - m) * idle_share(name, p, min(m, 3 * p), ratio)


@lru_cache(maxsize=4096)
def idle_share(name: str, p: int, m: int, w: float) -> float:
    """A rank's idle time in schedule ``name`` over 1F1B's, (p - 1) microbatch slots, with a microbatch's
    forward a third of the slot, its B the rest less ``w`` (the weight gradients' share, W) -- the paper's
    T_F : T_B : T_W -- each of a V's two chunks half of each. The schedule is played slot by slot
    (:func:`netmorph.mesh.schedules.idle_of`, its order found once): its idle stops changing past 2p
    microbatches, so the caller plays at most 3p."""
    if p < 2:
        return 0.0
    v = 2 if name in V_SHAPED else 1
    return idle_of(name, p, m, v, 1 / 3 / v, (2 / 3 - w) / v, w / v) / (p - 1)


def bucketed(bucket: float, n: int, compute: float, overlap: float = 1.0) -> float:
    """Seconds that ``n`` equal buckets of ``bucket`` seconds leave exposed when one is launched as each of ``n``
    layers of ``compute`` seconds finishes and they run in order on their own stream (DDP's and Megatron's
    ``overlap_grad_reduce`` buckets; FSDP's prefetched gathers): the stream ends one bucket after the compute
    while a bucket is shorter than a layer (the last bucket is always exposed), else (n - 1)(bucket - compute)
    later; ``overlap`` is the share of a layer a bucket can hide behind."""
    if n <= 0 or bucket <= 0:
        return 0.0
    return bucket + (n - 1) * max(0.0, bucket - overlap * compute)
