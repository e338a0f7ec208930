"""``netmorph failures``: what failures cost a long run at scale -- checkpoint interval, goodput, lost hours."""

from __future__ import annotations

import argparse
import json

from netmorph.cli import print_json
from netmorph.cli.flags import float_in, given, int_in, plot_file
from netmorph.errors import UsageError

FLAGS = {}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "failures",
        help="failure economics at scale: checkpoint interval (Young, Daly), goodput of "
        "restart vs in-place recovery, closed form beside a Monte-Carlo",
        description="At thousands of GPUs failure is the steady state. Given the job's MTBF (or a "
        "per-GPU MTBF and the GPU count), the checkpoint write time and the restart time, "
        "prints the expected interruptions, the optimal checkpoint interval, and the "
        "useful fraction of wall time for torchrun-style restart from a checkpoint and "
        "for in-place recovery, each in closed form and simulated.",
    )
    p.add_argument("--gpus", type=int_in(1, 10**7), default=16384, help="GPUs in the job (default 16384)")
    p.add_argument(
        "--job-mtbf", type=duration, metavar="DURATION", help="mean time between job interruptions, e.g. 3.1h"
    )
    p.add_argument(
        "--per-gpu-mtbf",
        type=duration,
        metavar="DURATION",
        help="one GPU's MTBF (the job's is this / --gpus); default: Llama 3's, from 419 interruptions "
        "in 54 days on 16,384 GPUs",
    )
    p.add_argument(
        "--checkpoint-write",
        type=duration,
        metavar="DURATION",
        help="time the job stops to write a checkpoint (default 1min)",
    )
    p.add_argument(
        "--restart",
        type=cost,
        metavar="DURATION",
        help="restart-all: failure to computing again (reschedule, fresh processes, rendezvous, load the "
        "checkpoint; default 10min)",
    )
    p.add_argument(
        "--interval", type=duration, metavar="DURATION", help="compute between checkpoints (default: Daly's optimum)"
    )
    p.add_argument(
        "--inplace-recovery",
        type=cost,
        default="1min",
        metavar="DURATION",
        help="in place: failure to the next completed step (default 1min; `netmorph elastic` measures it "
        "on local ranks)",
    )
    p.add_argument(
        "--step-time",
        type=duration,
        metavar="DURATION",
        help="one training step: in place redoes at most this (default 10s)",
    )
    p.add_argument(
        "--days", type=float_in(0, 3650, open_low=True), default=54.0, help="wall-clock length of the run (default 54)"
    )
    p.add_argument("--trials", type=int_in(1, 100_000), default=200, help="Monte-Carlo runs (default 200)")
    p.add_argument(
        "--distribution",
        choices=("exponential", "weibull"),
        default="exponential",
        help="times between failures (default exponential; weibull: same mean, --weibull-shape)",
    )
    p.add_argument(
        "--weibull-shape", type=float_in(0.1, 10), default=0.7, help="Weibull shape k (k < 1: clustered failures)"
    )
    p.add_argument("--seed", type=int, default=0, help="Monte-Carlo seed")
    p.add_argument(
        "--from-run",
        metavar="FILE",
        type=run_file,
        help="take the job MTBF, checkpoint write, restart and step time a run measured: the --json of "
        "benchmarks/failures_replay.py (a flag given beside it is refused)",
    )
    p.add_argument(
        "--fleet",
        action="store_true",
        help="print the published runs' failure statistics (Llama 3, OPT-175B) and what they imply",
    )
    p.add_argument("--plot", type=plot_file, metavar="PNG", help="draw goodput against the checkpoint interval")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run, flags=FLAGS)


def _seconds(text: str, zero_ok: bool) -> float:
    from netmorph.units import parse_duration

    try:
        v = parse_duration(given(text), "duration")
    except UsageError:
        raise argparse.ArgumentTypeError(f"cannot parse {text!r} (a number and a unit: 30s, 10min, 3.1h, 2d)") from None
    if not (0 <= v if zero_ok else 0 < v) or not v < 1e12:
        raise argparse.ArgumentTypeError(
            f"must be {'0 or more' if zero_ok else 'more than 0'} (and under 30,000 years), got {text!r}"
        )
    return v


def duration(text: str) -> float:
    """A DURATION flag (an argparse type): seconds, more than 0."""
    return _seconds(text, zero_ok=False)


def cost(text: str) -> float:
    """A DURATION flag that may be 0 (an argparse type): a restart or an in-place recovery that costs nothing."""
    return _seconds(text, zero_ok=True)


