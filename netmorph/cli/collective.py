"""``netmorph collective OP``: one collective realised by every algorithm, side by side.

Counts (rounds, messages, bytes on the wire) come from the schedule; time from
the event simulation on the chosen topology; the closed form each should equal
is printed with ``--formula``. nccl-tests' column conventions throughout.
"""

from __future__ import annotations

import sys

from netmorph.cli import print_json
from netmorph.cli.flags import int_in
from netmorph.collectives import ROOTED, canonical_op, check_request
from netmorph.cost.record import record
from netmorph.cost.topology import PRESETS, load_topology
from netmorph.cost.tuner import choose, predict
from netmorph.errors import UsageError
from netmorph.report.table import PREDICTED, format_formula, size_bands
from netmorph.report.table import header as table_header
from netmorph.report.table import row as table_row
from netmorph.units import DTYPES, parse_dtype, parse_size, parse_size_range

# library parameters set by a flag of another name (the rest are --name)
FLAGS = {"count": "--bytes", "nbytes": "--bytes"}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "collective",
        help="count and time a collective, every algorithm side by side",
        description="Realise one collective with each algorithm and print nccl-tests' table: predicted time, "
        "algbw, busbw, plus rounds, messages, bytes on the wire and bytes sent per rank.",
    )
    p.add_argument("op", help="allreduce, allgather, reduce_scatter, broadcast, reduce or alltoall")
    p.add_argument("--algo", default="all", help="algorithm name, auto (the tuner's pick) or all (default)")
    p.add_argument(
        "--world",
        "-p",
        type=int_in(1, 16384),
        required=True,
        help="number of ranks (1..16384; benchmarks/scale.py times larger rings)",
    )
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--bytes", "-b", help="message size, e.g. 8MiB, 1GB, 4096 (nccl-tests' convention per op)")
    size.add_argument("--sizes", help="sweep MIN:MAX in powers of two, e.g. 1KiB:1GiB")
    p.add_argument(
        "--topology", "-t", default="flat", help=f"preset ({', '.join(PRESETS)}) or a JSON file (default: flat)"
    )
    p.add_argument("--alpha", type=float, help="flat topology: latency per message, seconds (default 1e-6)")
    p.add_argument("--beta", type=float, help="flat topology: seconds per byte (default 1e-9, i.e. 1 GB/s)")
    p.add_argument("--gamma", type=float, help="flat topology: reduction seconds per byte (default 0)")
    p.add_argument("--dtype", default="float", help=f"element type ({', '.join(DTYPES)}; default float)")
    p.add_argument("--root", type=int, default=0, help="root rank for broadcast and reduce (default 0)")
    p.add_argument(
        "--segments", type=int_in(1, 1024), help="double_binary_tree: pipeline each half in N segments (default 1)"
    )
    p.add_argument("--formula", action="store_true", help="print the closed form under each row, evaluated")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per (algorithm, size)")
    p.set_defaults(run=run, flags=FLAGS)


def _topology(args):
    topo = load_topology(args.topology)
    over = {k: getattr(args, k) for k in ("alpha", "beta", "gamma") if getattr(args, k) is not None}
    for k, v in over.items():
        if not 0 <= v < 1e6:
            raise UsageError(f"--{k} must be a number >= 0 (seconds), got {v}")
    if over:
        if not topo.flat:
            raise UsageError(
                "--alpha/--beta/--gamma set the flat topology; for a two-level one write a JSON file (see --topology)"
            )
        topo = topo.with_flat(**over)
    topo.check_world(args.world)
    return topo


def run(args) -> int:
    op = canonical_op(args.op)
    dtype, itemsize = parse_dtype(args.dtype)
    sizes = [parse_size(args.bytes)] if args.bytes is not None else parse_size_range(args.sizes)
    mode = args.algo.lower()
    algos = check_request(op, mode, args.world, sizes, itemsize, args.root, args.segments, dtype)
    kw = {"root": args.root} if op in ROOTED else {}
    topo = _topology(args)
    redop = "sum" if op in ("allreduce", "reduce", "reduce_scatter") else "none"

    def build_kw(algo):
        k = dict(kw)
        if algo == "double_binary_tree" and args.segments:
            k["segments"] = args.segments
        return k

    _within_budget(op, algos, args.world, len(sizes), itemsize, topo, build_kw)
    records, reasons = [], []
    with _progress(len(sizes) * len(algos), args.world) as tick:
        for n in sizes:
            if mode == "auto":
                ch = choose(
                    op, args.world, n, topo, itemsize, algos=algos, **({"root": args.root} if op in ROOTED else {})
                )
                records.append([record(ch.best, topo, args.dtype, redop, auto=True, reason=ch.reason)])
                reasons.append((n, ch.reason))
                tick(len(algos))
                continue
            row = []
            for a in algos:
                row.append(
                    record(predict(op, a, args.world, n, topo, itemsize, **build_kw(a)), topo, args.dtype, redop)
                )
                tick(1)
            records.append(row)

    flat_records = [r for row in records for r in row]
    if args.json:
        print_json(flat_records, indent=1)
        return 0
    print(f"# netmorph collective {op}: world {args.world}, {dtype}, topology {topo.describe()}")
    print(
        f"# predicted by event simulation of each schedule; busbw = algbw x "
        f"{_factor_text(op)} (nccl-tests); * = fastest at that size"
    )
    print(table_header(PREDICTED))
    for same_size in records:
        best = min(same_size, key=lambda r: r["predicted_time_s"])
        for r in same_size:
            print(table_row(PREDICTED, {**r, "mark": "*" if (len(same_size) > 1 and r is best) else " "}))
            if args.formula:
                print(format_formula(r))
    for n, reason in reasons:
        print(f"# auto @ {n} B: {reason}")
    if mode == "all" and len(sizes) > 1:
        print("# fastest by size: " + _crossovers(records))
    return 0


def _factor_text(op):
    return {"allreduce": "2(p-1)/p", "broadcast": "1", "reduce": "1"}.get(op, "(p-1)/p")


def _crossovers(records) -> str:
    """The fastest algorithm at each size, as ranges of sizes."""
    best = [min(row, key=lambda r: r["predicted_time_s"]) for row in records]
    return size_bands([r["algo"] for r in best], [r["bytes"] for r in best], sep="..")


def _within_budget(op, algos, world, sizes, itemsize, topo, build_kw) -> None:
    """Refuse, before anything is built, a request whose schedules would not fit this machine's memory or
    would take longer than a run may (:mod:`netmorph.cost.footprint`: pilots at 128 and 256 ranks,
    extrapolated): the p² algorithms at 16384 ranks need tens of GB."""
    from netmorph.cost.footprint import footprint
    from netmorph.runtime import budget

    memory = seconds = 0.0
    for a in algos:
        m, t = footprint(op, a, world, itemsize, topo, **build_kw(a))
        memory, seconds = max(memory, m), seconds + t * sizes
    budget.check(
        memory,
        seconds,
        f"counting and timing {op} on {world} ranks ({len(algos)} algorithm"
        f"{'s' if len(algos) != 1 else ''} x {sizes} size{'s' if sizes != 1 else ''})",
        "--world or choose one --algo",
        "--world, --sizes or --algo",
    )


class _progress:
    """Progress on stderr (:class:`netmorph.cli.progress.Bar`): a bar at a terminal for sweeps long enough to
    want one, and off a terminal a line at least every 10 s once a sweep runs that long."""

    def __init__(self, total, world):
        from netmorph.cli import progress

        self.total = total
        self.bar = progress.Bar(
            "collective", unit="schedules", every=progress.EVERY, tty=total * world > 20000 and sys.stderr.isatty()
        )

    def __enter__(self):
        self.bar.__enter__()
        task = self.bar.add("simulating", self.total)
        return lambda k: self.bar.update(task, advance=k)

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)
