"""``netmorph bench OP``: measure collectives on real processes, nccl-tests style.

Every algorithm's schedule runs on ``--world`` OS processes over the chosen
backend; each row shows measured time, algbw, busbw and ``#wrong`` beside the
cost model's prediction, and (for the local fabric) torch.distributed's own
collective on gloo measured on the same machine, plus the fraction of this
machine's single-core memory-copy bandwidth. nccl-tests' flags mean what they
mean there (``all_reduce_perf -b 8 -e 128M -f 2 -n 20 -w 5 -c 1 -o sum -d float``);
rows print as each size completes, then nccl-tests' footers.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import sys

from netmorph.collectives import ALGORITHMS, ROOTED, canonical_op, check_algo
from netmorph.cli import add_timeout
from netmorph.errors import MissingPackage, UsageError, require
from netmorph.runtime.env import torchrun_rank, torchrun_world
from netmorph.schedule import REDOPS
from netmorph.units import DTYPES, parse_dtype, parse_size, parse_size_range

# library parameters set by a flag of another name (the rest are --name)
FLAGS = {"count": "--bytes", "nbytes": "--bytes"}
CSV_FIELDS = ("op", "algo", "backend", "world", "bytes", "count", "type", "redop", "root", "time_s", "algbw_gbps",
              "busbw_gbps", "wrong", "predicted_time_s", "of_memcpy")


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure collectives on real processes (nccl-tests style)",
                       description="Run each algorithm on --world processes and print nccl-tests' table "
                                   "(time, algbw, busbw, #wrong) beside the cost model and gloo. nccl-tests' "
                                   "flags -b -e -f -i -n -w -c -o -d -r are accepted with their meanings.")
    p.add_argument("op", help="allreduce, allgather, reduce_scatter, broadcast, reduce or alltoall")
    p.add_argument("--world", "-p", type=int, help="processes (ranks) to start; under torchrun, its WORLD_SIZE")
    p.add_argument("--bytes", "--minbytes", "-b", help="message size, or the sweep's smallest (nccl-tests -b); "
                                                        "K/M/G binary as in nccl-tests, KB/MB/GB decimal")
    p.add_argument("--maxbytes", "-e", help="the sweep's largest size (nccl-tests -e)")
    p.add_argument("--stepfactor", "-f", type=int, help="multiply the size by this between rows (nccl-tests -f; "
                                                         "default 2)")
    p.add_argument("--stepbytes", "-i", help="add this many bytes between rows instead (nccl-tests -i)")
    p.add_argument("--sizes", help="sweep MIN:MAX in powers of two, e.g. 1KiB:64MiB (= -b MIN -e MAX -f 2)")
    p.add_argument("--algo", default="all", help="algorithm, auto, or all (default)")
    p.add_argument("--backend", choices=("local", "torch", "torch-native"),
                   help="local shared memory (default), torch.distributed point-to-point (default under torchrun), "
                        "or torch's own collective")
    p.add_argument("--iters", "-n", type=int, default=20, help="timed iterations per case (default 20)")
    p.add_argument("--warmup", "-w", type=int, default=5, help="untimed iterations per case (default 5)")
    p.add_argument("--check", "-c", type=int, default=1, choices=(0, 1),
                   help="1 (default): one checked run counts #wrong; 0: skip it (#wrong N/A)")
    p.add_argument("--redop", "-o", default="sum", help=f"reduction: {', '.join(REDOPS)} (default sum)")
    p.add_argument("--dtype", "--datatype", "-d", default="float32",
                   help=f"one of {', '.join(d for d in DTYPES if d != 'bfloat16')} (default float32)")
    p.add_argument("--root", "-r", type=int, default=0, help="root rank of broadcast and reduce (default 0)")
    p.add_argument("--topology", default="local-shm", help="cost model for the prediction column (default local-shm)")
    p.add_argument("--no-compare", action="store_true", help="skip the torch.distributed (gloo) comparison rows")
    add_timeout(p, 30)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="one JSON list of every row, at the end")
    out.add_argument("--csv", action="store_true", help="CSV rows as they complete, with a header")
    p.set_defaults(run=run, flags=FLAGS)


def sizes_from(args) -> list[int]:
    """nccl-tests' sweep: -b to -e, times -f (default 2) or plus -i; or --sizes; or one -b."""
    if args.sizes is not None:
        if args.bytes is not None or args.maxbytes is not None:
            raise UsageError("--sizes replaces -b/-e: give one or the other")
        return parse_size_range(args.sizes)
    if args.bytes is None:
        raise UsageError("give a size: --bytes/-b SIZE (with -e MAX for a sweep) or --sizes MIN:MAX")
    lo = parse_size(args.bytes)
    hi = parse_size(args.maxbytes, "maxbytes") if args.maxbytes is not None else lo
    if hi < lo:
        raise UsageError(f"--maxbytes {hi} is smaller than --bytes {lo}")
    if args.stepfactor is not None and args.stepbytes is not None:
        raise UsageError("--stepfactor/-f and --stepbytes/-i are alternatives: give one")
    if args.stepbytes is not None:
        step = parse_size(args.stepbytes, "stepbytes")
        if step < 1:
            raise UsageError("--stepbytes must be >= 1")
        n = (hi - lo) // step + 1
        if n > 64:
            raise UsageError(f"--stepbytes {step} makes {n} sizes from {lo} to {hi}; at most 64")
        return [lo + k * step for k in range(n)]
    f = 2 if args.stepfactor is None else args.stepfactor
    if f < 2 and hi > lo:
        raise UsageError(f"--stepfactor must be >= 2, got {f}")
    if lo == 0:
        return [0] if hi == 0 else [0] + _geometric(1, hi, f)
    return _geometric(lo, hi, f)


