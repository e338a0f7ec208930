"""``netmorph train``: a small GPT trained split across real ranks -- DP, ZeRO, TP (+SP), PP, EP, 3D.

One line per step (nanoGPT's: step, loss, time, tokens/s, bytes sent per rank by
phase), then the summary: the bytes each phase sent beside its closed form, the
pipeline's in-flight microbatches and bubble, model-state memory, and with
``--check`` the 1-rank run's losses beside these.
"""

from __future__ import annotations

from netmorph.cli import job_split, print_json
from netmorph.cli.checkpoints import AlreadyTrained, add_checkpoint_arguments, checkpoint_start
from netmorph.cli.flags import add_timeout, float_in, int_in, pipeline_schedule, trace_file
from netmorph.cli.shape import add_shape_flags
from netmorph.cli.train_print import print_run
from netmorph.errors import UsageError, require
from netmorph.files import write_json
from netmorph.mesh.settings import CP_COMM, SCHEDULES
from netmorph.runtime.env import torchrun_world

# library parameters set by a flag of another name (the rest are --name)
FLAGS = {
    "micro_batch_size": "--micro-batch-size",
    "dp_mode": "--dp-mode",
    "bucket_mb": "--bucket-mb",
    "dp_algo": "--dp-algo",
    "tp_algo": "--tp-algo",
    "sequence_parallel": "--sequence-parallel",
    "cp_comm_type": "--cp-comm-type",
    "global_batch": "--global-batch-size",
    "top_k": "--top-k",
    "capacity_factor": "--capacity-factor",
}
BACKENDS = ("local", "torch", "torch-native")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a small GPT split across real ranks (DP, ZeRO, TP, PP, 3D)",
        description="Train a small GPT with tensor, pipeline and data parallelism on local "
        "processes; print per-step loss and traffic, then measured against predicted.",
    )
    g = p.add_argument_group("layout (Megatron's flag names accepted too)")
    g.add_argument("--tp", "--tensor-model-parallel-size", type=int, default=1, help="tensor-parallel size")
    g.add_argument("--pp", "--pipeline-model-parallel-size", type=int, default=1, help="pipeline stages")
    g.add_argument(
        "--cp",
        "--context-parallel-size",
        type=int,
        default=1,
        help="context-parallel size: each sequence split over cp ranks, head and tail chunks",
    )
    g.add_argument(
        "--cp-comm-type",
        choices=CP_COMM,
        default="p2p",
        help="how cp ranks attend over each other's K and V: p2p (default; ring attention), all_gather "
        "(Llama 3's) or a2a (DeepSpeed-Ulysses: heads traded for sequence; heads %% (tp x cp) = 0)",
    )
    g.add_argument(
        "--dp",
        type=int,
        help="data-parallel size (world = tp x cp x pp x dp; default 1, or under torchrun WORLD_SIZE / (tp x cp x pp))",
    )
    g.add_argument(
        "--ep",
        "--expert-model-parallel-size",
        type=int,
        default=1,
        help="expert-parallel size: the experts split over ep of the dp ranks (needs --experts)",
    )
    g.add_argument("--zero", type=int, default=0, help="ZeRO stage over the DP group: 0 (plain DP), 1, 2, 3")
    g.add_argument(
        "--dp-mode",
        default="bucket",
        choices=("bucket", "naive"),
        help="DDP-style buckets with backward overlap (default), or one all-reduce per gradient",
    )
    g.add_argument(
        "--bucket-mb",
        type=float_in(0, 4096, open_low=True),
        default=1.0,
        help="gradient bucket size, MiB (default 1; the planner prices the same layout field)",
    )
    from netmorph.collectives import REGISTRY

    names = ", ".join(REGISTRY["allreduce"])
    g.add_argument(
        "--dp-algo",
        default="ring",
        metavar="ALGO",
        help=f"the gradient all-reduce's algorithm: {names} (default ring, NCCL's for large messages)",
    )
    g.add_argument(
        "--tp-algo",
        default="ring",
        metavar="ALGO",
        help="the tensor-parallel all-reduces' algorithm, the same names (default ring)",
    )
    g.add_argument("--no-overlap", action="store_true", help="all-reduce buckets after backward, not during it")
    g.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (needs tp > 1)")
    g.add_argument(
        "--schedule",
        default="1f1b",
        type=pipeline_schedule,
        choices=SCHEDULES,
        help="pipeline schedule: afab (gpipe: GPipe's name for it), 1f1b (default), interleaved; the zero "
        "bubble ones, each backward as B (the input gradient) and a later W (the weights'): zb-h1 "
        "(1F1B's memory), zbv and dualpipev (two chunks a rank in a V; dualpipev needs "
        "2·pp microbatches)",
    )
    g.add_argument("--interleave", type=int, default=1, help="virtual stages per rank (interleaved schedule)")
    g.add_argument("--microbatches", type=int, help="microbatches per step per DP rank (default 2)")
    g.add_argument("--micro-batch-size", type=int, default=2, help="sequences per microbatch (default 2)")
    g.add_argument("--global-batch-size", type=int, help="sequences per step: sets --microbatches")
    m = p.add_argument_group("model")
    add_shape_flags(m, "train")
    m.add_argument(
        "--experts",
        "--num-experts",
        type=int,
        default=0,
        help="a mixture of experts: E experts in every layer's MLP (default 0: dense)",
    )
    m.add_argument("--top-k", "--moe-router-topk", type=int, default=2, help="experts per token (default 2)")
    m.add_argument(
        "--capacity-factor",
        "--moe-expert-capacity-factor",
        type=float_in(0, 1e3, open_low=True),
        default=1.0,
        help="expert capacity over the even share, >= 1 (default 1.0; assignments over it drop)",
    )
    m.add_argument(
        "--dropless",
        action="store_true",
        help="no capacity: every assignment is kept (Megatron with no --moe-expert-capacity-factor)",
    )
    r = p.add_argument_group("run")
    r.add_argument("--steps", type=int_in(1, 1 << 24, "1..2**24"), default=10, help="optimizer steps (default 10)")
    r.add_argument("--lr", type=float_in(0, 100, open_low=True), default=3e-3, help="Adam learning rate (default 3e-3)")
    r.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        help="parameters and activations (default float32; float64 for exact checks)",
    )
    r.add_argument(
        "--precision",
        "--bf16",
        dest="precision",
        nargs="?",
        const="bf16",
        choices=("fp32", "bf16"),
        help="bf16: mixed precision (Megatron's --bf16): bf16 weights, activations and matmuls, float32 "
        "main gradients, master weights and Adam state (2+4+4+4+4 B a parameter), the loss in "
        "float32; --check holds it against the float32 1-rank run (within 2%%)",
    )
    r.add_argument(
        "--grad-reduce-dtype",
        choices=("bfloat16", "float32"),
        help="with bf16: the gradients' reduction on the wire, bfloat16 (default, half the bytes) or "
        "float32 (Megatron's accumulate-allreduce-grads-in-fp32)",
    )
    r.add_argument(
        "--compute-ms",
        type=float,
        default=0.0,
        help="emulated extra compute per microbatch forward on each pipeline stage, shared by its "
        "--interleave chunks (backward: twice)",
    )
    r.add_argument(
        "--backend",
        choices=BACKENDS,
        help="local shared memory (default), torch (netmorph's "
        "schedules over torch.distributed; the default under torchrun) or torch-native",
    )
    r.add_argument("--check", action="store_true", help="also run the 1-rank model and compare the losses")
    r.add_argument(
        "--baseline",
        choices=("ddp",),
        help="also time PyTorch DDP (gloo) and the no-communication bound on the same ranks (data parallelism only)",
    )
    add_timeout(r, 60)
    r.add_argument(
        "--trace",
        type=trace_file,
        metavar="FILE",
        help="write a Chrome/Perfetto trace of the last step, one track per rank (compute slots and every message)",
    )
    r.add_argument("--json", action="store_true", help="print the run's summary as JSON")
    add_checkpoint_arguments(p)
    p.set_defaults(run=run, flags=FLAGS)


