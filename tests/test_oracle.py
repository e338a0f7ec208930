"""Oracle tests: every algorithm, every world size 1..17 and a few larger, uneven and zero sizes, against numpy."""

import numpy as np
import pytest
from cases import ALL
from hypothesis import given, settings
from hypothesis import strategies as st

from netmorph.collectives import ALGORITHMS, build
from netmorph.schedule import execute

WORLDS = list(range(1, 18)) + [24, 32, 33]
REDUCE = {"sum": np.sum, "max": np.max, "min": np.min}


def expected(op, p, inputs, redop, root, s):
    """What numpy says each rank must end with."""
    if op in ("allreduce", "reduce", "reduce_scatter"):
        total = REDUCE[redop](np.stack(inputs), axis=0) if len(inputs[0]) else inputs[0]
        return [total[s.out_off[r] : s.out_off[r] + s.out_len[r]] for r in range(p)]
    if op == "allgather":
        return [np.concatenate(inputs)] * p
    if op == "broadcast":
        return [inputs[root]] * p
    if op == "alltoall":
        splits = s.meta["splits"]
        pieces = [np.split(inputs[q], np.cumsum(splits[q])[:-1]) for q in range(p)]
        return [np.concatenate([pieces[q][r] for q in range(p)]) for r in range(p)]
    raise AssertionError(op)


def run_case(op, algo, p, n, dtype, redop, rng, root=0, splits=None):
    s = build(op, algo, p, n, np.dtype(dtype).itemsize, root=root, splits=splits)
    s.validate()
    if np.issubdtype(dtype, np.integer):
        inputs = [rng.integers(-1000, 1000, int(s.in_len[r])).astype(dtype) for r in range(p)]
    else:
        inputs = [rng.standard_normal(int(s.in_len[r])).astype(dtype) for r in range(p)]
    out = execute(s, inputs, op=redop)
    want = expected(op, p, inputs, redop, root, s)
    for r in range(p):
        if np.issubdtype(dtype, np.integer) or redop != "sum":
            np.testing.assert_array_equal(out[r], want[r], err_msg=f"{op}/{algo} p={p} n={n} rank {r}")
        else:  # the schedule sums in a different order than numpy: float rounding only
            np.testing.assert_allclose(
                out[r],
                want[r],
                rtol=1e-4 if dtype == np.float32 else 1e-12,
                atol=1e-4 if dtype == np.float32 else 1e-12,
            )


@pytest.mark.parametrize("op,algo", ALL)
@pytest.mark.parametrize("p", WORLDS)
def test_every_world_size(op, algo, p, rng):
    root = p - 1 if op in ("broadcast", "reduce") else 0
    for n in (0, 1, p - 1 if p > 1 else 2, 3 * p + 1, 64):  # zero, tiny, uneven, even
        run_case(op, algo, p, n, np.int64, "sum", rng, root=root)


@pytest.mark.parametrize("op,algo", [x for x in ALL if x[0] in ("allreduce", "reduce", "reduce_scatter")])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("redop", ["sum", "max", "min"])
def test_dtypes_and_reductions(op, algo, dtype, redop, rng):
    for p in (3, 8):
        run_case(op, algo, p, 37, dtype, redop, rng)


@pytest.mark.parametrize("algo", list(ALGORITHMS["alltoall"]))
@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 9), data=st.data())
def test_alltoall_uneven_splits(algo, p, data):
    splits = np.array(
        data.draw(st.lists(st.lists(st.integers(0, 6), min_size=p, max_size=p), min_size=p, max_size=p)), dtype=np.int64
    )
    run_case(
        "alltoall", algo, p, int(splits.sum(axis=1).max()), np.int64, "sum", np.random.default_rng(p), splits=splits
    )


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 20), n=st.integers(0, 200), which=st.sampled_from(ALL), seed=st.integers(0, 2**31))
def test_property_any_world_any_size(p, n, which, seed):
    op, algo = which
    root = seed % p if op in ("broadcast", "reduce") else 0
    run_case(op, algo, p, n, np.int64, "sum", np.random.default_rng(seed), root=root)


def test_double_binary_tree_pipelined(rng):
    for p in (2, 5, 8, 13):
        s = build("allreduce", "double_binary_tree", p, 100, 8, segments=4)
        s.validate()
        inputs = [rng.integers(0, 9, 100) for _ in range(p)]
        for out in execute(s, inputs):
            np.testing.assert_array_equal(out, np.sum(inputs, axis=0))


def test_nonroot_ranks_of_reduce_get_nothing():
    s = build("reduce", "binomial", 5, 10, 4, root=2)
    out = execute(s, [np.ones(10)] * 5)
    assert [len(o) for o in out] == [0, 0, 10, 0, 0]
    np.testing.assert_array_equal(out[2], np.full(10, 5.0))
