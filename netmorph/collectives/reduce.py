"""Reduce to a root: ``torch.distributed.reduce`` / ``ncclReduce`` / ``MPI_Reduce``.

- ``naive``: every peer sends its whole vector to the root, which folds them in
  one at a time (its receive port takes p-1 full vectors).
- ``binomial``: ceil(log2 p) rounds up a binomial tree (MPICH ``MPIR_Reduce_intra_binomial``).
"""

from __future__ import annotations

import numpy as np

from netmorph.collectives import base
from netmorph.schedule import REDUCE, Schedule


def naive(p: int, count: int, itemsize: int = 4, root: int = 0) -> Schedule:
    s = base.layout("reduce", "naive", p, count, itemsize, root=root)
    if p > 1 and count:
        peers = (np.arange(1, p, dtype=np.int64) + root) % p
        z = np.zeros(p - 1, dtype=np.int64)
        s.add(peers, np.full(p - 1, root), z, z, np.full(p - 1, count), REDUCE)
    return s


def binomial(p: int, count: int, itemsize: int = 4, root: int = 0) -> Schedule:
    s = base.layout("reduce", "binomial", p, count, itemsize, root=root)
    if p > 1 and count:
        base.binomial_reduce(s, (np.arange(p, dtype=np.int64) + root) % p, 0, count)
    return s
