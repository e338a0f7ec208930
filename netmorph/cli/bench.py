"""``netmorph bench OP``: measure collectives on real processes, nccl-tests style.

Every algorithm's schedule runs on ``--world`` OS processes over the chosen
backend; each row shows measured time, algbw, busbw and ``#wrong`` beside the
cost model's prediction, and (for the local fabric) torch.distributed's own
collective on gloo measured on the same machine, plus the fraction of this
machine's single-core memory-copy bandwidth.
"""

from __future__ import annotations

import json
import sys

from netmorph.collectives import ALGORITHMS, ROOTED, canonical_op, check_algo
from netmorph.errors import UsageError
from netmorph.units import DTYPES, parse_dtype, parse_size, parse_size_range

# library parameters set by a flag of another name (the rest are --name)
FLAGS = {"count": "--bytes", "nbytes": "--bytes"}


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure collectives on real processes (nccl-tests style)",
                       description="Run each algorithm on --world processes and print nccl-tests' table "
                                   "(time, algbw, busbw, #wrong) beside the cost model and gloo.")
    p.add_argument("op", help="allreduce, allgather, reduce_scatter, broadcast, reduce or alltoall")
    p.add_argument("--world", "-p", type=int, required=True)
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--bytes", "-b", help="message size, e.g. 16MiB")
    size.add_argument("--sizes", help="sweep MIN:MAX in powers of two, e.g. 1KiB:64MiB")
    p.add_argument("--algo", default="all", help="algorithm, auto, or all (default)")
    p.add_argument("--backend", default="local", choices=("local", "torch", "torch-native"),
                   help="local shared memory (default), torch.distributed point-to-point, or torch's own collective")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per case (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations per case (default 5)")
    p.add_argument("--dtype", default="float32", help=f"one of {', '.join(d for d in DTYPES if d != 'bfloat16')} (default float32)")
    p.add_argument("--topology", default="local-shm", help="cost model for the prediction column (default local-shm)")
    p.add_argument("--no-compare", action="store_true", help="skip the torch.distributed (gloo) comparison rows")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a rank waits on a silent peer (default 30)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run, flags=FLAGS)


def run(args) -> int:
    from netmorph.cost.topology import PRESETS, load_topology
    from netmorph.cost.tuner import auto_algo, predict
    from netmorph.report.table import MEASURED, header, row
    from netmorph.runtime.bench import Case, measure, memcpy_bandwidth

    op = canonical_op(args.op)
    if args.world < 1:
        raise UsageError(f"--world must be >= 1, got {args.world}")
    if args.world > 64:
        raise UsageError(f"--world {args.world}: this launches one process per rank; keep it <= 64 on one machine")
    numpy_dtype, itemsize = parse_dtype(args.dtype)
    if numpy_dtype == "bfloat16":
        raise UsageError("--dtype bfloat16 has no numpy type to run on; pick float16 or float32")
    for flag in ("iters", "warmup"):
        if getattr(args, flag) < (1 if flag == "iters" else 0):
            raise UsageError(f"--{flag} must be >= {1 if flag == 'iters' else 0}")
    if not 0 < args.timeout < 1e6:
        raise UsageError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
    sizes = [parse_size(args.bytes)] if args.bytes is not None else parse_size_range(args.sizes)
    for n in sizes:
        if n % itemsize:
            raise UsageError(f"--bytes {n} is not a whole number of {numpy_dtype} elements")
        per_rank = min(1 << 30, (8 << 30) // args.world) // 4          # the registered arena holds ~3 buffers
        if n > per_rank:
            raise UsageError(f"--bytes {n:,} is more than this machine's fabric holds per rank at world "
                             f"{args.world} ({per_rank:,} B)")
    if args.backend == "torch-native":
        algos = ["native"]
    elif args.algo.lower() == "all":
        algos = list(ALGORITHMS[op])
    elif args.algo.lower() == "auto":
        algos = ["auto"]
    else:
        algos = [check_algo(op, args.algo)]
    topo = load_topology(args.topology)
    compare = args.backend == "local" and not args.no_compare

    rows = []
    progress = _Progress(len(sizes))
    try:
        for n in sizes:
            cases = [Case(op, a, n) for a in algos]
            rows += measure(cases, args.world, args.backend, args.iters, args.warmup, numpy_dtype, args.timeout)
            if compare:
                rows += measure([Case(op, "native", n)], args.world, "torch-native", args.iters, args.warmup,
                                numpy_dtype, args.timeout)
            progress.advance()
    finally:
        progress.close()
    copy_bw = memcpy_bandwidth(max(sizes))
    for r in rows:
        algo = r["algo"]
        if algo == "auto":
            algo = r["algo"] = auto_algo(op, args.world, r["bytes"], itemsize, PRESETS["local-shm"]) + " (auto)"
        base = algo.split(" ")[0]
        if base in ALGORITHMS[op]:
            r["predicted_time_s"] = predict(op, base, args.world, r["bytes"], topo, itemsize,
                                            **({"root": 0} if op in ROOTED else {})).time
        else:
            r["predicted_time_s"] = None
        r["of_memcpy"] = r["busbw_gbps"] / copy_bw if copy_bw else None
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print(f"# netmorph bench {op}: world {args.world}, {numpy_dtype}, backend {args.backend}, "
          f"{args.iters} iterations (+{args.warmup} warmup); slowest rank's mean")
    print(f"# predicted: cost model on {topo.name}; memcpy: {copy_bw:.2f} GB/s on one core here")
    print(header(MEASURED))
    for r in rows:
        print(row(MEASURED, r))
    if compare:
        for n in sizes:
            here = [r for r in rows if r["bytes"] == n or abs(r["bytes"] - n) < itemsize * args.world]
            gloo = [r for r in here if r["backend"] == "torch-native"]
            mine = [r for r in here if r["backend"] == "local"]
            if gloo and mine and gloo[0]["busbw_gbps"] > 0:
                best = max(mine, key=lambda r: r["busbw_gbps"])
                print(f"# {n} B: best local {best['algo']} {best['busbw_gbps']:.2f} GB/s busbw = "
                      f"{best['busbw_gbps'] / gloo[0]['busbw_gbps']:.1f}x gloo; time "
                      f"{min(r['time_s'] for r in mine) * 1e6:.1f} us vs {gloo[0]['time_s'] * 1e6:.1f} us")
    bad = sum(r["wrong"] for r in rows)
    return 1 if bad else 0


class _Progress:
    def __init__(self, total):
        self.bar = None
        if total > 1 and sys.stderr.isatty():
            from rich.progress import Progress
            self.bar = Progress(transient=True)
            self.bar.start()
            self.task = self.bar.add_task("measuring", total=total)

    def advance(self):
        if self.bar:
            self.bar.advance(self.task)

    def close(self):
        if self.bar:
            self.bar.stop()
