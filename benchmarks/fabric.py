"""The local shared-memory fabric against torch.distributed's gloo, side by side in one run.

Issue target: a 16 MiB float32 all-reduce reaches at least 5x the bus bandwidth
of ``torch.distributed.all_reduce`` (gloo) at world 2 and at world 4; 8-byte
latency is reported against gloo too, and the bus bandwidth as a fraction of
this machine's single-core memory-copy bandwidth. Each configuration runs
``--repeats`` times, local and gloo alternating; medians are reported.

Then the price of collective fingerprints (a checked 64-byte header on every
message): the same all-reduces with them on and off, in alternating blocks within
one launch. Issue target: the 16 MiB bus bandwidth drops by at most 3%.

    python benchmarks/fabric.py [--worlds 2,4] [--bytes 16MiB] [--repeats 5] [--iters 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from netmorph.collectives import bandwidths
from netmorph.runtime import launch
from netmorph.runtime.bench import Case, measure, memcpy_bandwidth
from netmorph.units import parse_size

LOCAL_ALGOS = ["ring", "rabenseifner", "double_binary_tree", "two_shot"]
SMALL_ALGOS = ["recursive_doubling", "one_shot"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--bytes", default="16MiB")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    n = parse_size(args.bytes)
    copy_bw = memcpy_bandwidth(n)
    print(f"# all-reduce float32, {n:,} B; memcpy bandwidth of one core here: {copy_bw:.2f} GB/s")
    print(f"# medians of {args.repeats} alternating runs, {args.iters} timed iterations each")
    print(
        f"{'world':>5} {'backend':>12} {'algorithm':>20} {'bytes':>10} {'time(us)':>10} {'busbw(GB/s)':>11} "
        f"{'x gloo':>7} {'of memcpy':>9} {'#wrong':>6}"
    )
    for p in (int(x) for x in args.worlds.split(",")):
        local_cases = [Case("allreduce", a, n) for a in LOCAL_ALGOS] + [Case("allreduce", a, 8) for a in SMALL_ALGOS]
        gloo_cases = [Case("allreduce", "native", n), Case("allreduce", "native", 8)]
        runs_l, runs_g = [], []
        for _ in range(args.repeats):
            runs_l.append(measure(local_cases, p, "local", iters=args.iters, warmup=3, in_place_only=True))
            runs_g.append(measure(gloo_cases, p, "torch-native", iters=args.iters, warmup=3, in_place_only=True))

        def med(runs, k, key):
            return statistics.median(r[k][key] for r in runs)

        gloo_bw = med(runs_g, 0, "busbw_gbps")
        gloo_lat = med(runs_g, 1, "time_s")
        rows = []
        for k, c in enumerate(local_cases):
            rows.append((c, med(runs_l, k, "time_s"), med(runs_l, k, "busbw_gbps"), sum(r[k]["wrong"] for r in runs_l)))
        for c, t, bw, wrong in rows:
            big = c.nbytes == n
            ratio = f"{bw / gloo_bw:.1f}x" if big else f"{gloo_lat / t:.1f}x"
            frac = f"{bw / copy_bw:.0%}" if big else ""
            print(
                f"{p:>5} {'local':>12} {c.algo:>20} {c.nbytes:>10,} {t * 1e6:>10.1f} {bw if big else 0:>11.2f} "
                f"{ratio:>7} {frac:>9} {wrong:>6}"
            )
        for k, c in enumerate(gloo_cases):
            t, bw = med(runs_g, k, "time_s"), med(runs_g, k, "busbw_gbps")
            wrong = sum(r[k]["wrong"] for r in runs_g)
            print(
                f"{p:>5} {'gloo':>12} {'torch-native':>20} {c.nbytes:>10,} {t * 1e6:>10.1f} "
                f"{bw if c.nbytes == n else 0:>11.2f} {'1.0x':>7} {'':>9} {wrong:>6}"
            )
        best = max((r for r in rows if r[0].nbytes == n), key=lambda r: r[2])
        print(
            f"# world {p}: best local {best[0].algo} {best[2]:.2f} GB/s = {best[2] / gloo_bw:.1f}x gloo "
            f"({gloo_bw:.2f} GB/s); 8-byte latency {min(r[1] for r in rows if r[0].nbytes == 8) * 1e6:.0f} us "
            f"vs gloo {gloo_lat * 1e6:.0f} us",
            flush=True,
        )
    fingerprint_cost(args, n)


def _interleaved(comm, algo, nbytes, blocks, iters):
    """Blocks of ``iters`` all-reduces, fingerprints on and off in turn, in one launch: both halves
    see the same processes, cores and cache state (launch-to-launch spread here is larger than the
    effect measured)."""
    x = comm.alloc(max(1, nbytes // 4), np.float32)
    times = {True: [], False: []}
    for _ in range(3):
        comm.all_reduce(x, algo=algo)
    for b in range(2 * blocks):
        on = bool(b % 2)
        comm.fingerprints = on  # every rank switches at the same call
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            comm.all_reduce(x, algo=algo)
        times[on].append((time.perf_counter() - t0) / iters)
    return {on: statistics.median(v) for on, v in times.items()}


def fingerprint_cost(args, n: int) -> None:
    """Bus bandwidth and latency with every message's fingerprint header checked, and without."""
    blocks = 3 * args.repeats
    print(
        f"\n# fingerprints on vs off, interleaved in one launch: medians of {blocks} blocks of {args.iters} "
        f"calls each way; slowest rank"
    )
    print(
        f"{'world':>5} {'algorithm':>20} {'bytes':>10} {'on(us)':>9} {'off(us)':>9} {'on busbw':>9} "
        f"{'off busbw':>9} {'change':>7}"
    )
    for p in (int(x) for x in args.worlds.split(",")):
        for algo, nbytes in (("ring", n), ("two_shot", n), ("ring", 8)):
            res = launch(_interleaved, p, algo, nbytes, blocks, args.iters)
            t_on, t_off = max(r[True] for r in res), max(r[False] for r in res)
            bw_on, bw_off = (bandwidths("allreduce", nbytes, t, p)[1] for t in (t_on, t_off))
            change = bw_on / bw_off - 1 if nbytes == n else t_on / t_off - 1
            what = "busbw" if nbytes == n else "time"
            print(
                f"{p:>5} {algo:>20} {nbytes:>10,} {t_on * 1e6:>9.1f} {t_off * 1e6:>9.1f} {bw_on:>9.2f} "
                f"{bw_off:>9.2f} {change:>+7.1%} {what}",
                flush=True,
            )


if __name__ == "__main__":
    main()
