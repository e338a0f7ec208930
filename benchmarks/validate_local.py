"""The twin against the machine: every layout of 4 and of 8 local ranks, both GPT sizes, measured beside the
planner's prediction from a profile of the same ranks measured first (``netmorph validate local``).

    python benchmarks/validate_local.py [--worlds 4 8] [--steps 8] [--repeats 2] [--models small medium moe]

Prints each world's table and the issue's goal beside the result: mean |error| <= 10%, worst <= 20%, the
predicted best layout within 5% of the measured best -- and the machine's own noise beside it: every layout
trained ``--repeats`` times in rounds, how far its runs lie apart -- and each layout's steps split by what the
busiest stage's rank did (compute, tp, ep, dp, optimizer, rest), measured/predicted, and those parts summed
over the layouts: where the model is off. About 5 minutes per world on 2 cores.
"""

from __future__ import annotations

import argparse
import sys

from netmorph.calibrate.validate import summary, validate
from netmorph.cli.validate import parts_shown, phase_totals, split_cells


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--models", nargs="+", default=["small", "medium", "moe"], choices=["small", "medium", "moe"])
    args = ap.parse_args()
    every = []
    for world in args.worlds:
        rows = validate(world, tuple(args.models), steps=args.steps, repeats=args.repeats)["rows"]
        every += rows
        s = summary(rows)
        print(
            f"# world {world}: {s['layouts']} layouts, mean |error| {s['mean_abs_error']:.1%}, worst "
            f"{s['worst_abs_error']:.1%}; the same layout's runs apart by {s['mean_spread']:.1%} on average, "
            f"{s['worst_spread']:.1%} at worst; the machine's drift "
            f"{s['drift_range'][0]:.2f}x..{s['drift_range'][1]:.2f}x "
            f"(without it: mean {s['raw_mean_abs_error']:.1%}, worst {s['raw_worst_abs_error']:.1%})"
        )
        shown = parts_shown(rows)
        print(f"  {'':<38}{'':<38}{'':<39}" + " ".join(f"{k + ' m/p':>13}" for k in shown))
        for r in rows:
            print(
                f"  {r.model:<7} {r.name:<30} measured {1e3 * r.measured_s:8.1f} ms (runs apart {r.spread:5.1%})  "
                f"predicted {1e3 * r.predicted_s:8.1f} ms  {r.error:+7.1%} (drift {r.drift_factor:.2f}x)   "
                + split_cells(r, shown)
            )
        print("  " + phase_totals(s, shown))
        for name, m in s["by_model"].items():
            print(
                f"  {name}: rank correlation {m['spearman']:.2f}, predicted best {m['predicted_best']} "
                f"{'within' if m['predicted_best_within_5pct'] else 'NOT within'} 5% of the measured best "
                f"{m['measured_best']}",
                flush=True,
            )
    s = summary(every)
    print(
        f"# all {s['layouts']} layouts: mean |error| {s['mean_abs_error']:.1%} (goal 10%), worst "
        f"{s['worst_abs_error']:.1%} (goal 20%); runs of one layout apart by {s['mean_spread']:.1%} on average; "
        f"without the drift {s['raw_mean_abs_error']:.1%} / {s['raw_worst_abs_error']:.1%}"
    )
    print("# " + phase_totals(s, parts_shown(every)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
