"""A ring all-reduce's time against the compute between two calls, by group size: what one (base, α, β) misses.

`netmorph calibrate` fits the same-node link from ring all-reduces with every rank computing about
``LOAD_S`` (1 ms alone) between two calls, as a training step interleaves its layers with their collectives.
Where ranks share cores, a step of the ring waits for a peer the scheduler gave its core to another rank's
compute, so the time per call moves with that compute -- and not alike for every group size. This prints
:func:`netmorph.calibrate.links.ring_rank` (every group of ``g`` consecutive ranks at once, the slowest rank's
mean) for each load and group size, side by side in one run:

    python benchmarks/ring_load.py [--world 8] [--bytes 65536] [--loads 0.25,1,3]

On the 2-core VM this was written on (world 8, 64 KiB): a ring of 2 took 1.9 / 2.5 / 3.2 ms at 0.25 / 1 / 3 ms of
load, a ring of 4 4.7 / 6.7 / 6.7 ms, a ring of 8 13.0 / 14.1 / 12.6 ms; the trainer's tp2 with every rank busy
paid 3.5-5.8 ms a call and its tp8 8.5 ms (issue 28's closing note, stop 42).
"""

from __future__ import annotations

import argparse

from netmorph.calibrate.links import ring_rank
from netmorph.runtime.launch import launch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=8, help="local ranks (default 8)")
    ap.add_argument("--bytes", type=int, default=1 << 16, help="all-reduce size (default 65536)")
    ap.add_argument("--loads", default="0.25,1,3", help="ms of GEMMs between two calls, on one rank alone")
    ap.add_argument("--iters", type=int, default=20, help="timed calls per point (default 20)")
    args = ap.parse_args()
    loads = [float(x) for x in args.loads.split(",")]
    groups = [g for g in range(2, args.world + 1) if args.world % g == 0]
    print(f"# ring all-reduce of {args.bytes:,} B on {args.world} local ranks, every group at once: ms per call")
    print(f"{'load (ms alone)':>16} " + " ".join(f"{'ring of ' + str(g):>11}" for g in groups))
    for load in loads:
        row = [
            launch(ring_rank, args.world, g, sizes=(args.bytes,), iters=args.iters, load_s=load / 1e3, timeout=120)[0][
                0
            ]
            for g in groups
        ]
        print(f"{load:>16g} " + " ".join(f"{1e3 * t:>11.2f}" for t in row), flush=True)


if __name__ == "__main__":
    main()
