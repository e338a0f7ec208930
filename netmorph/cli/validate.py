"""``netmorph validate local``: every layout of a world trained here, beside the step time the planner predicts
for it from a profile of the same ranks measured first (``netmorph calibrate``)."""

from __future__ import annotations

from netmorph.cli import print_json
from netmorph.cli.flags import add_timeout, int_in
from netmorph.errors import UsageError, require

FLAGS = {}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "validate",
        help="hold the planner's predictions against netmorph's own training runs",
        description="local: calibrate this machine's ranks, train every layout of the world "
        "(tp x cp x pp x dp, ZeRO 0-3, GPipe / 1F1B / interleaved, SP, cp's p2p, "
        "all_gather and a2a) for real and print measured beside predicted step time, the mean and worst error, the rank "
        "correlation, and whether the predicted best layout is the measured best.",
    )
    p.add_argument("action", choices=("local",), help="local: netmorph's own ranks on this machine")
    p.add_argument("--world", type=int, default=4, choices=(2, 4, 8), help="ranks (default 4)")
    p.add_argument(
        "--model",
        action="append",
        choices=("small", "medium", "moe"),
        help="GPT: small (4 layers, h 64), medium (8 layers, h 128), moe (the small one with 4 experts, "
        "top-2, every ep); default small and medium",
    )
    p.add_argument(
        "--steps", type=int_in(3, 1000), default=8, help="steps per layout; the median after the first two (default 8)"
    )
    p.add_argument(
        "--repeats",
        type=int_in(1, 20),
        default=1,
        help="train every layout this many times, in rounds; the median counts, the spread is the "
        "machine's noise (default 1)",
    )
    p.add_argument("--only", type=int, help="the first N layouts alone (a quick look)")
    p.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    add_timeout(p, 120.0)
    p.set_defaults(run=run, flags=FLAGS)


def run(args) -> int:
    require("torch", "validate")
    from netmorph.calibrate.validate import MODELS, layouts, summary, validate
    from netmorph.cli.progress import Bar

    if args.only is not None and args.only < 1:
        raise UsageError(f"--only must be >= 1, got {args.only}")
    models = tuple(dict.fromkeys(args.model or ("small", "medium")))
    total = sum(len(layouts(MODELS[m], args.world)) for m in models)
    total = min(total, args.only or total)
    runs = total * args.repeats
    with (
        Bar("validate", unit="runs") as bar,
        bar.task(
            f"calibrating, then training {total} layouts of "
            f"{args.world} ranks" + (f" {args.repeats} times" if args.repeats > 1 else ""),
            runs,
        ) as task,
    ):
        out = validate(
            args.world,
            models,
            args.steps,
            timeout=args.timeout,
            only=args.only,
            repeats=args.repeats,
            on_run=lambda done, total: bar.update(task, completed=done),
        )
    rows, s = out["rows"], summary(out["rows"])
    if args.json:
        print_json(document(out), indent=1)
        return 0
    hw = out["profile"]["hardware"]
    print(f"# netmorph validate local: {args.world} ranks, profile measured first ({hw['description']})")
    shown = parts_shown(rows)
    print(
        f"{'model':<7} {'layout':<28} {'measured(ms)':>12} {'predicted(ms)':>13} {'error':>8} {'drift':>6}   "
        + " ".join(f"{k + ' m/p':>13}" for k in shown)
    )
    for r in rows:
        print(
            f"{r.model:<7} {r.name:<28} {1e3 * r.measured_s:>12.1f} {1e3 * r.predicted_s:>13.1f} "
            f"{r.error:>+8.1%} {r.drift_factor:>5.2f}x   " + split_cells(r, shown)
        )
    print(
        "# each step split by what the busiest stage's rank did, measured/predicted (ms): compute (its slots less "
        "the collectives in them), tp, cp (ring hops, gathers, all-to-alls), ep (all-to-alls), dp (reduction and "
        "ZeRO gathers not hidden by the backward), optimizer, rest (bubble, pipeline waits and sends, the host's own "
        "work)"
    )
    print("# " + phase_totals(s, shown))
    lo, hi = s["drift_range"]
    print(
        f"# drift: the machine's speed around each run (a reference GPT on every rank between its steps) over "
        f"its speed at calibration, {lo:.2f}x..{hi:.2f}x here; each prediction is the profile's times it"
    )
    print(
        f"# {s['layouts']} layouts: mean |error| {s['mean_abs_error']:.1%}, worst {s['worst_abs_error']:.1%} "
        f"(goal: 10% mean, 20% worst); without the drift {s['raw_mean_abs_error']:.1%} and "
        f"{s['raw_worst_abs_error']:.1%}"
    )
    if args.repeats > 1:
        print(
            f"# the machine's noise: the same layout's {args.repeats} runs apart by {s['mean_spread']:.1%} on "
            f"average, {s['worst_spread']:.1%} at worst"
        )
    for name, m in s["by_model"].items():
        print(
            f"# {name}: rank correlation {m['spearman']:.2f}; predicted best {m['predicted_best']}, measured best "
            f"{m['measured_best']}: {'within' if m['predicted_best_within_5pct'] else 'NOT within'} 5%"
        )
    return 0


def parts_shown(rows) -> list:
    """The parts of the step (:data:`~netmorph.parallel.phases.PHASES`) any row measured or predicted."""
    from netmorph.parallel.phases import PHASES

    return [k for k in PHASES if any(r.measured_split.get(k) or r.predicted_split.get(k) for r in rows)]


def split_cells(r, shown) -> str:
    """A row's parts, measured/predicted in ms, one right-aligned cell each."""
    return " ".join(f"{f'{1e3 * r.measured_split[k]:.1f}/{1e3 * r.predicted_split[k]:.1f}':>13}" for k in shown)


def phase_totals(s: dict, shown) -> str:
    """The summary's parts summed over the layouts, measured/predicted, and how far the model is off in each."""
    return "summed over the layouts, measured/predicted: " + ", ".join(
        f"{k} {m:.2f}/{p:.2f} s ({p / m - 1:+.0%})" if m > 0 else f"{k} {m:.2f}/{p:.2f} s"
        for k, (m, p) in s["phases"].items()
        if k in shown
    )


def document(out: dict) -> dict:
    """The ``--json`` object of a validation: every row, the summary, the profile it predicted from."""
    from netmorph.calibrate.validate import summary

    return {"rows": [r.to_json() for r in out["rows"]], "summary": summary(out["rows"]), "profile": out["profile"]}
