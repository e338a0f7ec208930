"""How fast, and how right, a stopped rank is named: `kill -STOP` one rank of `netmorph train` from outside.

For each layout, ``--runs`` times: start ``netmorph train`` (``--timeout T``), SIGSTOP a random rank mid-run
from this process, and time until the command exits; count the runs whose error names that rank as the root
cause, stopped by SIGSTOP. The goal (issue 26): every run right, within T + 1 s of the stop. Timed here, on a
machine that may be busy, not in the unit tests.

    python benchmarks/blame.py [--runs 10] [--timeout 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time

from netmorph.runtime.transport.blame import stop_rank

LAYOUTS = [
    ("tp2·pp2", ["--tp", "2", "--pp", "2"]),
    ("pp2·dp2", ["--pp", "2", "--dp", "2"]),
    ("tp2·dp2", ["--tp", "2", "--dp", "2"]),
    ("pp4", ["--pp", "4"]),
    ("dp4", ["--dp", "4"]),
    ("tp2·pp2·dp2", ["--tp", "2", "--pp", "2", "--dp", "2"]),
]
MODEL = [
    "--layers",
    "4",
    "--hidden",
    "16",
    "--heads",
    "2",
    "--seq",
    "8",
    "--vocab",
    "32",
    "--steps",
    "100000",
    "--compute-ms",
    "2",
]


def one(flags, timeout: float, rng: random.Random):
    """(right, seconds from the stop to the exit) for one run."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "netmorph", "train", *flags, *MODEL, "--timeout", str(timeout)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        world = 1
        for size in flags[1::2]:
            world *= int(size)
        after = 0.5 + rng.random()  # drawn in this order: --seed reproduces earlier runs
        victim = rng.randrange(world)
        pid = stop_rank(proc.pid, world, victim, after=after)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    first = err.splitlines()[0] if err else ""
    return (
        pid is not None
        and f"root cause: rank {victim} (pid {pid}): stopped answering (its process is stopped" in first,
        took,
        first,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    print(
        f"# netmorph train, one rank SIGSTOPped from outside mid-run, --timeout {args.timeout:g} s; "
        f"{args.runs} runs per layout; seconds from the stop to the command's exit"
    )
    print(f"{'layout':<12} {'right':>7} {'median s':>9} {'max s':>7}  within T + 1 s")
    wrong = 0
    for name, flags in LAYOUTS:
        results = [one(flags, args.timeout, rng) for _ in range(args.runs)]
        right = sum(r for r, _, _ in results)
        wrong += args.runs - right
        times = [t for _, t, _ in results]
        inside = sum(t <= args.timeout + 1 for t in times)
        print(
            f"{name:<12} {right:>3}/{args.runs:<3} {statistics.median(times):>9.2f} {max(times):>7.2f}  "
            f"{inside}/{args.runs}",
            flush=True,
        )
        for r, _, first in results:
            if not r:
                print(f"  wrong: {first}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
