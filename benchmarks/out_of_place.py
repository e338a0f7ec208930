"""nccl-tests' headline column, out of place, beside in place, the protocol-free bound and gloo, in one run.

``netmorph bench allreduce``'s first column is the out-of-place all-reduce (``ncclAllReduce(sendbuff,
recvbuff, ...)``); it runs the schedule's out-of-place case (:func:`netmorph.schedule.out_of_place`: the first
round reads the send buffer, no copy in front). Per world and size, alternated ``--repeats`` times in one run
(fabric, bound, gloo, fabric, ...), medians of the slowest rank's mean time:

- fabric out of place and in place (``--algo auto``: the tuner's choice, named),
- the protocol-free bound: plain numpy processes doing the two-shot all-reduce's memory work over one shared
  mapping (:func:`netmorph.runtime.membound.two_shot_bound`), out of place and in place: their ratio is what a
  third buffer costs the memory system alone (a CPU reads a destination line before it writes it),
- gloo: ``torch.distributed.all_reduce`` (in place: torch has no out-of-place all-reduce).

Goal at 16 MiB, world 2 and 4: out of place >= 90% of in place, >= 70% of the bound, >= 2x gloo.
``--profile`` then profiles the fabric's 16 MiB out-of-place call (cProfile in every rank) and says where the
time goes: the memory work (landing, reducing), waiting for peers, the fingerprint checks, the rest.

    python benchmarks/out_of_place.py [--worlds 2,4] [--sizes 1MiB,4MiB,16MiB,64MiB] [--repeats 5] [--iters 10]
                                      [--profile] [--json]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time

import numpy as np

from netmorph.cost.topology import PRESETS
from netmorph.cost.tuner import auto_algo
from netmorph.runtime.bench import Case, measure
from netmorph.runtime.launch import launch
from netmorph.runtime.membound import two_shot_bound
from netmorph.units import parse_size

GOAL = 16 << 20
# cProfile's own functions, grouped by where a call's time goes (tottime: numpy's ufuncs count in their caller)
WHERE = {
    "memory work": ("land", "fused_reduce", "_pull_desc", "push", "_push_desc"),
    "waiting for and waking peers": ("_sleep", "wait", "wake", "_wait", "_check", "progress", "_drain", "pull", "ring"),
    "fingerprint checks": ("check", "write", "stamp", "_collective_fp", "open", "descriptor_pairs", "_template"),
}


def _profiled(comm, nbytes, iters):
    """One rank: the 16 MiB out-of-place all-reduce under cProfile; (seconds a call, {function: tottime})."""
    import time

    n = nbytes // 4
    x, out = comm.alloc(n, np.float32), comm.alloc(n, np.float32)
    for _ in range(3):
        comm.all_reduce_into_tensor(out, x)
    comm.barrier()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(iters):
        comm.all_reduce_into_tensor(out, x)
    prof.disable()
    t = (time.perf_counter() - t0) / iters
    stats = pstats.Stats(prof).stats
    return t, {f"{fn}:{line}:{name}": v[2] / iters for (fn, line, name), v in stats.items()}


def profile(p: int, nbytes: int, iters: int) -> dict:
    res = launch(_profiled, p, nbytes, iters, timeout=120)
    t = max(r[0] for r in res)
    groups = {k: 0.0 for k in WHERE} | {"the rest (Python around the calls)": 0.0}
    for _, funcs in res:
        for key, sec in funcs.items():
            name = key.rsplit(":", 1)[1]
            where = next((k for k, names in WHERE.items() if name in names), "the rest (Python around the calls)")
            groups[where] += sec / p
    top = {}
    for _, funcs in res:
        for key, sec in funcs.items():
            top[key] = top.get(key, 0.0) + sec / p
    return {
        "world": p,
        "bytes": nbytes,
        "call_s": t,
        "by_part_s": groups,
        "top": sorted(top.items(), key=lambda kv: -kv[1])[:8],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--sizes", default="1MiB,4MiB,16MiB,64MiB")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--profile", action="store_true", help="then profile the 16 MiB out-of-place call")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = ap.parse_args()
    try:
        worlds = [int(w) for w in args.worlds.split(",")]
        sizes = [parse_size(s) for s in args.sizes.split(",")]
    except ValueError as e:
        print(f"out_of_place: --worlds / --sizes: {e}", file=sys.stderr)
        return 2
    if any(w < 2 for w in worlds) or args.repeats < 1 or args.iters < 1:
        print("out_of_place: --worlds must be at least 2, --repeats and --iters at least 1", file=sys.stderr)
        return 2
    out = {"rows": [], "goals": [], "profiles": []}
    say = (lambda *a, **k: None) if args.json else print
    say(
        f"# all-reduce float32; medians of {args.repeats} alternated runs (fabric, bound, gloo), {args.iters} "
        f"timed calls each; busbw in GB/s (nccl-tests: algbw x 2(p-1)/p), slowest rank"
    )
    say(
        f"{'world':>5} {'bytes':>11} {'algorithm':>12} {'out-of-place':>12} {'in-place':>9} {'oop/in':>7} "
        f"{'bound':>7} {'oop/bound':>9} {'bound(in)':>9} {'bound o/i':>9} {'gloo':>6} {'oop/gloo':>8}"
    )
    t0 = time.monotonic()
    for p in worlds:
        fab, bound, bound_in, gloo = [], [], [], []
        for k in range(args.repeats):
            # netmorph's progress line off a terminal (a transcript leaves it out)
            print(
                f"netmorph out_of_place: world {p}: run {k + 1} of {args.repeats} ({time.monotonic() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            fab.append(measure([Case("allreduce", "auto", n) for n in sizes], p, "local", iters=args.iters, warmup=3))
            bound.append([two_shot_bound(p, n, iters=args.iters, warmup=3)["busbw_gbps"] for n in sizes])
            bound_in.append(
                [two_shot_bound(p, n, iters=args.iters, warmup=3, in_place=True)["busbw_gbps"] for n in sizes]
            )
            gloo.append(
                measure(
                    [Case("allreduce", "native", n) for n in sizes],
                    p,
                    "torch-native",
                    iters=args.iters,
                    warmup=3,
                    in_place_only=True,
                )
            )
        for i, n in enumerate(sizes):
            oop = statistics.median(r[i]["busbw_gbps"] for r in fab)
            inp = statistics.median(r[i]["in_place_busbw_gbps"] for r in fab)
            bnd = statistics.median(b[i] for b in bound)
            bnd_in = statistics.median(b[i] for b in bound_in)
            glo = statistics.median(r[i]["in_place_busbw_gbps"] for r in gloo)
            wrong = sum(max(r[i]["wrong"], 0) + max(r[i]["in_place_wrong"], 0) for r in fab)
            algo = auto_algo("allreduce", p, n, 4, PRESETS["local-shm"])  # what --algo auto ran
            row = {
                "world": p,
                "bytes": n,
                "algo": algo,
                "out_of_place_busbw_gbps": oop,
                "in_place_busbw_gbps": inp,
                "bound_busbw_gbps": bnd,
                "bound_in_place_busbw_gbps": bnd_in,
                "gloo_busbw_gbps": glo,
                "oop_of_in_place": oop / inp,
                "oop_of_bound": oop / bnd,
                "oop_x_gloo": oop / glo,
                "wrong": wrong,
            }
            out["rows"].append(row)
            say(
                f"{p:>5} {n:>11,} {algo:>12} {oop:>12.2f} {inp:>9.2f} {oop / inp:>7.0%} {bnd:>7.2f} "
                f"{oop / bnd:>9.0%} {bnd_in:>9.2f} {bnd / bnd_in:>9.0%} {glo:>6.2f} {oop / glo:>7.1f}x"
                + (f"  #wrong {wrong}" if wrong else ""),
                flush=True,
            )
    for row in (r for r in out["rows"] if r["bytes"] == GOAL):
        checks = {
            "oop >= 90% of in place": row["oop_of_in_place"] >= 0.9,
            "oop >= 70% of the bound": row["oop_of_bound"] >= 0.7,
            "oop >= 2x gloo": row["oop_x_gloo"] >= 2,
        }
        out["goals"].append({"world": row["world"], **checks})
        say(
            f"# goal at 16 MiB, world {row['world']}: "
            + "; ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in checks.items())
        )
    if args.profile:
        for p in worlds:
            prof = profile(p, GOAL, args.iters)
            out["profiles"].append(prof)
            say(
                f"# profile, world {p}, 16 MiB out of place: {prof['call_s'] * 1e3:.2f} ms a call (profiled), a "
                f"rank's time by part (cProfile tottime, mean over ranks):"
            )
            for part, sec in prof["by_part_s"].items():
                say(f"#   {part:<36} {sec * 1e3:8.2f} ms  {sec / prof['call_s']:5.0%}")
            say("#   top functions: " + "; ".join(f"{k.rsplit('/', 1)[-1]} {v * 1e3:.2f} ms" for k, v in prof["top"]))
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
