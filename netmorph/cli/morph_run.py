"""``netmorph morph run``: the control loop -- train, measure, let the calibrated twin re-choose the split as the
bottleneck moves, reshard live -- on one box (a launch of ``--world`` ranks) or as one worker of a cluster of
torchrun jobs (``netmorph launch -- morph``), with the static splits run beside it and the table it prints."""

from __future__ import annotations

import math
import os
import statistics
import sys
from dataclasses import replace

from netmorph.cli import print_json
from netmorph.cli.cluster import in_cluster, report
from netmorph.errors import UsageError


def model_of(args):
    """The GPT the flags describe (both actions); one line for a size out of range, or for a model this machine
    cannot hold or train in time on the run's ranks (the budget ``train`` and ``moe`` are held to)."""
    from netmorph.mesh.shape import ModelShape
    from netmorph.models.gpt import synthetic_data_bytes
    from netmorph.runtime import budget

    m = ModelShape(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq, vocab=args.vocab)
    world = args.world if isinstance(args.world, int) and args.world > 0 else 8
    steps = args.steps if isinstance(args.steps, int) and args.steps > 0 else 100
    memory, seconds = budget.training(
        params_per_rank=m.params(),
        active_params=m.params(),
        layers=m.layers,
        hidden=m.hidden,
        heads=m.heads,
        seq=m.seq,
        vocab=m.vocab,
        micro_batch=1,
        microbatches=1,
        steps=steps,
        world=world,
        itemsize=8,
        data_bytes=synthetic_data_bytes(m.vocab),
    )
    budget.check(
        memory,
        seconds,
        f"training {m.params():,} parameters on {budget.ranks(world)}",
        "--layers, --hidden, --seq or --vocab",
        "--steps or the model (--layers, --hidden, --seq)",
    )
    return m


SHOWN = 10  # rows of the twin's table


def cluster_check(args, nodes: int, k: int, max_restarts: int) -> int:
    """A cluster's morph (``nodes`` torchrun jobs of ``k`` workers), checked before anything starts: its world,
    or one line naming the flag to change."""
    from netmorph.morph.cluster import check_cluster
    from netmorph.morph.controller import check_run, parse_scenario

    if args.action != "run":
        raise UsageError("a cluster runs morph's control loop (morph run); morph reshard runs on one box")
    if args.compare:
        raise UsageError(
            "--compare relaunches every rank on one box; across torchrun jobs it is "
            "benchmarks/elastic_torchrun.py's measurement, not morph's"
        )
    scenario = parse_scenario(args.scenario)
    world = check_cluster(nodes, k, args.world, scenario, max_restarts)
    d = args.checkpoint_dir
    if d is not None and not (os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK)):
        raise UsageError(
            f"--checkpoint-dir {d}: not a folder this worker can write in (every node's workers "
            f"write their checkpoints there)",
            "checkpoint_dir",
        )
    check_run(
        model_of(args), world, args.global_batch, 100 if args.steps is None else args.steps, args.segment, scenario
    )
    return world