def _dtype(args) -> str:
    """The trainer's dtype from --dtype and --precision (bf16: "bfloat16", mixed precision)."""
    if args.precision == "bf16":
        if args.dtype is not None:
            raise UsageError(f"--precision bf16 keeps float32 master state itself; drop --dtype {args.dtype}")
        return "bfloat16"
    if args.grad_reduce_dtype:
        raise UsageError("--grad-reduce-dtype is the wire of bf16 mixed precision: add --precision bf16")
    return args.dtype or "float32"


def config_from(args):
    from netmorph.mesh.shape import ModelShape
    from netmorph.models.moe import Router
    from netmorph.parallel.algos import CollectiveAlgos
    from netmorph.parallel.config import TrainConfig

    job_split(args, ("tp", "cp", "pp"), cap=16)
    mbs = args.micro_batch_size
    micro = args.microbatches
    if args.global_batch_size is not None:
        if args.dp < 1 or mbs < 1 or args.global_batch_size < 1 or args.global_batch_size % (args.dp * mbs):
            raise UsageError(
                f"--global-batch-size {args.global_batch_size} does not split into dp {args.dp} x "
                f"--micro-batch-size {mbs}"
            )
        from_global = args.global_batch_size // (args.dp * mbs)
        if micro is not None and micro != from_global:
            raise UsageError(
                f"--microbatches {micro} contradicts --global-batch-size {args.global_batch_size} "
                f"(= dp {args.dp} x {from_global} x {mbs})"
            )
        micro = from_global
    moe = dict(experts=args.experts, top_k=args.top_k, capacity_factor=args.capacity_factor) if args.experts else {}
    model = ModelShape(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq, vocab=args.vocab, **moe)
    ck, start = checkpoint_start(args, model, args.dp * (micro if micro is not None else 2) * mbs)
    steps = args.steps - start
    cfg = TrainConfig.make(
        model=model,
        tp=args.tp,
        pp=args.pp,
        dp=args.dp,
        ep=args.ep,
        zero=args.zero,
        cp=args.cp,
        cp_comm_type=args.cp_comm_type,
        dp_mode=args.dp_mode,
        bucket_mb=args.bucket_mb,
        overlap=not args.no_overlap,
        sequence_parallel=args.sequence_parallel,
        schedule=args.schedule,
        interleave=args.interleave,
        microbatches=micro if micro is not None else 2,
        micro_batch_size=mbs,
        steps=steps,
        lr=args.lr,
        dtype=_dtype(args),
        grad_reduce_dtype=args.grad_reduce_dtype or "",
        compute_ms=args.compute_ms,
        trace=bool(args.trace),
        start_step=start,
        checkpoint=ck,
        router=Router(dropless=args.dropless),
        algos=CollectiveAlgos(dp=args.dp_algo.replace("-", "_"), tp=args.tp_algo.replace("-", "_")),
    )
    cfg.check()
    from netmorph.models.gpt import synthetic_data_bytes
    from netmorph.runtime import budget

    m = cfg.model
    lay = cfg.layout
    memory, seconds = budget.training(
        params_per_rank=m.params() / (lay.tp * lay.pp),
        active_params=m.params(),
        layers=m.layers,
        hidden=m.hidden,
        heads=m.heads,
        seq=m.seq,
        vocab=m.vocab,
        micro_batch=lay.batch.micro_batch_size,
        microbatches=lay.microbatches,
        steps=cfg.steps,
        world=cfg.world,
        tp=lay.tp,
        pp=lay.pp,
        itemsize=8 if cfg.dtype == "float64" else 4,
        in_flight=lay.microbatches if lay.pipeline_schedule == "afab" else None,
        data_bytes=synthetic_data_bytes(m.vocab),
    )
    budget.check(
        memory,
        seconds,
        f"training {m.params():,} parameters on {budget.ranks(cfg.world)}",
        "--micro-batch-size (or --microbatches with afab), --layers, --hidden, --seq or --vocab",
        "--steps, --microbatches, --micro-batch-size or the model (--layers, --hidden, --seq, --vocab)",
    )
    if args.baseline and (cfg.layout.tp > 1 or cfg.layout.pp > 1):
        raise UsageError("--baseline ddp compares data parallelism only: use it with --tp 1 --pp 1")
    return cfg


