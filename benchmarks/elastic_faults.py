"""`netmorph elastic` under real faults, run as a user would: each scenario ``--runs`` times, all must survive.

- stop:      an outside ``kill -STOP`` of a worker mid-run (not the --hang flag: the process is frozen
             wherever it happens to be) -- the phi-accrual detector ejects it, the run finishes, the
             failure-free run's losses are met (``--check``);
- kill-2:    two workers SIGKILLed in the same step;
- kill-3:    three of four in the same step, down to --min-workers 1;
- below-min: two killed with --min-workers 3 -- the run must end with MembershipError as its root
             cause (exit 1), never a TimeoutError naming a survivor.

    python benchmarks/elastic_faults.py [--runs 20]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from netmorph.runtime.transport.blame import stop_rank


def elastic(*flags, stop_after: float | None = None, victim: int = 1):
    """Run ``netmorph elastic`` (4 workers, --check); with ``stop_after``, SIGSTOP worker ``victim`` that
    many seconds after every worker is up. (exit code, stdout, stderr, seconds)."""
    cmd = [
        sys.executable,
        "-m",
        "netmorph",
        "elastic",
        "--job",
        "lsq",
        "--workers",
        "4",
        "--timeout",
        "1",
        "--check",
        *flags,
    ]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if stop_after is not None:
        stop_rank(p.pid, 4, victim, after=stop_after)
    out, err = p.communicate(timeout=300)
    return p.returncode, out, err, time.monotonic() - t0


SCENARIOS = {
    "stop": lambda i: (
        elastic("--steps", "3000", stop_after=0.3 + 0.05 * (i % 10), victim=1 + i % 3),
        lambda code, out, err: code == 0 and "hang rank" in out and "✓" in out,
    ),
    "kill-2": lambda i: (
        elastic("--steps", "40", "--kill", f"1@{5 + i}", "--kill", f"2@{5 + i}"),
        lambda code, out, err: code == 0 and "kill ranks 1,2" in out and "✓" in out,
    ),
    "kill-3": lambda i: (
        elastic(
            "--steps",
            "40",
            "--min-workers",
            "1",
            "--kill",
            f"1@{5 + i}",
            "--kill",
            f"2@{5 + i}",
            "--kill",
            f"3@{5 + i}",
        ),
        lambda code, out, err: code == 0 and "kill ranks 1,2,3" in out and "✓" in out,
    ),
    "below-min": lambda i: (
        elastic("--steps", "40", "--min-workers", "3", "--kill", f"1@{5 + i}", "--kill", f"2@{5 + i}"),
        lambda code, out, err: (
            code == 1 and "root cause" in err and "MembershipError" in err.splitlines()[0] and "TimeoutError" not in err
        ),
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    print(f"# netmorph elastic, 4 workers, --timeout 1 s; {args.runs} runs of each scenario")
    print(f"{'scenario':<10} {'survived':>9} {'median s':>9}  as expected")
    failed = 0
    for name, make in SCENARIOS.items():
        good, times = 0, []
        for i in range(args.runs):
            (code, out, err, seconds), ok = make(i)
            times.append(seconds)
            if ok(code, out, err):
                good += 1
            else:
                failed += 1
                print(f"  {name} run {i}: exit {code}\n{out[-600:]}\n{err[-1200:]}", file=sys.stderr)
        times.sort()
        print(
            f"{name:<10} {good:>4}/{args.runs:<4} {times[len(times) // 2]:>9.2f}  "
            f"{'all' if good == args.runs else 'NOT ALL'}",
            flush=True,
        )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
