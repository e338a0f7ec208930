"""How fast the planner searches: every split of a model over a cluster.

Goals: searching the 1T-parameter model on 3072 GPUs in under a second (the
planner issue, over tp/pp/dp/mb/v<=8/ZeRO/recompute/sp), and a 405B dense model on
16,384 GPUs in under 2 s over today's larger space (also cp, uneven stages,
interleaving to 16, precision). Prints each search's time cold (every cache
cleared: the first search on a hardware preset, which also event-simulates its
collectives once) and warm (best of ``--repeats``, only the per-collective fits
kept -- what any later search on that hardware costs), the configurations
searched per second warm, and how many fit.

    python benchmarks/planner.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

from netmorph.mesh.presets import PRESETS as MODELS
from netmorph.planner import comm, layers, timing
from netmorph.planner.hardware import PRESETS as HARDWARE
from netmorph.planner.search import search

CASES = (
    ("gpt3-175b", "a100-80g", 1024, 1536),
    ("ptdp-1t", "a100-80g", 3072, 3072),
    ("llama-3-405b", "h100-80g", 16384, 2048),
)
PER_SEARCH = (layers._layer_costs, timing._microbatch, timing._after)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(
        f"# planner search; warm = best of {args.repeats} with the collective fits cached (the per-search caches "
        f"cleared)"
    )
    print(
        f"{'model':<13} {'hardware':<9} {'gpus':>6} {'batch':>6} {'searched':>10} {'fit':>6} {'cold':>8} {'warm':>8} "
        f"{'configs/s':>11}"
    )
    for name, hw_name, gpus, batch in CASES:
        hw = HARDWARE[hw_name]
        for cache in (comm._fit, comm._fit_links, *PER_SEARCH):
            cache.cache_clear()
        t0 = time.perf_counter()
        res = search(MODELS[name], gpus, hw, batch)
        cold = time.perf_counter() - t0
        warm = float("inf")
        for _ in range(args.repeats):
            for cache in PER_SEARCH:
                cache.cache_clear()
            t0 = time.perf_counter()
            search(MODELS[name], gpus, hw, batch)
            warm = min(warm, time.perf_counter() - t0)
        print(
            f"{name:<13} {hw_name:<9} {gpus:>6} {batch:>6} {res.searched:>10,} {res.fits:>6,} {cold:>7.2f}s "
            f"{warm:>7.2f}s {res.searched / warm:>11,.0f}"
        )


if __name__ == "__main__":
    main()
