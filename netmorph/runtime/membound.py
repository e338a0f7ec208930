"""The protocol-free bound of an all-reduce on this machine: the two-shot all-reduce's memory work alone.

What no fabric can beat on shared memory, with no protocol at all (no channels,
headers, descriptors or flags): ``p`` plain numpy processes over one shared
mapping, each holding a send and a receive buffer, doing exactly the memory
work of an out-of-place two-shot all-reduce (vLLM's custom all-reduce, the
2-stage kernel): rank r reduces block r of every rank's send buffer into its
own receive buffer (in 256 KiB chunks, the destination kept in cache, as the
fabric's fused reduction does), a barrier, then copies every other rank's
reduced block into its receive buffer, a barrier. The barrier is a flag per
rank in the same mapping, polled with ``sched_yield`` (more ranks than cores
here: a spinning rank must hand its core over). Each rank reads n and writes
n bytes in all; the time per call is the slowest rank's mean, as nccl-tests
times, so ``busbw = n / t x 2(p-1)/p`` is directly comparable with
``netmorph bench allreduce``'s column.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from multiprocessing import shared_memory

import numpy as np

from netmorph.collectives import bandwidths

CHUNK = 256 << 10


def _barrier(flags, r: int, gen: int) -> None:
    flags[r] = gen
    while flags.min() < gen:
        os.sched_yield()


def _rank(name, p, r, n, iters, warmup, times, in_place):
    shm = shared_memory.SharedMemory(name=name)
    views = []
    try:
        flat = np.ndarray((2 * p, n), np.float32, buffer=shm.buf)  # rows: p send buffers, p receive buffers
        flags = np.ndarray((p,), np.int64, buffer=shm.buf, offset=2 * p * n * 4)
        views += [flat, flags]
        send, recv = flat[:p], (flat[:p] if in_place else flat[p:])
        b = (np.arange(p + 1) * n) // p
        step = CHUNK // 4
        lo, hi = b[r], b[r + 1]
        gen = 0
        t0 = 0.0
        for it in range(warmup + iters):
            if it == warmup:
                gen += 1
                _barrier(flags, r, gen)
                t0 = time.perf_counter()
            for a in range(lo, hi, step):  # reduce-scatter: block r of every send
                e = min(a + step, hi)
                d = recv[r, a:e]
                if in_place:  # x_r += every other rank's block
                    for q in range(p):
                        if q != r:
                            np.add(d, send[q, a:e], out=d)
                else:  # recv_r = send_0 + send_1 + ...
                    np.add(send[0, a:e], send[1, a:e], out=d)
                    for q in range(2, p):
                        np.add(d, send[q, a:e], out=d)
            gen += 1
            _barrier(flags, r, gen)
            for q in range(p):  # all-gather: every other reduced block
                if q != r:
                    recv[r, b[q] : b[q + 1]] = recv[q, b[q] : b[q + 1]]
            gen += 1
            _barrier(flags, r, gen)
        times[r] = (time.perf_counter() - t0) / iters
    finally:
        del views[:]
        send = recv = flat = flags = d = None  # no view of the mapping may outlive it
        shm.close()


def two_shot_bound(
    world: int, nbytes: int, iters: int = 10, warmup: int = 2, timeout: float = 120.0, in_place: bool = False
) -> dict:
    """``{"time_s", "algbw_gbps", "busbw_gbps"}`` of the two-shot all-reduce's memory work on ``world`` plain
    processes (``world`` >= 2, float32): out of place (a send and a receive buffer per rank), or with
    ``in_place`` in one buffer -- the same work without a third buffer to write, which on a CPU costs the
    destination's lines read before they are written (write-allocate). The mapping and the processes are
    released on every exit path."""
    if world < 2:
        raise ValueError("two_shot_bound: world must be at least 2")
    n = max(1, nbytes // 4)
    ctx = mp.get_context("fork")
    shm = shared_memory.SharedMemory(create=True, size=2 * world * n * 4 + 8 * world)
    procs = []
    try:
        np.ndarray((2 * world, n), np.float32, buffer=shm.buf)[:] = 1.0
        np.ndarray((world,), np.int64, buffer=shm.buf, offset=2 * world * n * 4)[:] = 0
        times = ctx.Array("d", world)
        procs = [
            ctx.Process(target=_rank, args=(shm.name, world, r, n, iters, warmup, times, in_place))
            for r in range(world)
        ]
        for pr in procs:
            pr.start()
        for pr in procs:
            pr.join(timeout)
        if any(pr.exitcode != 0 for pr in procs):
            raise RuntimeError(f"two_shot_bound: a rank failed (exit codes {[pr.exitcode for pr in procs]})")
        t = max(times[:])
    finally:
        for pr in procs:
            if pr.is_alive():
                pr.kill()
                pr.join()
        shm.close()
        shm.unlink()
    algbw, busbw = bandwidths("allreduce", n * 4, t, world)
    return {"time_s": t, "algbw_gbps": algbw, "busbw_gbps": busbw}
