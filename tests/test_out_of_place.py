"""Out of place as a case of the schedule (NCCL's send and receive buffers): validated, executed, counted, run.

An out-of-place all-reduce, reduce or broadcast must put exactly the in-place schedule's messages on the
wire, read the send buffer where the in-place run would read an element it has not written yet, and add
no copy of the payload (the copy in front of an in-place schedule is what nccl-tests' first column used
to pay here).
"""

import numpy as np
import pytest

from netmorph.collectives import ALGORITHMS, build
from netmorph.runtime.interpreter import Call, program
from netmorph.runtime.launch import launch
from netmorph.schedule import Schedule, ScheduleError, count, execute, out_of_place

OOP = [(op, a) for op in ("allreduce", "reduce", "broadcast") for a in ALGORITHMS[op]]
WORLDS = list(range(1, 12)) + [16, 17]


def _roots(op, p):
    return [0] if op == "allreduce" else sorted({0, p // 2, p - 1})


@pytest.mark.parametrize("op,algo", OOP)
@pytest.mark.parametrize("p", WORLDS)
def test_out_of_place_equals_in_place_on_the_wire_and_in_the_result(op, algo, p, rng):
    for n in (0, 1, 3 * p + 1, 64):
        for root in _roots(op, p):
            s = build(op, algo, p, n, 8, root=root)
            t = out_of_place(s).validate()
            assert (t.in_off == s.buf_len).all() and (t.out_off == s.out_off).all()
            inputs = [rng.integers(-9, 9, int(s.in_len[r])).astype(np.int64) for r in range(p)]
            for a, b in zip(execute(s, inputs), execute(t, inputs)):
                np.testing.assert_array_equal(a, b)
            cs, ct = count(s), count(t)
            assert (ct.messages, ct.rounds, ct.bytes_on_wire) == (cs.messages, cs.rounds, cs.bytes_on_wire)
            np.testing.assert_array_equal(ct.bytes_sent, cs.bytes_sent)
            np.testing.assert_array_equal(ct.bytes_reduced, cs.bytes_reduced)
            # no copy of the payload added, but for a broadcast root's own part of its output (NCCL's root
            # copies sendbuff to recvbuff too) and a 1-rank group's
            extra = ct.local_bytes - cs.local_bytes
            if op == "broadcast" or p == 1:
                assert extra <= n * 8
            else:
                assert extra == 0, (op, algo, p, n, root, extra)


def test_the_first_round_of_an_out_of_place_ring_reads_the_send_buffer():
    """Rank 0 of a 4-rank ring sends its first block from the send buffer (after the n-element workspace)
    and reduces the block it receives with its own send-buffer block into the receive buffer."""
    n = 16
    _, prog = program(Call("allreduce", "ring", 4, n, 4, in_place=False), 0)
    first = prog[0]
    assert all(o >= n for m in first.sends for o in m.offs.tolist())
    (recv,) = first.recvs
    assert recv.acc is not None and (recv.acc >= n).all() and (recv.offs < n).all()
    later = [o for rr in prog[1:] for m in rr.sends for o in m.offs.tolist()]
    assert later and all(o < n for o in later)  # from then on everything is in the receive buffer
    assert not any(rr.local for rr in prog)  # and not one local copy


def test_an_accumulator_that_is_wrong_is_refused():
    s = out_of_place(build("allreduce", "ring", 3, 9, 8))
    bad = Schedule(
        s.op,
        s.algo,
        s.world,
        s.count,
        s.itemsize,
        s.buf_len,
        s.in_off,
        s.in_len,
        s.out_off,
        s.out_len,
        s.reduces,
        list(s.rounds),
        in_key=s.in_key,
    )
    r0 = bad.rounds[0]
    bad.rounds[0] = type(r0)(
        r0.src, r0.dst, r0.src_off, r0.dst_off, r0.length, r0.reduce, r0.msg, np.full(len(r0), -1)
    )  # forget the accumulators: the send buffer is lost
    with pytest.raises(ScheduleError, match="empty slot|wrong or partial"):
        bad.validate()
    with pytest.raises(ValueError, match="not an in-place op"):
        out_of_place(build("allgather", "ring", 3, 9, 8))


def _ops(comm, n, registered, tensors):
    """Every algorithm of the three ops, out of place; the cases that came out wrong or touched the input."""
    import torch

    p, rank = comm.world, comm.rank
    bad = []
    i = np.arange(n)
    for op in ("allreduce", "reduce", "broadcast"):
        for algo in list(ALGORITHMS[op]) + ["auto"]:
            x = ((rank + 1) * 10 + i % 7).astype(np.float64)
            out = np.full(n, -1.0)
            if registered:
                x, out = comm.alloc(n, np.float64), comm.alloc(n, np.float64)
                x[:], out[:] = ((rank + 1) * 10 + i % 7), -1.0
            keep = x.copy()
            xs, outs = (torch.from_numpy(x), torch.from_numpy(out)) if tensors else (x, out)
            total = sum((q + 1) * 10 + i % 7 for q in range(p)).astype(np.float64)
            if op == "allreduce":
                comm.all_reduce_into_tensor(outs, xs, algo=algo)
                want = total
            elif op == "reduce":
                comm.reduce_into_tensor(outs, xs, dst=1 % p, algo=algo)
                want = total if rank == 1 % p else np.full(n, -1.0)  # a non-root's output untouched
            else:
                root = p - 1
                comm.broadcast_into_tensor(outs, xs if rank == root else None, src=root, algo=algo)
                want = (p * 10 + i % 7).astype(np.float64)
            if not np.array_equal(out, want) or not np.array_equal(x, keep):
                bad.append((op, algo, rank))
        comm.free_all()
    return bad


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("registered", [False, True], ids=["plain", "registered"])
def test_every_algorithm_out_of_place_on_the_local_fabric(world, registered):
    assert [b for r in launch(_ops, world, 37, registered, False, timeout=30) for b in r] == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["torch", "torch-native"])
def test_out_of_place_on_torch_distributed(backend):
    """The same schedules over gloo point-to-point, on numpy buffers and on torch tensors the transport
    keeps as tensors (the device path); torch's own collectives take the copy-then-in-place default."""

    def run(comm, n):
        bad = _ops(comm, n, False, False)
        comm.keep_tensors = True
        return bad + _ops(comm, n, False, True)

    assert [b for r in launch(run, 3, 11, backend=backend, timeout=60) for b in r] == []


def _mismatch(comm):
    comm.all_reduce_into_tensor(np.zeros(4), np.zeros(5))


def test_an_input_of_another_length_names_the_argument():
    from netmorph.runtime.launch import LaunchError

    with pytest.raises(LaunchError, match=r"all_reduce_into_tensor: input must match the output's 4 elements"):
        launch(_mismatch, 2, timeout=10)
