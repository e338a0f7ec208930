"""All-reduce eight ways: ``torch.distributed.all_reduce`` / ``ncclAllReduce`` / ``MPI_Allreduce``.

- ``naive``: reduce everything to rank 0, then send it back out -- the
  parameter-server shape; the root's port carries 2(p-1) full vectors.
- ``ring``: reduce-scatter then all-gather around a ring; NCCL's ring
  algorithm (``ncclAllReduceRing``), gloo's ``AllreduceRing``, MPICH's
  ``MPIR_Allreduce_intra_ring``. Bandwidth-optimal, 2(p-1) rounds.
- ``recursive_doubling``: log2 p rounds of whole-vector pairwise exchange
  (MPICH ``MPIR_Allreduce_intra_recursive_doubling``). Latency-optimal.
- ``rabenseifner``: recursive-halving reduce-scatter + recursive-doubling
  all-gather (MPICH ``MPIR_Allreduce_intra_reduce_scatter_allgather``; gloo's
  ``AllreduceHalvingDoubling``). Ring's bytes in 2 log2 p rounds.
- ``binomial``: binomial-tree reduce to rank 0 + binomial broadcast
  (MPICH's fallback ``MPIR_Allreduce_intra_reduce_bcast`` composition).
- ``double_binary_tree``: NCCL's tree algorithm (``ncclGetDtree``): two
  complementary binary trees -- in the second, the leaves of the first are
  interior nodes -- each reducing then broadcasting half the vector, pipelined in
  ``segments`` pieces (Sanders, Speck, Träff 2009, "Two-tree algorithms").
- ``one_shot``: every rank sends its whole vector to every other and reduces
  what it gets -- one step on a fabric where a rank reaches all peers at once
  (vLLM's ``cross_device_reduce_1stage``, TensorRT-LLM's one-shot all-reduce).
- ``two_shot``: a direct reduce-scatter (rank r reduces block r read from every
  peer) then a direct all-gather, two steps of (p-1) concurrent messages (vLLM's
  ``cross_device_reduce_2stage``, TensorRT-LLM's two-shot); ring's bytes. On a
  single-port link model these cost what naive and ring cost; on shared memory
  or NVSwitch, where ports are not the limit, they need 1 and 2 synchronisations.

Non-power-of-two worlds use MPICH's fold (see :mod:`netmorph.collectives.base`).
"""

from __future__ import annotations

import numpy as np

from netmorph.collectives import base
from netmorph.schedule import COPY, REDUCE, Schedule


def _ranks(p):
    return np.arange(p, dtype=np.int64)


def naive(p: int, count: int, itemsize: int = 4) -> Schedule:
    s = base.layout("allreduce", "naive", p, count, itemsize)
    if p > 1 and count:
        peers = _ranks(p)[1:]
        z = np.zeros(p - 1, dtype=np.int64)
        s.add(peers, z, z, z, np.full(p - 1, count), REDUCE)  # all send to the root
        s.add(z, peers, z, z, np.full(p - 1, count), COPY)  # root sends to all
    return s


def ring(p: int, count: int, itemsize: int = 4) -> Schedule:
    s = base.layout("allreduce", "ring", p, count, itemsize)
    if p > 1 and count:
        b = base.bounds(count, p)
        base.ring_reduce_scatter(s, _ranks(p), b)
        base.ring_allgather(s, _ranks(p), b)
    return s


def recursive_doubling(p: int, count: int, itemsize: int = 4) -> Schedule:
    s = base.layout("allreduce", "recursive_doubling", p, count, itemsize)
    if p > 1 and count:
        f = base.Fold(p)
        f.fold_full(s, _ranks(p), count, REDUCE)
        base.full_exchange_doubling(s, f.real, count)
        f.unfold_full(s, _ranks(p), count)
    return s


def rabenseifner(p: int, count: int, itemsize: int = 4) -> Schedule:
    s = base.layout("allreduce", "rabenseifner", p, count, itemsize)
    if p > 1 and count:
        f = base.Fold(p)
        f.fold_full(s, _ranks(p), count, REDUCE)
        vb = base.bounds(count, f.pof2)
        steps = base.halving_steps(f.pof2, [1 << i for i in range(f.pof2.bit_length() - 1)])
        base.halving_reduce_scatter(s, f.real, vb, steps)
        base.doubling_allgather(s, f.real, vb, steps)
        f.unfold_full(s, _ranks(p), count)
    return s


