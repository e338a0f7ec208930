"""The schedules on real processes: bus bandwidth of the local fabric and of gloo on this machine, and each
schedule's measured time on an emulated two-level topology against the event simulation's prediction."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from netmorph.cost.topology import Topology
from netmorph.cost.tuner import predict

SIZES = [4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20]
LOCAL = ["ring", "rabenseifner", "two_shot"]
WORLDS = (2, 4)
# 2 "nodes" x 2 ranks, slow enough that the emulated links dominate Python's own costs
LAB = Topology(
    "lab-2x2",
    alpha=200e-6,
    beta=1 / 1e9,
    gamma=0.0,
    gpus_per_node=2,
    alpha_inter=1e-3,
    beta_inter=1 / 100e6,
    description="emulated: 2 nodes x 2 ranks; 200 us, 1 GB/s inside; 1 ms, 100 MB/s between",
)
EMU_ALGOS = ["ring", "recursive_doubling", "rabenseifner", "binomial", "double_binary_tree", "two_shot"]
EMU_SIZES = [1 << 10, 64 << 10, 512 << 10]
STEPS = 2 * len(WORLDS) + len(EMU_ALGOS)


@dataclass
class Fabric:
    busbw: dict  # {world: nccl-tests rows of the local fabric's LOCAL algorithms and of gloo}
    memcpy_gbps: float  # one core's copy bandwidth, out of cache: the bound drawn beside them
    emulated: list  # (algorithm, bytes, measured s, predicted s) on LAB
    cores: int  # this machine's
    sizes: list  # of the busbw sweep: SIZES (``quick``: without the largest)


def _emulated(comm, sizes, algo, reps):
    """The best of ``reps`` all-reduces of each size (one launch for every size: fewer process starts)."""
    out = []
    for n in sizes:
        x = np.ones(max(1, n // 4), np.float32)
        comm.barrier()
        comm.all_reduce(x, algo=algo)
        best = float("inf")
        for _ in range(reps):
            comm.barrier()
            t0 = time.perf_counter()
            comm.all_reduce(x, algo=algo)
            best = min(best, time.perf_counter() - t0)
        out.append(best)
    return out


def run(tick=lambda: None, quick: bool = False) -> Fabric:
    """nccl-tests' sweep on 2 and 4 ranks (local fabric, gloo), then every schedule on the emulated cluster;
    ``quick``: 3 timed iterations after 1 warm-up (8 after 2), sizes up to 2 MiB (16 MiB, more than half the
    sweep's time), the best of 2 emulated all-reduces (of 3)."""
    iters, warmup, reps = (3, 1, 2) if quick else (8, 2, 3)
    sizes = SIZES[:-1] if quick else SIZES
    from netmorph.runtime.bench import Case, measure, memcpy_bandwidth
    from netmorph.runtime.launch import launch

    bw = {}
    for p in WORLDS:
        rows = measure(
            [Case("allreduce", a, n) for n in sizes for a in LOCAL],
            p,
            "local",
            iters=iters,
            warmup=warmup,
            in_place_only=True,
        )
        tick()
        rows += measure(
            [Case("allreduce", "native", n) for n in sizes],
            p,
            "torch-native",
            iters=iters,
            warmup=warmup,
            in_place_only=True,
        )
        tick()
        bw[p] = rows
    copy = memcpy_bandwidth()
    pts = []
    for a in EMU_ALGOS:
        per_rank = launch(_emulated, 4, EMU_SIZES, a, reps, topology=LAB, timeout=30)
        for k, n in enumerate(EMU_SIZES):
            pts.append((a, n, max(r[k] for r in per_rank), predict("allreduce", a, 4, n, LAB).time))
        tick()
    return Fabric(bw, copy, pts, os.cpu_count() or 1, sizes)
