"""The twin against the machine: every layout of 4 and of 8 local ranks, both GPT sizes, measured beside the
planner's prediction from a profile of the same ranks measured first (``netmorph validate local``).

    python benchmarks/validate_local.py [--worlds 4 8] [--steps 6]

Prints each world's table and the issue's goal beside the result: mean |error| <= 10%, worst <= 20%, the
predicted best layout within 5% of the measured best. About 3 minutes per world on 2 cores.
"""

from __future__ import annotations

import argparse
import sys

from netmorph.calibrate.validate import summary, validate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    every = []
    for world in args.worlds:
        rows = validate(world, steps=args.steps)["rows"]
        every += rows
        s = summary(rows)
        print(f"# world {world}: {s['layouts']} layouts, mean |error| {s['mean_abs_error']:.1%}, worst "
              f"{s['worst_abs_error']:.1%}")
        for r in rows:
            print(f"  {r.model:<7} {r.name:<30} measured {1e3 * r.measured_s:8.1f} ms  predicted "
                  f"{1e3 * r.predicted_s:8.1f} ms  {r.error:+7.1%}")
        for name, m in s["by_model"].items():
            print(f"  {name}: rank correlation {m['spearman']:.2f}, predicted best {m['predicted_best']} "
                  f"{'within' if m['predicted_best_within_5pct'] else 'NOT within'} 5% of the measured best "
                  f"{m['measured_best']}", flush=True)
    s = summary(every)
    print(f"# all {s['layouts']} layouts: mean |error| {s['mean_abs_error']:.1%} (goal 10%), worst "
          f"{s['worst_abs_error']:.1%} (goal 20%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
