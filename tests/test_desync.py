"""Collective fingerprints: ranks that disagree on a call fail with CollectiveMismatch naming both
calls, on every backend that carries netmorph messages -- never a wrong result, never a bare
IndexError. (Each case below returned wrong sums, hung or raised IndexError before.)"""

import numpy as np
import pytest

from netmorph.runtime.launch import LaunchError, launch
from netmorph.runtime.transport import fingerprint
from netmorph.runtime.transport.fingerprint import CollectiveMismatch

BACKENDS = ["local", "torch"]


def _root_disagrees(comm):
    x = np.full(4, float(comm.rank + 1), dtype=np.float32)
    comm.broadcast(x, src=0 if comm.rank == 0 else 1)  # the others think the root is 1
    y = np.ones(4, dtype=np.float32)
    comm.all_reduce(y)  # correctly matched: must not eat the leftovers
    return y.tolist()


def _redop_disagrees(comm):
    comm.all_reduce(np.ones(8, dtype=np.float32), op="max" if comm.rank == 1 else "sum")


def _count_disagrees(comm):
    comm.all_reduce(np.ones(10 + 2 * (comm.rank == 1), dtype=np.float32), algo="ring")


def _dtype_disagrees(comm):
    comm.all_reduce(np.ones(16, dtype=np.float64 if comm.rank == 0 else np.float32), algo="ring")


def _algo_disagrees(comm):
    comm.all_reduce(np.ones(64, dtype=np.float32), algo="ring" if comm.rank else "recursive_doubling")


def _sends_merged(comm):
    if comm.rank == 0:
        comm.send(np.ones(4, dtype=np.float32), 1)
        comm.send(np.ones(4, dtype=np.float32), 1)
    elif comm.rank == 1:
        comm.recv(np.zeros(8, dtype=np.float32), 0)


def _send_f32_recv_f64(comm):
    if comm.rank == 0:
        comm.send(np.ones(4, dtype=np.float32), 1)
    elif comm.rank == 1:
        comm.recv(np.zeros(4, dtype=np.float64), 0)


def _bigger_send(comm):
    # on gloo, a message longer than the posted receive aborts the receiving process (SIGABRT)
    if comm.rank == 0:
        comm.send(np.ones(1000, dtype=np.float32), 1)
    elif comm.rank == 1:
        comm.recv(np.zeros(10, dtype=np.float32), 0)


CASES = {
    "broadcast root": (_root_disagrees, "root="),
    "reduce op": (_redop_disagrees, "op=max"),
    "count": (_count_disagrees, "12 x float32"),
    "dtype": (_dtype_disagrees, "float64"),
    "algorithm": (_algo_disagrees, "recursive_doubling"),
    "two sends into one receive": (_sends_merged, "send/recv(8 x float32"),
    "float32 sent, float64 received": (_send_f32_recv_f64, "float64"),
    "longer message than the receive": (_bigger_send, "send/recv(1000 x float32"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_mismatched_calls_raise_collective_mismatch(case, backend):
    fn, words = CASES[case]
    with pytest.raises(LaunchError) as ei:
        launch(fn, 4 if backend == "local" else 2, backend=backend, timeout=4)
    err = ei.value
    assert err.root.exc_type == "CollectiveMismatch", str(err)
    assert "collective mismatch" in err.root.message and words in err.root.message, err.root.message
    if backend == "local":  # the local fabric publishes the mismatch: every blocked rank names it
        blocked = [f for f in err.failures if f.exc_type]
        assert all(f.exc_type == "CollectiveMismatch" for f in blocked), str(err)


def _rank_calls_after_failure(comm):
    try:
        comm.all_reduce(np.ones(10 + 2 * (comm.rank == 1), dtype=np.float32), algo="ring")
    except CollectiveMismatch:
        pass
    kinds = []
    for _ in range(2):
        try:
            comm.all_reduce(np.ones(4, dtype=np.float32))
            kinds.append("ok")
        except Exception as e:  # noqa: BLE001 - the kind is the assertion
            kinds.append(type(e).__name__)
    return kinds


@pytest.mark.timeout(60)
def test_a_broken_communicator_raises_the_same_error_on_every_call():
    for kinds in launch(_rank_calls_after_failure, 3, timeout=5):
        assert kinds == ["CollectiveMismatch", "CollectiveMismatch"]


def _matched(comm):
    x = np.arange(8, dtype=np.float64) * (comm.rank + 1)
    comm.all_reduce(x)
    g = comm.new_group([0, 1]) if comm.rank < 2 else None
    if g is not None:  # a subgroup's calls are counted on the subgroup
        comm.all_reduce(np.ones(3), group=g)
    comm.all_reduce(np.ones(2))
    if comm.rank == 0:
        comm.send(np.ones(5), 1)
    elif comm.rank == 1:
        comm.recv(np.zeros(5), 0)
    return x.tolist()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fingerprints", [True, False])
def test_headers_are_counted_apart_from_the_payload(fingerprints):
    got = launch(_matched, 3, ledger=True, fingerprints=fingerprints)
    results, led = list(got), got.ledger
    expect = (np.arange(8) * 6.0).tolist()
    assert all(r == expect for r in results)
    payload = sum(r[2] for r in led.records)
    carrying = sum(1 for r in led.records if r[2])
    assert led.bytes == payload
    assert led.overhead_bytes == (fingerprint.HEADER_BYTES * carrying if fingerprints else 0)
    assert ("fingerprints" in led.summary()) == fingerprints


def test_describe_names_the_call():
    fp = fingerprint.stamp("reduce", "binomial", 7, 1024, np.float16, 3, "max", (0, 1, 2, 3))
    text = fingerprint.describe(np.frombuffer(fingerprint.header(fp, 2048).tobytes(), np.int64))
    assert text.startswith("reduce(binomial, 1024 x float16, root=3, op=max, group of 4")
    assert "call #7" in text and "2,048 B" in text
    assert "not a netmorph message" in fingerprint.describe(np.full(8, 1 << 40))
