"""Cluster-scale step simulation: ranks, events and wall time (issue goals: GPT-3 175B at 1024 ranks < 10 s,
a 1T model at 3072 ranks < 60 s, on 2 cores).

    python benchmarks/simulate.py
"""

from __future__ import annotations

from netmorph.mesh.layout import Batch, Knobs, Layout
from netmorph.mesh.presets import PRESETS as MODELS
from netmorph.planner.hardware import PRESETS as HARDWARE
from netmorph.simulate import simulate_config

CASES = [  # model, tp, pp, dp, microbatch, global batch, v, goal (s)
    ("gpt3-175b", 8, 8, 16, 1, 1536, 1, 10),
    ("gpt3-175b", 8, 8, 16, 1, 1536, 2, 10),
    ("ptdp-529.6b", 8, 35, 9, 1, 2520, 1, 60),
    ("ptdp-1t", 8, 64, 6, 1, 3072, 1, 60),
]


def main() -> None:
    hw = HARDWARE["a100-80g"]
    print(
        f"{'model':<12} {'split':<28} {'ranks':>6} {'events':>12} {'sim wall (s)':>12} {'goal':>6} "
        f"{'step (s)':>9} {'planner (s)':>11} {'diff':>7}"
    )
    for name, t, p, d, mb, gb, v, goal in CASES:
        c = Layout(
            tp=t,
            pp=p,
            dp=d,
            interleave=v,
            zero=0,
            batch=Batch(micro_batch_size=mb, global_batch=gb),
            knobs=Knobs(recompute="full", dp_overlap=True),
        )
        out = simulate_config(MODELS[name], c, hw)
        diff = out["step_time_s"] / out["planner_step_time_s"] - 1
        print(
            f"{name:<12} {c.label():<28} {out['ranks']:>6,} {out['events']:>12,} {out['sim_wall_s']:>12.2f} "
            f"{'<' + str(goal):>6} {out['step_time_s']:>9.2f} {out['planner_step_time_s']:>11.2f} {100 * diff:>+6.1f}%"
        )


if __name__ == "__main__":
    main()
