"""``netmorph bench OP``: measure collectives on real processes with nccl-tests' command line and table.

``netmorph bench allreduce -b 8 -e 128M -f 2 -g 4`` reads as ``all_reduce_perf -b 8
-e 128M -f 2 -g 4`` does: the same flags with the same defaults (-b/-e 32M, -i 1M
steps unless -f, -n 20, -w 1, -c 1, -o sum, -d float, -r 0), sizes read as nccl-tests
reads them (a number and only the first letter after it: K, M, G, binary), ``-o all``
/ ``-d all`` / ``-r all``. Each algorithm prints nccl-tests' table -- out-of-place and
in-place groups, the count column per rank where nccl-tests has it, root -1 where the
op has none -- and its footers; torch.distributed's own collective (gloo) follows on
the local fabric; then one line per size sets the best measured algorithm beside the
cost model and gloo. Ranks: ``--world``, or nccl-tests' ``-t`` threads x ``-g`` GPUs
(default 1 x 1); ``-p`` (parallel init) is accepted and changes nothing here.
"""

from __future__ import annotations

import contextlib
import io

from netmorph.cli.bench_tables import tables
from netmorph.cli.flags import add_timeout, int_in
from netmorph.collectives import ALGORITHMS, ROOTED, canonical_op, check_algo
from netmorph.errors import MissingPackage, UsageError, require
from netmorph.runtime.env import torchrun_rank, torchrun_world
from netmorph.units import NCCL_TYPES, parse_nccl_size, parse_size_range

# library parameters set by a flag of another name (the rest are --name)
FLAGS = {"count": "--minbytes", "nbytes": "--minbytes"}
# nccl-tests' -o names
OPS = ("sum", "prod", "max", "min", "avg")
NO_GLOO = ("uint32", "uint64")  # types gloo refuses ("Invalid scalar type"); the local fabric has them
MAX_SIZES = 1024


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="measure collectives on real processes (nccl-tests' flags and table)",
        description="Run each algorithm on real processes and print nccl-tests' table (out-of-place "
        "and in-place time, algbw, busbw, #wrong) and footers, then the best algorithm "
        "per size beside the cost model and gloo. nccl-tests' flags, with its defaults.",
    )
    p.add_argument("op", help="allreduce, allgather, reduce_scatter, broadcast, reduce or alltoall")
    p.add_argument(
        "--world",
        type=int,
        help="ranks to start (default: -t x -g, as nccl-tests counts them; under torchrun, its WORLD_SIZE)",
    )
    p.add_argument(
        "-t", "--nthreads", type=int_in(1, 64), default=1, help="nccl-tests' threads per process (ranks: -t x -g)"
    )
    p.add_argument("-g", "--ngpus", type=int_in(1, 64), default=1, help="nccl-tests' GPUs per thread (ranks: -t x -g)")
    p.add_argument(
        "-b",
        "--minbytes",
        "--bytes",
        default="32M",
        help="smallest size (default 32M); K, M, G binary, as nccl-tests reads them",
    )
    p.add_argument("-e", "--maxbytes", default="32M", help="largest size (default 32M)")
    p.add_argument("-i", "--stepbytes", default="1M", help="add this between sizes (default 1M) unless -f")
    p.add_argument(
        "-f",
        "--stepfactor",
        type=int,
        default=1,
        help="multiply the size by this between rows (default 1: off, -i steps)",
    )
    p.add_argument("-n", "--iters", type=int_in(1, 100_000), default=20, help="timed iterations (default 20)")
    p.add_argument(
        "-w",
        "--warmup_iters",
        "--warmup",
        dest="warmup",
        type=int_in(0, 100_000),
        default=1,
        help="untimed iterations (default 1)",
    )
    p.add_argument(
        "-c",
        "--check",
        type=int_in(0, 1000),
        default=1,
        help="checked runs on fresh data after the timed ones; 0: none (#wrong N/A) (default 1)",
    )
    p.add_argument("-o", "--op", dest="redop", default="sum", help=f"reduction: {'/'.join(OPS)}/all (default sum)")
    p.add_argument(
        "-d", "--datatype", "--dtype", dest="dtype", default="float", help=f"{'/'.join(NCCL_TYPES)}/all (default float)"
    )
    p.add_argument("-r", "--root", default="0", help="root of broadcast and reduce, or all (default 0)")
    p.add_argument(
        "-p",
        "--parallel_init",
        type=int,
        default=0,
        choices=(0, 1),
        help="nccl-tests' parallel initialisation: accepted, changes nothing here",
    )
    p.add_argument("--sizes", help="netmorph's shorthand: MIN:MAX in powers of two (= -b MIN -e MAX -f 2)")
    p.add_argument("--algo", default="all", help="algorithm, auto, or all (default)")
    p.add_argument(
        "--backend",
        choices=("local", "torch", "torch-native"),
        help="local shared memory (default), torch.distributed point-to-point (default under torchrun), "
        "or torch's own collective",
    )
    p.add_argument("--topology", default="local-shm", help="cost model for the predictions (default local-shm)")
    p.add_argument("--no-compare", action="store_true", help="skip torch.distributed's own collective (gloo)")
    add_timeout(p, 30)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="one JSON list of every row, at the end")
    out.add_argument("--csv", action="store_true", help="CSV rows as each algorithm completes, with a header")
    p.set_defaults(run=run, flags=FLAGS)


