"""The OPT-175B logbook, replayed: a real training job under ``torchrun --max-restarts``, failures injected at a
scaled MTBF, restarted from its own checkpoints at Daly's interval and at half and twice it; the measured goodput
beside ``netmorph failures``' closed form (Daly's complete model) and Monte-Carlo for the same inputs.

The job: ``torchrun --standalone --nproc-per-node K --max-restarts 10000 -m netmorph train --dp K --steps S
--save D --save-every N --load D`` (every restart reads ``D/latest``, DCP's format, as a Megatron or torchtitan
job does). The failures: a Poisson process in wall time (exponential gaps of mean ``--mtbf``, one seed for the
three intervals, so each sees the same failure times); at each, one worker the agent runs is SIGKILLed, and
torchrun tears the job down, re-runs the rendezvous and starts fresh interpreters. A failure that falls while no
worker runs (the agent between two attempts) strikes the next attempt as soon as it has a worker: the model's
failure during a restart.

Every model input is measured here, none is typed in or fitted to the goodputs it is compared with:

- ``step_time_s``: the median step of a run that saves nothing (its ``--json``);
- ``checkpoint_write_s`` (C): the median save's cost inside the step, from a run that saves every step;
- ``restart_s`` (R): a run killed once, right after a checkpoint was published (the driver watches ``D/latest``):
  its wall time less the same run's without the kill, less the work done between the publish and the kill --
  torchrun's detection, the teardown, the fresh interpreters, the rendezvous, the checkpoint's read;
- ``startup_s``: the first launch's start-up (a cost the model does not have: taken off every run's wall time).

Measured goodput: the failure-free compute (steps x step) over the wall time less the start-up. The model's
interval is the compute between two checkpoints (N x step). The closing lines say whether each interval's
measured goodput is within 10% of the model and whether Daly's interval measured best. ``--json`` gives the
figures ``netmorph failures --from-run FILE`` reads.

    python benchmarks/failures_replay.py [--mtbf 20] [--work 90] [--nproc-per-node 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from netmorph.failures import daly, goodput, monte_carlo
from netmorph.runtime.transport.blame import child_pids


def _job(k: int, folder: str, steps: int, every: int, model: list, tmp: str) -> subprocess.Popen:
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(k),
        "--max-restarts",
        "10000",
        "--monitor-interval",
        "0.1",
        "-m",
        "netmorph",
        "train",
        "--dp",
        str(k),
        "--steps",
        str(steps),
        "--json",
        *model,
    ]
    if every:
        args += ["--save", folder, "--save-every", str(every), "--load", folder]
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        TMPDIR=tmp,
        PYTHONUNBUFFERED="1",
        GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
    )
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )


def _finish(p: subprocess.Popen, timeout: float) -> dict:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise RuntimeError(f"the job ran past {timeout:.0f} s") from None
    if p.returncode:
        raise RuntimeError(f"the job failed (exit {p.returncode}):\n{err[-1500:]}")
    # a worker killed after the last step leaves the restarted job nothing to do: it exits 0 with no JSON
    return json.loads(out[out.index("{") :]) if "{" in out else {}


def run(k, steps, every, model, tmp, kills=None, after_publish=False, timeout=1800.0) -> dict:
    """One job; ``kills``: wall times (from the start) at which a worker is SIGKILLed; ``after_publish``: one
    kill, right after the first checkpoint after ``kills[0]`` is published. Returns the wall time, the job's
    final ``--json``, the failures done and (``after_publish``) the work between the publish and the kill."""
    folder = tempfile.mkdtemp(dir=tmp)
    shutil.rmtree(folder)
    t0 = time.monotonic()
    p = _job(k, folder, steps, every, model, tmp)
    since, struck, published = None, [], []  # struck: (when, the step latest named) per kill
    stop = threading.Event()
    latest = os.path.join(folder, "latest")

    def watch():  # every publish: (when, its step)
        last = None
        while not stop.is_set():
            if (now := _latest_step(latest)) != last and now is not None:
                published.append((time.monotonic(), now))
                last = now
            time.sleep(0.002)

    def strike():
        nonlocal since
        for at in kills or []:
            while not stop.is_set() and time.monotonic() - t0 < at:
                time.sleep(0.01)
            if after_publish:  # wait for the next publish, then strike at once
                seen = len(published)
                while not stop.is_set() and len(published) == seen:
                    time.sleep(0.002)
            while not stop.is_set() and not (pids := child_pids(p.pid)):
                time.sleep(0.01)
            if stop.is_set():
                return
            try:
                os.kill(pids[-1], signal.SIGKILL)
            except ProcessLookupError:
                continue
            struck.append((time.monotonic(), _latest_step(latest)))
            if after_publish:
                since = struck[-1][0] - published[-1][0]

    th = threading.Thread(target=strike, daemon=True)
    th.start()
    tw = threading.Thread(target=watch, daemon=True)
    tw.start()
    try:
        doc = _finish(p, timeout)
    finally:
        stop.set()
        th.join(5)
        tw.join(5)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "wall_s": time.monotonic() - t0,
        "doc": doc,
        "failures": len(struck),
        "since_publish_s": since,
        "struck": struck,
        "published": published,
        "struck_s": [w - t0 for w, _ in struck],
    }


def _latest_step(latest: str) -> int | None:
    try:
        with open(latest) as fh:
            return int(fh.read().strip().split("-")[1])
    except (OSError, ValueError, IndexError):
        return None


def observed_restarts(r: dict, step: float, C: float) -> list[float]:
    """Each failure's restart as the replay saw it: the kill to the next publish, less the steps computed from
    the checkpoint it resumed from to that publish and their save -- for the failures whose next publish came
    before the next failure (a diagnostic beside the probes' R, not an input of the model)."""
    out = []
    for i, (t, resumed) in enumerate(r["struck"]):
        nxt = r["struck"][i + 1][0] if i + 1 < len(r["struck"]) else float("inf")
        after = [(tp, s) for tp, s in r["published"] if tp > t]
        if after and after[0][0] < nxt:
            tp, s = after[0]
            out.append(tp - t - (s - (resumed or 0)) * step - C)
    return out


def trace_goodput(work: float, tau: float, C: float, R: float, failures: list) -> float:
    """The model's own accounting on the replay's own failures: ``work`` seconds of compute, a save of ``C``
    after every ``tau`` of it (and at the end, as train saves), each failure (seconds from the first step) losing
    the work since the last save and costing ``R`` (a failure during a restart restarts it). What the closed
    form and the Monte-Carlo average over, for the one failure trace this run drew: the Poisson draw's luck
    taken out of the comparison."""
    t, saved = 0.0, 0.0
    pending = sorted(failures)
    while saved < work - 1e-12:
        seg = min(tau, work - saved)
        end = t + seg + C
        if pending and pending[0] < end:
            t = max(t, pending.pop(0)) + R
            while pending and pending[0] < t:  # failed again while restarting
                t = pending.pop(0) + R
            continue
        t, saved = end, saved + seg
    return work / t


def poisson(mtbf: float, horizon: float, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(np.cumsum(rng.exponential(mtbf, int(4 * horizon / mtbf) + 16)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mtbf", type=float, default=20.0, help="the job's MTBF, in seconds of wall time (default 20)")
    ap.add_argument(
        "--work",
        type=float,
        default=90.0,
        help="the failure-free compute each interval's run does, seconds (default 90)",
    )
    ap.add_argument("--nproc-per-node", type=int, default=2)
    ap.add_argument(
        "--model",
        default="--layers 4 --hidden 512 --heads 8 --seq 64 --vocab 512",
        help="train's model flags (default: a 4-layer GPT whose save takes a good part of a step)",
    )
    ap.add_argument("--probes", type=int, default=3, help="restart measurements, the median taken (default 3)")
    ap.add_argument("--seed", type=int, default=0, help="the failure times' seed (the same for every interval)")
    ap.add_argument("--trials", type=int, default=400, help="Monte-Carlo runs (default 400)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not (args.mtbf > 0 and args.work > 0 and args.nproc_per_node >= 1 and args.probes >= 1):
        ap.error("--mtbf, --work: more than 0; --nproc-per-node, --probes: at least 1")
    k, model = args.nproc_per_node, args.model.split()

    def term(*_):  # SIGTERM as Ctrl-C: every job's process group goes with us
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, term)

    def say(text):
        print(f"failures_replay: {text}", file=sys.stderr, flush=True)

    tmp = tempfile.mkdtemp(prefix="netmorph-replay-")
    try:
        say("measuring the step (a run that saves nothing)")
        clean = run(k, 60, 0, model, tmp)
        step = statistics.median(clean["doc"]["step_times_s"][5:])
        startup = clean["wall_s"] - sum(clean["doc"]["step_times_s"])
        say(f"step {step * 1e3:.1f} ms, start-up {startup:.2f} s; measuring the save (a run that saves every step)")
        saving = run(k, 30, 1, model, tmp)
        times = saving["doc"]["step_times_s"][5:]
        C = max(statistics.median(times) - step, 0.0)
        size = saving["doc"]["checkpoints"][-1]["bytes"]
        say(f"checkpoint {size / 1e6:.1f} MB, {C * 1e3:.1f} ms; measuring the restart (one kill after a publish)")
        n_probe = max(int(2.0 / step), 5)
        probe_steps = 4 * n_probe
        probes = []
        for i in range(args.probes):  # pairs, so a slow start-up counts on both sides
            base = run(k, probe_steps, n_probe, model, tmp)
            hit = run(k, probe_steps, n_probe, model, tmp, kills=[startup + 1.0], after_publish=True)
            probes.append(hit["wall_s"] - base["wall_s"] - hit["since_publish_s"])
        R = statistics.median(probes)
        say(f"restart {R:.2f} s (median of {', '.join(f'{p:.2f}' for p in probes)})")
        tau_daly = daly(C, args.mtbf)
        steps = max(int(args.work / step), 10)
        rows = []
        for name, scale in (("daly/2", 0.5), ("daly", 1.0), ("2*daly", 2.0)):
            every = max(int(round(scale * tau_daly / step)), 1)
            tau = every * step
            model_g = goodput(tau, C, R, args.mtbf)
            horizon = startup + steps * step / max(model_g, 0.05)
            say(
                f"{name}: a checkpoint every {every} steps ({tau:.2f} s), {steps} steps, failures every "
                f"{args.mtbf:g} s on average"
            )
            r = run(k, steps, every, model, tmp, kills=poisson(args.mtbf, horizon, args.seed))
            measured = steps * step / (r["wall_s"] - startup)
            mc = monte_carlo(
                tau, C, R, args.mtbf, hours=(r["wall_s"] - startup) / 3600, trials=args.trials, seed=args.seed
            )
            seen = observed_restarts(r, step, C)
            traced = trace_goodput(steps * step, tau, C, R, [f - startup for f in r["struck_s"]])
            rows.append(
                {
                    "interval": name,
                    "every_steps": every,
                    "interval_s": tau,
                    "failures": r["failures"],
                    "restart_observed_s": statistics.median(seen) if seen else None,
                    "wall_s": r["wall_s"],
                    "goodput_measured": measured,
                    "goodput_model": model_g,
                    "goodput_monte_carlo": float(mc.mean()),
                    "goodput_monte_carlo_std": float(mc.std(ddof=1)),
                    "rel_diff_to_model": measured / model_g - 1,
                    "goodput_same_failures": traced,
                    "rel_diff_to_same_failures": measured / traced - 1,
                    "within_10pct": abs(measured / model_g - 1) <= 0.10,
                }
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    best = max(rows, key=lambda r: r["goodput_measured"])["interval"]
    out = {
        "nproc_per_node": k,
        "model": args.model,
        "job_mtbf_s": args.mtbf,
        "step_time_s": step,
        "checkpoint_write_s": C,
        "checkpoint_bytes": size,
        "restart_s": R,
        "restart_probes_s": probes,
        "startup_s": startup,
        "interval_daly_s": tau_daly,
        "steps": steps,
        "seed": args.seed,
        "intervals": rows,
        "best_measured": best,
        "daly_best_measured": best == "daly",
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(
        f"# train --dp {k} {args.model} under torchrun --max-restarts, {steps} steps; failures: Poisson, MTBF "
        f"{args.mtbf:g} s (seed {args.seed}); measured: step {step * 1e3:.1f} ms, checkpoint "
        f"{size / 1e6:.1f} MB in {C * 1e3:.0f} ms, restart {R:.2f} s; Daly's interval {tau_daly:.2f} s"
    )
    print(
        f"{'interval':<8} {'every':>6} {'tau (s)':>8} {'failures':>8} {'wall (s)':>9} {'measured':>9} "
        f"{'model':>7} {'Monte-Carlo':>14} {'vs model':>9} {'same failures':>13} {'vs them':>8} "
        f"{'restart seen (s)':>16}"
    )
    for r in rows:
        print(
            f"{r['interval']:<8} {r['every_steps']:>6} {r['interval_s']:>8.2f} {r['failures']:>8} "
            f"{r['wall_s']:>9.1f} {100 * r['goodput_measured']:>8.1f}% {100 * r['goodput_model']:>6.1f}% "
            f"{100 * r['goodput_monte_carlo']:>7.1f}% ± {100 * r['goodput_monte_carlo_std']:.1f} "
            f"{100 * r['rel_diff_to_model']:>+8.1f}% {100 * r['goodput_same_failures']:>12.1f}% "
            f"{100 * r['rel_diff_to_same_failures']:>+7.1f}% {r['restart_observed_s'] or float('nan'):>16.2f}"
        )
    print(
        f"# goal: each within 10% of the model ({sum(r['within_10pct'] for r in rows)} of 3), Daly's interval "
        f"the best measured ({best} was); Monte-Carlo ± is one run's spread at this length, the noise a single "
        f"replay carries; 'same failures' is the model's accounting on this run's own failure times"
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("failures_replay: interrupted; every job stopped", file=sys.stderr)
        sys.exit(130)
