"""ZB-H1's bubble measured beside 1F1B's, with emulated compute (F, B and W timed apart), one run.

Issue target: at pp 4 with 8 microbatches ZB-H1's ``bubble_fraction.measured`` at most 0.6x 1F1B's (the paper's
theory at F = B = W: 0.41x here, (p-1)/(3m+p-1) against (p-1)/(m+p-1)). Each schedule trains a small GPT for
--steps steps with --compute-ms of emulated compute per forward (1F1B's backward sleeps twice that; ZB-H1's B
and W once each), alternated and run twice so a slow spell of the machine falls on both; the better of the two
of each is kept. Exits 1 past the target.

    python benchmarks/zero_bubble.py [--pp 4] [--microbatches 8] [--compute-ms 20] [--steps 4]
"""

from __future__ import annotations

import argparse
import sys

from netmorph.mesh.shape import ModelShape
from netmorph.parallel.hybrid import TrainConfig
from netmorph.parallel.run import train


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--compute-ms", type=float, default=20.0)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    model = ModelShape(layers=2 * args.pp, hidden=32, heads=4, seq=16, vocab=64)
    best = {}
    for name in ("1f1b", "zb-h1", "1f1b", "zb-h1"):
        cfg = TrainConfig.make(model=model, pp=args.pp, schedule=name, microbatches=args.microbatches,
                               steps=args.steps, compute_ms=args.compute_ms)
        out = train(cfg)
        if name not in best or out.bubble_fraction["measured"] < best[name].bubble_fraction["measured"]:
            best[name] = out
    print(f"{'schedule':<8} {'bubble measured':>15} {'theory':>7} {'step(ms)':>9} {'peak in flight':>14}")
    for name, out in best.items():
        b = out.bubble_fraction
        print(f"{name:<8} {b['measured']:>15.1%} {b['theory']:>7.1%} {1e3 * out.step_time_s:>9.1f} "
              f"{out.in_flight_peak[0]:>14}")
    ratio = best["zb-h1"].bubble_fraction["measured"] / best["1f1b"].bubble_fraction["measured"]
    ok = ratio <= 0.6
    print(f"# pp {args.pp}, {args.microbatches} microbatches, {args.compute_ms:g} ms emulated per forward: ZB-H1's "
          f"bubble {ratio:.2f}x 1F1B's ({'within' if ok else 'NOT within'} the 0.6x target; theory "
          f"{best['zb-h1'].bubble_fraction['theory'] / best['1f1b'].bubble_fraction['theory']:.2f}x)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