def run(args) -> int:
    from netmorph.cli.progress import Bar

    require("torch", "training")
    from netmorph.parallel.run import train, train_torchrun

    try:
        cfg = config_from(args)
    except AlreadyTrained as done:
        return done.report()
    if torchrun_world() is not None:
        out = train_torchrun(cfg, args.backend, args.timeout, args.check)
        if out is None:  # not rank 0: rank 0 prints for the job, as nccl-tests under mpirun
            return 0
        return _print(args, cfg, out)
    from netmorph.runtime.budget import ranks

    with Bar("train", unit="steps") as bar, bar.task(f"training on {ranks(cfg.world)}", cfg.steps) as task:
        out = train(
            cfg,
            args.backend,
            args.timeout,
            args.check,
            on_progress=lambda done, total: bar.update(task, completed=done),
            baseline=args.baseline,
        )
    return _print(args, cfg, out)


def _print(args, cfg, out) -> int:
    from netmorph.planner.memory import trainer_memory

    plan = trainer_memory(cfg.model, cfg.layout, *cfg.state_sizes())
    if out.trace is not None:
        write_json(args.trace, out.trace)
    if args.json:
        print_json({**out.to_json(), "planner_memory_bytes": plan}, indent=1)
        return 0
    print_run(cfg, out, plan)
    if out.trace is not None:
        print(f"# trace of the last step: {args.trace} (open in Perfetto or chrome://tracing)")
    return 0