# what --from-run FILE sets: the flag, the measured figure's key in the file
MEASURED = {
    "job_mtbf": "job_mtbf_s",
    "checkpoint_write": "checkpoint_write_s",
    "restart": "restart_s",
    "step_time": "step_time_s",
}
DEFAULTS = {"checkpoint_write": 60.0, "restart": 600.0, "step_time": 10.0}


def run_file(path: str) -> dict:
    """``--from-run FILE`` (an argparse type): the measured costs of a run, each a number of seconds."""
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {path!r} ({e.strerror})") from None
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{path!r} is not JSON (give benchmarks/failures_replay.py --json's output)"
        ) from None
    if not isinstance(doc, dict):
        raise argparse.ArgumentTypeError(f"{path!r} is not one JSON object of a run's figures")
    out = {}
    for flag, key in MEASURED.items():
        v = doc.get(key)
        if (
            not isinstance(v, (int, float))
            or isinstance(v, bool)
            or not (0 <= v < 1e12)
            or (v == 0 and key != "restart_s")
        ):
            raise argparse.ArgumentTypeError(f"{path!r}: {key} must be a number of seconds (more than 0), got {v!r}")
        out[flag] = float(v)
    return out


def _measured(args) -> None:
    """Fill the costs ``--from-run`` measured, then the defaults; a flag typed beside ``--from-run`` is refused."""
    if args.from_run:
        typed = [f for f in MEASURED if getattr(args, f) is not None] + (["per_gpu_mtbf"] if args.per_gpu_mtbf else [])
        if typed:
            flag = "--" + typed[0].replace("_", "-")
            raise UsageError(
                f"{flag} and --from-run both set it: give one (--from-run takes the job MTBF, checkpoint "
                f"write, restart and step time the run measured)",
                typed[0],
            )
        for flag, v in args.from_run.items():
            setattr(args, flag, v)
    for flag, v in DEFAULTS.items():
        if getattr(args, flag) is None:
            setattr(args, flag, v)


def _per_gpu_default():
    from netmorph.failures import fleet, job_mtbf

    f = fleet()["llama3-405b"]
    return job_mtbf(f) * f["gpus"]


def run(args) -> int:
    from netmorph.failures import daly, fleet, goodput, inplace_goodput, monte_carlo, optimum, young
    from netmorph.failures.model import check_job, human_time

    if args.fleet:
        return _fleet(fleet(), args.json)
    _measured(args)
    if args.job_mtbf and args.per_gpu_mtbf:
        raise UsageError("give --job-mtbf or --per-gpu-mtbf, not both")
    if args.job_mtbf:
        M, origin = args.job_mtbf, ("(measured: --from-run)" if args.from_run else "(given)")
    else:
        per = args.per_gpu_mtbf or _per_gpu_default()
        M = per / args.gpus
        origin = (
            f"= per-GPU MTBF {human_time(per)}"
            + ("" if args.per_gpu_mtbf else ", Llama 3's (419 interruptions in 54 days on 16,384 GPUs),")
            + f" / {args.gpus:,} GPUs"
        )
    C, R, r, s = args.checkpoint_write, args.restart, args.inplace_recovery, args.step_time
    check_job(M, C, s, args.days, args.trials)
    tau = args.interval or daly(C, M)
    hours = args.days * 24
    mc = dict(hours=hours, trials=args.trials, seed=args.seed, dist=args.distribution, shape=args.weibull_shape)
    sim = {"restart": monte_carlo(tau, C, R, M, **mc), "inplace": monte_carlo(s, 0.0, r, M, **mc)}
    closed = {"restart": goodput(tau, C, R, M), "inplace": inplace_goodput(s, r, M)}
    out = {
        "gpus": args.gpus,
        "job_mtbf_h": M / 3600,
        "days": args.days,
        "expected_interruptions": hours * 3600 / M,
        "interval_young_min": young(C, M) / 60,
        "interval_daly_min": daly(C, M) / 60,
        "interval_optimum_min": optimum(C, R, M) / 60,
        "interval_used_min": tau / 60,
        "checkpoint_write_s": C,
        "restart_s": R,
        "inplace_recovery_s": r,
        "step_time_s": s,
        "distribution": args.distribution,
        "goodput": closed,
        "simulated_goodput": {k: float(v.mean()) for k, v in sim.items()},
        "simulated_stderr": {k: float(v.std(ddof=1) / len(v) ** 0.5) if len(v) > 1 else 0.0 for k, v in sim.items()},
        "lost_hours": {k: hours * (1 - v) for k, v in closed.items()},
        "lost_gpu_hours": {k: hours * (1 - v) * args.gpus for k, v in closed.items()},
    }
    if args.plot:
        from netmorph.failures import curve
        from netmorph.report.failures import plot_goodput

        plot_goodput(
            args.plot,
            [curve(args.gpus, M, C, R, r, s)],
            C,
            R,
            r,
            s,
            tau=tau,
            mc_points={args.gpus: [(tau, out["simulated_goodput"]["restart"], out["simulated_stderr"]["restart"])]},
        )
    if args.json:
        print_json(out)
        return 0
    print(
        f"# netmorph failures: {args.gpus:,} GPUs, job MTBF {human_time(M)} {origin}, {args.days:g} days; "
        f"checkpoint write {human_time(C)}, restart {human_time(R)}; in place: recovery {human_time(r)}, "
        f"step {s:g} s"
    )
    print(f"expected interruptions   {out['expected_interruptions']:,.1f}   ({hours:g} h / {human_time(M)})")
    print(
        f"checkpoint interval      Young sqrt(2CM) {human_time(young(C, M))}   Daly {human_time(daly(C, M))}   "
        f"exact optimum {human_time(optimum(C, R, M))}   (used: {human_time(tau)})"
    )
    what = "exponential" if args.distribution == "exponential" else f"Weibull k={args.weibull_shape:g}"
    print(
        f"{'recovery':<26} {'goodput':>8} {'Monte-Carlo (' + str(args.trials) + ' runs, ' + what + ')':>36} "
        f"{'lost wall h':>12} {'lost GPU-h':>14}"
    )
    for key, label in (("restart", "restart from checkpoint"), ("inplace", "in place")):
        se = out["simulated_stderr"][key]
        mc_text = f"{100 * out['simulated_goodput'][key]:.2f}% ± {100 * se:.2g}%"
        print(
            f"{label:<26} {100 * closed[key]:>7.2f}% {mc_text:>36} {out['lost_hours'][key]:>12,.1f} "
            f"{out['lost_gpu_hours'][key]:>14,.0f}"
        )
    print(
        f"# goodput: useful fraction of wall time, Daly's complete model (exponential failures, failures also "
        f"during checkpoints and restarts). Per failure, restart loses ~interval/2 + restart = "
        f"{(tau / 2 + R) / 60:.1f} min; in place ~step/2 + recovery = {(s / 2 + r) / 60:.1f} min."
    )
    if args.distribution != "exponential":
        print("# the closed form assumes exponential failures; the Monte-Carlo used the Weibull above")
    return 0


