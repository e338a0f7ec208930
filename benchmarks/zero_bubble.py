"""The zero-bubble schedules' bubbles measured beside 1F1B's, with emulated compute (F, B and W timed apart), one run.

Issue targets, at pp 4 with 8 microbatches: ZB-H1's ``bubble_fraction.measured`` at most 0.6x 1F1B's and ZB-V's
at most 0.4x (theory at F = B = W: ZB-H1 (p-1)/(3m+p-1), ZB-V and DualPipeV (p-1)/(6m+p-1), against 1F1B's
(p-1)/(m+p-1)); DualPipeV is printed beside them. Each schedule trains a small GPT for --steps steps with
--compute-ms of emulated compute per stage forward (1F1B's backward sleeps twice that; a zero-bubble B and W
once each; a V's chunk half of each), the four alternated and run twice so a slow spell of the machine falls on
all; the better of the two of each is kept. Beside each bubble: the peak microbatches in flight and the
weight-gradient stash every rank held, measured and as the memory model counts them. Exits 1 past a target.

    python benchmarks/zero_bubble.py [--pp 4] [--microbatches 8] [--compute-ms 20] [--steps 4]
"""

from __future__ import annotations

import argparse
import sys

from netmorph.mesh.shape import ModelShape
from netmorph.parallel.config import TrainConfig
from netmorph.parallel.run import train
from netmorph.planner.memory import wgrad_stash_elements

SCHEDULES = ("1f1b", "zb-h1", "zbv", "dualpipev")
TARGETS = {"zb-h1": 0.6, "zbv": 0.4}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--compute-ms", type=float, default=20.0)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    if args.pp < 2 or args.microbatches < 2 * args.pp:
        print("zero_bubble.py: --pp must be >= 2 and --microbatches >= 2·pp (DualPipeV's least)", file=sys.stderr)
        return 2
    model = ModelShape(layers=2 * args.pp, hidden=32, heads=4, seq=16, vocab=64)
    best, cfgs = {}, {}
    for name in SCHEDULES * 2:
        cfg = cfgs[name] = TrainConfig.make(
            model=model,
            pp=args.pp,
            schedule=name,
            microbatches=args.microbatches,
            steps=args.steps,
            compute_ms=args.compute_ms,
        )
        out = train(cfg)
        if name not in best or out.bubble_fraction["measured"] < best[name].bubble_fraction["measured"]:
            best[name] = out
    base = best["1f1b"].bubble_fraction["measured"]
    print(
        f"{'schedule':<10} {'bubble measured':>15} {'theory':>7} {'vs 1f1b':>7} {'step(ms)':>9} "
        f"{'in flight, chunks: measured = model':>36} {'W stash B (worst rank): measured = model':>41}"
    )
    ok = True
    for name, out in best.items():
        b, lay = out.bubble_fraction, cfgs[name].layout
        ratio = b["measured"] / base
        flight = [out.in_flight_peak[r] for r in sorted(out.in_flight_peak)]
        model_flight = [int(lay.in_flight(r) * lay.interleave) for r in range(lay.pp)]
        ins, grads = wgrad_stash_elements(model, lay)
        model_stash = (
            max(lay.w_stash(r) for r in range(lay.pp))
            * model.layers
            / lay.pp
            * (ins + grads)
            * cfgs[name].wire_sizes()[0]
        )
        stash = out.memory_bytes["wgrad_stash_peak"]
        print(
            f"{name:<10} {b['measured']:>15.1%} {b['theory']:>7.1%} {ratio:>6.2f}x {1e3 * out.step_time_s:>9.1f} "
            f"{str(flight) + ' = ' + str(model_flight):>36} {f'{stash:,} = {model_stash:,.0f}':>41}"
        )
        if name in TARGETS and ratio > TARGETS[name]:
            ok = False
    print(
        f"# pp {args.pp}, {args.microbatches} microbatches, {args.compute_ms:g} ms emulated per stage forward; "
        "targets: "
        + ", ".join(
            f"{n} <= {t}x 1F1B's bubble ({'met' if best[n].bubble_fraction['measured'] / base <= t else 'NOT met'})"
            for n, t in TARGETS.items()
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
