"""``netmorph sgd``: data-parallel SGD under one consistency model, or all of them side by side."""

from __future__ import annotations

import argparse
from dataclasses import replace

from netmorph.cli import print_json
from netmorph.cli.flags import add_timeout, plot_file
from netmorph.errors import UsageError, require
from netmorph.runtime.env import torchrun_world

COLS = (
    f"{'mode':<8} {'updates':>7} {'upd/s':>8} {'wall(s)':>8} {'to target':>9} {'final loss':>11} "
    f"{'metric':>18} {'stale max':>9}  {'staleness k:count':<24} {'bytes on wire':>14}"
)


# convex: about half the stability limit 2/L of its Hessian (L ~ 1/64); sparse: batch-1 steps on
# unit-norm examples; mlp: a plain SGD rate for a 64-64-10 net
DEFAULT_LR = {"convex": 40.0, "sparse": 0.5, "mlp": 0.5}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sgd",
        help="train with BSP / async / SSP / Hogwild / local SGD on real processes",
        description="Data-parallel SGD on worker processes under a consistency model; "
        "--compare runs every model on the same problem and update budget. Under torchrun "
        "(torchrun --nproc-per-node W [+ S] -m netmorph sgd --mode M) the job's ranks are "
        "the workers (and servers), over torch.distributed point-to-point; rank 0 prints.",
    )
    p.add_argument("--mode", default="bsp", help="bsp, async, ssp, hogwild or local (default bsp)")
    p.add_argument("--compare", action="store_true", help="run every mode and compare (table + figure)")
    p.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    p.add_argument("--servers", type=int, default=1, help="parameter-server shards for async/ssp (default 1)")
    p.add_argument("--staleness", type=int, default=2, help="SSP bound s (default 2)")
    p.add_argument("--local-steps", type=int, default=8, help="local SGD: average every H steps (default 8)")
    p.add_argument("--outer-lr", type=float, default=1.0, help="local SGD outer learning rate (DiLoCo: 0.7)")
    p.add_argument("--outer-momentum", type=float, default=0.0, help="local SGD outer Nesterov momentum (DiLoCo: 0.9)")
    p.add_argument("--n-push", type=int, default=1, help="async: push every n steps (Downpour)")
    p.add_argument("--n-fetch", type=int, default=1, help="async: fetch every n steps (Downpour)")
    p.add_argument("--straggler", type=straggler, help="RANK:FACTOR, e.g. 1:4 -- that worker computes FACTOR x slower")
    p.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        help="random extra delay per step, mean as a fraction of --compute-ms (exponential)",
    )
    p.add_argument(
        "--slow-link", type=slow_link, help="SRC:DST:ALPHA_US:MB_PER_S -- emulate a slow link between two ranks"
    )
    p.add_argument("--steps", type=int, default=200, help="updates per worker; the run's budget is steps x workers")
    p.add_argument("--compute-ms", type=float, default=2.0, help="emulated forward+backward time per step (default 2)")
    p.add_argument("--model", default="convex", help="convex (least squares), sparse, or mlp (digits)")
    p.add_argument(
        "--lr", type=float, help="learning rate of the synchronous step (default: convex 40, sparse 0.5, mlp 0.5)"
    )
    p.add_argument("--batch", type=int, help="examples per worker step")
    p.add_argument("--seed", type=int, default=0, help="data and initialisation seed (default 0)")
    p.add_argument(
        "--plot",
        type=plot_file,
        metavar="FILE",
        help="with --compare: also draw loss against wall-clock time and updates into FILE (.png, .svg, .pdf)",
    )
    add_timeout(p, 60)
    p.add_argument("--json", action="store_true", help="print one JSON object per mode")
    p.set_defaults(run=run)


def _fields(text, names, kinds):
    """``text`` split at ':' into len(kinds) fields of those types (argparse's error otherwise)."""
    parts = text.split(":")
    if len(parts) != len(kinds):
        raise argparse.ArgumentTypeError(f"expected {':'.join(names)}, got {text!r}")
    try:
        return tuple(k(x) for k, x in zip(kinds, parts))
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot parse {text!r} as {':'.join(names)}") from None


def straggler(text: str) -> tuple:
    """``--straggler RANK:FACTOR`` (an argparse type)."""
    return _fields(text, ("RANK", "FACTOR"), (int, float))


def slow_link(text: str) -> tuple:
    """``--slow-link SRC:DST:ALPHA_US:MB_PER_S`` (an argparse type): (src, dst, alpha s, bytes/s)."""
    s, d, a_us, mbps = _fields(text, ("SRC", "DST", "ALPHA_US", "MB_PER_S"), (int, int, float, float))
    if not (0 <= a_us <= 1e6 and 0 < mbps <= 1e6):  # NaN fails both; 1e308 us would never arrive
        raise argparse.ArgumentTypeError(
            f"ALPHA_US must be in 0..1000000 (1 s) and MB_PER_S in (0, 1000000], got {text!r}"
        )
    if s == d:
        raise argparse.ArgumentTypeError(f"SRC and DST must be two different ranks, got {text!r}")
    return s, d, a_us * 1e-6, mbps * 1e6


