"""MoE step time on the local fabric against torch.distributed's own all_to_all_single (gloo), one run.

Issue target (report, no threshold): step time with ep 2 and ep 4 on the local fabric
vs the same model with ``--backend torch-native``, and the all-to-all's share of the
step. Medians over the steps after the first, slowest rank.

    python benchmarks/moe.py [--steps 12] [--eps 2,4]
"""

from __future__ import annotations

import argparse
import statistics

from netmorph.mesh.layout import Layout
from netmorph.moe import MoEConfig, moe_shape, train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--eps", default="2,4")
    args = ap.parse_args()
    print(f"{'ep':>3} {'backend':>13} {'step(ms)':>9} {'a2a(ms)':>8} {'a2a share':>9} {'a2a B/rank/step':>15}")
    for ep in (int(x) for x in args.eps.split(",")):
        rows = {}
        for backend in ("local", "torch-native", "local", "torch-native"):  # alternated, best of two
            out = train(
                MoEConfig.make(moe_shape(experts=2 * ep), split=Layout(ep=ep, dp=ep), steps=args.steps, backend=backend)
            )
            steps = out["steps"][1:]
            step = statistics.median(s["step_s"] for s in steps)
            a2a = statistics.median(s["a2a_s"] for s in steps)
            nbytes = statistics.median(max(s["a2a_bytes"]) for s in steps)
            if backend not in rows or step < rows[backend][0]:
                rows[backend] = (step, a2a, nbytes)
        for backend, (step, a2a, nbytes) in rows.items():
            print(
                f"{ep:>3} {backend:>13} {1e3 * step:>9.1f} {1e3 * a2a:>8.1f} {a2a / step:>9.0%} {nbytes:>15,.0f}",
                flush=True,
            )
        print(
            f"# ep {ep}: local step {rows['torch-native'][0] / rows['local'][0]:.2f}x faster than gloo's "
            f"all_to_all_single; all-to-all {rows['torch-native'][1] / max(rows['local'][1], 1e-9):.1f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
