"""``netmorph morph``: the flags of both actions, and ``morph reshard``, which moves a training run's live state
from one parallel layout to another (``morph run``, the control loop, is :mod:`netmorph.cli.morph_run`).

Trains ``--steps`` on the ``--from`` layout, plans the move of every parameter and Adam moment to
the ``--to`` layout (who sends what to whom, counted before anything moves), runs it over the
fabric, checks every element against the state gathered to one place, and trains ``--steps`` more
on the new layout beside an unmorphed run of the same length.
"""

from __future__ import annotations

from netmorph.cli import action_only, check_action, print_json
from netmorph.cli.cluster import add_cluster_flags
from netmorph.cli.flags import add_timeout, float_in, int_in, link_mbps, plot_file
from netmorph.cli.morph_run import control, model_of
from netmorph.cli.shape import add_shape_flags
from netmorph.errors import UsageError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "morph",
        help="adaptive parallelism: re-plan and reshard a live run when the network "
        "changes; `morph reshard` moves one run between two layouts",
        description="run (default): train on an emulated two-node cluster, let the bottleneck move "
        "(--scenario), and watch the control loop measure, re-plan and reshard, beside "
        "static splits. reshard: move the training state from one (tp, pp, dp, ZeRO) "
        "layout to another over the fabric: the plan as data, its bytes, the check.",
    )
    p.add_argument(
        "action",
        nargs="?",
        default="run",
        choices=("run", "reshard"),
        help="run (default): the control loop on a scenario; reshard: one move between two layouts",
    )
    p.add_argument("--world", type=int, help="ranks (default 8 for run, 4 for reshard)")
    p.add_argument(
        "--scenario",
        default="link-degrades@40",
        help="run: none, or events joined by commas, each from STEP on: link-degrades@STEP[xF] "
        "(inter-node links F (10) times slower), link-recovers@STEP, node-lost@STEP[:NODE] (the "
        "second node's ranks, node 0's with :0, and the state only they held gone: killed), "
        "node-hangs@STEP[:NODE] (the same ranks "
        "stopped, SIGSTOP: found by their heartbeats and fenced), node-joins@STEP (a node back, "
        "holding nothing), seq-grows@STEP[xF] (sequences F (2, 4 or 8; default 2) times longer), "
        "memory-shrinks@STEP[xF] (each rank's memory 1/F (1/2) of a whole replica's). Default "
        "link-degrades@40",
    )
    p.add_argument(
        "--segment", type=int_in(2, 10_000), default=10, help="run: steps between the controller's looks (default 10)"
    )
    p.add_argument(
        "--static",
        type=int_in(0, 64),
        default=4,
        help="run: how many static layouts to run beside it: the start split, then the best-ranked (default 4; "
        "0: the adaptive run alone, its time compared with nothing)",
    )
    p.add_argument(
        "--compute-ms",
        type=float_in(0, 1e4),
        default=40.0,
        help="run: emulated accelerator time per sequence forward, whole model (default 40)",
    )
    p.add_argument(
        "--inter-node-mbps",
        type=link_mbps,
        default=50.0,
        help="run: the healthy link between the two nodes, MB/s (default 50; inside a node 2 GB/s)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int_in(1, 10_000),
        default=20,
        help="run: steps between checkpoints, where a run goes back to when a lost node took state no "
        "survivor holds (default 20)",
    )
    p.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="run across torchrun jobs: the folder the live loop's checkpoints go to (in a folder of "
        "their own, removed at the end); on a real cluster one every node sees, a shared "
        "filesystem (default: a temporary folder on rank 0's host)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="run: also run the start split as torchrun would restart it: a node lost or joining "
        "restarts every rank (the relaunch measured) from the last checkpoint",
    )
    p.add_argument("--plot", type=plot_file, help="run: draw throughput over time, adaptive vs static, to this PNG")
    p.add_argument("--from", dest="before", default="tp2,pp2", help="reshard: layout before (default tp2,pp2)")
    p.add_argument("--to", dest="after", default="dp4,zero3", help="reshard: layout after (default dp4,zero3)")
    p.add_argument(
        "--steps", type=int, help="run: steps in all (default 100); reshard: before and after the move (default 2)"
    )
    add_shape_flags(p, "morph")
    p.add_argument(
        "--global-batch", type=int_in(1, 4096), default=8, help="sequences per step, both layouts (default 8)"
    )
    add_timeout(p, 60)
    add_cluster_flags(
        p,
        "morph",
        "run: the two nodes are two torchrun jobs (netmorph launch --nodes 2 "
        "--nproc-per-node K -- morph ...), the link between them emulated on gloo; "
        "node-lost/hangs take node 1 out, node-joins takes back the workers its "
        "torchrun restarts (--max-restarts 1 or more)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)
    action_only(
        p,
        "run",
        (
            "scenario",
            "segment",
            "static",
            "compute_ms",
            "inter_node_mbps",
            "checkpoint_every",
            "compare",
            "plot",
            "lighthouse",
            "node",
            "nodes",
            "checkpoint_dir",
        ),
    )
    action_only(p, "reshard", ("before", "after"))


def run(args) -> int:
    # the control loop's flags are checked for either action: a nonsense value is refused, not ignored
    check_action(args)
    if args.action == "run":
        return control(args)
    args.world = 4 if args.world is None else args.world
    args.steps = 2 if args.steps is None else args.steps
    return _reshard(args)


def _reshard(args) -> int:
    from netmorph.mesh.elements import check
    from netmorph.morph.layouts import check_move, parse_layout, train_config
    from netmorph.morph.reshard import execute, gather_reference, matches, plan
    from netmorph.parallel import limits
    from netmorph.parallel.hybrid import train_rank
    from netmorph.parallel.state import assemble
    from netmorph.runtime.launch import launch

    check_move(args.world, args.steps)
    model = model_of(args)
    layouts = []
    for flag, text in (("--from", args.before), ("--to", args.after)):
        try:
            lay = parse_layout(text, args.world)
            check(lay, model)
            limits.require(lay, model, ignore=("batch",))  # and one the trainer runs
        except UsageError as e:
            raise UsageError(f"{flag} {e}") from None
        layouts.append(lay)
    before, after = layouts
    ca = train_config(model, before, args.steps, args.global_batch)
    cb = train_config(model, after, args.steps, args.global_batch, start=args.steps)
    cw = train_config(model, before, 2 * args.steps, args.global_batch)
    p = plan(model, before, after)
    from netmorph.cli.progress import Bar

    with Bar("morph") as bar, bar.task(f"training on {before.tag()}, moving to {after.tag()}, and the unmorphed run"):
        a = launch(train_rank, ca.world, ca, None, None, timeout=args.timeout)
        states = [r.state.flat for r in a]
        new, ledger = execute(p, states, timeout=args.timeout)
        exact = matches(p, new, gather_reference(p, states))
        b = launch(train_rank, cb.world, cb, None, new, timeout=args.timeout)
        whole = launch(train_rank, cw.world, cw, None, None, timeout=args.timeout)
    losses = next(r.losses for r in a if r.losses) + next(r.losses for r in b if r.losses)
    unmorphed = next(r.losses for r in whole if r.losses)
    dloss = max(abs(x - y) for x, y in zip(losses, unmorphed))
    fb, fw = assemble(b), assemble(whole)
    dparam = max(float((fb[k] - fw[k]).abs().max()) for k in fw)
    phase = ledger.by_phase().get("morph", {"messages": 0, "bytes": 0})
    seconds = max(st["seconds"] for st in new)
    ok = exact and phase == {"messages": p.messages, "bytes": p.bytes} and dloss <= 1e-9 and dparam <= 1e-9
    matrix = p.bytes_matrix()
    if args.json:
        print_json(
            {
                "world": args.world,
                "before": before.tag(),
                "after": after.tag(),
                **p.summary(),
                "matrix": matrix.tolist(),
                "ledger": phase,
                "reshard_s": seconds,
                "exact": exact,
                "losses": losses,
                "unmorphed_losses": unmorphed,
                "max_loss_diff": dloss,
                "max_param_diff": dparam,
                "ok": ok,
            }
        )
        return 0 if ok else 1
    print(
        f"# netmorph morph reshard: GPT {args.layers} layers x {args.hidden} on {args.world} ranks, "
        f"{before.tag()} -> {after.tag()} after {args.steps} steps (global batch {args.global_batch})"
    )
    print(
        f"plan      {p.messages} messages in {p.rounds} rounds, {p.bytes:,} B on the wire, "
        f"{p.kept_bytes():,} B kept in place (parameters, Adam m and v; counted before it runs)"
    )
    print("bytes     source rank (rows) -> destination rank (columns):")
    print(f"{'':>10}" + "".join(f"{j:>10}" for j in range(args.world)))
    for i in range(args.world):
        print(f"{i:>10}" + "".join(f"{'-' if v == 0 else f'{v:,}':>10}" for v in matrix[i]))
    same = "=" if phase == {"messages": p.messages, "bytes": p.bytes} else "!="
    print(
        f"ran       ledger phase morph: {phase['messages']} messages, {phase['bytes']:,} B ({same} the plan) in "
        f"{1e3 * seconds:.1f} ms"
    )
    print(
        f"check     every parameter and Adam moment equals the state gathered to one place: {'yes' if exact else 'NO'}"
    )
    print(
        f"          {args.steps} more steps on {after.tag()} against {2 * args.steps} unmorphed on "
        f"{before.tag()}: max |loss diff| {dloss:.1e}, max |param diff| {dparam:.1e} "
        f"{'✓' if ok else '✗ (tolerance 1e-9)'}"
    )
    return 0 if ok else 1
