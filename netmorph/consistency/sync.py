"""Synchronous data parallelism and its periodic relaxation.

- ``bsp``: every step, all-reduce the gradients and apply their mean -- PyTorch DDP
  (``torch.nn.parallel.DistributedDataParallel``), Horovod. Linearizable: every
  worker sees the exact average, at the pace of the slowest.
- ``local``: local SGD -- each worker takes H steps on its own copy, then the copies
  are averaged (all-reduce); with an outer learning rate and Nesterov momentum on the
  averaged change this is DiLoCo (Douillard et al. 2023). H = 1 is BSP.
"""

from __future__ import annotations

import time

import numpy as np

from netmorph.consistency.common import Pacer, Snapshots
from netmorph.consistency.problems import make


def _start(comm, cfg):
    """The problem, initial parameters, pacer; then a barrier, the clock, and rank 0's snapshots."""
    prob = make(cfg.model, cfg.batch, cfg.seed)
    w = prob.init(cfg.seed)
    pace = Pacer(cfg, comm.rank)
    comm.barrier()
    t0 = time.perf_counter()
    snaps = Snapshots(cfg.steps * comm.world, cfg.snapshots, t0) if comm.rank == 0 else None
    if snaps:
        snaps.maybe(0, w)
    return prob, w, pace, t0, snaps


def bsp(comm, cfg, progress):
    p, rank = comm.world, comm.rank
    prob, w, pace, t0, snaps = _start(comm, cfg)
    for step in range(cfg.steps):
        pace.start()
        _, g = prob.grad(w, prob.batch(rank, step))
        pace.finish()
        with comm.phase("dp.grad"):
            comm.all_reduce(g)  # (dim,) sum over workers
        w -= cfg.lr * g / p
        progress.bump(rank)
        if snaps:
            snaps.maybe((step + 1) * p, w)
    wall = time.perf_counter() - t0
    if snaps:
        snaps.maybe(cfg.steps * p, w, force=True)
    return {
        "wall": wall,
        "updates": cfg.steps,
        "staleness": {0: cfg.steps},
        "snapshots": snaps.items if snaps else None,
        "w": w if rank == 0 else None,
    }


def local_sgd(comm, cfg, progress):
    p, rank, H = comm.world, comm.rank, cfg.local_steps
    prob, w_global, pace, t0, snaps = _start(comm, cfg)
    w = w_global.copy()
    momentum = np.zeros_like(w)
    stale = {}
    for step in range(cfg.steps):
        pace.start()
        _, g = prob.grad(w, prob.batch(rank, step))
        pace.finish()
        w -= cfg.lr * g
        since = step % H  # local steps since the copies last agreed
        stale[since] = stale.get(since, 0) + 1
        progress.bump(rank)
        if (step + 1) % H == 0 or step + 1 == cfg.steps:
            with comm.phase("dp.params"):
                comm.all_reduce(w)  # (dim,) sum of the copies
            avg = w / p
            delta = w_global - avg  # DiLoCo's outer gradient
            if cfg.outer_momentum:
                momentum = cfg.outer_momentum * momentum + delta
                step_dir = delta + cfg.outer_momentum * momentum  # Nesterov
            else:
                step_dir = delta
            w_global = w_global - cfg.outer_lr * step_dir
            w = w_global.copy()
            if snaps:
                snaps.maybe((step + 1) * p, w_global)
    wall = time.perf_counter() - t0
    if snaps:
        snaps.maybe(cfg.steps * p, w_global, force=True)
    return {
        "wall": wall,
        "updates": cfg.steps,
        "staleness": stale,
        "snapshots": snaps.items if snaps else None,
        "w": w_global if rank == 0 else None,
    }