def sizes_from(args) -> list[int]:
    """nccl-tests' sweep: from -b to -e, times -f when it is above 1, else plus -i; or netmorph's --sizes."""
    if args.sizes is not None:
        return parse_size_range(args.sizes)
    lo = parse_nccl_size(args.minbytes, "minbytes")
    hi = parse_nccl_size(args.maxbytes, "maxbytes")
    if hi < lo:
        raise UsageError(f"-e/--maxbytes {hi} is smaller than -b/--minbytes {lo} (nccl-tests: invalid sizes)")
    if args.stepfactor < 1:
        raise UsageError(f"-f/--stepfactor must be >= 1 (1: off), got {args.stepfactor}")
    if args.stepfactor > 1:
        out = [lo]
        while out[-1] * args.stepfactor <= hi and out[-1] > 0:
            out.append(out[-1] * args.stepfactor)
            if len(out) > MAX_SIZES:
                break
    else:
        step = parse_nccl_size(args.stepbytes, "stepbytes")
        if step < 1 and hi > lo:
            raise UsageError("-i/--stepbytes must be >= 1")
        n = 1 if hi == lo else (hi - lo) // step + 1
        out = [lo + k * step for k in range(min(n, MAX_SIZES + 1))]
    if len(out) > MAX_SIZES:
        raise UsageError(f"-b {lo} to -e {hi} makes more than {MAX_SIZES} sizes; raise -i or use -f")
    return out


def _choices(text: str, allowed, flag: str) -> list[str]:
    if text == "all":
        return list(allowed)
    if text not in allowed:
        raise UsageError(f"{flag} must be one of {', '.join(allowed)} or all, got {text!r}")
    return [text]


def plan(args, op: str) -> tuple[list, list, list]:
    """(types as numpy names, reduce ops, roots) the flags ask for, in nccl-tests' order."""
    types = [NCCL_TYPES[t] for t in _choices(args.dtype, list(NCCL_TYPES), "-d/--datatype")]
    reducing = op in ("allreduce", "reduce", "reduce_scatter")
    ops = _choices(args.redop, OPS, "-o/--op") if reducing else ["sum"]
    ints = [t for t in types if not t.startswith(("float", "bfloat"))]
    if ops == ["avg"] and ints:
        raise UsageError(f"-o avg needs a floating-point -d (netmorph averages by dividing), got {args.dtype}")
    if args.root == "all":
        roots = list(range(args.world)) if op in ROOTED else [0]
    else:
        try:
            root = int(args.root)
        except ValueError:
            raise UsageError(f"-r/--root must be a rank or all, got {args.root!r}") from None
        if op in ROOTED and not 0 <= root < args.world:
            raise UsageError(f"-r/--root must be in 0..{args.world - 1}, got {root}")
        roots = [root if op in ROOTED else 0]
    return types, ops, roots


