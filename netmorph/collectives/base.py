"""Workspace layouts per op and the building blocks several algorithms share.

Layouts follow nccl-tests' count conventions (see :class:`Schedule`). The
building blocks are the phases MPICH composes its algorithms from -- the ring
reduce-scatter and all-gather, recursive halving and doubling on a power-of-two
set of *virtual* ranks, and the fold/unfold that MPICH uses for any other world
size: with ``pof2`` the largest power of two <= p and ``rem = p - pof2``, the
first ``2*rem`` ranks pair up, each even rank hands its data to the odd one and
sits out, and the odd one hands the result back at the end
(``MPIR_Allreduce_intra_recursive_doubling``, ``..._reduce_scatter_allgather``).
"""

from __future__ import annotations

import numpy as np

from netmorph.schedule import COPY, REDUCE, Schedule


def bounds(n: int, k: int) -> np.ndarray:
    """Split ``n`` elements into ``k`` near-equal blocks: block i is ``[b[i], b[i+1])``."""
    return (np.arange(k + 1, dtype=np.int64) * n) // max(k, 1)


def pof2_floor(p: int) -> int:
    return 1 << (p.bit_length() - 1) if p > 0 else 0


def ceil_log2(p: int) -> int:
    return (p - 1).bit_length() if p > 1 else 0


# ---------------------------------------------------------------- layouts


def _spans(p, n):
    return np.full(p, n, dtype=np.int64)


def layout(op: str, algo: str, p: int, count: int, itemsize: int, root: int = 0, splits=None) -> Schedule:
    """An empty schedule with the workspace layout of ``op``."""
    zeros = np.zeros(p, dtype=np.int64)
    n = count
    if op == "allreduce":
        return Schedule(op, algo, p, n, itemsize, _spans(p, n), zeros, _spans(p, n), zeros.copy(), _spans(p, n), True)
    if op == "reduce":
        out_len = zeros.copy()
        out_len[root] = n
        return Schedule(
            op, algo, p, n, itemsize, _spans(p, n), zeros, _spans(p, n), zeros.copy(), out_len, True, root=root
        )
    if op == "reduce_scatter":
        b = bounds(n, p)
        return Schedule(op, algo, p, n, itemsize, _spans(p, n), zeros, _spans(p, n), b[:-1].copy(), np.diff(b), True)
    if op == "allgather":
        b = bounds(n, p)
        return Schedule(
            op, algo, p, n, itemsize, _spans(p, n), b[:-1].copy(), np.diff(b), zeros.copy(), _spans(p, n), False
        )
    if op == "broadcast":
        in_len = zeros.copy()
        in_len[root] = n
        return Schedule(
            op, algo, p, n, itemsize, _spans(p, n), zeros, in_len, zeros.copy(), _spans(p, n), False, root=root
        )
    if op == "alltoall":
        splits = np.asarray(splits, dtype=np.int64)
        send = splits.sum(axis=1)
        recv = splits.sum(axis=0)
        s = Schedule(
            op, algo, p, n, itemsize, send + recv, zeros, send, send.copy(), recv, False, meta={"splits": splits}
        )
        return s
    raise ValueError(f"unknown op {op!r}")


# ---------------------------------------------------------------- ring phases


def _rotations(b: np.ndarray):
    """Block offsets and lengths laid twice, so rotation ``shift`` is the view ``[shift, shift + q)``.

    A ring's 2(p-1) rounds then share O(p) memory instead of O(p^2): at 4096
    ranks that is the difference between 0.1 MB and 800 MB of offsets.
    """
    off, ln = b[:-1], np.diff(b)
    return np.concatenate([off, off]), np.concatenate([ln, ln])


def ring_reduce_scatter(s: Schedule, real: np.ndarray, b: np.ndarray, final_shift: int = 0) -> None:
    """p-1 rounds; member i sends block (i - k - 1 + final_shift) to i+1 and reduces what it gets.

    Afterwards member i holds block ``(i + final_shift) % q`` fully reduced
    (``final_shift=0``: its own block, as reduce-scatter requires).
    """
    q = len(real)
    src, dst = real, real[(np.arange(q) + 1) % q]
    off2, len2 = _rotations(b)
    for k in range(q - 1):
        sh = (final_shift - k - 1) % q
        s.add(src, dst, off2[sh : sh + q], off2[sh : sh + q], len2[sh : sh + q], REDUCE)


def ring_allgather(s: Schedule, real: np.ndarray, b: np.ndarray, start_shift: int = 0) -> None:
    """p-1 rounds; member i starts with block (i + start_shift) and forwards what it last got."""
    q = len(real)
    src, dst = real, real[(np.arange(q) + 1) % q]
    off2, len2 = _rotations(b)
    for k in range(q - 1):
        sh = (start_shift - k) % q
        s.add(src, dst, off2[sh : sh + q], off2[sh : sh + q], len2[sh : sh + q], COPY)


# ---------------------------------------------------------------- power-of-two folding