def _geometric(lo, hi, f):
    out = [lo]
    while out[-1] * f <= hi and f > 1:
        out.append(out[-1] * f)
    return out


def run(args) -> int:
    from netmorph.cost.topology import PRESETS, load_topology
    from netmorph.cost.tuner import auto_algo, predict
    from netmorph.runtime.bench import measure, measure_in_job, memcpy_bandwidth

    op = canonical_op(args.op)
    job = torchrun_world()
    if job is not None:                  # joined from torchrun's environment, as nccl-tests under mpirun
        args.backend = args.backend or "torch"
        if args.backend == "local":
            raise UsageError("--backend local forks its own ranks; under torchrun use --backend torch or torch-native")
        if args.world is not None and args.world != job:
            raise UsageError(f"--world {args.world} != torchrun's WORLD_SIZE {job}; drop --world under torchrun")
        args.world = job
    elif args.world is None:
        raise UsageError("--world is required (how many ranks to start), unless started by torchrun")
    args.backend = args.backend or "local"
    if args.world < 1:
        raise UsageError(f"--world must be >= 1, got {args.world}")
    if args.world > 64 and job is None:
        raise UsageError(f"--world {args.world}: this launches one process per rank; keep it <= 64 on one machine")
    numpy_dtype, itemsize = parse_dtype(args.dtype)
    if numpy_dtype == "bfloat16":
        raise UsageError("--dtype bfloat16 has no numpy type to run on; pick float16 or float32")
    if args.redop not in REDOPS:
        raise UsageError(f"--redop/-o must be one of {', '.join(REDOPS)}, got {args.redop!r}")
    if op in ROOTED and not 0 <= args.root < args.world:
        raise UsageError(f"--root/-r must be in 0..{args.world - 1}, got {args.root}")
    for flag in ("iters", "warmup"):
        if not (1 if flag == "iters" else 0) <= getattr(args, flag) <= 100_000:
            raise UsageError(f"--{flag} must be in {1 if flag == 'iters' else 0}..100000")
    sizes = sizes_from(args)
    from netmorph.runtime.transport.shm.mapping import default_arena_bytes
    per_rank = default_arena_bytes(args.world) // 4                  # the registered arena holds ~3 buffers
    for n in sizes:
        if n % itemsize:
            raise UsageError(f"--bytes {n} is not a whole number of {numpy_dtype} elements")
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
    if args.backend != "local":
        require("torch", f"--backend {args.backend}")
    compare = args.backend == "local" and not args.no_compare
    no_torch = None
    if compare:
        try:
            require("torch", "the gloo comparison")
        except MissingPackage as e:           # measure what can be measured; say what is missing
            compare, no_torch = False, str(e)
    copy_bw = memcpy_bandwidth(max(sizes))
    root = args.root if op in ROOTED else 0
    redop = args.redop if op in ("allreduce", "reduce", "reduce_scatter") else "none"

    def finish(r):
        algo = r["algo"]
        if algo == "auto":
            algo = r["algo"] = auto_algo(op, args.world, r["bytes"], itemsize, PRESETS["local-shm"]) + " (auto)"
        base = algo.split(" ")[0]
        r["predicted_time_s"] = (predict(op, base, args.world, r["bytes"], topo, itemsize,
                                         **({"root": root} if op in ROOTED else {})).time
                                 if base in ALGORITHMS[op] else None)
        r["of_memcpy"] = r["busbw_gbps"] / copy_bw if copy_bw else None
        r["redop"], r["root"] = redop, root
        return r

    comm = None
    if job is not None:
        from netmorph.runtime import init_from_env
        comm = init_from_env(args.backend, args.timeout)

    def measure_size(cases, backend):
        if comm is not None:                   # rank 0 gets the rows; the others measure and stay quiet
            return measure_in_job(comm, cases, args.iters, args.warmup, numpy_dtype) or []
        return measure(cases, args.world, backend, args.iters, args.warmup, numpy_dtype, args.timeout)

    quiet = job is not None and torchrun_rank() != 0
    try:
        with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
            return _table(args, op, sizes, algos, compare, no_torch, topo, copy_bw, numpy_dtype, itemsize, root,
                          redop, measure_size, finish, progress=not quiet)
    finally:
        if comm is not None:
            comm.close()


