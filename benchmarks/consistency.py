"""What a straggler costs each consistency model: updates per second, side by side in one run.

BSP runs at the straggler's pace; the parameter server (async) and Hogwild! keep
going. The unit tests check the semantics (lockstep, who makes more updates);
the speed ratios live here, where a busy machine cannot fail a build.

    python benchmarks/consistency.py [--workers 3] [--steps 60] [--straggler 5]
"""

from __future__ import annotations

import argparse

from netmorph.consistency import Config, run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--straggler", type=float, default=5.0, help="worker 1 computes this many times slower")
    ap.add_argument("--compute-ms", type=float, default=2.0)
    args = ap.parse_args()
    kw = dict(
        workers=args.workers,
        steps=args.steps,
        straggler=(1, args.straggler),
        compute_ms=args.compute_ms,
        model="convex",
        lr=40.0,
        snapshots=5,
    )
    print(
        f"# {args.workers} workers, {args.steps} steps each, worker 1 x{args.straggler:g} slower, "
        f"{args.compute_ms:g} ms emulated compute per step"
    )
    print(f"{'mode':<8} {'updates':>8} {'wall(s)':>8} {'upd/s':>8} {'x bsp':>6}")
    base = None
    for mode in ("bsp", "async", "hogwild", "local", "ssp"):
        s = run(Config(mode=mode, **kw)).summary
        base = base or s["updates_per_s"]
        print(
            f"{mode:<8} {s['updates']:>8} {s['wall_s']:>8.2f} {s['updates_per_s']:>8.0f} "
            f"{s['updates_per_s'] / base:>5.1f}x"
        )
    print(
        f"# BSP's ideal with this straggler: 1/{args.straggler:g} of the straggler-free rate; async's: "
        f"({args.workers - 1} + 1/{args.straggler:g}) / {args.workers} of it"
    )


if __name__ == "__main__":
    main()