class Fold:
    """MPICH's non-power-of-two fold: ``p`` real ranks -> ``pof2`` virtual ranks.

    Real ranks ``0 .. 2*rem-1`` pair as (even, odd); the even one sits out.
    ``real[v]`` is the real rank playing virtual rank ``v``; ``first[v]`` the
    first real rank whose block virtual rank ``v`` stands for (so virtual block
    v covers real blocks ``first[v] .. first[v+1]-1``, contiguous).
    """

    def __init__(self, p: int):
        self.p = p
        self.pof2 = pof2_floor(p)
        self.rem = p - self.pof2
        v = np.arange(self.pof2)
        self.real = np.where(v < self.rem, 2 * v + 1, v + self.rem).astype(np.int64)
        first = np.where(v < self.rem, 2 * v, v + self.rem)
        self.first = np.append(first, p).astype(np.int64)
        self.evens = np.arange(0, 2 * self.rem, 2, dtype=np.int64)  # ranks that sit out

    def vbounds(self, b: np.ndarray) -> np.ndarray:
        """Element bounds of the virtual blocks, from real-block bounds ``b``."""
        return b[self.first]

    def fold_full(self, s: Schedule, ranks: np.ndarray, n: int, reduce: bool) -> None:
        """Each even rank of a pair sends its whole ``[0, n)`` to the odd one."""
        if self.rem:
            e = ranks[self.evens]
            s.add(e, ranks[self.evens + 1], np.zeros_like(e), np.zeros_like(e), np.full(len(e), n), reduce)

    def unfold_full(self, s: Schedule, ranks: np.ndarray, n: int) -> None:
        """Each odd rank of a pair hands the whole result back to the even one."""
        if self.rem:
            e = ranks[self.evens]
            s.add(ranks[self.evens + 1], e, np.zeros_like(e), np.zeros_like(e), np.full(len(e), n), COPY)


# ---------------------------------------------------------------- halving / doubling


def halving_steps(pof2: int, masks) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Recursive vector halving over ``pof2`` virtual ranks, block units.

    For each mask (in the given order) virtual rank v exchanges with ``v ^ mask``,
    keeps the half of its current block range on its side of the bit and sends
    the other half. Returns ``(mask, keep_lo, keep_hi, send_lo, send_hi)`` per step.
    Masks descending end with v holding block v; ascending (MPICH's
    Rabenseifner, distance doubling) end with v holding block bitreverse(v).
    """
    v = np.arange(pof2)
    lo, hi = np.zeros(pof2, dtype=np.int64), np.full(pof2, pof2, dtype=np.int64)
    steps = []
    for m in masks:
        mid = (lo + hi) // 2
        upper = (v & m) != 0
        keep_lo, keep_hi = np.where(upper, mid, lo), np.where(upper, hi, mid)
        send_lo, send_hi = np.where(upper, lo, mid), np.where(upper, mid, hi)
        steps.append((m, keep_lo, keep_hi, send_lo, send_hi))
        lo, hi = keep_lo, keep_hi
    return steps


def halving_reduce_scatter(s: Schedule, real: np.ndarray, vb: np.ndarray, steps) -> None:
    v = np.arange(len(real))
    for m, _, _, slo, shi in steps:
        s.add(real, real[v ^ m], vb[slo], vb[slo], vb[shi] - vb[slo], REDUCE)


def doubling_allgather(s: Schedule, real: np.ndarray, vb: np.ndarray, steps) -> None:
    """Replay halving ``steps`` backwards as copies: each union restores the range before that step."""
    v = np.arange(len(real))
    for m, klo, khi, _, _ in reversed(steps):
        s.add(real, real[v ^ m], vb[klo], vb[klo], vb[khi] - vb[klo], COPY)


def doubling_allgather_from_own(s: Schedule, real: np.ndarray, vb: np.ndarray) -> None:
    """Recursive doubling all-gather where virtual rank v starts with block v."""
    q = len(real)
    steps = halving_steps(q, [1 << i for i in reversed(range(q.bit_length() - 1))])
    doubling_allgather(s, real, vb, steps)


def full_exchange_doubling(s: Schedule, real: np.ndarray, n: int) -> None:
    """Recursive doubling all-reduce core: log2(q) rounds of whole-vector exchange + reduce."""
    q = len(real)
    v = np.arange(q)
    zeros = np.zeros(q, dtype=np.int64)
    m = 1
    while m < q:
        s.add(real, real[v ^ m], zeros, zeros, np.full(q, n), REDUCE)
        m <<= 1


# ---------------------------------------------------------------- binomial trees


def binomial_bcast(s: Schedule, real: np.ndarray, lo: int, hi: int) -> None:
    """Binomial broadcast of elements [lo, hi) from member 0: round j, member v < 2^j sends to v + 2^j."""
    q = len(real)
    m = 1
    while m < q:
        v = np.arange(min(m, q - m))
        s.add(real[v], real[v + m], np.full(len(v), lo), np.full(len(v), lo), np.full(len(v), hi - lo), COPY)
        m <<= 1


def binomial_reduce(s: Schedule, real: np.ndarray, lo: int, hi: int) -> None:
    """Binomial reduce of [lo, hi) to member 0: round j, member v with v % 2^(j+1) == 2^j sends to v - 2^j."""
    q = len(real)
    m = 1
    while m < q:
        v = np.arange(m, q, 2 * m)
        s.add(real[v], real[v - m], np.full(len(v), lo), np.full(len(v), lo), np.full(len(v), hi - lo), REDUCE)
        m <<= 1


def binomial_scatter(s: Schedule, real: np.ndarray, b: np.ndarray) -> None:
    """Binomial scatter from member 0 so member v ends with block v (MPICH ``MPII_Scatter_for_bcast``)."""
    q = len(real)
    m = 1 << ceil_log2(q)
    m >>= 1
    while m >= 1:
        v = np.arange(0, q, 2 * m)
        v = v[v + m < q]
        lo = b[v + m]
        hi = b[np.minimum(v + 2 * m, q)]
        s.add(real[v], real[v + m], lo, lo, hi - lo, COPY)
        m >>= 1
