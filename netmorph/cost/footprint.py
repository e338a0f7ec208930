"""What counting and timing one schedule will cost this process, estimated before it is built: memory and seconds.

A schedule is arrays of transfers, and some algorithms have p² of them (one-shot and two-shot all-reduce,
the direct all-to-alls, the scatter-ring broadcast): at 16384 ranks two-shot's schedule and its simulation
need about 60 GB, and a sweep of sizes rebuilds it at every size. So before ``netmorph collective`` builds
anything it measures a *pilot* of each algorithm at two small worlds (128 and 256 ranks: build, count and
simulate, traced with ``tracemalloc``), fits each quantity's growth ``q(p) = q(256)·(p/256)^k`` to the two
pilots (the exponent from the pair: 2 for a p² schedule, about 1 for the memory of a ring whose rounds share
one pattern; the time's at least the memory's, since a small pilot's time is mostly fixed costs),
and extrapolates to the world asked for -- a fit on this process's own measurements, never a constant
typed in. Worlds up to the pilot's are cheap by construction and are not estimated.
"""

from __future__ import annotations

import math
import time
import tracemalloc
from functools import lru_cache

import numpy as np

PILOTS = (128, 256)


def _pilot(op: str, algo: str, world: int, itemsize: int, build_kw: tuple, topo) -> tuple[float, float]:
    """(peak traced bytes, seconds) of building, counting and timing one schedule (its latency and bandwidth
    parts too, as the tuner's reason does)."""
    from netmorph.cost.tuner import predict

    kw = dict(build_kw)
    if op == "alltoall":
        kw["splits"] = np.full((world, world), 1, dtype=np.int64)
    nbytes = world * 64 * itemsize
    t0 = time.perf_counter()
    predict(op, algo, world, nbytes, topo, itemsize, parts=True, **kw)
    seconds = time.perf_counter() - t0
    tracemalloc.start()  # a second run, traced (tracing slows it)
    try:
        predict(op, algo, world, nbytes, topo, itemsize, parts=True, **kw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return float(peak), seconds


@lru_cache(maxsize=64)
def _pilots(op: str, algo: str, itemsize: int, build_kw: tuple, topo):
    return [_pilot(op, algo, p, itemsize, build_kw, topo) for p in PILOTS]


def _exponent(small: float, large: float) -> float:
    """The growth exponent the two pilots show (at least 1: nothing here shrinks per rank)."""
    lo, hi = PILOTS
    return max(1.0, math.log(max(large, 1e-9) / max(small, 1e-9)) / math.log(hi / lo))


def footprint(op: str, algo: str, world: int, itemsize: int, topo, **build_kw) -> tuple[float, float]:
    """(bytes, seconds) one size of ``op`` by ``algo`` on ``world`` ranks will take to build, count and
    simulate in this process (0, 0 for worlds up to the pilots')."""
    if world <= PILOTS[-1]:
        return 0.0, 0.0
    (m1, t1), (m2, t2) = _pilots(op, algo, itemsize, tuple(sorted(build_kw.items())), topo)
    # time grows at least as fast as the arrays it walks (a small pilot's time is mostly fixed costs)
    k = max(_exponent(m1, m2), _exponent(t1, t2))
    return m2 * (world / PILOTS[1]) ** _exponent(m1, m2), t2 * (world / PILOTS[1]) ** k