def binomial(p: int, count: int, itemsize: int = 4) -> Schedule:
    s = base.layout("allreduce", "binomial", p, count, itemsize)
    if p > 1 and count:
        base.binomial_reduce(s, _ranks(p), 0, count)
        base.binomial_bcast(s, _ranks(p), 0, count)
    return s


def one_shot(p: int, count: int, itemsize: int = 4) -> Schedule:
    s = base.layout("allreduce", "one_shot", p, count, itemsize)
    if p > 1 and count:
        src, dst = _rotated_pairs(p)
        z = np.zeros(len(src), dtype=np.int64)
        s.add(src, dst, z, z, np.full(len(src), count), REDUCE)
    return s


def two_shot(p: int, count: int, itemsize: int = 4) -> Schedule:
    s = base.layout("allreduce", "two_shot", p, count, itemsize)
    if p > 1 and count:
        b = base.bounds(count, p)
        src, dst = _rotated_pairs(p)
        s.add(src, dst, b[dst], b[dst], b[dst + 1] - b[dst], REDUCE)  # block d to its owner d
        s.add(dst, src, b[dst], b[dst], b[dst + 1] - b[dst], COPY)  # owner d hands block d out
    return s


def _rotated_pairs(p):
    """All (src, dst) pairs, step k = 1..p-1 sending to src+k: every port busy once per step."""
    r = np.arange(p, dtype=np.int64)
    src = np.concatenate([r for _ in range(1, p)])
    dst = np.concatenate([(r + k) % p for k in range(1, p)])
    return src, dst


# ---------------------------------------------------------------- NCCL's double binary tree


def btree_parent(p: int) -> np.ndarray:
    """Parent of each rank in NCCL's in-order binary tree rooted at 0 (-1 for the root).

    The lowest set bit of a rank gives its level; its parent flips that bit and
    sets the next one up, or just clears it when that would leave the world
    (NCCL ``ncclGetBtree``; the tree alternates leaves and interior nodes).
    """
    parent = np.full(p, -1, dtype=np.int64)
    for r in range(1, p):
        bit = r & -r
        up = (r ^ bit) | (bit << 1)
        parent[r] = up if up < p else r ^ bit
    return parent


def dtree_parents(p: int) -> tuple[np.ndarray, np.ndarray]:
    """Both trees of NCCL's ``ncclGetDtree``: the btree and its mirror (even p) or shift (odd p)."""
    t0 = btree_parent(p)
    r = np.arange(p)
    if p % 2:  # shift by one: rank r plays btree position (r - 1) mod p
        pos = (r - 1) % p
        back = (np.arange(p) + 1) % p
    else:  # mirror: rank r plays position p - 1 - r
        pos = p - 1 - r
        back = p - 1 - np.arange(p)
    t1 = np.where(t0[pos] < 0, -1, back[np.maximum(t0[pos], 0)])
    return t0, t1


def _depths(parent: np.ndarray) -> np.ndarray:
    d = np.zeros(len(parent), dtype=np.int64)
    for r in range(len(parent)):
        x = r
        while parent[x] >= 0:
            d[r] += 1
            x = parent[x]
    return d


def double_binary_tree(p: int, count: int, itemsize: int = 4, segments: int = 1) -> Schedule:
    s = base.layout("allreduce", "double_binary_tree", p, count, itemsize)
    s.meta["segments"] = segments
    if p == 1 or not count:
        return s
    if segments < 1:
        raise ValueError("segments must be >= 1")
    halves = base.bounds(count, 2)
    rows: dict[int, list] = {}
    for t, parent in enumerate(dtree_parents(p)):
        seg = base.bounds(int(halves[t + 1] - halves[t]), segments) + halves[t]
        depth = _depths(parent)
        D = int(depth.max())
        kids = np.nonzero(parent >= 0)[0]
        for j in range(segments):
            lo, ln = int(seg[j]), int(seg[j + 1] - seg[j])
            for c in kids:  # reduce up: a node at depth d sends segment j in round (D - d) + j
                rows.setdefault(D - depth[c] + j, []).append((c, parent[c], lo, ln, True))
            for c in kids:  # broadcast down: parent at depth d sends in round D + j + d
                rows.setdefault(D + j + depth[parent[c]], []).append((parent[c], c, lo, ln, False))
    for k in sorted(rows):
        rr = rows[k]
        src, dst, lo, ln, red = (np.array(x) for x in zip(*rr))
        s.add(src, dst, lo, lo, ln, red.astype(bool))
    return s