def _fleet(runs: dict, as_json: bool) -> int:
    from netmorph.failures import daly, goodput, job_mtbf

    rows = []
    for name, f in runs.items():
        M = job_mtbf(f)
        rows.append(
            {
                "run": name,
                "gpus": f["gpus"],
                "days": f["days"],
                "interruptions": f["interruptions"],
                "job_mtbf_h": M / 3600,
                "per_gpu_mtbf_years": M * f["gpus"] / (3600 * 24 * 365),
                "daly_interval_min_at_1min_write": daly(60, M) / 60,
                "goodput_at_1min_write_10min_restart": goodput(daly(60, M), 60, 600, M),
                "published_effective_training_time": f.get("published_effective_training_time"),
                "what": f["what"],
                "source": f["source"],
            }
        )
    if as_json:
        print_json(rows)
        return 0
    print(
        f"{'run':<12} {'GPUs':>7} {'days':>5} {'interruptions':>13} {'job MTBF':>9} {'per-GPU MTBF':>13} "
        f"{'Daly (C=1min)':>13} {'goodput (C=1min, R=10min)':>26}"
    )
    for r in rows:
        print(
            f"{r['run']:<12} {r['gpus']:>7,} {r['days']:>5g} {r['interruptions']:>13} {r['job_mtbf_h']:>7.2f} h "
            f"{r['per_gpu_mtbf_years']:>9.1f} yr {r['daly_interval_min_at_1min_write']:>9.1f} min "
            f"{100 * r['goodput_at_1min_write_10min_restart']:>25.1f}%"
        )
    for r in rows:
        extra = (
            f"; published effective training time > {100 * r['published_effective_training_time']:.0f}%"
            if r["published_effective_training_time"]
            else ""
        )
        print(f"# {r['run']}: {r['what']}{extra}. Source: {r['source']}.")
    print(
        "# computed from the published counts: job MTBF = days / interruptions, per-GPU MTBF = job MTBF x GPUs; "
        "checkpoint and restart times are not published: 1 min and 10 min are assumptions (set them with "
        "--checkpoint-write / --restart)"
    )
    return 0
