"""Closed forms each measured number should equal (flat α-β-γ topology).

n is the op's size in bytes (nccl-tests' convention), p the world size,
lg = ceil(log2 p), p' the largest power of two <= p, L = log2 p', and
f = 1 when p is not a power of two (MPICH's fold adds a step before and after).
Sources: Thakur, Rabenseifner & Gropp 2005 (MPICH); Chan et al. 2007
("Collective communication: theory, practice, and experience"); Bruck et al.
1997. Forms hold exactly when n divides evenly into the blocks the algorithm
cuts (p blocks, or p' blocks for Rabenseifner); ``None`` marks a quantity with no
simple closed form (then the simulator is the reference).
"""

from __future__ import annotations

from dataclasses import dataclass

from netmorph.collectives.base import ceil_log2, pof2_floor

SIMULATED = "— (p not a power of two: ranks idle unevenly; the simulator is the reference)"


@dataclass
class Formula:
    rounds: int
    rounds_expr: str
    sent: float | None  # max bytes sent by one rank
    sent_expr: str
    time: float | None  # seconds
    time_expr: str


def _bits(p: int) -> int:
    """Blocks a Bruck all-to-all forwards per rank, summed over rounds: sum_k #{j<p : bit k of j}."""
    return sum(bin(j).count("1") for j in range(1, p))


def closed_form(op: str, algo: str, p: int, n: float, alpha: float, beta: float, gamma: float) -> Formula | None:
    """The closed forms of ``algo`` for ``op`` (its registry record's; None: the simulator is the reference)."""
    from netmorph.collectives import REGISTRY

    rec = REGISTRY.get(op, {}).get(algo)
    return rec.closed_form(p, n, alpha, beta, gamma) if rec is not None else None