def run(args) -> int:
    from netmorph.cost.topology import load_topology
    from netmorph.runtime.bench import measure, measure_in_job, memcpy_bandwidth

    op = canonical_op(args.op)
    job = torchrun_world()
    if job is not None:  # joined from torchrun's environment, as nccl-tests under mpirun
        args.backend = args.backend or "torch"
        if args.backend == "local":
            raise UsageError("--backend local forks its own ranks; under torchrun use --backend torch or torch-native")
        if args.world is not None and args.world != job:
            raise UsageError(f"--world {args.world} != torchrun's WORLD_SIZE {job}; drop --world under torchrun")
        args.world = job
    elif args.world is None:
        args.world = args.nthreads * args.ngpus
    args.backend = args.backend or "local"
    if args.world < 1:
        raise UsageError(f"--world must be >= 1, got {args.world}")
    if args.world > 64 and job is None:
        raise UsageError(f"--world {args.world}: this launches one process per rank; keep it <= 64 on one machine")
    types, ops, roots = plan(args, op)
    gloo_lacks = tuple(t for t in NO_GLOO if t in types)  # asked for: gloo's runs leave them out
    if args.backend != "local":
        refused = [t for t in types if t in NO_GLOO]
        if refused and args.dtype != "all":
            raise UsageError(
                f"-d {args.dtype}: gloo has no {refused[0]} (--backend {args.backend}); use --backend "
                f"local, or another type"
            )
        types = [t for t in types if t not in NO_GLOO]
    sizes = sizes_from(args)
    from netmorph.runtime.transport.shm.mapping import default_arena_bytes

    per_rank = default_arena_bytes(args.world) // 4  # the registered arena holds ~3 buffers
    if max(sizes) > per_rank:
        raise UsageError(
            f"-e {max(sizes):,} B is more than this machine's fabric holds per rank at world "
            f"{args.world} ({per_rank:,} B)"
        )
    if args.backend == "torch-native":
        algos = ["native"]
    elif args.algo.lower() == "all":
        algos = list(ALGORITHMS[op])
    elif args.algo.lower() == "auto":
        algos = ["auto"]
    else:
        algos = [check_algo(op, args.algo)]
    _budget(args, len(sizes) * len(types) * len(ops) * len(roots), len(algos) + 1, max(sizes))
    topo = load_topology(args.topology)
    if args.backend != "local":
        require("torch", f"--backend {args.backend}")
    compare = args.backend == "local" and not args.no_compare
    no_torch = None
    if compare:
        try:
            require("torch", "the gloo comparison")
        except MissingPackage as e:  # measure what can be measured; say what is missing
            compare, no_torch = False, str(e)
    from netmorph.runtime.bench import Case

    cases = [
        Case(op, "", n, o, r, args.check, t)
        for t in types
        for o in ops
        for r in roots
        for n in sizes
        if not (o == "avg" and not t.startswith(("float", "bfloat")))
    ]
    comm = None
    if job is not None:
        from netmorph.runtime import init_from_env

        comm = init_from_env(args.backend, args.timeout)

    def measure_algo(algo, backend):
        mine = [
            Case(c.op, algo, c.nbytes, c.redop, c.root, c.check, c.dtype)
            for c in cases
            if backend == "local" or c.dtype not in NO_GLOO
        ]
        if comm is not None:  # rank 0 gets the rows; the others measure and stay quiet
            return measure_in_job(comm, mine, args.iters, args.warmup) or []
        return measure(mine, args.world, backend, args.iters, args.warmup, args.timeout)

    quiet = job is not None and torchrun_rank() != 0
    try:
        with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
            return tables(
                args,
                op,
                sizes,
                algos,
                compare,
                no_torch,
                topo,
                memcpy_bandwidth(max(sizes)),
                measure_algo,
                quiet,
                gloo_lacks,
            )
    finally:
        if comm is not None:
            comm.close()


def _budget(args, cases: int, runs: int, largest: int) -> None:
    """Refuse a sweep that would run past the hour: every case timed (-w + -n) and checked (-c), out of
    place and in place, by every algorithm and gloo, at no better than 1 GB/s and 20 us a call here."""
    from netmorph.runtime import budget

    calls = cases * runs * 2 * (args.iters + args.warmup + args.check)
    seconds = calls * (20e-6 + largest / 1e9)
    budget.check(
        0,
        seconds,
        f"this sweep ({cases} cases x {runs} runs)",
        "",
        "-e, -n, -w, -c, or the sizes (-b/-f/-i), types (-d) and ops (-o)",
    )
