"""``netmorph train``: a small GPT trained split across real ranks -- DP, ZeRO, TP (+SP), PP, EP, 3D.

One line per step (nanoGPT's: step, loss, time, tokens/s, bytes sent per rank by
phase), then the summary: the bytes each phase sent beside its closed form, the
pipeline's in-flight microbatches and bubble, model-state memory, and with
``--check`` the 1-rank run's losses beside these.
"""

from __future__ import annotations

from netmorph.cli import add_timeout, float_in, int_in, job_split, pipeline_schedule, print_json, trace_file
from netmorph.cli.checkpoints import AlreadyTrained, add_checkpoint_arguments, checkpoint_start
from netmorph.cli.shape import add_shape_flags
from netmorph.errors import UsageError, require
from netmorph.files import write_json
from netmorph.mesh.settings import CP_COMM, SCHEDULES, SPLIT_BACKWARD
from netmorph.runtime.env import torchrun_world

# library parameters set by a flag of another name (the rest are --name)
FLAGS = {"micro_batch_size": "--micro-batch-size", "dp_mode": "--dp-mode", "bucket_mb": "--bucket-mb",
         "dp_algo": "--dp-algo", "tp_algo": "--tp-algo", "sequence_parallel": "--sequence-parallel",
         "cp_comm_type": "--cp-comm-type",
         "global_batch": "--global-batch-size",
         "top_k": "--top-k", "capacity_factor": "--capacity-factor"}
