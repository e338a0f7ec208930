"""What a checkpoint costs the step: no save, a synchronous save and an asynchronous save every N steps.

The trainer's GPT (float32 by default) on ``--world`` local ranks, data-parallel with ZeRO-1 unless ``--layout``
says otherwise, ``--compute-ms`` of emulated compute per microbatch forward so that a step is a step and not the
scheduler. Three runs of the same steps, side by side in one process: no ``--save``; ``--save DIR --save-every
N`` (the step waits for the write: DCP's plan exchange, every rank's ``.distcp`` fsynced, the metadata, the
rename); ``--async-save`` (the step copies its shards to host memory and exchanges the plan, a thread writes
them -- torchtitan's ``async_mode="async"``). Prints per mode the median step, the median of the steps that saved
and the run's wall time, and per save its size, its time and bandwidth (for async, the part the step waited).

    python benchmarks/checkpoint_save.py [--world 4] [--layers 4] [--hidden 512] [--steps 24] [--every 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time

from netmorph.checkpoint import Checkpointing
from netmorph.mesh.shape import ModelShape
from netmorph.parallel.config import TrainConfig
from netmorph.parallel.run import train


def run(args, ck: Checkpointing) -> dict:
    model = ModelShape(layers=args.layers, hidden=args.hidden, heads=8, seq=64, vocab=512)
    cfg = TrainConfig.make(
        model,
        dp=args.world,
        zero=1,
        microbatches=2,
        micro_batch_size=1,
        steps=args.steps,
        dtype=args.dtype,
        compute_ms=args.compute_ms,
        checkpoint=ck,
    )
    t0 = time.perf_counter()
    out = train(cfg, timeout=120)
    wall = time.perf_counter() - t0
    saves = out.checkpoints or []
    saving = {c["step"] for c in saves}
    steps = out.step_times_s[1:]  # the first step builds the modules
    with_save = [t for k, t in enumerate(out.step_times_s, 1) if k in saving and k > 1]
    return {
        "params": model.params(),
        "median_step_s": statistics.median(steps),
        "median_save_step_s": statistics.median(with_save) if with_save else None,
        "wall_s": wall,
        "saves": [{k: c[k] for k in ("step", "bytes", "save_s", "staged_s", "blocked_s")} for c in saves],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--compute-ms", type=float, default=40.0)
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="netmorph-ckpt-bench-")
    try:
        out = {"none": run(args, Checkpointing())}
        out["sync"] = run(args, Checkpointing(save=f"{root}/sync", every=args.every, keep=1))
        out["async"] = run(args, Checkpointing(save=f"{root}/async", every=args.every, keep=1, async_save=True))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    size = out["sync"]["saves"][0]["bytes"]
    print(
        f"# GPT l{args.layers} h{args.hidden} ({out['none']['params']:,} params, {args.dtype}), dp{args.world} "
        f"ZeRO-1, {args.steps} steps, --compute-ms {args.compute_ms:g}; a checkpoint every {args.every} steps: "
        f"{size / 1e6:.1f} MB (parameters and Adam's two moments, DCP's format)"
    )
    print(
        f"{'mode':<6} {'median step (ms)':>16} {'step with a save (ms)':>22} {'wall (s)':>9} "
        f"{'save (ms)':>10} {'MB/s':>7} {'step waited (ms)':>17}"
    )
    for mode, r in out.items():
        saves = r["saves"]
        save_s = statistics.median(c["save_s"] for c in saves) if saves else None
        waited = statistics.median(c["staged_s"] + c["blocked_s"] for c in saves) if saves else None
        if mode == "sync" and saves:
            waited = save_s
        print(
            f"{mode:<6} {1e3 * r['median_step_s']:>16.1f} "
            f"{'-' if r['median_save_step_s'] is None else format(1e3 * r['median_save_step_s'], '.1f'):>22} "
            f"{r['wall_s']:>9.2f} {'-' if save_s is None else format(1e3 * save_s, '.0f'):>10} "
            f"{'-' if save_s is None else format(size / save_s / 1e6, '.0f'):>7} "
            f"{'-' if waited is None else format(1e3 * waited, '.0f'):>17}"
        )
    base = out["none"]["median_step_s"]
    for mode in ("sync", "async"):
        s = out[mode]["median_save_step_s"]
        if s:
            print(f"# {mode}: a step that saves takes {s / base:.2f}x a step that does not")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
