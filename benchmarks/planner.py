"""How fast the planner searches: every split of a model over a cluster.

Goal (the planner issue): searching the 1T-parameter model on 3072 GPUs in under
a second. Prints each search's time cold (the per-collective fits the planner
caches cleared first) and warm (best of ``--repeats`` after it), the
configurations searched per second cold, and how many fit.

    python benchmarks/planner.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

from netmorph.planner.hardware import PRESETS as HARDWARE
from netmorph.planner.model import PRESETS as MODELS
from netmorph.planner import timing
from netmorph.planner.search import search

CASES = (("gpt3-175b", 1024, 1536), ("ptdp-1t", 3072, 3072))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    hw = HARDWARE["a100-80g"]
    print(f"# planner search on {hw.name}; warm = best of {args.repeats} with the collective fits cached")
    print(f"{'model':<12} {'gpus':>6} {'batch':>6} {'searched':>10} {'fit':>6} {'cold':>8} {'warm':>8} {'configs/s':>11}")
    for name, gpus, batch in CASES:
        timing._fit.cache_clear()
        t0 = time.perf_counter()
        res = search(MODELS[name], gpus, hw, batch, top=0)
        cold = time.perf_counter() - t0
        warm = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            search(MODELS[name], gpus, hw, batch, top=0)
            warm = min(warm, time.perf_counter() - t0)
        print(f"{name:<12} {gpus:>6} {batch:>6} {res.searched:>10,} {res.fits:>6,} {cold:>7.2f}s {warm:>7.2f}s "
              f"{res.searched / cold:>11,.0f}")


if __name__ == "__main__":
    main()