BACKENDS = ("local", "torch", "torch-native")


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a small GPT split across real ranks (DP, ZeRO, TP, PP, 3D)",
                       description="Train a small GPT with tensor, pipeline and data parallelism on local "
                                   "processes; print per-step loss and traffic, then measured against predicted.")
    g = p.add_argument_group("layout (Megatron's flag names accepted too)")
    g.add_argument("--tp", "--tensor-model-parallel-size", type=int, default=1, help="tensor-parallel size")
    g.add_argument("--pp", "--pipeline-model-parallel-size", type=int, default=1, help="pipeline stages")
    g.add_argument("--cp", "--context-parallel-size", type=int, default=1,
                   help="context-parallel size: each sequence split over cp ranks, head and tail chunks")
    g.add_argument("--cp-comm-type", choices=CP_COMM, default="p2p",
                   help="how cp ranks attend over each other's K and V: p2p (default; ring attention), all_gather "
                        "(Llama 3's) or a2a (DeepSpeed-Ulysses: heads traded for sequence; heads %% (tp x cp) = 0)")
    g.add_argument("--dp", type=int, help="data-parallel size (world = tp x cp x pp x dp; default 1, or under "
                                         "torchrun WORLD_SIZE / (tp x cp x pp))")
    g.add_argument("--ep", "--expert-model-parallel-size", type=int, default=1,
                   help="expert-parallel size: the experts split over ep of the dp ranks (needs --experts)")
    g.add_argument("--zero", type=int, default=0, help="ZeRO stage over the DP group: 0 (plain DP), 1, 2, 3")
    g.add_argument("--dp-mode", default="bucket", choices=("bucket", "naive"),
                   help="DDP-style buckets with backward overlap (default), or one all-reduce per gradient")
    g.add_argument("--bucket-mb", type=float_in(0, 4096, open_low=True), default=1.0,
                   help="gradient bucket size, MiB (default 1; the planner prices the same layout field)")
    from netmorph.collectives import REGISTRY
    names = ", ".join(REGISTRY["allreduce"])
    g.add_argument("--dp-algo", default="ring", metavar="ALGO",
                   help=f"the gradient all-reduce's algorithm: {names} (default ring, NCCL's for large messages)")
    g.add_argument("--tp-algo", default="ring", metavar="ALGO",
                   help="the tensor-parallel all-reduces' algorithm, the same names (default ring)")
    g.add_argument("--no-overlap", action="store_true", help="all-reduce buckets after backward, not during it")
    g.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (needs tp > 1)")
    g.add_argument("--schedule", default="1f1b", type=pipeline_schedule,
                   choices=SCHEDULES,
                   help="pipeline schedule: afab (gpipe: GPipe's name for it), 1f1b (default), interleaved; the zero "
                        "bubble ones, each backward as B (the input gradient) and a later W (the weights'): zb-h1 "
                        "(1F1B's memory), zbv and dualpipev (two chunks a rank in a V; dualpipev needs "
                        "2·pp microbatches)")
    g.add_argument("--interleave", type=int, default=1, help="virtual stages per rank (interleaved schedule)")
    g.add_argument("--microbatches", type=int, help="microbatches per step per DP rank (default 2)")
    g.add_argument("--micro-batch-size", type=int, default=2, help="sequences per microbatch (default 2)")
    g.add_argument("--global-batch-size", type=int, help="sequences per step: sets --microbatches")
    m = p.add_argument_group("model")
    add_shape_flags(m, "train")
    m.add_argument("--experts", "--num-experts", type=int, default=0,
                   help="a mixture of experts: E experts in every layer's MLP (default 0: dense)")
    m.add_argument("--top-k", "--moe-router-topk", type=int, default=2, help="experts per token (default 2)")
    m.add_argument("--capacity-factor", "--moe-expert-capacity-factor", type=float_in(0, 1e3, open_low=True),
                   default=1.0,
                   help="expert capacity over the even share, >= 1 (default 1.0; assignments over it drop)")
    m.add_argument("--dropless", action="store_true",
                   help="no capacity: every assignment is kept (Megatron with no --moe-expert-capacity-factor)")
    r = p.add_argument_group("run")
    r.add_argument("--steps", type=int_in(1, 1 << 24, "1..2**24"), default=10, help="optimizer steps (default 10)")
    r.add_argument("--lr", type=float_in(0, 100, open_low=True), default=3e-3, help="Adam learning rate (default 3e-3)")
    r.add_argument("--dtype", choices=("float32", "float64"),
                   help="parameters and activations (default float32; float64 for exact checks)")
    r.add_argument("--precision", "--bf16", dest="precision", nargs="?", const="bf16", choices=("fp32", "bf16"),
                   help="bf16: mixed precision (Megatron's --bf16): bf16 weights, activations and matmuls, float32 "
                        "main gradients, master weights and Adam state (2+4+4+4+4 B a parameter), the loss in "
                        "float32; --check holds it against the float32 1-rank run (within 2%%)")
    r.add_argument("--grad-reduce-dtype", choices=("bfloat16", "float32"),
                   help="with bf16: the gradients' reduction on the wire, bfloat16 (default, half the bytes) or "
                        "float32 (Megatron's accumulate-allreduce-grads-in-fp32)")
    r.add_argument("--compute-ms", type=float, default=0.0,
                   help="emulated extra compute per microbatch forward on each pipeline stage, shared by its "
                        "--interleave chunks (backward: twice)")
    r.add_argument("--backend", choices=BACKENDS, help="local shared memory (default), torch (netmorph's "
                   "schedules over torch.distributed; the default under torchrun) or torch-native")
    r.add_argument("--check", action="store_true", help="also run the 1-rank model and compare the losses")
    r.add_argument("--baseline", choices=("ddp",), help="also time PyTorch DDP (gloo) and the no-communication "
                                                        "bound on the same ranks (data parallelism only)")
    add_timeout(r, 60)
    r.add_argument("--trace", type=trace_file,
                   metavar="FILE", help="write a Chrome/Perfetto trace of the last step, one track "
                                       "per rank (compute slots and every message)")
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
    from netmorph.parallel.hybrid import TrainConfig
    job_split(args, ("tp", "cp", "pp"), cap=16)
    mbs = args.micro_batch_size
    micro = args.microbatches
    if args.global_batch_size is not None:
        if args.dp < 1 or mbs < 1 or args.global_batch_size < 1 or args.global_batch_size % (args.dp * mbs):
            raise UsageError(f"--global-batch-size {args.global_batch_size} does not split into dp {args.dp} x "
                             f"--micro-batch-size {mbs}")
        from_global = args.global_batch_size // (args.dp * mbs)
        if micro is not None and micro != from_global:
            raise UsageError(f"--microbatches {micro} contradicts --global-batch-size {args.global_batch_size} "
                             f"(= dp {args.dp} x {from_global} x {mbs})")
        micro = from_global
    moe = dict(experts=args.experts, top_k=args.top_k, capacity_factor=args.capacity_factor) if args.experts else {}
    model = ModelShape(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq, vocab=args.vocab,
                       **moe)
    ck, start = checkpoint_start(args, model, args.dp * (micro if micro is not None else 2) * mbs)
    steps = args.steps - start
    cfg = TrainConfig.make(model=model, tp=args.tp, pp=args.pp, dp=args.dp, ep=args.ep, zero=args.zero,
                           cp=args.cp, cp_comm_type=args.cp_comm_type, dp_mode=args.dp_mode,
                      bucket_mb=args.bucket_mb, overlap=not args.no_overlap,
                      sequence_parallel=args.sequence_parallel, schedule=args.schedule, interleave=args.interleave,
                      microbatches=micro if micro is not None else 2, micro_batch_size=mbs, steps=steps,
                      lr=args.lr, dtype=_dtype(args), grad_reduce_dtype=args.grad_reduce_dtype or "",
                      compute_ms=args.compute_ms, trace=bool(args.trace),
                      start_step=start, checkpoint=ck, router=Router(dropless=args.dropless),
                      algos=CollectiveAlgos(dp=args.dp_algo.replace("-", "_"), tp=args.tp_algo.replace("-", "_")))
    cfg.check()
    from netmorph.models.gpt import synthetic_data_bytes
    from netmorph.runtime import budget
    m = cfg.model
    lay = cfg.layout
    memory, seconds = budget.training(params_per_rank=m.params() / (lay.tp * lay.pp), active_params=m.params(),
                                      layers=m.layers, hidden=m.hidden, heads=m.heads, seq=m.seq,
                                      vocab=m.vocab, micro_batch=lay.batch.micro_batch_size, microbatches=lay.microbatches,
                                      steps=cfg.steps, world=cfg.world, tp=lay.tp, pp=lay.pp,
                                      itemsize=8 if cfg.dtype == "float64" else 4,
                                      in_flight=lay.microbatches if lay.pipeline_schedule == "afab" else None,
                                      data_bytes=synthetic_data_bytes(m.vocab))
    budget.check(memory, seconds, f"training {m.params():,} parameters on {budget.ranks(cfg.world)}",
                 "--micro-batch-size (or --microbatches with afab), --layers, --hidden, --seq or --vocab",
                 "--steps, --microbatches, --micro-batch-size or the model (--layers, --hidden, --seq, --vocab)")
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
        if out is None:                  # not rank 0: rank 0 prints for the job, as nccl-tests under mpirun
            return 0
        return _print(args, cfg, out)
    from netmorph.runtime.budget import ranks
    with Bar("train", unit="steps") as bar, bar.task(f"training on {ranks(cfg.world)}", cfg.steps) as task:
        out = train(cfg, args.backend, args.timeout, args.check,
                    on_progress=lambda done, total: bar.update(task, completed=done), baseline=args.baseline)
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


