"""How long a pipeline's microbatch slots take: the wave of a schedule on its stages (the bubble), with the ranks'
cores shared or not, a zero-bubble schedule's weight gradients filling its drain, and gradient buckets behind a
backward -- the pieces of :func:`netmorph.planner.timing.step_time` that are about the order work runs in, not
its cost.
"""

from __future__ import annotations


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
        return float(m)                       # every step has the one stage active: m slots, every rank busy
    steps = m * v + p - 1
    busy = sum(max(1.0, sharing * min(j + 1, p, m * v, steps - j) / p) for j in range(steps))
    return busy / (sharing * v)


def zero_bubble_slots(m: int, p: int, per_mb: float, w: float, sharing: float = 1.0) -> float:
    """:func:`shared_slots` of ZB-H1 (Qi et al. 2024): each microbatch's backward split into B and W (``w``
    seconds of the ``per_mb``), the drain's waits filled with W -- (p - 1)(F + B - W) of bubble instead of 1F1B's
    (p - 1)(F + B + W), at 1F1B's activations."""
    slots = shared_slots(m, p, 1, sharing)
    fill = min(1.0, 2 * w / per_mb) if per_mb > 0 else 0.0
    return m + (slots - m) * (1 - fill)


def bucketed(bucket: float, n: int, compute: float, overlap: float = 1.0) -> float:
    """Seconds that ``n`` equal buckets of ``bucket`` seconds leave exposed when one is launched as each of ``n``
    layers of ``compute`` seconds finishes and they run in order on their own stream (DDP's and Megatron's
    ``overlap_grad_reduce`` buckets; FSDP's prefetched gathers): the stream ends one bucket after the compute
    while a bucket is shorter than a layer (the last bucket is always exposed), else (n - 1)(bucket - compute)
    later; ``overlap`` is the share of a layer a bucket can hide behind."""
    if n <= 0 or bucket <= 0:
        return 0.0
    return bucket + (n - 1) * max(0.0, bucket - overlap * compute)
