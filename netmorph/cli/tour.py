"""``netmorph tour``: the main job -- a terminal summary and one HTML report with figures.

Each capability contributes a section: ``netmorph.tour.<name>.run`` makes its experiments and returns their
result, ``netmorph.report.<name>.build_section`` draws it (collectives, the fabric, training, mixture of
experts, elastic membership, serving, failures at scale, SGD consistency models, the planner, a whole step
simulated at cluster scale, and the control loop).
"""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path

from netmorph.errors import UsageError
from netmorph.files import output_problem, printable, probe_writable

# (section, what its progress bar says): netmorph.tour.<section> runs it, netmorph.report.<section> draws it
PLAN = (
    ("collectives", "collectives: simulating schedules"),
    ("fabric", "real ranks: measuring processes"),
    ("train", "train: DP, ZeRO, TP and PP on real ranks"),
    ("moe", "moe: routing tokens to 4 expert ranks"),
    ("elastic", "elastic: killing workers mid-run"),
    ("serving", "serve: paged KV cache, batching"),
    ("failures", "failures: goodput at 1k-100k GPUs"),
    ("consistency", "sgd: training under 5 consistency models"),
    ("planner", "planner: searching DP/TP/PP splits"),
    ("simulate", "simulate: one step on 1024 ranks"),
    ("morph", "morph: the split follows the link"),
)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "tour",
        help="write the report (figures + index.html) and print its summary",
        description="Run every section of the tour and write DIR/index.html with PNG figures.",
    )
    p.add_argument("--out", default="report", help="output folder (default: report/)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer steps and requests per run: the same sections and figures in about half the time",
    )
    p.set_defaults(run=run)


def run(args) -> int:
    from rich.console import Console

    from netmorph import report, tour
    from netmorph.cli.progress import Bar
    from netmorph.report.html import Section, write_page
    from netmorph.version import __version__

    if not args.out.strip():
        raise UsageError("--out is empty; name a folder for the report")
    out = Path(args.out)
    check_writable(out)

    console = Console(soft_wrap=True)
    console.print(f"[bold]netmorph tour[/bold] -> {out}/index.html")
    sections = []
    t0 = time.time()
    with Bar("tour", transient=False, width=36) as bar:
        for name, label in PLAN:
            experiment = importlib.import_module(f"{tour.__name__}.{name}")
            with bar.task(label, experiment.STEPS) as task:
                try:
                    result = experiment.run(lambda t=task: bar.update(t, advance=1), quick=args.quick)
                    drawing = importlib.import_module(f"{report.__name__}.{name}")
                    sections.append(drawing.build_section(result, out))
                except Exception as e:  # one broken section must not cost the reader the others
                    console.print(f"[yellow]section {name} could not run: {type(e).__name__}: {e}[/yellow]")
                    sections.append(
                        Section(
                            f"{name} (did not run)", f"<p>This section failed: <code>{type(e).__name__}: {e}</code></p>"
                        )
                    )
    write_page(out / "index.html", sections, __version__)

    for sec in sections:
        console.print(f"\n[bold]{sec.title}[/bold]")
        for line in sec.summary:
            console.print(f"  {line}", highlight=False)
        for name, _ in sec.figures:
            console.print(f"  figure: {out / name}", highlight=False)
    console.print(f"\nwrote {out / 'index.html'} in {time.time() - t0:.1f} s", highlight=False)
    return 0


def check_writable(out: Path) -> None:
    """Before any work: ``out`` is a folder (made if missing) a file can be created in, and none of the
    names the tour writes there (``index.html``, ``*.png``) stands for something that is not a regular
    file -- a device node, a FIFO, a folder (:func:`netmorph.files.output_problem`)."""
    try:
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out: {printable(out)} exists and is not a folder; name a folder for the report")
        out.mkdir(parents=True, exist_ok=True)
        probe_writable(out)
        names = [e.name for e in os.scandir(out) if e.name == "index.html" or e.name.endswith(".png")]
    except OSError as e:
        raise UsageError(f"--out: cannot write to {printable(out)}: {e.strerror or e}") from None
    for name in sorted(names):
        problem = output_problem(out / name)
        if problem:
            problem = problem.split("; name a file")[0]
            raise UsageError(f"--out: the tour writes {name} there, but {problem}; move it or name another folder")
