"""Parallel training speed, side by side in one run: netmorph's data parallelism against PyTorch DDP
and the no-communication bound, and the pipeline schedules' measured bubbles.

Goal (the parallel-training and calibration issues): with one core per rank (dp 2 on 2 cores) netmorph DP
(bucketed + overlap) at least as fast as DDP and at >= 95% of the no-communication bound -- the same ranks
stepping the same model with gradient synchronisation skipped. The three alternate step by step in one
launch (A/B/C, A/B/C, ...: ``netmorph train --baseline ddp``), so a slow spell of the machine falls on all
three; each is the median step with its interquartile range, and a ratio is called only when the ranges
are apart. Beside it, the planner on a profile of the same ranks (``netmorph calibrate``, measured first)
says where the step goes: compute, the data-parallel reduction left exposed, the optimizer.
Bubbles are measured with emulated compute (``compute_ms``), so 8 processes on 2 cores time the
schedule, not the scheduler.

    python benchmarks/train.py [--steps 24] [--no-profile]
"""

from __future__ import annotations

import argparse

from netmorph.calibrate.run import calibrate
from netmorph.calibrate.validate import planner_layout
from netmorph.mesh.shape import ModelShape
from netmorph.parallel.config import TrainConfig
from netmorph.parallel.run import train
from netmorph.planner.hardware import hardware_from
from netmorph.planner.timing import step_time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--no-profile", action="store_true", help="skip the calibration and the planner's split")
    args = ap.parse_args()
    model = ModelShape()
    print(
        f"# default GPT ({model.params():,} params), float32, {args.steps} steps alternated A/B/C in one launch;"
        " median step in ms [interquartile range]"
    )
    print(
        f"{'dp':>3} {'netmorph':>21} {'DDP (gloo)':>21} {'no-comm':>21} {'netmorph/bound':>15} {'DDP/bound':>10}"
        "  verdicts"
    )
    for dp in (2, 4):
        cfg = TrainConfig.make(model=model, dp=dp, steps=args.steps, dtype="float32")
        out = train(cfg, baseline="ddp")
        b = out.baseline
        cell = {
            m: f"{1e3 * b[m]['median_s']:.1f} [{1e3 * b[m]['q1_s']:.1f}, {1e3 * b[m]['q3_s']:.1f}]"
            for m in ("netmorph", "ddp", "no_comm")
        }
        print(
            f"{dp:>3} {cell['netmorph']:>21} {cell['ddp']:>21} {cell['no_comm']:>21} {b['of_bound']:>15.0%} "
            f"{b['ddp_of_bound']:>10.0%}  vs DDP: {b['vs_ddp']}; vs the bound: {b['vs_bound']}",
            flush=True,
        )
        if not args.no_profile:
            hw = hardware_from(calibrate(dp), "the profile measured here")
            pred = step_time(model, planner_layout(cfg.layout, "float32", model), hw)
            gap = b["netmorph"]["median_s"] - b["no_comm"]["median_s"]
            print(
                f"    the planner on a profile of these {dp} ranks: step {1e3 * pred.step_time_s:.1f} ms = "
                f"compute {1e3 * pred.compute_s:.1f} + data-parallel exposed "
                f"{1e3 * pred.parts.data_parallel:.1f} ({1e3 * pred.comm_hidden_s:.1f} more hidden "
                f"behind the backward) + optimizer {1e3 * pred.optimizer_s:.1f}; "
                f"measured netmorph - no-comm: {1e3 * gap:+.1f} ms",
                flush=True,
            )
    print("\n# 8 ranks, the same global batch of 32: 3D against pure data parallelism (tokens/s, step ms)")
    for label, kw in (
        ("dp8", dict(dp=8, microbatches=2)),
        ("tp2 pp2 dp2", dict(tp=2, pp=2, dp=2, microbatches=8)),
        ("tp2 pp2 dp2 ZeRO-1", dict(tp=2, pp=2, dp=2, zero=1, microbatches=8)),
    ):
        out = train(TrainConfig.make(model=model, steps=args.steps // 2 + 1, dtype="float32", **kw))
        print(f"{label:<20} {out.tokens_per_s:>9,.0f} {out.step_time_s * 1e3:>8.1f} ms")
    print("\n# pipeline bubble, pp 4, 8 microbatches, 20 ms emulated compute per forward")
    print(f"{'schedule':<16} {'measured':>9} {'theory':>8}")
    for name, v in (("afab", 1), ("1f1b", 1), ("interleaved", 2)):
        cfg = TrainConfig.make(
            model=ModelShape(layers=8, hidden=32, seq=16),
            pp=4,
            schedule=name,
            interleave=v,
            microbatches=8,
            steps=3,
            compute_ms=20.0,
        )
        b = train(cfg).bubble_fraction
        print(f"{name + (' v=2' if v > 1 else ''):<16} {b['measured']:>9.1%} {b['theory']:>8.1%}")


if __name__ == "__main__":
    main()
