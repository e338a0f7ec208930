"""netmorph's morphing network beside torchft, plain DDP and torchrun's restart-all, on one job.

The job: netmorph elastic's GPT (``netmorph.elastic.gpt.MODEL``, float64, Adam 3e-3), data-parallel over
``--nodes`` emulated nodes of ``--nproc-per-node`` workers on 127.0.0.1 (gloo), ``--steps`` steps of a 12-sequence
global batch. Each system runs it its own way; one worker of the last node is SIGKILLed in ``--kill-step``:

- ``ddp``: one torchrun job of every worker, ``torch.nn.parallel.DistributedDataParallel``; no fault (it cannot
  survive one): the steady-state step every other system is held against;
- ``torchrun_restart``: the same DDP job under ``torchrun --max-restarts 3``, a checkpoint (``torch.save``) every
  ``--checkpoint-every`` steps: a death stops every worker, the agent re-runs the rendezvous, fresh interpreters
  reload the checkpoint;
- ``torchft``: each node a replica group, its own ``torchrun --nproc-per-node K --max-restarts 3`` job, torchft's
  ``Manager`` over its ``torchft_lighthouse``, its ``DistributedDataParallel`` and ``OptimizerWrapper``
  (the gradients averaged inside a group over torchrun's own group, across groups by the Manager): the other
  groups go on, the killed group's torchrun restarts it and it heals from a live peer (torchft's checkpoint
  transport);
- ``netmorph``: ``netmorph launch --nodes N --nproc-per-node K -- elastic --backend torch-native --kill
  RANK@STEP``: netmorph's membership (heartbeats, the lighthouse's views, the survivors' agreement, a gloo group
  per epoch) with the gradients averaged by the epoch group's own gloo all-reduce -- the collective torchft's
  Manager calls on its quorum's group, so the two differ only in how they keep the membership;
- ``netmorph_schedules``: the same with ``--backend torch`` (elastic's default), the gradients averaged by
  netmorph's own schedules over the group's point-to-point, every message fingerprinted and counted.

Per system: ``steady_step_s`` (median step, steps clear of the fault), ``recovery_s`` (the death to the next
completed step), ``steps_redone`` (steps computed again after it), ``heal_s`` (a restarted node's workers' start
to their first completed step); medians over ``--repeats`` runs (one kill each). A system whose package is not
installed makes the benchmark say so and exit 1 (torchft: ``pip install -e '.[peers]'``).

    python benchmarks/torchft_peer.py [--nodes 2[,3]] [--nproc-per-node 2] [--steps 300] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from netmorph.elastic.node import process_start

GLOBAL_BATCH = 12


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _stamp(path: str, *fields) -> None:
    with open(path, "a") as fh:
        fh.write(" ".join(repr(f) for f in fields) + "\n")


def _rows(path: str) -> list:
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [[float(x) for x in line.split()] for line in fh if line.strip()]


# ---------------------------------------------------------------------------------------------- the workers
def _model_and_batches():
    import torch

    from netmorph.elastic.gpt import MODEL
    from netmorph.models.gpt import GPTStage, synthetic_batch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPTStage(MODEL, dtype=torch.float64)

    def batch(step, part, parts):
        per = GLOBAL_BATCH // parts
        lo = step * GLOBAL_BATCH + part * per
        return synthetic_batch(MODEL, range(lo, lo + per))

    return model, batch


def ddp_worker(out: str, kill_step: int, victim: int, every: int) -> None:
    """A torchrun worker of the DDP job; with ``every`` > 0 it checkpoints and resumes (restart-all)."""
    import datetime

    import torch
    import torch.distributed as dist

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    store = dist.PrefixStore(
        f"attempt{attempt}",
        dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=datetime.timedelta(seconds=60),
        ),
    )
    dist.init_process_group("gloo", store=store, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batch = _model_and_batches()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.95))
    ckpt = os.path.join(out, "ckpt.pt")
    step = 0
    if every and os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    if rank == 0:
        _stamp(os.path.join(out, "starts"), process_start(), attempt)
    while step < STEPS:
        if step == kill_step and rank == victim and attempt == 0:
            _stamp(os.path.join(out, "deaths"), time.time(), step)
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        x, y = batch(step, rank, world)
        ddp(x, y).backward()
        opt.step()
        step += 1
        if rank == 0:
            _stamp(os.path.join(out, "steps"), time.time(), step)
            if every and step % every == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)
    dist.destroy_process_group()


def torchft_worker(out: str, kill_step: int, victim_group: int, victim_local: int, groups: int) -> None:
    """A torchrun worker of one torchft replica group."""
    import datetime

    import torch
    import torch.distributed as dist
    from torchft import Manager
    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper
    from torchft.process_group import ProcessGroupGloo

    gid = int(os.environ["REPLICA_GROUP_ID"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    local, k = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.PrefixStore(
        f"intra{attempt}",
        dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=datetime.timedelta(seconds=60),
        ),
    )
    dist.init_process_group("gloo", store=store, rank=local, world_size=k)  # the group's own, torchrun's
    model, batch = _model_and_batches()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.95))

    def state_dict():
        return {"model": model.state_dict(), "opt": opt.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["opt"])

    manager = Manager(
        pg=ProcessGroupGloo(),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"group{gid}",
        timeout=datetime.timedelta(seconds=30),
    )
    ddp = DistributedDataParallel(manager, model)
    optim = OptimizerWrapper(manager, opt)
    log = os.path.join(out, f"group{gid}")
    if local == 0:
        _stamp(log + ".starts", process_start(), attempt)
    while manager.current_step() < STEPS:
        step = manager.current_step()
        if step == kill_step and gid == victim_group and local == victim_local and attempt == 0:
            _stamp(os.path.join(out, "deaths"), time.time(), step)
            os.kill(os.getpid(), signal.SIGKILL)
        optim.zero_grad()
        x, y = batch(step, gid * k + local, groups * k)
        ddp(x, y).backward()
        for p in model.parameters():  # inside the group: average over its workers
            dist.all_reduce(p.grad)
            p.grad /= k
        optim.step()
        if local == 0:
            _stamp(log + ".steps", time.time(), manager.current_step())
    dist.destroy_process_group()
    manager.shutdown()


STEPS = 300


# ---------------------------------------------------------------------------------------------- the runs
def _env(tmp):
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        TMPDIR=tmp,
        TORCH_CPP_LOG_LEVEL="ERROR",
        GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
    )
    return env


def _torchrun(k, restarts, args, env, port=None):
    rdzv = ["--standalone"] if port is None else ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *rdzv,
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(k),
            "--max-restarts",
            str(restarts),
            __file__,
            *args,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _figures(steps, deaths, kill_step: int, restarted_at: float | None = None) -> dict:
    """steady_step_s, recovery_s, steps_redone from (time, steps done) stamps and the death (in ``kill_step``:
    ``kill_step`` steps were done). Recovery ends at the next completed step: in place, the one the death
    interrupted (done = kill_step + 1; a stamp of the step before it can land just after the death); after a
    restart-all, the new job's first (``restarted_at``: when it started)."""
    steps = sorted(steps)
    gaps = [b[0] - a[0] for a, b in zip(steps, steps[1:])]
    out = {"steps_done": int(max((s for _, s in steps), default=0))}
    if not deaths:
        out["steady_step_s"] = statistics.median(gaps) if gaps else None
        return out
    at = deaths[0][0]
    if restarted_at is None:
        after = [s for s in steps if s[0] > at and s[1] > kill_step]
    else:
        after = [s for s in steps if s[0] > restarted_at]
    clear = [b[0] - a[0] for a, b in zip(steps, steps[1:]) if b[0] < at - 0.5 or a[0] > at + 10]
    out["steady_step_s"] = statistics.median(clear or gaps)
    out["recovery_s"] = after[0][0] - at if after else None
    out["steps_redone"] = int(kill_step + 1 - (after[0][1] - 1)) if after else None
    return out


