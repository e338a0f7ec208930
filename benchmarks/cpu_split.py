"""Where a layout's CPU goes, rank by rank: is the step waiting, or is the machine full?

Where local ranks outnumber the cores, a training step can be bound by the cores (every core busy the whole
step: the step is the ranks' summed CPU over the cores, and what the model must get right is each rank's CPU)
or by waits (cores idle while ranks sleep on a peer: what the model must get right is the critical path). This
trains one layout of ``netmorph validate local`` and prints, per rank and per step after the warm-up: the wall
time, the process's CPU time (``time.process_time``), and the CPU and wall time inside the communicator's
collectives and point-to-point calls (the calls are timed where the trainer makes them, each outermost call
once), then the cores the step kept busy -- the summed CPU over the wall. With ``--profile`` (a ``netmorph
calibrate`` profile of the same world) it prints beside them the planner's compute for the busiest stage, one
rank alone (its every-rank-busy compute over the profile's ``core_sharing``) and every rank busy, and its step.

    python benchmarks/cpu_split.py --world 8 --model medium --layout tp2.pp1.dp4.sp [--profile P.json]

On the 2-core VM this was written on (world 8, medium, one run each, the profile of an earlier calibration):
- tp1·pp1·dp8: 1.96 cores busy; 168-180 ms of CPU a rank a step, 18 of it in its 8 all-reduce calls; the CPU
  outside them 150-161 ms against the planner's compute alone 145 (1.04-1.11x): the machine is full, and the
  model's compute is the ranks' CPU.
- tp2·pp1·dp4·sp: 1.99 cores busy; 286-304 ms a rank, 113-140 of it in 290 collective calls (0.39-0.48 ms of CPU
  each, against 0.26 ms for the same ring of 64 KiB on 2 ranks alone; 2.3-2.7 ms of wall); outside them 152-183
  ms against the planner's 98 (1.6-1.8x): the step is the cores', and the model misses CPU around the collectives
  (likely: each call blocks, and a rank that slept comes back to cold caches; the reference GPT core_sharing is
  measured on never blocks -- not tested). The planner: 907 ms, measured 1185.
- tp1·pp8·dp1·1f1b: 1.78 cores busy; 29-32 ms of CPU a rank in a 134 ms step: the step is its critical path
  (waits), not the cores. The planner: 130 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from netmorph.calibrate.validate import MODELS, Row, layouts, planner_layout
from netmorph.errors import UsageError
from netmorph.parallel.config import TrainConfig
from netmorph.parallel.hybrid import train_rank
from netmorph.planner.hardware import load_hardware
from netmorph.planner.timing import step_time
from netmorph.runtime.base import CommBase
from netmorph.runtime.comm import Comm
from netmorph.runtime.launch import launch

WARMUP = 2
CALLS = (
    (Comm, ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")),
    (CommBase, ("send", "recv", "isend")),
)


def _timed(acc: dict, method):
    """``method`` with its CPU and wall time added to ``acc`` -- only a thread's outermost call (a collective's
    own sends are inside it; the trainer's gradient buckets are all-reduced from a thread of their own, beside
    the main thread's calls)."""

    def call(self, *args, **kwargs):
        if getattr(acc["inside"], "depth", 0):
            return method(self, *args, **kwargs)
        acc["inside"].depth = 1
        c0, w0 = time.thread_time(), time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            with acc["lock"]:
                acc["cpu"] += time.thread_time() - c0
                acc["wall"] += time.perf_counter() - w0
                acc["calls"] += 1
            acc["inside"].depth = 0

    return call


def rank_split(comm, cfg: TrainConfig) -> dict:
    """This rank's means per step after :data:`WARMUP`: wall, process CPU, and CPU, wall and calls inside the
    communicator."""
    acc = {"cpu": 0.0, "wall": 0.0, "calls": 0, "inside": threading.local(), "lock": threading.Lock()}
    for cls, names in CALLS:
        for name in names:
            setattr(cls, name, _timed(acc, getattr(cls, name)))  # this rank's process only
    marks = []

    def after(done, state, loss):
        marks.append((time.perf_counter(), time.process_time(), acc["cpu"], acc["wall"], acc["calls"]))

    train_rank(comm, cfg, commit=after)
    first, last = marks[WARMUP - 1], marks[-1]
    n = len(marks) - WARMUP
    return dict(
        zip(("wall_s", "cpu_s", "comm_cpu_s", "comm_wall_s", "calls"), ((b - a) / n for a, b in zip(first, last)))
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=8, help="local ranks (default 8)")
    ap.add_argument("--model", default="medium", choices=sorted(MODELS))
    ap.add_argument("--layout", default="tp2.pp1.dp4.sp", help="a validate layout's name, '.' for '·'")
    ap.add_argument("--steps", type=int, default=10, help=f"training steps, the first {WARMUP} not counted")
    ap.add_argument("--profile", help="a `netmorph calibrate` profile of the same world: the model's side")
    args = ap.parse_args()
    model = MODELS[args.model]
    name = args.layout.replace(".", "·")
    found = {Row(args.model, lay, 1, 1, {}).name: lay for lay in layouts(model, args.world)}
    if name not in found or args.steps <= WARMUP:
        print(
            f"cpu_split: --layout must be one of {', '.join(found)} (dots for '·') and --steps over {WARMUP}",
            file=sys.stderr,
        )
        return 2
    hw = None
    if args.profile:
        try:
            hw = load_hardware(args.profile)
        except UsageError as e:
            print(f"cpu_split: {e}", file=sys.stderr)
            return 2
    cfg = TrainConfig(model=model, layout=found[name], steps=args.steps, dtype="float32")
    out = launch(rank_split, cfg.world, cfg, timeout=300)
    wall = statistics.median(r["wall_s"] for r in out)
    print(f"# {args.model} {name} on {args.world} local ranks: per rank per step, the mean over {args.steps - WARMUP}")
    print(
        f"{'rank':>4} {'wall ms':>9} {'cpu ms':>8} {'in comm: cpu ms':>16} {'wall ms':>8} {'calls':>6} "
        f"{'cpu/call ms':>12} {'cpu outside':>12}"
    )
    for k, r in enumerate(out):
        per = r["comm_cpu_s"] / r["calls"] if r["calls"] else 0.0
        print(
            f"{k:>4} {1e3 * r['wall_s']:>9.1f} {1e3 * r['cpu_s']:>8.1f} {1e3 * r['comm_cpu_s']:>16.1f} "
            f"{1e3 * r['comm_wall_s']:>8.1f} {r['calls']:>6.0f} {1e3 * per:>12.3f} "
            f"{1e3 * (r['cpu_s'] - r['comm_cpu_s']):>12.1f}"
        )
    print(f"# cores kept busy: {sum(r['cpu_s'] for r in out) / wall:.2f} (the ranks' CPU summed over the step's wall)")
    if hw is not None:
        pred = step_time(model, planner_layout(found[name], "float32", model), hw)
        print(
            f"# the planner on {args.profile}: compute {1e3 * pred.compute_s / hw.core_sharing:.1f} ms one rank "
            f"alone, {1e3 * pred.compute_s:.1f} ms every rank busy (core_sharing {hw.core_sharing:.2f}); "
            f"step {1e3 * pred.step_time_s:.1f} ms against {1e3 * wall:.1f} ms measured"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
