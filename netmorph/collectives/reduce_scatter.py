"""Reduce-scatter: ``torch.distributed.reduce_scatter_tensor`` / ``ncclReduceScatter`` / ``MPI_Reduce_scatter_block``.

``--bytes`` is the full vector each rank holds; rank r ends with block r of the sum.

- ``ring``: p-1 rounds around a ring (NCCL's ring; the first half of a ring all-reduce).
- ``pairwise``: round k, rank r sends its block for rank r+k straight to it
  (MPICH ``MPIR_Reduce_scatter_intra_pairwise``); no forwarding.
- ``recursive_halving``: log2 p rounds halving the vector (MPICH
  ``MPIR_Reduce_scatter_intra_recursive_halving``); other world sizes fold first,
  and the odd rank of a pair hands the even one its block at the end.
"""

from __future__ import annotations

import numpy as np

from netmorph.collectives import base
from netmorph.schedule import COPY, REDUCE, Schedule


def ring(p: int, count: int, itemsize: int = 4) -> Schedule:
    s = base.layout("reduce_scatter", "ring", p, count, itemsize)
    if p > 1 and count:
        base.ring_reduce_scatter(s, np.arange(p, dtype=np.int64), base.bounds(count, p))
    return s


def pairwise(p: int, count: int, itemsize: int = 4) -> Schedule:
    s = base.layout("reduce_scatter", "pairwise", p, count, itemsize)
    if p > 1 and count:
        b = base.bounds(count, p)
        r = np.arange(p, dtype=np.int64)
        for k in range(1, p):
            d = (r + k) % p
            s.add(r, d, b[d], b[d], b[d + 1] - b[d], REDUCE)
    return s


def recursive_halving(p: int, count: int, itemsize: int = 4) -> Schedule:
    s = base.layout("reduce_scatter", "recursive_halving", p, count, itemsize)
    if p == 1 or not count:
        return s
    b = base.bounds(count, p)
    r = np.arange(p, dtype=np.int64)
    f = base.Fold(p)
    f.fold_full(s, r, count, REDUCE)
    steps = base.halving_steps(f.pof2, [1 << i for i in reversed(range(f.pof2.bit_length() - 1))])
    base.halving_reduce_scatter(s, f.real, f.vbounds(b), steps)
    if f.rem:
        e = f.evens
        s.add(e + 1, e, b[e], b[e], b[e + 1] - b[e], COPY)
    return s
