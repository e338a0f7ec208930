"""Broadcast: ``torch.distributed.broadcast`` / ``ncclBroadcast`` / ``MPI_Bcast``.

- ``naive``: the root sends the whole buffer to each peer in turn ((p-1) full sends on one port).
- ``binomial``: ceil(log2 p) rounds, every holder doubles the set (MPICH
  ``MPIR_Bcast_intra_binomial``), best for short messages.
- ``scatter_ring``: binomial scatter of p blocks, then a ring all-gather (van de
  Geijn; MPICH ``MPIR_Bcast_intra_scatter_ring_allgather``), for long messages.
- ``scatter_recursive_doubling``: binomial scatter, then a recursive-doubling
  all-gather (MPICH ``MPIR_Bcast_intra_scatter_recursive_doubling_allgather``).

Algorithms work on ranks relative to the root (``(rank - root) mod p``), as MPICH's do.
"""

from __future__ import annotations

import numpy as np

from netmorph.collectives import base
from netmorph.collectives.allgather import recursive_doubling_rounds
from netmorph.schedule import COPY, Schedule


def _relative(p, root):
    return (np.arange(p, dtype=np.int64) + root) % p


def naive(p: int, count: int, itemsize: int = 4, root: int = 0) -> Schedule:
    s = base.layout("broadcast", "naive", p, count, itemsize, root=root)
    if p > 1 and count:
        peers = _relative(p, root)[1:]
        z = np.zeros(p - 1, dtype=np.int64)
        s.add(np.full(p - 1, root), peers, z, z, np.full(p - 1, count), COPY)
    return s


def binomial(p: int, count: int, itemsize: int = 4, root: int = 0) -> Schedule:
    s = base.layout("broadcast", "binomial", p, count, itemsize, root=root)
    if p > 1 and count:
        base.binomial_bcast(s, _relative(p, root), 0, count)
    return s


def scatter_ring(p: int, count: int, itemsize: int = 4, root: int = 0) -> Schedule:
    s = base.layout("broadcast", "scatter_ring", p, count, itemsize, root=root)
    if p > 1 and count:
        real, b = _relative(p, root), base.bounds(count, p)
        base.binomial_scatter(s, real, b)
        base.ring_allgather(s, real, b)
    return s


def scatter_recursive_doubling(p: int, count: int, itemsize: int = 4, root: int = 0) -> Schedule:
    s = base.layout("broadcast", "scatter_recursive_doubling", p, count, itemsize, root=root)
    if p > 1 and count:
        real, b = _relative(p, root), base.bounds(count, p)
        base.binomial_scatter(s, real, b)
        recursive_doubling_rounds(s, real, b)
    return s