def _layout(cfg) -> str:
    parts = [f"tp{cfg.layout.tp}"] + [f"cp{cfg.layout.cp} {cfg.layout.knobs.cp_comm_type}"] * (cfg.layout.cp > 1) + \
        [f"pp{cfg.layout.pp}", f"dp{cfg.layout.dp}"]
    if cfg.layout.ep > 1:
        parts.append(f"ep{cfg.layout.ep}")
    if cfg.layout.zero:
        parts.append(f"ZeRO-{cfg.layout.zero}")
    if cfg.layout.knobs.sequence_parallel:
        parts.append("SP")
    sched = cfg.layout.pipeline_schedule + (f" v={cfg.layout.interleave}" if cfg.layout.interleave > 1 else "")
    return " ".join(parts) + (f", {sched}" if cfg.layout.pp > 1 else "")


def print_run(cfg, out, plan: dict) -> None:
    """The table ``netmorph train`` prints for ``out`` (a :class:`TrainSummary`), model states beside
    ``plan`` (the planner's memory of the same layout)."""
    m = cfg.model
    moe = f", {m.experts} experts top-{m.top_k}" if m.experts else ""
    print(f"# netmorph train: GPT l{m.layers} h{m.hidden} heads {m.heads} s{m.seq} V{m.vocab}{moe} "
          f"({m.params():,} params, {'bf16 mixed precision' if cfg.mixed else cfg.dtype}); {_layout(cfg)}; "
          f"{cfg.layout.microbatches} microbatches x "
          f"{cfg.layout.batch.micro_batch_size} per DP rank, global batch {cfg.layout.batch.global_batch}; "
          f"backend {out.backend}")
    from netmorph.parallel.phases import shown_phases
    shown = [ph for ph in shown_phases() if ph in out.bytes_per_rank_by_phase]
    wide = {ph: max(12, len(ph)) for ph in shown}                  # a column as wide as its phase's name
    print(f"{'step':>4} {'loss':>9} {'time(ms)':>9} {'tokens/s':>9}  " + " ".join(f"{ph:>{wide[ph]}}" for ph in shown)
          + "   (bytes sent per rank, max over ranks)")
    tokens = cfg.layout.batch.global_batch * cfg.model.seq
    if out.resumed_from:
        print(f"# resumed from {out.resumed_from} (saved after step {cfg.start_step}): the steps from "
              f"{cfg.start_step + 1} on, on the same global batches")
    for k, (loss, t) in enumerate(zip(out.losses, out.step_times_s), cfg.start_step + 1):
        b = out.step_bytes_by_phase[k - 1 - cfg.start_step]
        print(f"{k:>4} {loss:>9.5f} {t * 1e3:>9.1f} {tokens / t:>9,.0f}  "
              + " ".join(f"{b.get(ph, 0):>{wide[ph]},}" for ph in shown))
    print(f"# median step {out.step_time_s * 1e3:.1f} ms, {out.tokens_per_s:,.0f} tokens/s")
    parts = out.step_parts
    whole = sum(parts.values()) or 1.0
    print("# the busiest rank's step, mean after the first: " +
          ", ".join(f"{k} {1e3 * v:.1f} ms ({v / whole:.0%})" for k, v in parts.items() if v > 0) +
          " (rest: bubble, pipeline waits and sends, the host's own work; `netmorph validate local` holds each "
          "part against the planner's)")
    if out.backend == "torch-native":
        print("# traffic: torch's own collectives do not say what each rank sent (the ledger holds the buffer "
              "size per call); run --backend local or torch to set it against the closed forms")
        shown = []
    else:
        print("# traffic per rank per step: measured (max over ranks) vs the closed form, exact on every rank:")
    name = max([12] + [len(ph) for ph in shown])
    for ph in shown:
        pred = out.predicted_bytes_per_rank_by_phase.get(ph, 0)
        ok = out.traffic_exact.get(ph, out.bytes_per_rank_by_phase[ph] == pred)   # 0 sent, 0 predicted
        mark = "✓" if ok else "✗"
        print(f"#   {ph:<{name}} {out.bytes_per_rank_by_phase[ph]:>12,} {pred:>14,.0f} {mark}  "
              f"{out.formulas.get(ph, '')}")
    if cfg.layout.pp > 1:
        fl = out.in_flight_peak
        p = cfg.layout.pp
        bound = {"afab": f"m = {cfg.layout.microbatches} on stage 0", "1f1b": f"p = {p} on stage 0",
                 "zb-h1": f"p = {p} on stage 0",
                 "zbv": f"2p = {2 * p} chunks of half a stage on every rank, 1F1B's p stages' worth",
                 "dualpipev": f"2p+1 = {2 * p + 1} chunks of half a stage on every rank"}.get(
            cfg.layout.pipeline_schedule, "(p-1)·2 + (v-1)·p + 1 on stage 0")
        print(f"# pipeline: microbatches in flight per stage {[fl[s] for s in sorted(fl)]} "
              f"({cfg.layout.pipeline_schedule}: at most {bound})")
        if cfg.layout.pipeline_schedule in SPLIT_BACKWARD:
            from netmorph.planner.memory import wgrad_stash_elements
            lay = cfg.layout
            want = max(lay.w_stash(r) for r in range(p)) * m.layers / p * sum(wgrad_stash_elements(m, lay)) * \
                cfg.wire_sizes()[0]
            got = out.memory_bytes["wgrad_stash_peak"]
            print(f"# weight-gradient stash (each owed W's linear inputs and output gradients, the most loaded "
                  f"rank): {got:,} B vs the memory model's {want:,.0f} {'✓' if got == want else '✗'}")
        bub = out.bubble_fraction
        how = (f"emulated compute {cfg.compute_ms:g} ms per forward" if cfg.compute_ms else
               "no --compute-ms: with more ranks than cores this measures the scheduler, not the schedule")
        form = bub["form"] + (" (F = B = W)" if cfg.layout.pipeline_schedule in SPLIT_BACKWARD else "")
        print(f"# bubble: measured {bub['measured']:.1%} of the pipeline's time idle vs {form} = "
              f"{bub['theory']:.1%} ({how})")
    mem = out.memory_bytes
    parts = []
    for k in ("params", "grads", "optimizer"):
        ok = "✓" if mem[k] == plan[k] else "✗"
        parts.append(f"{k} {mem[k]:,} B vs {plan[k]:,.0f} {ok}")
    print("# model states on the most loaded rank, measured vs the planner's count (the placement table, each "
          "field's most loaded stage): " + ", ".join(parts))
    act = mem.get("activations_peak")
    if act:
        print(f"# activations at the peak (saved for backward x microbatches held): {act:,} B; Korthikanti et al.'s "
              f"estimate {plan['activations']:,.0f} B (16-bit; this model has no dropout): "
              f"ratio {act / plan['activations']:.2f}")
    for c in out.checkpoints or []:
        mode = (f"staged in the step in {1e3 * c['staged_s']:.0f} ms, written in the background" if cfg.checkpoint.async_save
                else "in the step")
        print(f"# checkpoint {c['path']}: {c['bytes']:,} B, {1e3 * c['save_s']:.0f} ms ({mode}; "
              f"{c['bytes'] / max(c['save_s'], 1e-9) / 1e6:.0f} MB/s)" +
              (f"; removed step {', '.join(map(str, c['removed']))} (--keep {cfg.checkpoint.keep})" if c["removed"] else ""))
    if out.baseline is not None:
        print_baseline(out.baseline)
    if out.reference_losses is not None:
        tol = {"float64": 1e-9, "float32": 1e-4}.get(cfg.dtype, 2e-2)
        ok = "✓" if out.max_rel_loss_diff <= tol else "✗"
        print(f"# check: the {'float32 ' if cfg.mixed else ''}1-rank run on the same global batches: max relative "
              f"loss difference "
              f"{out.max_rel_loss_diff:.2e} (<= {tol:g} {ok}), max weight difference "
              f"{out.max_abs_weight_diff:.2e}")


