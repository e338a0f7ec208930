"""Measure collectives on real ranks, as nccl-tests does (``all_reduce_perf -b MIN -e MAX -f 2``).

One launch covers every case (size, type, reduce op, root) of one algorithm. Per case,
as nccl-tests' ``BenchTime``: the out-of-place call and then the in-place one are each
run ``warmup`` times untimed and ``iters`` times timed between barriers, and their time
is the slowest rank's mean; then ``check`` runs on fresh inputs count the wrong elements
over every rank (``#wrong``), stopping at the first run with any. Buffers sit in
registered memory (``ncclMemAlloc``). Inputs are small integers, so every sum, max, min
and product is exact in every type, bfloat16 included, and the check is equality.

Sizes follow nccl-tests' ``GetCollByteCount``: all-gather, reduce-scatter and all-to-all
move a per-rank ``count`` rounded down to 16 bytes' worth of elements, and their size
column is the whole buffer (count x ranks); the others move ``size / itemsize``.

In place and out of place: an out-of-place all-reduce, reduce or broadcast runs the
communicator's out-of-place entry (``all_reduce_into_tensor``: NCCL's send and receive
buffers), whose schedule reads the send buffer in its first round -- no copy in front
of it; torch's own collectives (``native``) have no such entry and copy first, as a
torch user would. All-gather and reduce-scatter take
nccl-tests' in-place layout (the input is the rank's block of the output, or the output
the rank's block of the input). An in-place all-to-all, which nccl-tests times but does
not check, goes through a scratch buffer and is reported without ``#wrong``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from netmorph.collectives import bandwidths
from netmorph.runtime.launch import launch
from netmorph.schedule import REDOPS
from netmorph.units import numpy_dtype

SPLIT = ("allgather", "reduce_scatter", "alltoall")  # a per-rank count, as nccl-tests sizes them


@dataclass
class Case:
    op: str
    algo: str  # an algorithm name, "auto", or "native" (torch.distributed's own)
    nbytes: int
    redop: str = "sum"  # nccl-tests' -o
    root: int = 0  # nccl-tests' -r (broadcast, reduce)
    check: int = 1  # nccl-tests' -c: checked runs after the timed ones (0: none)
    dtype: str = "float32"


def counts(op: str, nbytes: int, itemsize: int, world: int) -> tuple[int, int]:
    """(count, size): nccl-tests' count column (per rank for all-gather, reduce-scatter, all-to-all;
    16 bytes' alignment) and its size column (the bytes of the larger buffer)."""
    count = nbytes // itemsize
    if op in SPLIT:
        base = (count // world) & ~(max(1, 16 // itemsize) - 1)
        return base, base * world * itemsize
    return count, count * itemsize


def _contribution(redop, rank, p, count, dtype):
    """Rank ``rank``'s input to a reduction: 0, 1 or 2 (sums stay under 2p, exact in int8 and bfloat16);
    for a product, one rank holds 2 and another 3 at each element (the product is 6, or 2)."""
    i = np.arange(count)
    if redop == "prod":
        return np.where((i + rank) % p == 0, 2, np.where((i + rank) % p == 1, 3, 1)).astype(dtype)
    return ((rank + i) % 3).astype(dtype)


def _reduced(redop, p, count, dtype):
    stack = np.stack([_contribution(redop, r, p, count, dtype) for r in range(p)])
    if redop == "avg":
        return (np.sum(stack.astype(np.float64), axis=0) / p).astype(dtype)
    return REDOPS[redop].reduce(stack, axis=0).astype(dtype)


def _pattern(rank, n, dtype, start=0):
    """Distinct small values per (rank, element) for the data-moving collectives."""
    return ((rank * 37 + np.arange(start, start + n)) % 101).astype(dtype)


def _inputs(op, p, rank, count, dtype, redop="sum", root=0):
    """(this rank's input, the output it expects), ``count`` as :func:`counts` gives it."""
    if op in ("allreduce", "reduce"):
        return _contribution(redop, rank, p, count, dtype), _reduced(redop, p, count, dtype)
    if op == "reduce_scatter":
        full = _reduced(redop, p, count * p, dtype)
        return _contribution(redop, rank, p, count * p, dtype), full[rank * count : (rank + 1) * count]
    if op == "broadcast":
        want = _pattern(root, count, dtype)
        return (want.copy() if rank == root else np.zeros(count, dtype)), want
    if op == "allgather":
        return _pattern(rank, count, dtype), np.concatenate([_pattern(r, count, dtype) for r in range(p)])
    if op == "alltoall":
        x = _pattern(rank, count * p, dtype)
        want = np.concatenate([_pattern(s, count, dtype, start=rank * count) for s in range(p)])
        return x, want
    raise ValueError(op)


def _reg(comm, a):
    """``a`` copied into registered memory (what an NCCL user gets from ncclMemAlloc)."""
    r = comm.alloc(a.shape, a.dtype)
    r[:] = a
    return r


class _Buffers:
    """The send and receive buffers of one case, in registered memory, laid out for ``in_place``."""

    def __init__(self, comm, c: Case, x, in_place: bool):
        p, me, n = comm.world, comm.rank, len(x)
        self.c, self.in_place = c, in_place
        if c.op == "allgather":
            self.out = comm.alloc(n * p, x.dtype)
            self.x = self.out[me * n : (me + 1) * n] if in_place else comm.alloc(n, x.dtype)
        elif c.op == "reduce_scatter":
            self.x = comm.alloc(n, x.dtype)
            self.out = self.x[me * (n // p) : (me + 1) * (n // p)] if in_place else comm.alloc(n // p, x.dtype)
        elif c.op == "alltoall":
            self.x = comm.alloc(n, x.dtype)
            self.out = self.x if in_place else comm.alloc(n, x.dtype)
            self.scratch = comm.alloc(n, x.dtype) if in_place else None
        else:
            self.x = comm.alloc(n, x.dtype)
            self.out = self.x if in_place else comm.alloc(n, x.dtype)
        self.load(x)

    def load(self, x) -> None:
        self.x[:] = x

    def run(self, comm) -> np.ndarray:
        c, x, out = self.c, self.x, self.out
        kw = {} if c.algo == "native" else {"algo": c.algo}
        if c.op in ("allreduce", "reduce", "broadcast") and out is not x:  # out of place: NCCL's entries
            if c.op == "allreduce":
                comm.all_reduce_into_tensor(out, x, op=c.redop, **kw)
            elif c.op == "reduce":
                comm.reduce_into_tensor(out, x, c.root, op=c.redop, **kw)
            else:
                comm.broadcast_into_tensor(out, x, c.root, **kw)
        elif c.op == "allreduce":
            comm.all_reduce(out, op=c.redop, **kw)
        elif c.op == "reduce":
            comm.reduce(out, c.root, op=c.redop, **kw)
        elif c.op == "broadcast":
            comm.broadcast(out, c.root, **kw)
        elif c.op == "allgather":
            comm.all_gather_into_tensor(out, x, **kw)
        elif c.op == "reduce_scatter":
            comm.reduce_scatter_tensor(out, x, op=c.redop, **kw)
        elif self.in_place:  # all-to-all in place: through a scratch buffer
            comm.all_to_all_single(self.scratch, x, **kw)
            x[:] = self.scratch
        else:
            comm.all_to_all_single(out, x, **kw)
        return out


def _time(comm, bufs: _Buffers, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        bufs.run(comm)
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        bufs.run(comm)
    t = (time.perf_counter() - t0) / iters
    comm.barrier()
    return t


def _wrong(comm, c: Case, bufs: _Buffers, count: int, dtype) -> int:
    """``c.check`` runs on fresh inputs; the wrong elements summed over every rank at the first run that
    has any (nccl-tests' CheckData); -1 when nothing is checked (``-c 0``, or an in-place all-to-all)."""
    if not c.check or (c.op == "alltoall" and bufs.in_place):
        return -1
    wrong = 0
    for _ in range(c.check):
        x, want = _inputs(c.op, comm.world, comm.rank, count, dtype, c.redop, c.root)
        bufs.load(x)
        got = bufs.run(comm)
        mine = 0 if c.op == "reduce" and comm.rank != c.root else int((got != want).sum())
        total = np.array([mine], dtype=np.int64)
        comm.all_reduce(total)
        wrong = int(total[0])
        if wrong:
            break
    return wrong


def _rank_fn(comm, cases, iters, warmup, places=(False, True)):
    out = []
    for c in cases:
        dtype = numpy_dtype(c.dtype)
        count, _ = counts(c.op, c.nbytes, dtype.itemsize, comm.world)
        length = count * comm.world if c.op in SPLIT and c.op != "allgather" else count
        row = []
        for in_place in places:
            bufs = _Buffers(comm, c, np.zeros(length, dtype), in_place)  # timed on zeros: no overflow
            t = _time(comm, bufs, iters, warmup)
            row += [t, _wrong(comm, c, bufs, count, dtype)]
            comm.free_all()
        out.append(tuple(row * (2 if len(places) == 1 else 1)))
    return out


def measure(
    cases,
    world: int,
    backend: str = "local",
    iters: int = 20,
    warmup: int = 1,
    timeout: float = 30.0,
    fingerprints: bool = True,
    in_place_only: bool = False,
):
    """Run every case on ``world`` ranks; one dict per case: nccl-tests' columns for out of place (``time_s``,
    ``algbw_gbps``, ``busbw_gbps``, ``wrong``: the slowest rank's mean time; -1 wrong: not checked) and
    the same under ``in_place_``. ``in_place_only``: time the in-place call alone (what a trainer's
    gradient all-reduce is), reported under both. ``fingerprints=False`` measures without the
    per-message call check."""
    # torch-native is the baseline netmorph is measured against: torch's collectives as production runs
    # them, without TORCH_DISTRIBUTED_DEBUG=DETAIL's extra check of every call
    results = launch(
        _rank_fn,
        world,
        cases,
        iters,
        warmup,
        (True,) if in_place_only else (False, True),
        backend=backend,
        timeout=timeout,
        fingerprints=fingerprints and backend != "torch-native",
    )
    times = [[max(r[k][j] for r in results) for j in (0, 2)] for k in range(len(cases))]
    wrongs = [[results[0][k][j] for j in (1, 3)] for k in range(len(cases))]  # summed over ranks already
    return _rows(cases, times, wrongs, world, backend)


def measure_in_job(comm, cases, iters: int = 20, warmup: int = 1):
    """The same measurement by a rank of a job someone else started (torchrun, as nccl-tests runs
    under mpirun): every rank calls it; the slowest rank's times come together over ``comm`` and rank 0
    gets the rows (the others None). The wrong counts are already summed over the ranks."""
    mine = _rank_fn(comm, cases, iters, warmup)
    times = np.array([[t[0], t[2]] for t in mine], dtype=np.float64).reshape(-1)
    comm.all_reduce(times, op="max")
    if comm.rank != 0:
        return None
    backend = "torch-native" if type(comm).__name__ == "NativeComm" else comm.transport.name
    return _rows(cases, times.reshape(-1, 2).tolist(), [[t[1], t[3]] for t in mine], comm.world, backend)


def _rows(cases, times, wrongs, world, backend):
    rows = []
    for c, (t_out, t_in), (w_out, w_in) in zip(cases, times, wrongs):
        dtype = numpy_dtype(c.dtype)
        count, size = counts(c.op, c.nbytes, dtype.itemsize, world)
        row = {
            "op": c.op,
            "algo": c.algo,
            "backend": backend if c.algo != "native" else "torch-native",
            "world": world,
            "bytes": size,
            "count": count,
            "type": c.dtype,
            "redop": c.redop,
            "root": c.root,
        }
        for key, t, wrong in (("", t_out, w_out), ("in_place_", t_in, w_in)):
            algbw, busbw = bandwidths(c.op, size, t, world)
            row.update(
                {f"{key}time_s": t, f"{key}algbw_gbps": algbw, f"{key}busbw_gbps": busbw, f"{key}wrong": int(wrong)}
            )
        rows.append(row)
    return rows


OUT_OF_CACHE = 64 << 20


def memcpy_bandwidth(nbytes: int = OUT_OF_CACHE, repeats: int = 20) -> float:
    """This machine's single-core copy bandwidth (GB/s, payload bytes per second), copying at least
    64 MiB: out of every cache level, so it is one stable reference, not a step at each cache size
    (a copy that fits in L2 runs ~10x faster and is no bound for a fabric moving between cores)."""
    n = max(nbytes, OUT_OF_CACHE) // 4
    a = np.ones(n, np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return a.nbytes / best / 1e9