def run_ddp(nodes, k, tmp, kill_step, every=0, restart=False) -> dict:
    out = tempfile.mkdtemp(dir=tmp)
    victim = nodes * k - 1
    args = ["--worker", "ddp", out, str(kill_step if restart else -1), str(victim), str(every)]
    p = _torchrun(nodes * k, 3 if restart else 0, args, _env(tmp))
    _, err = p.communicate(timeout=600)
    if p.returncode:
        raise RuntimeError(f"ddp job failed:\n{err[-20000:]}")
    steps = [tuple(r) for r in _rows(os.path.join(out, "steps"))]
    deaths = _rows(os.path.join(out, "deaths"))
    later = [t for t, attempt in _rows(os.path.join(out, "starts")) if attempt > 0]
    fig = _figures(steps, deaths, kill_step, later[0] if later else None)
    if restart:
        first = [t for t, _ in steps if later and t > later[0]]
        fig["heal_s"] = first[0] - later[0] if first else None  # everything restarts: the new job's start to a step
    return fig


def run_torchft(nodes, k, tmp, kill_step) -> dict:
    out = tempfile.mkdtemp(dir=tmp)
    port = _free_port()
    lighthouse = shutil.which("torchft_lighthouse") or os.path.join(
        os.path.dirname(sys.executable), "torchft_lighthouse"
    )
    lh = subprocess.Popen(
        [
            lighthouse,
            "--min_replicas",
            "1",
            "--bind",
            f"127.0.0.1:{port}",
            "--join_timeout_ms",
            "100",
            "--heartbeat_timeout_ms",
            "1000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    jobs = []
    try:
        time.sleep(1.0)
        for g in range(nodes):
            env = dict(_env(tmp), REPLICA_GROUP_ID=str(g), TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{port}")
            jobs.append(
                _torchrun(
                    k,
                    3,
                    ["--worker", "torchft", out, str(kill_step), str(nodes - 1), str(k - 1), str(nodes)],
                    env,
                    port=_free_port(),
                )
            )
        for j in jobs:
            _, err = j.communicate(timeout=600)
            if j.returncode:
                raise RuntimeError(f"a torchft group failed:\n{err[-20000:]}")
    finally:
        for j in jobs:
            if j.poll() is None:
                j.kill()
        lh.terminate()
        lh.wait(10)
    deaths = _rows(os.path.join(out, "deaths"))
    survivor = [tuple(r) for r in _rows(os.path.join(out, "group0.steps"))]
    fig = _figures(survivor, deaths, kill_step)
    starts = _rows(os.path.join(out, f"group{nodes - 1}.starts"))
    victim = [tuple(r) for r in _rows(os.path.join(out, f"group{nodes - 1}.steps"))]
    later = [t for t, a in starts if a > 0]
    first = [t for t, _ in victim if later and t > later[0]]
    fig["heal_s"] = first[0] - later[0] if first else None
    return fig


def run_netmorph(nodes, k, tmp, kill_step, backend) -> dict:
    victim = nodes * k - 1
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "netmorph",
            "launch",
            "--nodes",
            str(nodes),
            "--nproc-per-node",
            str(k),
            "--max-restarts",
            "3",
            "--",
            "elastic",
            "--steps",
            str(STEPS),
            "--kill",
            f"{victim}@{kill_step}",
            "--backend",
            backend,
            "--json",
            "--timeout",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(tmp),
    )
    if r.returncode:
        raise RuntimeError(f"netmorph launch failed:\n{r.stderr[-20000:]}")
    doc = json.loads(r.stdout)
    kill = next(e for e in doc["events"] if e["kind"] == "kill")
    tl = doc["timeline"]
    at = kill["at_s"]
    clear = [b[0] - a[0] for a, b in zip(tl, tl[1:]) if b[0] < at - 0.5 or a[0] > at + 10]
    gaps = [b[0] - a[0] for a, b in zip(tl, tl[1:])]
    return {
        "steady_step_s": statistics.median(clear or gaps),
        "recovery_s": kill["resumed_after_s"],
        "steps_redone": kill["steps_redone"],
        "heal_s": doc.get("heal_s"),
        "steps_done": STEPS,
    }


SYSTEMS = ("ddp", "torchft", "netmorph", "netmorph_schedules", "torchrun_restart")


def main() -> int:
    global STEPS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="2", help="node counts, comma-separated (2,3: a table for each)")
    ap.add_argument("--nproc-per-node", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--kill-step", type=int, default=25)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    STEPS = args.steps
    if args.worker:
        kind, *rest = args.worker
        if kind == "ddp":
            ddp_worker(rest[0], int(rest[1]), int(rest[2]), int(rest[3]))
        else:
            torchft_worker(rest[0], int(rest[1]), int(rest[2]), int(rest[3]), int(rest[4]))
        return 0
    systems = args.systems.split(",")
    try:
        node_counts = [int(n) for n in args.nodes.split(",")]
    except ValueError:
        ap.error(f"--nodes {args.nodes!r}: node counts such as 2 or 2,3")
    if any(n < 1 for n in node_counts) or args.nproc_per_node < 1:
        ap.error("--nodes and --nproc-per-node: at least 1")
    if unknown := set(systems) - set(SYSTEMS):
        ap.error(f"--systems: {', '.join(sorted(unknown))} is none of {', '.join(SYSTEMS)}")
    if "torchft" in systems:
        try:
            import torchft  # noqa: F401
        except ImportError:
            print(
                "torchft_peer: torchft is not installed (pip install -e '.[peers]'); the comparison needs it",
                file=sys.stderr,
            )
            return 1
    os.environ["STEPS"] = str(STEPS)
    tmp = tempfile.mkdtemp(prefix="netmorph-peer-")
    try:
        by_nodes = {n: measure(n, args, systems, tmp) for n in node_counts}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        doc = (
            by_nodes[node_counts[0]]
            if len(node_counts) == 1
            else {"by_nodes": {str(n): v for n, v in by_nodes.items()}}
        )
        print(json.dumps(doc, indent=1))
    else:
        for n in node_counts:
            table(by_nodes[n], systems)
    # a peer that broke is a figure of the comparison; netmorph breaking is a defect of ours
    mine = ("netmorph", "netmorph_schedules")
    return 1 if any(v.get(s, {}).get("failed_runs") for v in by_nodes.values() for s in mine) else 0


FIGURES = ("steady_step_s", "recovery_s", "steps_redone", "heal_s")


def measure(nodes: int, args, systems, tmp) -> dict:
    """Every system's figures on ``nodes`` nodes, medians over the repeats; a run that failed is counted in
    ``failed_runs`` with its first error line in ``failure`` (a peer that breaks is a result, not a crash)."""
    results = {s: [] for s in systems}
    for i in range(args.repeats):
        for s in systems:
            print(f"torchft_peer: {nodes} nodes, {s}, run {i + 1} of {args.repeats}", file=sys.stderr, flush=True)
            k, ks = args.nproc_per_node, args.kill_step
            try:
                if s == "ddp":
                    results[s].append(run_ddp(nodes, k, tmp, ks))
                elif s == "torchrun_restart":
                    results[s].append(run_ddp(nodes, k, tmp, ks, args.checkpoint_every, restart=True))
                elif s == "torchft":
                    results[s].append(run_torchft(nodes, k, tmp, ks))
                else:
                    results[s].append(run_netmorph(nodes, k, tmp, ks, "torch-native" if s == "netmorph" else "torch"))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                reason = _reason(str(e))
                print(f"torchft_peer: {nodes} nodes, {s} failed: {reason}", file=sys.stderr, flush=True)
                results[s].append({"failed": reason})
    out = {
        "nodes": nodes,
        "nproc_per_node": args.nproc_per_node,
        "steps": STEPS,
        "kill_step": args.kill_step,
        "repeats": args.repeats,
    }
    for s, runs in results.items():
        ok = [r for r in runs if "failed" not in r]
        out[s] = {
            k: (statistics.median(v) if (v := [r[k] for r in ok if r.get(k) is not None]) else None) for k in FIGURES
        }
        out[s]["failed_runs"] = len(runs) - len(ok)
        if len(ok) < len(runs):
            out[s]["failure"] = next(r["failed"] for r in runs if "failed" in r)
    return out


def _reason(err: str) -> str:
    """The worker's own exception out of a failed run's stderr: the last line naming one that is not torchrun's
    summary of it (ChildFailedError) nor a frame of the traceback."""
    import re

    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    named = [
        ln
        for ln in lines
        if re.search(r"\w+(Error|Exception|Timeout)\b|^\S*\s*assert ", ln)
        and not re.match(r"(\[\w+\]:\s*)?File ", ln)
        and "ChildFailedError" not in ln
        and "elastic" not in ln
    ]
    return (named[-1] if named else lines[-1] if lines else "no output")[:300]


def table(out: dict, systems) -> None:
    nodes, k = out["nodes"], out["nproc_per_node"]
    print(
        f"# the GPT job, data-parallel over {nodes} nodes x {k} workers (gloo, 127.0.0.1), "
        f"{STEPS} steps, one worker of the last node SIGKILLed in step {out['kill_step']}; medians of "
        f"{out['repeats']} runs"
    )
    print(
        f"{'system':<18} {'steady step (ms)':>16} {'x DDP':>6} {'recovery (s)':>12} {'steps redone':>12} "
        f"{'heal (s)':>9} {'failed':>6}"
    )
    base = out.get("ddp", {}).get("steady_step_s")

    def f(v, fmt, width):
        return format("-" if v is None else format(v, fmt), f">{width}")

    for s in systems:
        r = out[s]
        step = r["steady_step_s"]
        print(
            f"{s:<18} {f(step and step * 1e3, '.1f', 16)} {f(step / base if base and step else None, '.2f', 6)} "
            f"{f(r['recovery_s'], '.2f', 12)} {f(r['steps_redone'], '.0f', 12)} {f(r['heal_s'], '.2f', 9)} "
            f"{r['failed_runs']:>6}"
        )
    for s in systems:
        if out[s].get("failure"):
            print(f"# {s} failed {out[s]['failed_runs']} of {out['repeats']} runs: {out[s]['failure']}")
    print(
        "# heal '-': the restarted node was not back before the last step (raise --steps), or the system has "
        "no restarted node"
    )
    nm, ft, rs = (out.get(s, {}) for s in ("netmorph", "torchft", "torchrun_restart"))
    if nm.get("steady_step_s") and ft.get("steady_step_s"):
        print(
            f"# netmorph's steady step {nm['steady_step_s'] / ft['steady_step_s']:.2f}x torchft's (goal <= 1); "
            f"recovery {nm['recovery_s'] / ft['recovery_s']:.2f}x torchft's (goal <= 1)"
        )
    if nm.get("recovery_s") and rs.get("recovery_s"):
        print(
            f"# netmorph recovers {rs['recovery_s'] / nm['recovery_s']:.1f}x faster than torchrun's restart "
            f"(goal >= 5x) and redoes {nm['steps_redone']:.0f} step(s) to its {rs['steps_redone']:.0f}"
        )
    print()


if __name__ == "__main__":
    STEPS = int(os.environ.get("STEPS", STEPS))
    sys.exit(main())