def control(args) -> int:
    """morph run: on one box (a launch of ``--world`` ranks per run), or as one worker of a cluster."""
    cluster = None
    if not in_cluster(args) and args.checkpoint_dir is not None:
        raise UsageError(
            "--checkpoint-dir places a cluster's checkpoints (with --lighthouse, under netmorph "
            "launch); on one box they go to a temporary folder",
            "checkpoint_dir",
        )
    if in_cluster(args):
        if args.late_nodes:
            raise UsageError("--late-node: morph's cluster starts every node at once", "late_node")
        from netmorph.morph.cluster import Cluster, lost, rejoins
        from netmorph.morph.controller import parse_scenario

        scenario = parse_scenario(args.scenario)
        args.world = cluster_check(
            args, args.nodes, int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
        )
        cluster = Cluster(
            args.lighthouse,
            args.node,
            args.nodes,
            args.timeout,
            joins=rejoins(scenario),
            checkpoint_dir=args.checkpoint_dir,
        )
        if cluster.leaves:  # restarted, and the scenario takes no node back
            cluster.close()
            if lost(scenario) == args.node:  # lost for good (no node-joins: at most one loss)
                print(
                    f"# netmorph morph: node {args.node} restarted by torchrun after the scenario lost it; the run "
                    "goes on without it (the scenario has no node-joins after the loss)",
                    file=sys.stderr,
                )
                return 0
            print(
                f"netmorph morph: node {args.node} was restarted by torchrun after a worker of it failed, which the "
                f"scenario did not do; morph takes a node back only at a node-joins step, so this one leaves "
                f"(the first incarnation's log above says why it failed)",
                file=sys.stderr,
            )
            return 1
    try:
        code = _control_on(args, cluster)
        if cluster is not None and cluster.head:  # it printed the job's result: its code is the job's
            report(args, code)
        return code
    finally:
        if cluster is not None:
            cluster.close()


