"""All-gather: ``torch.distributed.all_gather_into_tensor`` / ``ncclAllGather`` / ``MPI_Allgather``.

``--bytes`` is the gathered total (nccl-tests' convention); rank r contributes
block r of it.

- ``ring``: p-1 rounds, each rank forwards the block it last received (NCCL's
  ring all-gather; MPICH ``MPIR_Allgather_intra_ring``). Bandwidth-optimal.
- ``recursive_doubling``: log2 p rounds exchanging doubling ranges (MPICH
  ``MPIR_Allgather_intra_recursive_doubling``); other world sizes fold first.
- ``bruck``: ceil(log2 p) rounds for any p (Bruck et al. 1997; MPICH
  ``MPIR_Allgather_intra_brucks``). MPICH packs into a rotated scratch buffer and
  shifts at the end; here each message carries up to two segments placed
  directly, so the wire bytes are the same and no local shift is needed.
"""

from __future__ import annotations

import numpy as np

from netmorph.collectives import base
from netmorph.schedule import COPY, Schedule


def ring(p: int, count: int, itemsize: int = 4) -> Schedule:
    s = base.layout("allgather", "ring", p, count, itemsize)
    if p > 1 and count:
        base.ring_allgather(s, np.arange(p, dtype=np.int64), base.bounds(count, p))
    return s


def recursive_doubling_rounds(s: Schedule, real: np.ndarray, b: np.ndarray) -> None:
    """Member i holds block i of bounds ``b``; after this every member holds all of ``[b[0], b[-1])``."""
    q = len(real)
    f = base.Fold(q)
    if f.rem:  # even member hands its block to the odd one, whose virtual block is now both
        e = f.evens
        s.add(real[e], real[e + 1], b[e], b[e], b[e + 1] - b[e], COPY)
    base.doubling_allgather_from_own(s, real[f.real], f.vbounds(b))
    if f.rem:
        e = f.evens
        n0, n1 = np.full(len(e), b[0]), np.full(len(e), b[-1] - b[0])
        s.add(real[e + 1], real[e], n0, n0, n1, COPY)


def recursive_doubling(p: int, count: int, itemsize: int = 4) -> Schedule:
    s = base.layout("allgather", "recursive_doubling", p, count, itemsize)
    if p > 1 and count:
        recursive_doubling_rounds(s, np.arange(p, dtype=np.int64), base.bounds(count, p))
    return s


def bruck(p: int, count: int, itemsize: int = 4) -> Schedule:
    s = base.layout("allgather", "bruck", p, count, itemsize)
    if p == 1 or not count:
        return s
    b = base.bounds(count, p)
    r = np.arange(p, dtype=np.int64)
    dist = 1
    while dist < p:
        cnt = min(dist, p - dist)  # rank r holds blocks r .. r+dist-1 (mod p)
        first = r
        last = r + cnt  # exclusive, may wrap past p
        # segment 1: blocks first .. min(last, p); segment 2: wrapped blocks 0 .. last - p
        end1 = np.minimum(last, p)
        wrap = np.maximum(last - p, 0)
        src = np.concatenate([r, r[wrap > 0]])
        dst = (src - dist) % p
        lo = np.concatenate([b[first], np.zeros(int((wrap > 0).sum()), dtype=np.int64)])
        hi = np.concatenate([b[end1], b[wrap[wrap > 0]]])
        s.add(src, dst, lo, lo, hi - lo, COPY, msg=src)
        dist <<= 1
    return s