def builtin_form(op: str, algo: str, p: int, n: float, alpha: float, beta: float, gamma: float) -> Formula | None:
    """The builtin algorithms' closed forms (the sources above)."""
    if p == 1 or n == 0:
        return Formula(0, "0", 0, "0", 0.0, "0")
    a, b, g = alpha, beta, gamma
    lg = ceil_log2(p)
    p2 = pof2_floor(p)
    L = p2.bit_length() - 1
    f = 1 if p != p2 else 0
    T = a + n * b  # one whole-vector message
    naive_reduce = T + (p - 2) * max(T, n * g) + n * g
    naive_reduce_expr = "(α+nβ) + (p−2)·max(α+nβ, nγ) + nγ"
    key = (op, algo)
    if key == ("allreduce", "ring"):
        return Formula(
            2 * (p - 1),
            "2(p−1)",
            2 * n * (p - 1) / p,
            "2n(p−1)/p",
            2 * (p - 1) * a + 2 * n * (p - 1) / p * b + n * (p - 1) / p * g,
            "2(p−1)α + 2n(p−1)/p·β + n(p−1)/p·γ",
        )
    if key == ("allreduce", "recursive_doubling"):
        if f:  # the fold's reduction overlaps the partner's first exchange: no simple form
            return Formula(L + 2, "log2 p' + 2", (L + 1) * n, "(log2 p' + 1)·n", None, SIMULATED)
        return Formula(L, "log2 p", L * n, "log2 p·n", L * (T + n * g), "log2 p·(α + nβ + nγ)")
    if key == ("allreduce", "rabenseifner"):
        return Formula(
            2 * L + 2 * f,
            "2·log2 p'" + (" + 2f" if f else ""),
            2 * n * (p2 - 1) / p2 + f * n,
            "2n(p'−1)/p'" + (" + f·n" if f else ""),
            2 * L * a + 2 * n * (p2 - 1) / p2 * b + n * (p2 - 1) / p2 * g + f * (2 * T + n * g),
            "2·log2 p'·α + 2n(p'−1)/p'·β + n(p'−1)/p'·γ" + (" + f·(2α + 2nβ + nγ)" if f else ""),
        )
    if key == ("allreduce", "binomial"):
        return Formula(
            2 * lg,
            "2⌈log2 p⌉",
            lg * n,
            "⌈log2 p⌉·n",
            None if f else lg * (T + n * g) + lg * T,
            SIMULATED if f else "log2 p·(α + nβ + nγ) + log2 p·(α + nβ)",
        )
    if key == ("allreduce", "naive"):
        return Formula(
            2 * (p - 1),
            "2(p−1)",
            (p - 1) * n,
            "(p−1)·n",
            naive_reduce + (p - 1) * T,
            naive_reduce_expr + " + (p−1)(α+nβ)",
        )
    if key == ("allreduce", "double_binary_tree"):
        return None
    if key == ("allreduce", "one_shot"):
        return Formula(p - 1, "p−1", (p - 1) * n, "(p−1)·n", naive_reduce, naive_reduce_expr)
    if key == ("allreduce", "two_shot"):
        Tb = a + n / p * b
        rs = Tb + (p - 2) * max(Tb, n / p * g) + n / p * g
        return Formula(
            2 * (p - 1),
            "2(p−1)",
            2 * n * (p - 1) / p,
            "2n(p−1)/p",
            rs + (p - 1) * Tb,
            "(α+nβ/p) + (p−2)·max(α+nβ/p, nγ/p) + nγ/p + (p−1)(α + nβ/p)",
        )
    if key == ("allgather", "ring"):
        return Formula(
            p - 1, "p−1", n * (p - 1) / p, "n(p−1)/p", (p - 1) * a + n * (p - 1) / p * b, "(p−1)α + n(p−1)/p·β"
        )
    if key == ("allgather", "recursive_doubling"):
        if f:
            return Formula(L + 2, "log2 p' + 2", None, "—", None, SIMULATED)
        return Formula(L, "log2 p", n * (p - 1) / p, "n(p−1)/p", L * a + n * (p - 1) / p * b, "log2 p·α + n(p−1)/p·β")
    if key == ("allgather", "bruck"):
        return Formula(
            lg, "⌈log2 p⌉", n * (p - 1) / p, "n(p−1)/p", lg * a + n * (p - 1) / p * b, "⌈log2 p⌉·α + n(p−1)/p·β"
        )
    if key in (("reduce_scatter", "ring"), ("reduce_scatter", "pairwise")):
        return Formula(
            p - 1,
            "p−1",
            n * (p - 1) / p,
            "n(p−1)/p",
            (p - 1) * a + n * (p - 1) / p * (b + g),
            "(p−1)α + n(p−1)/p·(β + γ)",
        )
    if key == ("reduce_scatter", "recursive_halving"):
        if f:
            return Formula(L + 2, "log2 p' + 2", None, "—", None, SIMULATED)
        return Formula(
            L, "log2 p", n * (p - 1) / p, "n(p−1)/p", L * a + n * (p - 1) / p * (b + g), "log2 p·α + n(p−1)/p·(β + γ)"
        )
    if key == ("broadcast", "naive"):
        return Formula(p - 1, "p−1", (p - 1) * n, "(p−1)·n", (p - 1) * T, "(p−1)(α + nβ)")
    if key == ("broadcast", "binomial"):
        return Formula(lg, "⌈log2 p⌉", lg * n, "⌈log2 p⌉·n", lg * T, "⌈log2 p⌉·(α + nβ)")
    if key == ("broadcast", "scatter_ring"):
        if f:
            return Formula(lg + p - 1, "⌈log2 p⌉ + p−1", None, "—", None, SIMULATED)
        return Formula(
            L + p - 1,
            "log2 p + p−1",
            2 * n * (p - 1) / p,
            "2n(p−1)/p",
            (L + p - 1) * a + 2 * n * (p - 1) / p * b,
            "(log2 p + p−1)α + 2n(p−1)/p·β",
        )
    if key == ("broadcast", "scatter_recursive_doubling"):
        if f:
            return Formula(lg + L + 2, "⌈log2 p⌉ + log2 p' + 2", None, "—", None, SIMULATED)
        return Formula(
            2 * L,
            "2·log2 p",
            2 * n * (p - 1) / p,
            "2n(p−1)/p",
            2 * L * a + 2 * n * (p - 1) / p * b,
            "2·log2 p·α + 2n(p−1)/p·β",
        )
    if key == ("reduce", "naive"):
        return Formula(p - 1, "p−1", n, "n", naive_reduce, naive_reduce_expr)
    if key == ("reduce", "binomial"):
        return Formula(
            lg, "⌈log2 p⌉", n, "n", None if f else lg * (T + n * g), SIMULATED if f else "log2 p·(α + nβ + nγ)"
        )
    if key == ("alltoall", "naive"):
        return Formula(p - 1, "p−1", n * (p - 1) / p, "n(p−1)/p", None, "— (receive-port contention: simulated)")
    if key == ("alltoall", "pairwise"):
        return Formula(p - 1, "p−1", n * (p - 1) / p, "n(p−1)/p", (p - 1) * (a + n / p * b), "(p−1)(α + n/p·β)")
    if key == ("alltoall", "bruck"):
        k = _bits(p)
        return Formula(
            lg,
            "⌈log2 p⌉",
            n / p * k,
            "n/p·Σ_k #{j<p: bit k of j}",
            lg * a + n / p * k * b,
            "⌈log2 p⌉·α + n/p·β·Σ_k #{j<p: bit k of j}",
        )
    return None