def _control_on(args, cluster) -> int:
    from netmorph.morph.cluster import lost
    from netmorph.morph.controller import (
        Trainer,
        check_run,
        parse_scenario,
        relaunch_seconds,
        run_adaptive,
        run_static,
        twin_of,
    )
    from netmorph.morph.members import membership_changes
    from netmorph.morph.scenario import LOSSES

    if args.compare and args.static == 0:
        raise UsageError("--compare restarts the start split beside its static run: --static 1 or more", "static")
    world = 8 if args.world is None else args.world
    steps = 100 if args.steps is None else args.steps
    scenario = parse_scenario(args.scenario)
    model = model_of(args)
    check_run(model, world, args.global_batch, steps, args.segment, scenario)
    trainer = Trainer(
        model, args.global_batch, world, args.timeout, args.compute_ms, args.inter_node_mbps, args.checkpoint_every
    )
    workers = None if cluster is None else cluster.comm  # a cluster: the runs are on this communicator

    def head() -> bool:  # whether this process prints: rank 0 now (a survivor's once a loss of node 0 renumbers)
        return cluster is None or cluster.head

    def say(*a, **k) -> None:
        if not args.json and head():
            print(*a, **k)

    where = (
        "two emulated nodes"
        if cluster is None
        else f"two torchrun jobs of {world // 2} workers (gloo, the links emulated on it)"
    )
    say(
        f"# netmorph morph: GPT {args.layers} layers x {args.hidden}, sequence {model.seq}, on {world} ranks, "
        f"{where} ({1 / trainer.base.beta / 1e9:.0f} GB/s inside, {1 / trainer.base.beta_inter / 1e6:g} MB/s "
        f"between), accelerators of {trainer.device_flops / 1e9:.3g} GFLOP/s; {steps} steps, scenario "
        f"{scenario.label()}"
    )
    from netmorph.calibrate.run import measure_links
    from netmorph.cli.progress import Bar

    quiet = {} if head() else {"tty": False, "every": math.inf}  # one worker of a cluster shows progress
    with Bar("morph", **quiet) as bar:
        with bar.task("measuring the links (netmorph calibrate's link phase)"):
            links = (
                measure_links(world, trainer.base, timeout=args.timeout)
                if cluster is None
                else cluster.links(trainer.base)
            )
        twin = twin_of(trainer, links)
        hw = twin.hardware
        say(
            f"the twin: links measured on these ranks (inside a node {1e6 * hw.alpha_intra:.0f} us + "
            f"{hw.nvlink_bandwidth / 1e6:.0f} MB/s, between {1e6 * hw.alpha_inter:.0f} us + "
            f"{hw.nic_bandwidth / 1e6:.1f} MB/s), the planner's step time of every layout:",
            flush=True,
        )
        ranked = twin.layouts(world, model.seq)
        for lay in ranked[:SHOWN]:
            t = twin.step(lay)
            comm = ", ".join(
                f"{k.replace('_parallel', '').replace('pipeline_p2p', 'pp')} {1e3 * v:.0f}"
                for k, v in t.comm_s.items()
                if v >= 5e-4
            )
            say(
                f"  {lay.tag():<14} {1e3 * t.step_time_s:6.0f} ms/step  (compute {1e3 * t.compute_s:.0f}, "
                f"bubble {1e3 * t.bubble_s:.0f}" + (f", {comm}" if comm else "") + ")"
            )
        if len(ranked) > SHOWN:
            say(f"  ... and {len(ranked) - SHOWN} more")
        start = ranked[0]
        say(
            f"start on {start.tag()} (the twin's best on the healthy cluster); controller every {args.segment} steps:",
            flush=True,
        )
        with bar.task("the control loop's run"):
            adaptive = run_adaptive(
                trainer, twin, start, steps, args.segment, scenario, log=say, comm=workers, verbose=not args.json
            )
        statics = {}
        # the best-ranked splits, and under memory pressure the best of those that fit the tightest memory: the
        # split a user who knew the scenario would have chosen
        tight = min(scenario.memory(s) for s in range(steps + 1))
        fits = [] if math.isinf(tight) else replace(twin, memory_share=tight).layouts(world, model.seq)[:1]
        # a cluster that lost a node has no second node left for the static splits: the adaptive run alone
        alone = cluster is not None and membership_changes(scenario)
        for lay in [] if alone or args.static == 0 else list(dict.fromkeys(ranked[: args.static] + fits)):
            say(f"static {lay.tag()} ...", flush=True)
            with bar.task(f"static {lay.tag()}"):
                statics[lay.tag()] = run_static(
                    trainer, lay, steps, args.segment, scenario, log=say, twin=twin, comm=workers
                )
        restart = None
        if args.compare:
            with bar.task("measuring a restart, then the start split restarted as torchrun would"):
                restart_s = relaunch_seconds(world, trainer.base, args.timeout)
                say(
                    f"restart {start.tag()} ... (a relaunch of {world} ranks and their rendezvous: {restart_s:.2f} s)",
                    flush=True,
                )
                restart = run_static(
                    trainer, start, steps, args.segment, scenario, log=say, twin=twin, restart_s=restart_s
                )
    if not head():  # a cluster's worker other than rank 0 (at the end): it ran its part, rank 0 prints
        return 0
    best_static = min(statics, key=lambda k: statics[k].total_s) if statics else None
    healthy = min(steps, scenario.at if scenario.events else steps)
    # the twin as the run left it (the per-operator cost it measured), on the healthy link: each static split's
    # healthy steps against it
    healed = replace(adaptive.twin, hardware=replace(adaptive.twin.hardware, nic_bandwidth=hw.nic_bandwidth))
    predicted = {lay.tag(): healed.predict(lay) for lay in dict.fromkeys(ranked + fits)}
    measured = {k: statistics.median(r.step_s[:healthy]) for k, r in statics.items() if healthy and r.step_s}
    out = {
        "world": world,
        "steps": steps,
        "scenario": scenario.label(),
        "decisions": [
            {
                "step": d.step,
                "from": d.before,
                "to": d.after,
                "measured_step_s": _finite(d.measured_step_s),
                "predicted_current_s": _finite(d.predicted_current_s),
                "predicted_best_s": d.predicted_best_s,
                "reshard_bytes": d.reshard_bytes,
                "reshard_s": d.reshard_s,
                "payback_steps": _finite(d.payback_steps),
                "reason": d.reason,
                "top": [list(t) for t in d.top],
            }
            for d in adaptive.decisions
        ],
        "throughput": adaptive.throughput(),
        "layouts": adaptive.layout_path,
        "static_runs": {k: _finite(r.total_s) for k, r in statics.items()},
        "static_failed": {k: r.failed for k, r in statics.items() if r.failed},
        "total_s": adaptive.total_s,
        "reshard_s": adaptive.reshard_s,
        "redone_steps": adaptive.redone,
        "start": start.tag(),
        "start_static_total_s": _finite(statics[start.tag()].total_s) if statics else None,
        "best_static": best_static,
        "best_static_total_s": _finite(statics[best_static].total_s) if statics else None,
        "decide_s": adaptive.decide_s,
        "links": {k: {"alpha": v["alpha"], "beta": v["beta"], "base": v.get("base", 0.0)} for k, v in links.items()},
        "restart_total_s": None if restart is None else _finite(restart.total_s),
        "restart_redone_steps": None if restart is None else restart.redone,
        "final_loss": {
            name: (r.losses[-1] if r.losses and not r.failed else None) for name, r in _rows(adaptive, statics, restart)
        },
        "predicted_ms": {k: 1e3 * v for k, v in predicted.items()},
        "measured_healthy_ms": {k: 1e3 * v for k, v in measured.items()},
    }
    if args.plot:
        from netmorph.report.morph import plot_throughput

        plot_throughput(args.plot, adaptive, statics, scenario)
    if args.json:
        print_json(out)
        return 0
    first = statics[start.tag()].total_s if statics else math.nan
    print(
        f"{'run':<24} {'total (s)':>10} {'vs start':>9} {'redone':>7} {'final loss':>11} {'median tokens/s':>16} "
        f"{'healthy ms/step: measured':>26} {'twin':>6}"
    )
    for name, r in _rows(adaptive, statics, restart):
        if r.failed:
            print(f"{name:<24} {'-':>10} {'-':>9} {'-':>7} {'-':>11} {'-':>16}  stopped: {r.failed}")
            continue
        vs = f"{100 * (r.total_s / first - 1):>+8.1f}%" if math.isfinite(first) else f"{'-':>9}"
        tag = name.removeprefix("static ")
        twin_col = (
            f" {1e3 * measured[tag]:>26.0f} {1e3 * predicted[tag]:>6.0f}"
            if tag in measured and tag in predicted
            else ""
        )
        print(
            f"{name:<24} {r.total_s:>10.2f} {vs} {r.redone:>7} {r.losses[-1]:>11.6f} "
            f"{statistics.median(r.throughput()):>16,.0f}" + twin_col
        )

    def total(r, name):
        return f"{r.total_s:.2f} s on {name}" if not r.failed else f"no finish on {name} (stopped: {r.failed})"

    against = (
        f" against {total(statics[start.tag()], 'the start split ' + start.tag())} and "
        f"{total(statics[best_static], f'the best of the {len(statics)} static splits run, ' + best_static)}"
        if statics
        else " (no static split beside it: --static 0)"
        if args.static == 0
        else f" (no static split beside it: across torchrun jobs this run's loss took node {lost(scenario)}'s workers)"
    )
    print(
        f"# adaptive {adaptive.total_s:.2f} s{against}; "
        f"{len(adaptive.decisions)} move(s), {adaptive.reshard_s * 1e3:.1f} ms moving state, {adaptive.redone} steps "
        f"redone; each look {1e3 * max(adaptive.decide_s, default=0):.0f} ms at most (every layout priced by the "
        f"planner, none trial-run)"
    )
    if any(e.kind in LOSSES for e in scenario.events) and statics:
        print(
            "# every run meets the loss mid-step and recovers in its one launch (the static splits with fewer "
            "replicas, as torchelastic restarts them)"
            + ("" if restart is None else "; the restart relaunches every rank and reads the last checkpoint")
        )
    if args.plot:
        print(f"# figure: {args.plot}")
    return 0


def _rows(adaptive, statics: dict, restart) -> list:
    """[(name, Run)] as the table lists them."""
    return (
        [("adaptive", adaptive)]
        + [(f"static {k}", r) for k, r in statics.items()]
        + ([] if restart is None else [(f"restart {next(iter(statics))}", restart)])
    )


def _finite(x: float):
    """JSON has no infinity: a run that stopped, or a move that never pays back, is null."""
    return x if math.isfinite(x) else None