def print_baseline(b: dict) -> None:
    """netmorph, DDP and the no-communication bound, alternated step by step in one launch: each one's median
    step and interquartile range, and a verdict only where the ranges do not overlap."""
    print(f"# baseline, same ranks and batches, {b['steps']} steps each after the first, alternated A/B/C in one "
          "launch (median step, interquartile range, tokens/s):")
    for mode, label in (("netmorph", "netmorph"), ("ddp", "PyTorch DDP (gloo)"), ("no_comm", "no communication")):
        q = b[mode]
        print(f"#   {label:<20} {1e3 * q['median_s']:8.1f} ms  [{1e3 * q['q1_s']:.1f}, {1e3 * q['q3_s']:.1f}]"
              f"  {q['tokens_per_s']:>9,.0f} tokens/s")
    if b["vs_ddp"] == "too few steps":
        print(f"# netmorph {b['of_bound']:.0%} of the no-communication bound, DDP {b['ddp_of_bound']:.0%}: "
              f"{b['steps']} steps counted, too few to call either ratio (--steps 8 or more)")
        return
    to_bound = {"faster": "above it, the ranges apart", "slower": "below it, the ranges apart",
                "within noise": "the ranges overlap: as fast as the bound at this noise"}[b["vs_bound"]]
    to_ddp = {"faster": "faster, the ranges apart", "slower": "slower, the ranges apart",
              "within noise": "the ranges overlap: not decided"}[b["vs_ddp"]]
    print(f"# netmorph {b['of_bound']:.0%} of the no-communication bound ({to_bound}), DDP "
          f"{b['ddp_of_bound']:.0%}; netmorph against DDP: {to_ddp}")