def config_from(args):
    from netmorph.consistency import Config

    slow = args.slow_link
    lr = args.lr if args.lr is not None else DEFAULT_LR.get(args.model, 1.0)  # an unknown model: check() says so
    cfg = Config(
        mode=args.mode,
        workers=args.workers,
        servers=args.servers,
        steps=args.steps,
        lr=lr,
        model=args.model,
        batch=args.batch,
        seed=args.seed,
        staleness=args.staleness,
        local_steps=args.local_steps,
        outer_lr=args.outer_lr,
        outer_momentum=args.outer_momentum,
        n_push=args.n_push,
        n_fetch=args.n_fetch,
        compute_ms=args.compute_ms,
        straggler=args.straggler,
        jitter=args.jitter,
        slow_link=slow,
        timeout=args.timeout,
    )
    cfg.check()
    if args.plot is not None:
        if not args.compare:
            raise UsageError("--plot draws the --compare run; add --compare")
    from netmorph.consistency import MODES
    from netmorph.runtime import budget

    budget.check(
        0,
        budget.sgd(cfg.model, cfg.workers, cfg.steps, cfg.compute_ms, len(MODES) if args.compare else 1),
        f"{cfg.steps * cfg.workers:,} updates",
        "",
        "--steps, --workers or --compute-ms",
    )
    return cfg


def _metric(r):
    for k in ("test_accuracy", "distance_to_optimum", "distance_to_planted"):
        if k in r:
            name = {"test_accuracy": "acc", "distance_to_optimum": "|w-w*|", "distance_to_planted": "rms|w-w0|"}[k]
            return f"{name} {r[k]:.4g}"
    return ""


def _hist(h):
    items = sorted(h.items())
    text = " ".join(f"{k}:{v}" for k, v in items[:5])
    return text + (" ..." if len(items) > 5 else "")


def format_rows(rows):
    lines = [COLS]
    for r in rows:
        if "time_to_target_s" not in r:  # one mode alone: no best-of-all target to reach
            tt = "-"
        else:
            tt = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f}"
        lines.append(
            f"{r['mode']:<8} {r['updates']:>7} {r['updates_per_s']:>8.0f} {r['wall_s']:>8.2f} {tt:>9} "
            f"{r['final_loss']:>11.4g} {_metric(r):>18} {r['max_staleness']:>9}  "
            f"{_hist(r['staleness_histogram']):<24} {r['bytes_on_wire']:>14,}"
        )
    return lines


def run(args) -> int:
    from netmorph.cli.progress import Bar
    from netmorph.consistency import MODES, compare
    from netmorph.consistency import run as run_mode

    cfg = config_from(args)
    if args.model == "mlp":
        require("torch", "--model mlp")
    if torchrun_world() is not None:
        return _in_job(args, cfg, run_mode)
    with Bar("sgd", unit="updates", width=10) as bar:
        tasks = {}

        def on_mode(m):
            if "_current" in tasks:
                bar.finish(tasks["_current"])
            tasks[m] = bar.add(m, cfg.steps * cfg.workers)
            tasks["_current"] = tasks[m]

        def on_progress(done, total):
            bar.update(tasks["_current"], completed=min(done, total))

        if args.compare:
            rows = [r.summary for r in compare(cfg, MODES, on_mode, on_progress)]
        else:
            on_mode(cfg.mode)
            rows = [run_mode(cfg, on_progress).summary]
        bar.finish(tasks["_current"])
    return _print(args, cfg, rows)


def _in_job(args, cfg, run_mode) -> int:
    """Under torchrun the job's ranks are the run's: WORLD_SIZE = --workers (+ --servers for async/ssp), over
    torch.distributed point-to-point; each worker takes --steps updates (no shared pool); rank 0 prints."""
    if args.compare:
        raise UsageError("--compare runs every mode on its own ranks; under torchrun run one --mode per job")
    if cfg.mode == "hogwild":
        raise UsageError(
            "--mode hogwild shares one address space between the workers: it runs on netmorph's "
            "own ranks, not under torchrun"
        )
    if cfg.slow_link is not None:
        raise UsageError("--slow-link emulates a link of netmorph's own fabric: not under torchrun")
    # the shared pool of updates lives in memory the ranks share: under torchrun each worker takes --steps
    got = run_mode(replace(cfg, shared_budget=False), None, backend="job")
    return 0 if got is None else _print(args, cfg, [got.summary])


def _print(args, cfg, rows) -> int:
    if args.json:
        print_json(rows, indent=1)
        return 0
    strag = f", straggler worker {cfg.straggler[0]} x{cfg.straggler[1]:g}" if cfg.straggler else ""
    servers = ""
    if args.compare:
        servers = f" (+{cfg.servers} server rank(s) for async/ssp)"
    elif cfg.mode in ("async", "ssp"):
        servers = f" + {cfg.servers} server rank(s)"
    print(
        f"# netmorph sgd: model {cfg.model}, {cfg.workers} workers{servers}, "
        f"{cfg.steps * cfg.workers} updates, {cfg.compute_ms:g} ms compute/step{strag}, lr {cfg.lr:g}"
    )
    if args.compare and rows[0].get("target_loss") is not None:
        print(f"# target loss {rows[0]['target_loss']:.5f} (90% of the best reduction); staleness in global steps")
    for line in format_rows(rows):
        print(line)
    for r in rows:
        extra = f"; collisions {100 * r['conflict_rate']:.1f}% of updates" if "conflict_rate" in r else ""
        print(f"#   {r['mode']:<8} {r['system']}{extra}")
    if args.plot is not None:
        from netmorph.report.consistency import plot

        plot(rows, args.plot, f"{cfg.model}, {cfg.workers} workers{strag}")
        print(f"# figure: {args.plot}")
    return 0
