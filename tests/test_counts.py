"""Counting tests: measured rounds / messages / bytes equal the closed forms (and the issue's figures)."""

import numpy as np
import pytest
from cases import ALL

from netmorph.collectives import ALGORITHMS, build
from netmorph.collectives.formulas import closed_form
from netmorph.schedule import count

MiB = 1 << 20


def test_ring_allreduce_p8_8mib():
    c = count(build("allreduce", "ring", 8, 8 * MiB // 4, 4))
    assert c.rounds == 14
    assert c.messages == 112
    assert (c.bytes_sent == 14_680_064).all()
    assert (c.bytes_recv == 14_680_064).all()
    assert c.bytes_on_wire == 117_440_512
    assert (c.bytes_reduced == 8 * MiB * 7 // 8).all()  # n(p-1)/p reduced per rank


def test_recursive_doubling_p8():
    c = count(build("allreduce", "recursive_doubling", 8, 8 * MiB // 4, 4))
    assert c.rounds == 3
    assert (c.bytes_sent == 3 * 8 * MiB).all()


def test_rabenseifner_moves_ring_bytes_in_6_rounds():
    ring = count(build("allreduce", "ring", 8, 8 * MiB // 4, 4))
    rab = count(build("allreduce", "rabenseifner", 8, 8 * MiB // 4, 4))
    assert rab.rounds == 6
    assert rab.bytes_on_wire == ring.bytes_on_wire
    np.testing.assert_array_equal(rab.bytes_sent, ring.bytes_sent)


@pytest.mark.parametrize("p", [2, 3, 5, 8, 16])
def test_ring_uses_exactly_p_edges(p):
    """tinygrad's count: a ring all-reduce issues 2p(p-1) transfers over p distinct edges."""
    c = count(build("allreduce", "ring", p, 10 * p, 4))
    assert c.messages == 2 * p * (p - 1)
    assert c.links == p
    m = c.traffic_matrix()
    for r in range(p):
        assert m[r, (r + 1) % p] > 0 and m[r].sum() == m[r, (r + 1) % p]


def test_naive_root_port_is_the_bottleneck():
    c = count(build("allreduce", "naive", 8, 1024, 4))
    assert c.rounds == 14 and c.logical_rounds == 2 and c.messages == 14
    assert c.bytes_sent[0] == 7 * 4096 and c.bytes_recv[0] == 7 * 4096
    assert c.bytes_reduced[0] == 7 * 4096 and c.bytes_reduced[1:].sum() == 0


def test_double_binary_tree_counts():
    for p in (4, 8, 9, 16):
        for seg in (1, 3):
            c = count(build("allreduce", "double_binary_tree", p, 96 * p, 4, segments=seg))
            assert c.messages == 4 * (p - 1) * seg  # 2 trees x (up + down) x edges x segments
            assert c.bytes_on_wire == 2 * 96 * p * 4 * (p - 1)  # each tree moves n/2 up and down every edge


def test_trees_are_complementary():
    """NCCL's dtree: for even p, a leaf of one tree is an interior node of the other (except the ends)."""
    from netmorph.collectives.allreduce import dtree_parents

    for p in (8, 16, 32):
        t0, t1 = dtree_parents(p)
        interior0 = set(t0[t0 >= 0].tolist())
        interior1 = set(t1[t1 >= 0].tolist())
        assert len(interior0 & interior1) <= 2
        for t in (t0, t1):
            assert (t < 0).sum() == 1  # one root
            assert max(np.bincount(t[t >= 0])) <= 2  # binary


def test_alltoall_bruck_moves_more_bytes_in_fewer_rounds():
    pw = count(build("alltoall", "pairwise", 16, 16 * 64, 4))
    br = count(build("alltoall", "bruck", 16, 16 * 64, 4))
    assert pw.rounds == 15 and br.rounds == 4
    assert 15 * br.bytes_on_wire == 32 * pw.bytes_on_wire  # (n/2)·log2 p vs n(p-1)/p per rank at p = 16
    assert pw.local_bytes == br.local_bytes == 16 * 64 * 4  # each rank's own block is a local copy


CLOSED = [x for x in ALL if x != ("allreduce", "double_binary_tree")]  # DBT: counted in its own test


@pytest.mark.parametrize("op,algo", CLOSED)
@pytest.mark.parametrize("p", [2, 3, 4, 6, 7, 8, 16, 32])
def test_counts_equal_closed_forms(op, algo, p):
    n = p * (1 << p.bit_length()) * 16 * 4  # bytes dividing into p and pof2 blocks
    c = count(build(op, algo, p, n // 4, 4))
    f = closed_form(op, algo, p, n, 1e-6, 1e-9, 0.0)
    assert f is not None
    assert c.rounds == f.rounds, f.rounds_expr
    if f.sent is not None:
        assert c.max_bytes_sent == pytest.approx(f.sent), f.sent_expr


def test_zero_bytes_is_empty():
    for op, algos in ALGORITHMS.items():
        for a in algos:
            c = count(build(op, a, 5, 0, 4))
            assert c.messages == 0 and c.bytes_on_wire == 0 and c.rounds == 0
