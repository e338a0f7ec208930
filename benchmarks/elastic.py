"""Recovery from a killed worker: netmorph in place vs Horovod-style rollback vs torchrun-style restart-all.

The same BSP job (4 workers, 60 steps) and the same two kills, recovered three ways,
``--repeats`` times, medians printed. Issue goal: in-place recovery (death -> next
completed step) at least 5x faster than the restart, and at most the step in flight
redone. The restart here forks warm processes and reloads a checkpoint from disk;
under real torchrun each restart also pays fresh interpreters and imports.

    python benchmarks/elastic.py [--repeats 5] [--checkpoint-every 10]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from netmorph.elastic.restart import restart_all
from netmorph.elastic.train import ElasticConfig, train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    args = ap.parse_args()
    cfg = ElasticConfig(workers=4, steps=60, kills=((2, 25), (1, 47)))
    runs = {"in place": [], "rollback": [], "restart": []}
    for _ in range(args.repeats):
        ip = train(cfg)
        runs["in place"].append(
            (sum(e["resumed_after_s"] for e in ip["events"]), sum(e["steps_redone"] for e in ip["events"]))
        )
        rb = train(replace(cfg, commit_every=args.checkpoint_every))
        runs["rollback"].append(
            (sum(e["resumed_after_s"] for e in rb["events"]), sum(e["steps_redone"] for e in rb["events"]))
        )
        rs = restart_all(replace(cfg, commit_every=args.checkpoint_every))
        runs["restart"].append(
            (sum(e["recovery_s"] for e in rs["events"]), sum(e["steps_redone"] for e in rs["events"]))
        )
    print(
        f"# 4 workers, kills in steps 25 and 47, checkpoint/commit every {args.checkpoint_every} steps; "
        f"medians of {args.repeats}"
    )
    print(f"{'recovery':<10} {'recovery (ms, 2 kills)':>22} {'steps redone':>12}")
    med = {k: (statistics.median(t for t, _ in v), statistics.median(s for _, s in v)) for k, v in runs.items()}
    for k, (t, s) in med.items():
        print(f"{k:<10} {1e3 * t:>22.1f} {s:>12.0f}")
    print(f"# in place recovers {med['restart'][0] / med['in place'][0]:.1f}x faster than restart-all")


if __name__ == "__main__":
    main()
