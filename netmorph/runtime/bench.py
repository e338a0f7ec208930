"""Measure collectives on real ranks, nccl-tests style (``all_reduce_perf -b MIN -e MAX -f 2``).

One launch covers every (algorithm, size): per case, one checked run counts
wrong elements (``#wrong``), then ``warmup`` untimed and ``iters`` timed runs
between barriers; a case's time is the slowest rank's mean, as nccl-tests
reports. Inputs are small integers so float sums are exact and the check is
equality.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from netmorph.collectives import bandwidths
from netmorph.schedule import REDOPS
from netmorph.runtime.launch import launch


@dataclass
class Case:
    op: str
    algo: str          # an algorithm name, "auto", or "native" (torch.distributed's own)
    nbytes: int
    redop: str = "sum"  # nccl-tests' -o
    root: int = 0       # nccl-tests' -r (broadcast, reduce)
    check: bool = True  # nccl-tests' -c: one checked run before the timed ones


def _contribution(op, redop, rank, count, dtype):
    """Rank ``rank``'s input to a reduction: small integers, so every sum, max, min and (powers of
    two) product is exact in every type and the check is equality."""
    i = np.arange(count)
    if redop == "prod":
        return ((rank + i) % 2 + 1).astype(dtype)
    return ((rank + 1) + (i % 13)).astype(dtype)


def _inputs(op, p, rank, count, dtype, redop="sum", root=0):
    """(this rank's input, the expected output)."""
    i = np.arange(count)
    if op in ("allreduce", "reduce", "reduce_scatter"):
        ufunc = REDOPS[redop]
        x = _contribution(op, redop, rank, count, dtype)
        full = ufunc.reduce(np.stack([_contribution(op, redop, r, count, dtype) for r in range(p)]), axis=0)
        if op == "reduce_scatter":
            n = count // p
            return x, full[rank * n:(rank + 1) * n]
        return x, full.astype(dtype)
    if op == "broadcast":
        x = ((i % 13) + 1).astype(dtype) if rank == root else np.zeros(count, dtype)
        return x, ((i % 13) + 1).astype(dtype)
    if op == "allgather":
        n = count // p
        x = ((rank + 1) + (np.arange(n) % 13)).astype(dtype)
        want = np.concatenate([((r + 1) + (np.arange(n) % 13)) for r in range(p)]).astype(dtype)
        return x, want
    if op == "alltoall":
        n = count // p
        x = (rank * 1000 + np.arange(count) % 997).astype(dtype)
        want = np.concatenate([(s * 1000 + (np.arange(rank * n, (rank + 1) * n) % 997)) for s in range(p)])
        return x, want.astype(dtype)
    raise ValueError(op)


def _reg(comm, a):
    """``a`` copied into registered memory (what an NCCL user gets from ncclMemAlloc)."""
    r = comm.alloc(a.shape, a.dtype)
    r[:] = a
    return r


def _call(comm, op, algo, x, count, p, redop="sum", root=0):
    kw = {} if algo == "native" else {"algo": algo}
    if op == "allreduce":
        comm.all_reduce(x, op=redop, **kw)
        return x
    if op == "reduce":
        comm.reduce(x, root, op=redop, **kw)
        return x
    if op == "broadcast":
        comm.broadcast(x, root, **kw)
        return x
    if op == "allgather":
        out = comm.alloc(count, x.dtype)
        comm.all_gather_into_tensor(out, x, **kw)
        return out
    if op == "reduce_scatter":
        out = comm.alloc(count // p, x.dtype)
        comm.reduce_scatter_tensor(out, x, op=redop, **kw)
        return out
    if op == "alltoall":
        out = comm.alloc(x.shape, x.dtype)
        comm.all_to_all_single(out, x, **kw)
        return out
    raise ValueError(op)


def _rank_fn(comm, cases, iters, warmup, dtype):
    p, rank = comm.world, comm.rank
    out = []
    for c in cases:
        itemsize = np.dtype(dtype).itemsize
        count = c.nbytes // itemsize
        if c.op in ("allgather", "reduce_scatter", "alltoall"):
            count -= count % p
        x, want = _inputs(c.op, p, rank, count, dtype, c.redop, c.root)
        wrong = -1                            # -1: not checked (-c 0)
        if c.check:
            got = _call(comm, c.op, c.algo, _reg(comm, x), count, p, c.redop, c.root)
            wrong = 0 if c.op == "reduce" and rank != c.root else int((got != want).sum())
            comm.free_all()
        x = _reg(comm, np.zeros_like(x))      # timed runs reduce zeros: no overflow, same memory traffic
        for _ in range(warmup):
            _call(comm, c.op, c.algo, x, count, p, c.redop, c.root)
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            _call(comm, c.op, c.algo, x, count, p, c.redop, c.root)
        t = (time.perf_counter() - t0) / iters
        comm.barrier()
        comm.free_all()
        out.append((t, wrong))
    return out


def measure(cases, world: int, backend: str = "local", iters: int = 20, warmup: int = 5, dtype="float32",
            timeout: float = 30.0, fingerprints: bool = True):
    """Run every case on ``world`` ranks; returns one dict per case (slowest rank's mean time, summed #wrong).
    ``fingerprints=False`` measures without the per-message call check (to price it)."""
    # torch-native is the baseline netmorph is measured against: torch's collectives as production runs
    # them, without TORCH_DISTRIBUTED_DEBUG=DETAIL's extra check of every call
    results = launch(_rank_fn, world, cases, iters, warmup, dtype, backend=backend, timeout=timeout,
                     fingerprints=fingerprints and backend != "torch-native")
    times = [max(r[k][0] for r in results) for k in range(len(cases))]
    wrong = [sum(r[k][1] for r in results) for k in range(len(cases))]
    return _rows(cases, times, wrong, world, backend, dtype)


def measure_in_job(comm, cases, iters: int = 20, warmup: int = 5, dtype="float32"):
    """The same measurement by a rank of a job someone else started (torchrun, as nccl-tests runs
    under mpirun): every rank calls it; the slowest rank's time and the summed #wrong come together
    over ``comm`` and rank 0 gets the rows (the others None)."""
    mine = _rank_fn(comm, cases, iters, warmup, dtype)
    times = np.array([t for t, _ in mine], dtype=np.float64)
    wrong = np.array([w for _, w in mine], dtype=np.float64)
    comm.all_reduce(times, op="max")
    comm.all_reduce(wrong, op="sum")
    if comm.rank != 0:
        return None
    wrong = [int(w) if c.check else -1 for w, c in zip(wrong, cases)]
    backend = "torch-native" if type(comm).__name__ == "NativeComm" else comm.transport.name
    return _rows(cases, times.tolist(), wrong, comm.world, backend, dtype)


def _rows(cases, times, wrong, world, backend, dtype):
    rows = []
    itemsize = np.dtype(dtype).itemsize
    for c, t, bad in zip(cases, times, wrong):
        bad = -1 if not c.check else bad
        nbytes = c.nbytes - (c.nbytes // itemsize % world) * itemsize if c.op in (
            "allgather", "reduce_scatter", "alltoall") else c.nbytes
        algbw, busbw = bandwidths(c.op, nbytes, t, world)
        rows.append({"op": c.op, "algo": c.algo, "backend": backend if c.algo != "native" else "torch-native",
                     "world": world, "bytes": nbytes, "count": nbytes // itemsize, "type": str(np.dtype(dtype)),
                     "time_s": t, "algbw_gbps": algbw, "busbw_gbps": busbw, "wrong": bad})
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
