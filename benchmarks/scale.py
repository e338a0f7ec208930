"""How fast the schedule machinery counts and simulates at scale.

Issue target: counting and simulating a ring all-reduce on 4096 ranks (33 million
transfers) in under 2 seconds. Rounds are held as numpy arrays and the executors
work a round at a time; this prints the figure for 1024 / 4096 / 16384 ranks.

    python benchmarks/scale.py [--worlds 1024,4096,16384] [--bytes 1GiB] [--topology flat]
"""

from __future__ import annotations

import argparse
import time

from netmorph.collectives import build
from netmorph.cost.simulate import simulate
from netmorph.cost.topology import load_topology
from netmorph.schedule import count
from netmorph.units import fmt_time, parse_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", default="1024,4096,16384")
    ap.add_argument("--bytes", default="1GiB")
    ap.add_argument("--algo", default="ring")
    ap.add_argument("--topology", default="flat")
    args = ap.parse_args()
    nbytes = parse_size(args.bytes)
    topo = load_topology(args.topology)
    print(f"# {args.algo} all-reduce of {args.bytes} per rank on topology {topo.name}")
    print(
        f"{'ranks':>7} {'rounds':>7} {'transfers':>12} {'build':>10} {'count':>10} {'simulate':>10} "
        f"{'count+sim':>10} {'total':>10} {'predicted':>12}"
    )
    for p in (int(x) for x in args.worlds.split(",")):
        t0 = time.perf_counter()
        s = build("allreduce", args.algo, p, nbytes // 4, 4)
        t1 = time.perf_counter()
        c = count(s)
        t2 = time.perf_counter()
        r = simulate(s, topo)
        t3 = time.perf_counter()
        print(
            f"{p:>7} {c.rounds:>7} {c.messages:>12,} {t1 - t0:>9.3f}s {t2 - t1:>9.3f}s {t3 - t2:>9.3f}s "
            f"{t3 - t1:>9.3f}s {t3 - t0:>9.3f}s {fmt_time(r.time):>12}",
            flush=True,
        )


if __name__ == "__main__":
    main()
