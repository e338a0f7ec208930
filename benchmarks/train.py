"""Parallel training speed, side by side in one run: netmorph's data parallelism against PyTorch DDP
and the no-communication bound, and the pipeline schedules' measured bubbles.

Goal (the parallel-training issue): netmorph DP (bucketed + overlap) at >= 95% of the
no-communication bound at dp 2 and dp 4, never below DDP on gloo. The bound is the
same ranks stepping the same model with gradient synchronisation skipped.
Bubbles are measured with emulated compute (``compute_ms``), so 8 processes on 2
cores time the schedule, not the scheduler.

    python benchmarks/train.py [--steps 12] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics

from netmorph.mesh.shape import ModelShape
from netmorph.parallel.hybrid import TrainConfig
from netmorph.parallel.run import baselines, train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model = ModelShape()
    print(f"# default GPT ({model.params():,} params), float32, {args.steps} steps, medians of {args.repeats} "
          f"alternating runs; tokens/s")
    print(f"{'dp':>3} {'naive':>9} {'bucket':>9} {'no-overlap':>10} {'DDP':>9} {'no-comm':>9} "
          f"{'bucket/bound':>12} {'DDP/bound':>9}")
    for dp in (2, 4):
        runs = {k: [] for k in ("naive", "bucket", "no-overlap", "ddp", "bound")}
        for _ in range(args.repeats):
            for mode in ("naive", "bucket", "no-overlap"):
                cfg = TrainConfig.make(model=model, dp=dp, steps=args.steps, dtype="float32",
                                  dp_mode="naive" if mode == "naive" else "bucket", overlap=mode == "bucket")
                runs[mode].append(train(cfg).tokens_per_s)
            b = baselines(TrainConfig.make(model=model, dp=dp, steps=args.steps, dtype="float32"))
            runs["ddp"].append(b["tokens_per_s"])
            runs["bound"].append(b["no_comm_tokens_per_s"])
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(f"{dp:>3} {med['naive']:>9,.0f} {med['bucket']:>9,.0f} {med['no-overlap']:>10,.0f} "
              f"{med['ddp']:>9,.0f} {med['bound']:>9,.0f} {med['bucket'] / med['bound']:>12.0%} "
              f"{med['ddp'] / med['bound']:>9.0%}")
    print("\n# 8 ranks, the same global batch of 32: 3D against pure data parallelism (tokens/s, step ms)")
    for label, kw in (("dp8", dict(dp=8, microbatches=2)), ("tp2 pp2 dp2", dict(tp=2, pp=2, dp=2, microbatches=8)),
                      ("tp2 pp2 dp2 ZeRO-1", dict(tp=2, pp=2, dp=2, zero=1, microbatches=8))):
        out = train(TrainConfig.make(model=model, steps=args.steps // 2 + 1, dtype="float32", **kw))
        print(f"{label:<20} {out.tokens_per_s:>9,.0f} {out.step_time_s * 1e3:>8.1f} ms")
    print("\n# pipeline bubble, pp 4, 8 microbatches, 20 ms emulated compute per forward")
    print(f"{'schedule':<16} {'measured':>9} {'theory':>8}")
    for name, v in (("afab", 1), ("1f1b", 1), ("interleaved", 2)):
        cfg = TrainConfig.make(model=ModelShape(layers=8, hidden=32, seq=16), pp=4, schedule=name, interleave=v,
                          microbatches=8, steps=3, compute_ms=20.0)
        b = train(cfg).bubble_fraction
        print(f"{name + (' v=2' if v > 1 else ''):<16} {b['measured']:>9.1%} {b['theory']:>8.1%}")


if __name__ == "__main__":
    main()
