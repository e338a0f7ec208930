"""``netmorph moe``: the GPT trainer's mixture of experts seen through its router; ``moe drops``: capacity
arithmetic."""

from __future__ import annotations

from dataclasses import replace

from netmorph.cli import action_only, check_action, job_split, print_json
from netmorph.cli.checkpoints import AlreadyTrained, add_checkpoint_arguments, checkpoint_start
from netmorph.cli.flags import add_timeout, float_in, int_in, plot_file
from netmorph.cli.shape import add_shape_flags
from netmorph.errors import require
from netmorph.mesh.layout import Layout

# library parameters set by a flag of another name (the rest are --name)
FLAGS = {
    "jitter_eps": "--jitter",
    "tokens": "--tokens",
    "expert_ffn": "--ffn",
    "top_k": "--top-k",
    "capacity_factor": "--capacity-factor",
}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "moe",
        help="train a mixture of experts over expert-parallel ranks (all-to-all routing)",
        description="A learned router sends each token to its top-k experts, spread over --ep "
        "ranks: the all-to-all's traffic matrix is a function of the input. `moe "
        "drops` computes what a capacity factor drops under uniform routing.",
    )
    p.add_argument(
        "action",
        nargs="?",
        default="train",
        choices=("train", "drops"),
        help="train (default): train and log routing; drops: expected drops of uniform routing",
    )
    r = p.add_argument_group("experts and routing (Megatron's --num-experts, --moe-router-topk, ...)")
    r.add_argument("--experts", "--num-experts", type=int, default=8, help="experts per MoE layer E (default 8)")
    r.add_argument(
        "--ep",
        "--expert-model-parallel-size",
        type=int,
        default=4,
        help="expert-parallel ranks: E/ep experts each (default 4)",
    )
    r.add_argument(
        "--dp",
        type=int,
        help="data-parallel replicas of the EP group (default 1, or under torchrun "
        "WORLD_SIZE / (ep x tp x pp); the data-parallel size is ep x dp)",
    )
    r.add_argument(
        "--tp",
        "--tensor-model-parallel-size",
        type=int,
        default=1,
        help="tensor-parallel size of the attention (experts stay whole on every tp rank)",
    )
    r.add_argument("--pp", "--pipeline-model-parallel-size", type=int, default=1, help="pipeline stages")
    r.add_argument("--world", type=int, help="processes; must equal ep x dp x tp x pp (the default)")
    r.add_argument("--top-k", "--moe-router-topk", type=int, default=2, help="experts per token k (default 2)")
    r.add_argument(
        "--capacity-factor",
        "--moe-expert-capacity-factor",
        type=float_in(0, 1e3, open_low=True),
        default=1.25,
        help="C = ceil(k*T/E * CF) per expert per rank (default 1.25)",
    )
    r.add_argument("--dropless", action="store_true", help="no capacity: every assignment is kept (MegaBlocks)")
    r.add_argument(
        "--drop-policy",
        "--moe-token-drop-policy",
        default="position",
        choices=("position", "probs"),
        help="which assignments an expert over capacity keeps: earliest tokens or highest gates",
    )
    r.add_argument(
        "--pre-softmax",
        action="store_true",
        help="softmax over all experts before top-k (Switch, GShard); default after (Mixtral, Megatron)",
    )
    r.add_argument("--aux-loss-coeff", type=float, default=0.01, help="load-balancing loss alpha (default 0.01)")
    r.add_argument("--z-loss-coeff", type=float, default=0.0, help="router z-loss beta (default 0)")
    r.add_argument("--jitter", type=float, default=0.0, help="router input jitter epsilon (default 0)")
    m = p.add_argument_group("model and run")
    add_shape_flags(m, "moe", {"layers": "each with experts"})
    m.add_argument("--ffn", type=int, default=64, help="expert MLP width (default 64)")
    m.add_argument("--batch", type=int, default=4, help="sequences per rank per step (default 4)")
    m.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    m.add_argument("--lr", type=float_in(0, 100, open_low=True), default=3e-3, help="Adam learning rate (default 3e-3)")
    m.add_argument("--seed", type=int, default=0, help="weights and data seed (default 0)")
    m.add_argument("--dtype", default="float32", choices=("float32", "float64"), help="default float32")
    m.add_argument(
        "--backend",
        choices=("local", "torch", "torch-native"),
        help="local shared memory (default), netmorph's schedules over torch.distributed (the "
        "default under torchrun, where the job is the run), or torch's own all_to_all_single",
    )
    add_timeout(m, 60)
    m.add_argument("--check", action="store_true", help="also run the 1-rank model and compare")
    m.add_argument(
        "--plot", type=plot_file, metavar="FILE", help="draw the traffic matrices of consecutive steps into FILE"
    )
    d = p.add_argument_group("moe drops")
    d.add_argument(
        "--tokens", type=int_in(1, 1 << 20, "1..2**20"), default=4096, help="tokens routed per rank T (default 4096)"
    )
    d.add_argument("--trials", type=int_in(1, 100_000), default=200, help="random routings simulated (default 200)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_checkpoint_arguments(p)
    p.set_defaults(run=run, flags=FLAGS)
    action_only(
        p,
        "train",
        (
            "plot",
            "check",
            "dropless",
            "pre_softmax",
            "steps",
            "backend",
            "save",
            "save_every",
            "keep",
            "async_save",
            "load",
        ),
    )
    action_only(p, "drops", ("tokens", "trials"))


def run(args) -> int:
    check_action(args)
    if args.action == "drops":
        return _drops(args)
    require("torch", "netmorph moe")
    from netmorph.moe.train import MoEConfig, moe_shape, view

    job = job_split(args, ("ep", "tp", "pp"), cap=32)  # under torchrun the job is the run
    dp = args.dp
    from netmorph.models.moe import Router

    model = moe_shape(
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        ffn=args.ffn,
        vocab=args.vocab,
        seq=args.seq,
        experts=args.experts,
        top_k=args.top_k,
        capacity_factor=args.capacity_factor,
        seed=args.seed,
    )
    router = Router(
        pre_softmax=args.pre_softmax,
        aux_loss_coeff=args.aux_loss_coeff,
        z_loss_coeff=args.z_loss_coeff,
        jitter_eps=args.jitter,
        drop_policy=args.drop_policy,
        dropless=args.dropless,
    )
    cfg = MoEConfig.make(
        model,
        router,
        Layout(tp=args.tp, pp=args.pp, dp=args.ep * dp, ep=args.ep),
        batch=args.batch,
        steps=args.steps,
        lr=args.lr,
        dtype=args.dtype,
        backend=args.backend,
        timeout=args.timeout,
        world=args.world,
    )
    try:  # --load: the run goes on after the step its checkpoint saved
        ck, start = checkpoint_start(args, cfg.train.model, cfg.train.layout.batch.global_batch)
    except AlreadyTrained as done:
        return done.report()
    cfg = replace(cfg, train=replace(cfg.train, steps=args.steps - start, start_step=start, checkpoint=ck))
    cfg.train.check()
    from netmorph.models.gpt import synthetic_data_bytes
    from netmorph.runtime import budget

    m = cfg.train.model
    itemsize = 8 if args.dtype == "float64" else 4
    memory, seconds = budget.training(
        params_per_rank=m.params() / (args.tp * args.pp),
        active_params=m.active_params(),
        layers=m.layers,
        hidden=m.hidden,
        heads=m.heads,
        seq=m.seq,
        vocab=m.vocab,
        micro_batch=args.batch,
        microbatches=1,
        steps=cfg.train.steps,
        world=cfg.world,
        tp=args.tp,
        pp=args.pp,
        itemsize=itemsize,
        extra_bytes_per_rank=8 * m.params(),  # every rank draws the whole model once
        data_bytes=synthetic_data_bytes(m.vocab),
    )
    budget.check(
        memory,
        seconds,
        f"training {m.experts} experts on {budget.ranks(cfg.world)}",
        "--experts, --ffn, --hidden, --vocab, --seq or --batch",
        "--steps, --seq, --batch or the model (--layers, --hidden, --ffn)",
    )
    if job is not None:
        from netmorph.parallel.run import train_torchrun

        summary = train_torchrun(cfg.train, cfg.backend, cfg.timeout, check=args.check)
        if summary is None:  # not rank 0: rank 0 prints the job's view
            return 0
        out = view(cfg, summary)
    else:
        from netmorph.cli.progress import Bar
        from netmorph.moe.train import train

        with Bar("moe") as bar, bar.task(f"training on {budget.ranks(cfg.world)}"):
            out = train(cfg, check=args.check)
    if args.plot:
        from netmorph.report.moe import plot_traffic

        plot_traffic(out, args.plot)
    if args.json:
        print_json(_json(cfg, out))
        return 0
    _print(cfg, out)
    if args.plot:
        print(f"# figure: {args.plot}")
    return 0


def _print(moe, out) -> None:
    cfg = out["config"]
    cap = (
        "dropless (no capacity)"
        if cfg["capacity"] is None
        else f"capacity factor {cfg['capacity_factor']:g}: C = {cfg['capacity']} per expert per rank, "
        f"{cfg['drop_policy']} drops"
    )
    split = "".join(f" x {k} {cfg[k]}" for k in ("tp", "pp") if cfg[k] > 1)
    print(
        f"# netmorph moe: {cfg['experts']} experts over ep {cfg['ep']} x dp {cfg['dp']}{split}, "
        f"top-{cfg['top_k']}, {cap}; {cfg['tokens_per_rank']} tokens per rank per step, GPT h {cfg['hidden']}, "
        f"{cfg['layers']} layers with experts, aux {cfg['aux_loss_coeff']:g}; backend {cfg['backend']}"
    )
    print(
        f"{'step':>4} {'loss':>8} {'aux':>8} {'dropped':>8} {'imbalance':>9} {'max expert batch':>16} "
        f"{'a2a B/rank (max)':>16} {'= matrix':>8}"
    )
    for i, s in enumerate(out["steps"], cfg["start_step"] + 1):
        print(
            f"{i:>4} {s['loss']:>8.4f} {s['aux']:>8.5f} {100 * s['drop_fraction']:>7.1f}% {s['load_imbalance']:>9.2f} "
            f"{s['largest_expert_batch']:>16} {max(s['a2a_bytes']):>16,} {_mark(s['exact']):>8}"
        )
    b = 8 if cfg["dtype"] == "float64" else 4
    if cfg["backend"] == "torch-native":
        print("# torch's all_to_all_single reports no per-peer bytes: the ledger holds each call's whole input")
    else:
        exact = all(s["exact"] for s in out["steps"])
        print(
            f"# all-to-all bytes on every link (rank -> rank), measured by the ledger vs the router's traffic "
            f"matrix x h x {b} B, dispatch and combine, forward and backward: "
            f"{'equal on every link and step ✓' if exact else 'DIFFER ✗'}"
        )
    steps = out["steps"][1:] or out["steps"]
    step_s = sorted(s["step_s"] for s in steps)[len(steps) // 2]
    a2a_s = sorted(s["a2a_s"] for s in steps)[len(steps) // 2]
    print(
        f"# median step {1e3 * step_s:.1f} ms, of which {1e3 * a2a_s:.1f} ms in the all-to-alls "
        f"({100 * a2a_s / step_s:.0f}%; slowest rank)"
    )
    last = out["steps"][-1]["traffic"]
    print("# last step's traffic matrix (tokens, row = source rank, column = destination):")
    for r, row in enumerate(last):
        print(f"#   {r:>2}: " + " ".join(f"{n:>5}" for n in row))
    if "max_rel_loss_diff" in out:
        ok = out["max_rel_loss_diff"] <= (1e-9 if cfg["dtype"] == "float64" else 1e-4) and out["same_routing"]
        print(
            f"# check: the 1-rank model on the same tokens: max relative loss difference "
            f"{out['max_rel_loss_diff']:.2e}, max parameter difference {out['max_param_diff']:.2e}, "
            f"routing {'identical' if out['same_routing'] else 'DIFFERENT'} {'✓' if ok else '✗'}"
        )


def _mark(exact) -> str:
    return "-" if exact is None else "✓" if exact else "✗"


def _json(moe, out) -> dict:
    steps, cfg = out["steps"], out["config"]
    j = {
        **{
            k: cfg[k]
            for k in (
                "experts",
                "ep",
                "dp",
                "tp",
                "pp",
                "top_k",
                "capacity_factor",
                "capacity",
                "drop_policy",
                "tokens_per_rank",
                "steps",
                "backend",
            )
        },
        "losses": [s["loss"] for s in steps],
        "aux_losses": [s["aux"] for s in steps],
        "drop_fraction": [s["drop_fraction"] for s in steps],
        "load_imbalance": [s["load_imbalance"] for s in steps],
        "largest_expert_batch": [s["largest_expert_batch"] for s in steps],
        "traffic_matrices": [s["traffic"] for s in steps],
        "a2a_bytes_per_rank": [s["a2a_bytes"] for s in steps],
        "predicted_a2a_bytes_per_rank": [s["predicted_a2a_bytes"] for s in steps],
        "step_time_s": [s["step_s"] for s in steps],
        "a2a_time_s": [s["a2a_s"] for s in steps],
    }
    for k in ("reference_losses", "max_rel_loss_diff", "max_param_diff", "same_routing"):
        if k in out:
            j[k] = out[k]
    return j


def _drops(args) -> int:
    from netmorph.models.capacity import capacity, check_routing, exact_drop_fraction, simulated_drop_fraction

    check_routing(args.tokens, args.experts, args.top_k, args.trials)
    cap = capacity(args.tokens, args.experts, args.top_k, args.capacity_factor)
    exact = exact_drop_fraction(args.tokens, args.experts, args.top_k, cap)
    sim = simulated_drop_fraction(args.tokens, args.experts, args.top_k, cap, args.trials, args.seed)
    if args.json:
        print_json(
            {
                "tokens": args.tokens,
                "experts": args.experts,
                "top_k": args.top_k,
                "capacity_factor": args.capacity_factor,
                "capacity": cap,
                "simulated_drop_fraction": sim,
                "exact_drop_fraction": exact,
                "trials": args.trials,
            }
        )
        return 0
    print(
        f"# {args.tokens} tokens, top-{args.top_k} of {args.experts} experts, capacity factor "
        f"{args.capacity_factor:g}: C = ceil(k*T/E * CF) = {cap} per expert"
    )
    print(
        f"# uniform random routing: each expert's load ~ Binomial(T, k/E) = Binomial({args.tokens}, "
        f"{args.top_k / args.experts:.4g})"
    )
    print(f"dropped: simulated {100 * sim:.3f}% ({args.trials} trials)   exact {100 * exact:.3f}%")
    return 0
