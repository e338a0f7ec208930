"""Hogwild!: lock-free SGD on one parameter vector in shared memory (Niu, Recht, Ré, Wright 2011).

Every worker reads the coordinates its example touches straight from the shared
vector, computes, and writes its update back with no lock -- a concurrent write to
the same coordinate can be lost. On a sparse problem (``--model sparse``: each
example touches k of d coordinates) collisions are rare and the workers' updates
add up almost as if serial; on a dense one every update touches every coordinate,
read-modify-write races lose work and the cache lines bounce between cores.
Nothing crosses the wire: the bytes are writes to shared memory.
"""

from __future__ import annotations

import time

import numpy as np

from netmorph.consistency.common import Pacer, Snapshots
from netmorph.consistency.problems import make


def hogwild(comm, cfg, progress):
    prob = make(cfg.model, cfg.batch, cfg.seed)
    p, rank = comm.world, comm.rank
    w = comm.shared(prob.dim, np.float64)  # (dim,) the one parameter vector, every rank maps it
    counts = comm.shared(p, np.int64)  # per-worker update counters: no lost counts
    last = comm.shared(prob.dim, np.int64)  # which update last wrote each coordinate
    if rank == 0:
        w[:] = prob.init(cfg.seed)
        counts[:] = 0
        last[:] = -1
        first = np.array(w)
    comm.barrier()
    pace = Pacer(cfg, rank)
    lr = cfg.lr / p
    sparse = hasattr(prob, "sparse_grad")
    stale = {}
    written = 0
    conflicts = 0
    t0 = time.perf_counter()
    snaps = Snapshots(cfg.steps * p, cfg.snapshots, t0) if rank == 0 else None
    if snaps:
        snaps.maybe(0, first)
    budget = cfg.steps * p  # a shared update budget: fast workers take more of it
    step = -1
    while (int(counts.sum()) < budget) if cfg.shared_budget else (step + 1 < cfg.steps):
        step += 1
        pace.start()
        seen = int(counts.sum())
        idx = prob.batch(rank, step)
        if sparse:
            _, cols, g = prob.sparse_grad(w, idx)  # reads w[cols] in place, no lock
        else:
            _, g = prob.grad(np.array(w), idx)  # a racy snapshot of the whole vector
        pace.finish()  # the forward/backward time between read and write
        now = int(counts.sum())
        k = max(0, (now - seen) // p)
        # a collision: someone wrote a coordinate this update read, between its read and its write
        touched = cols if sparse else slice(None)
        conflicts += bool((last[touched] >= seen).any())
        if sparse:
            np.subtract.at(w, cols, lr * g)  # write back, no lock
            written += len(cols) * 8
        else:
            w -= lr * g  # read-modify-write of every coordinate
            written += g.nbytes
        stale[k] = stale.get(k, 0) + 1
        last[touched] = now
        counts[rank] += 1
        progress.bump(rank)
        if snaps:
            snaps.maybe(int(counts.sum()), w)
    wall = time.perf_counter() - t0
    comm.barrier()
    if snaps:
        snaps.maybe(int(counts.sum()), w, force=True)
    return {
        "wall": wall,
        "updates": step + 1,
        "staleness": stale,
        "shared_bytes_written": written,
        "conflicts": conflicts,
        "snapshots": snaps.items if snaps else None,
        "w": np.array(w) if rank == 0 else None,
    }
