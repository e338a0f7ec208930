"""``netmorph simulate step``: one training step played on every rank of a cluster, beside the planner."""

from __future__ import annotations

from netmorph.cli import print_json
from netmorph.cli.flags import trace_file
from netmorph.errors import UsageError

FLAGS = {
    "schedule": "--schedule",
    "layers": "--layers",
    "zero": "--zero",
    "micro_batch_size": "--microbatch",
    "microbatches": "--global-batch",
}


def add_parser(sub) -> None:
    from netmorph.cli.split import add_split_args

    p = sub.add_parser(
        "simulate",
        help="simulate one whole training step on every rank (thousands of them)",
        description="Build every rank's program for one PTD-P iteration (the pipeline schedule's "
        "slots, the TP all-reduces inside each layer, the PP sends, the DP buckets), "
        "play it on the hardware's two-level topology, and set the step time and its "
        "breakdown beside the planner's analytic estimate.",
    )
    p.add_argument("action", choices=("step",), help="step: one training iteration")
    add_split_args(p, bare=False)
    p.add_argument(
        "--trace", type=trace_file, metavar="JSON", help="write a Perfetto / chrome://tracing trace of the traced ranks"
    )
    p.add_argument(
        "--trace-ranks",
        metavar="LIST",
        help="global ranks to trace: 'stages' (default: rank 0 of every pipeline stage), 'all', or a comma list",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run, flags=FLAGS)


def _trace_ranks(text, c) -> list:
    stage = c.tp * c.cp * c.dp
    if text in (None, "stages"):
        return [r * stage for r in range(c.pp)]
    if text == "all":
        if c.gpus > 4096:
            raise UsageError(f"--trace-ranks all: {c.gpus} ranks make a trace too large to open; list some")
        return list(range(c.gpus))
    try:
        ranks = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise UsageError(f"--trace-ranks: expected 'stages', 'all' or a comma list of ranks, got {text!r}") from None
    bad = [r for r in ranks if not 0 <= r < c.gpus]
    if bad:
        raise UsageError(f"--trace-ranks: no rank {bad[0]} among {c.gpus}")
    return ranks


def write_trace(path, spans, c) -> None:
    """Chrome trace events: one process per pipeline stage, one thread per traced rank (µs)."""
    from netmorph.files import write_json

    stage = c.tp * c.cp * c.dp
    events = [
        {"name": name, "cat": cat, "ph": "X", "ts": 1e6 * t0, "dur": 1e6 * (t1 - t0), "pid": g // stage, "tid": g}
        for g, name, cat, t0, t1 in spans
        if cat != "slot"
    ]
    events += [
        {"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"pipeline stage {r}"}}
        for r in sorted({g // stage for g, *_ in spans})
    ]
    events += [
        {
            "name": "thread_name",
            "ph": "M",
            "pid": g // stage,
            "tid": g,
            "args": {"name": f"rank {g} (dp {(g // (c.tp * c.cp)) % c.dp}, cp {(g // c.tp) % c.cp}, tp {g % c.tp})"},
        }
        for g in sorted({g for g, *_ in spans})
    ]
    write_json(path, {"traceEvents": events, "displayTimeUnit": "ms"})


def run(args) -> int:
    from netmorph.cli.split import config_from, model_and_hardware, print_notes
    from netmorph.simulate import check_simulated, simulate_config

    model, hw = model_and_hardware(args)
    c = config_from(args)
    check_simulated(model, c, args.schedule)
    if args.trace_ranks is not None and not args.trace:
        raise UsageError("--trace-ranks picks the ranks --trace writes: add --trace FILE.json")
    ranks = _trace_ranks(args.trace_ranks, c) if args.trace else ()
    out = simulate_config(model, c, hw, args.schedule, ranks)
    print_notes(args)
    spans = out.pop("spans")
    if args.trace:
        write_trace(args.trace, spans, c)
    if args.json:
        print_json(out)
        return 0
    b, pb = out["breakdown_s"], out["planner_breakdown_s"]
    print(
        f"# netmorph simulate step: {model.name} on {c.gpus:,} x {hw.name}, {c.label()}, global batch "
        f"{c.batch.global_batch} ({c.microbatches} microbatches per pipeline), schedule {out['schedule']}"
        + ("" if out["fits"] else "; warning: does not fit in memory (the planner says)")
    )
    print(f"simulated {out['ranks']:,} ranks, {out['events']:,} events in {out['sim_wall_s']:.2f} s")
    diff = out["step_time_s"] / out["planner_step_time_s"] - 1
    print(f"{'':<22} {'simulated':>10} {'planner':>10}")
    print(
        f"{'step time (s)':<22} {out['step_time_s']:>10.3f} {out['planner_step_time_s']:>10.3f}   ({100 * diff:+.1f}%)"
    )
    for k, label in (
        ("compute", "compute"),
        ("tp", "TP all-reduces"),
        ("cp", "CP exchanges"),
        ("pp", "PP transfers"),
        ("dp", "DP exposed"),
        ("bubble", "bubble"),
        ("optimizer", "optimizer"),
        ("slowdown", "slowed beside comm"),
    ):
        if k not in ("slowdown", "cp") or b[k] or pb[k]:
            print(f"  {label:<20} {b[k]:>10.3f} {pb[k]:>10.3f}")
    print(
        f"bytes sent by link class: NVLink {out['bytes_by_link_class']['nvlink'] / 1e12:,.2f} TB, NIC "
        f"{out['bytes_by_link_class']['nic'] / 1e12:,.2f} TB (all ranks)"
    )
    print(
        "# simulated breakdown: the rank that finishes last (its waits for input beyond the transfer are the "
        "bubble); the planner's: the most loaded stage (its layers plus the LM head), (m + p - 1) slots"
    )
    if hw.core_sharing > 1:
        print(
            f"# {hw.name}'s ranks share cores (a rank computes {hw.core_sharing:.2f}x slower with every rank busy): "
            f"the bubble of the schedule played on a device per rank is lent to the ranks not in it, as the planner "
            f"lends it" + ("; the trace shows the schedule on a device per rank" if args.trace else "")
        )
    if args.trace:
        print(f"# trace: {args.trace} ({len({g for g, *_ in spans})} ranks; open in ui.perfetto.dev)")
    return 0