def _table(args, op, sizes, algos, compare, no_torch, topo, copy_bw, numpy_dtype, itemsize, root, redop,
           measure_size, finish, progress: bool) -> int:
    """Print the header, one row per algorithm as each size completes, and nccl-tests' footers."""
    from netmorph.report.table import MEASURED, header, row
    from netmorph.runtime.bench import Case
    text = not (args.json or args.csv)
    if text:
        print(f"# netmorph bench {op}: world {args.world}, {numpy_dtype}, redop {redop}, root {root}, backend "
              f"{args.backend}, {args.iters} iterations (+{args.warmup} warmup){'' if args.check else ', no check'}; "
              f"slowest rank's mean")
        print(f"# predicted: cost model on {topo.name}; memcpy: {copy_bw:.2f} GB/s on one core here")
        if no_torch:
            print(f"# {no_torch}; add --no-compare to skip it")
        print(header(MEASURED))
    writer = None
    if args.csv:
        writer = csv.DictWriter(sys.stdout, CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
    rows = []
    bar = _Progress(len(sizes) if progress else 0)
    try:
        for n in sizes:
            cases = [Case(op, a, n, args.redop, root, bool(args.check)) for a in algos]
            here = measure_size(cases, args.backend)
            if compare:
                here += measure_size([Case(op, "native", n, args.redop, root, bool(args.check))], "torch-native")
            for r in here:
                finish(r)
                if text:
                    print(row(MEASURED, {**r, "wrong": r["wrong"] if r["wrong"] >= 0 else "N/A"}), flush=True)
                elif writer is not None:
                    writer.writerow(r)
                    sys.stdout.flush()
            rows += here
            bar.advance()
    finally:
        bar.close()
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
    if text:
        _footers(rows, sizes, compare, itemsize, args.world, bool(args.check))
    bad = sum(r["wrong"] for r in rows if r["wrong"] > 0)
    return 1 if bad else 0


def _footers(rows, sizes, compare, itemsize, world, checked) -> None:
    """nccl-tests' closing lines, per algorithm; then the local fabric against gloo, per size."""
    bad = sum(r["wrong"] for r in rows if r["wrong"] > 0)
    print(f"# Out of bounds values : {bad} {'OK' if not bad else 'FAILED'}" if checked
          else "# Out of bounds values : N/A (--check 0)")
    for algo in dict.fromkeys(r["algo"] for r in rows):
        mine = [r["busbw_gbps"] for r in rows if r["algo"] == algo]
        backend = next(r["backend"] for r in rows if r["algo"] == algo)
        print(f"# Avg bus bandwidth    : {sum(mine) / len(mine):.3f}  ({algo}, {backend}, {len(mine)} sizes)")
    if compare:
        for n in sizes:
            here = [r for r in rows if r["bytes"] == n or abs(r["bytes"] - n) < itemsize * world]
            gloo = [r for r in here if r["backend"] == "torch-native"]
            mine = [r for r in here if r["backend"] == "local"]
            if gloo and mine and gloo[0]["busbw_gbps"] > 0:
                best = max(mine, key=lambda r: r["busbw_gbps"])
                print(f"# {n} B: best local {best['algo']} {best['busbw_gbps']:.2f} GB/s busbw = "
                      f"{best['busbw_gbps'] / gloo[0]['busbw_gbps']:.1f}x gloo; time "
                      f"{min(r['time_s'] for r in mine) * 1e6:.1f} us vs {gloo[0]['time_s'] * 1e6:.1f} us")


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
