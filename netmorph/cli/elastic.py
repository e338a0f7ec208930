"""``netmorph elastic``: data-parallel training that survives killed workers, re-forming in place."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from netmorph.cli import print_json
from netmorph.cli.cluster import add_cluster_flags, in_cluster, report
from netmorph.cli.flags import add_timeout, float_in, int_in, plot_file
from netmorph.errors import UsageError, require

FLAGS = {"kills": "--kill", "joins": "--join", "hangs": "--hang"}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "elastic",
        help="train through worker deaths: detect, agree on a view, re-form in place",
        description="BSP data-parallel training (netmorph train's GPT, or --job lsq: least "
        "squares) on --workers processes; --kill RANK@STEP SIGKILLs a worker mid-step; the "
        "survivors agree on a new membership view through a store and carry on without "
        "a restart.",
    )
    p.add_argument("--workers", type=int, default=4, help="worker processes at launch (default 4)")
    p.add_argument("--min-workers", type=int, default=2, help="fewer members than this ends the job (default 2)")
    p.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    p.add_argument(
        "--kill",
        action="append",
        type=at_step("RANK@STEP"),
        default=[],
        metavar="RANK@STEP",
        help="SIGKILL RANK in STEP's all-reduce (repeatable), e.g. --kill 2@20",
    )
    p.add_argument(
        "--hang",
        action="append",
        type=at_step("RANK@STEP"),
        default=[],
        metavar="RANK@STEP",
        help="SIGSTOP RANK in STEP (hung, not dead): found by the phi-accrual detector after --timeout, "
        "fenced (SIGKILL) and removed from the view (repeatable)",
    )
    p.add_argument(
        "--detector",
        default="phi",
        choices=("phi", "fixed"),
        help="how a hung worker is told from a slow one: phi accrual (default) or a fixed timeout",
    )
    p.add_argument(
        "--join",
        action="append",
        type=at_step("N@STEP"),
        default=[],
        metavar="N@STEP",
        help="N new workers join at STEP and receive the parameters by broadcast (repeatable)",
    )
    p.add_argument(
        "--job",
        default="gpt",
        choices=("gpt", "lsq"),
        help="what trains: gpt (default), netmorph train's GPT trainer (DDP buckets, Adam) on whichever "
        "members are left, renumbered 0..n-1 as ncclCommShrink does; or lsq, least squares on a "
        "ring all-reduce, a step in microseconds (thousands of steps to stop a worker in)",
    )
    p.add_argument(
        "--global-batch",
        type=int_in(1, 1 << 20, "1..2**20"),
        default=None,
        help="samples (gpt: sequences) per step, re-split over the members (default 96; gpt 12)",
    )
    p.add_argument(
        "--lr", type=float_in(0, 100, open_low=True), default=None, help="learning rate (default 0.5; gpt: Adam's 3e-3)"
    )
    p.add_argument("--seed", type=int, default=0, help="--job lsq: the problem's seed (default 0)")
    add_timeout(p, 10)
    p.add_argument("--check", action="store_true", help="also run without failures and compare")
    p.add_argument(
        "--compare",
        action="store_true",
        help="also recover the same job as torchrun does (every worker restarted from the last "
        "checkpoint on disk) and as Horovod Elastic does (roll back to the last in-memory commit)",
    )
    p.add_argument(
        "--checkpoint-every", type=int, default=10, help="--compare: steps between checkpoints / commits (default 10)"
    )
    p.add_argument(
        "--plot",
        type=plot_file,
        metavar="PNG",
        help="--compare: draw membership, throughput and progress over wall time for the three recoveries",
    )
    c = add_cluster_flags(p, "elastic", "--kill and --hang then name the launch's global ranks")
    c.add_argument(
        "--tp",
        type=int_in(1, 32),
        default=1,
        help="tensor parallel over T workers of each node (Megatron's --tensor-model-parallel-size; T "
        "divides --nproc-per-node), data parallel across nodes: a node lost takes whole "
        "tensor-parallel groups with it (default 1)",
    )
    c.add_argument(
        "--pp",
        type=int_in(1, 32),
        default=1,
        help="pipeline stages over P workers of each node (Megatron's --pipeline-model-parallel-size; T x P "
        "divides --nproc-per-node): a replica is one node's T x P workers, data parallel across "
        "nodes (default 1)",
    )
    c.add_argument(
        "--backend",
        default="torch",
        choices=("torch", "torch-native"),
        help="the collectives across a cluster: torch (default), netmorph's schedules over each epoch "
        "group's point-to-point, every message fingerprinted and counted; or torch-native, the epoch "
        "group's own (gloo's, NCCL's), as torchft runs its quorum's process group",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run, flags=FLAGS)


def at_step(shape: str):
    """An argparse type for ``A@STEP`` (``shape`` names the fields, e.g. RANK@STEP): the pair of ints."""

    def parse(spec: str) -> tuple[int, int]:
        try:
            a, b = spec.split("@")
            return int(a), int(b)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {shape}, e.g. 2@20, got {spec!r}") from None

    parse.__name__ = shape
    return parse


def config_from(args):
    """The job the flags describe (one box)."""
    from netmorph.elastic.train import ElasticConfig

    gpt = args.job == "gpt"
    lr = args.lr if args.lr is not None else 3e-3 if gpt else 0.5
    batch = args.global_batch if args.global_batch is not None else 12 if gpt else 96
    return ElasticConfig(
        workers=args.workers,
        min_workers=args.min_workers,
        steps=args.steps,
        global_batch=batch,
        lr=lr,
        seed=args.seed,
        job=args.job,
        kills=tuple(args.kill),
        joins=tuple(args.join),
        hangs=tuple(args.hang),
        detector=args.detector,
        timeout=args.timeout,
    )


def cluster_config(args, nodes: int, k: int):
    """The job as a cluster of ``nodes`` torchrun jobs of ``k`` workers (``--workers`` is then nodes x k)."""
    if any(n >= nodes for n in args.late_nodes):
        raise UsageError(f"--late-node must be in 0..--nodes - 1 = {nodes - 1}")
    if args.job != "gpt" or args.compare or args.plot or args.join:
        raise UsageError(
            "a cluster runs --job gpt; --compare, --plot and --join are the one-box launch's (a node "
            "joins by starting: netmorph launch --join NODE@STEP)"
        )
    return replace(
        config_from(args),
        workers=nodes * k,
        nodes=nodes,
        late_nodes=tuple(args.late_nodes),
        min_workers=min(args.min_workers, nodes * k),
        tp=args.tp,
        pp=args.pp,
    )


def _cluster(args):
    """``--lighthouse``: this torchrun job is one node of a cluster; the summary on the final view's rank 0."""
    cfg = cluster_config(args, args.nodes, int(os.environ["LOCAL_WORLD_SIZE"]))
    cfg.check()
    from netmorph.elastic.node import run as run_node

    return cfg, run_node(cfg, args.lighthouse, args.node, check=args.check, native=args.backend == "torch-native")


def run(args) -> int:
    require("torch", "netmorph elastic")  # the membership store is torch's FileStore
    from netmorph.elastic.train import train

    gpt = args.job == "gpt"
    cfg = config_from(args)
    if in_cluster(args):
        cfg, out = _cluster(args)
        if out is None:  # not the final view's rank 0: it prints for the job, as nccl-tests under mpirun
            return 0
        return report(args, _print(args, cfg, out, gpt))
    cfg = replace(cfg, tp=args.tp, pp=args.pp)  # > 1 is refused on one box: a node is its failure domain
    cfg.check()
    if args.backend != "torch":
        raise UsageError(
            f"--backend {args.backend} picks the collectives across a cluster's nodes; on one box elastic "
            "runs on netmorph's fabric: run it under netmorph launch"
        )
    if not 1 <= args.checkpoint_every <= (cfg.steps if args.compare else 100_000):  # vs --steps: --compare's
        raise UsageError(
            f"--checkpoint-every must be in 1..{'--steps ' + str(cfg.steps) if args.compare else 100_000}"
            f", got {args.checkpoint_every}"
        )
    if args.plot and not args.compare:
        raise UsageError("--plot draws the three recoveries: add --compare")
    from netmorph.runtime import budget

    budget.check(
        0,
        budget.elastic(args.job, cfg.workers, cfg.steps, 3 if args.compare else 1),
        f"{cfg.steps} steps on {budget.ranks(cfg.workers)}",
        "",
        "--steps or --workers",
    )
    out = train(cfg, check=args.check)  # fewer than --min-workers left: LaunchError, exit 1
    if args.compare:
        out["compare"] = _compare(cfg, out, args.checkpoint_every)
    if args.plot:
        from netmorph.report.elastic import plot_recoveries

        plot_recoveries(
            out["compare"],
            cfg.global_batch,
            args.plot,
            f"{cfg.workers} workers, {cfg.steps} steps; checkpoint / commit every {args.checkpoint_every}",
        )
    return _print(args, cfg, out, gpt)


def _print(args, cfg, out, gpt: bool) -> int:
    from netmorph.elastic.gpt import MODEL

    if args.json:
        print_json(out)
        return 0
    what = (
        "least squares"
        if not gpt
        else (f"netmorph train's GPT ({MODEL.layers} layers, hidden {MODEL.hidden}, DDP buckets, Adam)")
    )
    where = (
        f"{out['nodes']} nodes (torchrun jobs) x {out['nproc_per_node']} = {cfg.workers} workers"
        if "nodes" in out
        else f"{cfg.workers} workers"
    )
    inside = [f"tensor parallel {cfg.tp}"] * (cfg.tp > 1) + [f"{cfg.pp} pipeline stages"] * (cfg.pp > 1)
    if inside:
        where += f", {' x '.join(inside)} within each node, data parallel across"
    over = "replicas" if inside else "members"
    coll = {  # a cluster: whose collectives run on the membership epochs' gloo groups
        "torch-native": "; collectives: gloo's own on each membership epoch's group",
        "torch": "; collectives: netmorph's schedules over each membership epoch's gloo group",
    }.get(out.get("backend"), "")
    if out.get("node_group"):
        coll += "; within a node: its torchrun job's own process group, kept across the epochs"
    print(
        f"# netmorph elastic: {what} on {where} (min {cfg.min_workers}), {cfg.steps} steps, global "
        f"batch {cfg.global_batch}{' sequences' if gpt else ''} re-split over the {over}; kills: "
        + (", ".join(f"rank {r} in step {s}" for r, s in cfg.kills) or "none")
        + ("; hangs: " + ", ".join(f"rank {r} in step {s}" for r, s in cfg.hangs) if cfg.hangs else "")
        + ("; joins: " + ", ".join(f"{n} at step {s}" for n, s in cfg.joins) if cfg.joins else "")
        + coll
    )
    wide = max(20, *(len(str(e["members"])) for e in out["epochs"]))
    print(f"{'epoch':>5} {'members':<{wide}} {'from step':>9}")
    for e in out["epochs"]:
        print(f"{e['epoch']:>5} {str(e['members']):<{wide}} {e['first_step']:>9}")
    if out["events"]:
        width = max(14, *(len(",".join(map(str, e.get("ranks") or [e["rank"]]))) + 11 for e in out["events"]))
        print(f"{'event':<{width}} {'step':>5} {'detected':>10} {'agreed':>10} {'resumed':>10} {'steps redone':>12}")
        for e in out["events"]:
            ranks = e.get("ranks") or [e["rank"]]
            what = (
                f"join {sorted(e['rank'])}"
                if e["kind"] == "join"
                else f"{e['kind']} rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}"
            )
            print(
                f"{what:<{width}} {e['step']:>5} {1e3 * e['detected_after_s']:>8.1f}ms "
                f"{1e3 * e['agreed_after_s']:>8.1f}ms {1e3 * e['resumed_after_s']:>8.1f}ms {e['steps_redone']:>12}"
            )
        print(
            "# times after the death or the hang (a join: after the members reached its step); resumed = the next "
            "completed step. "
            + (
                "The survivors kept their processes and read nothing from disk; a node that lost "
                "a worker (restarted by its torchrun) or started late asked to join"
                + (
                    f", healed from a live peer {out['heal_s']:.2f} s after its workers started "
                    "(imports and rendezvous included)."
                    if "heal_s" in out
                    else "."
                )
                if "nodes" in out
                else "No process was restarted and nothing was read from disk."
            )
        )
    if getattr(cfg, "late_nodes", ()) and not any(e["kind"] == "join" for e in out["events"]):
        print(
            f"# node(s) {', '.join(map(str, cfg.late_nodes))} started late and were not admitted before the last "
            "step (raise --steps)"
        )
    print(f"# final loss {out['losses'][-1]:.6g}; wall {out['wall_s']:.2f} s")
    if args.compare:
        print(f"# the same job and kills, three recoveries (checkpoint / commit every {args.checkpoint_every} steps):")
        print(f"{'recovery':<40} {'wall(s)':>8} {'steps redone':>12} {'recovery (ms)':>14} {'caught up (ms)':>15}")
        for name, label in (
            ("inplace", "netmorph in place"),
            ("rollback", "Horovod Elastic: last commit"),
            ("restart", "torchrun-style: restart all + checkpoint"),
        ):
            c = out["compare"][name]
            print(
                f"{label:<40} {c['wall_s']:>8.2f} {c['steps_redone']:>12} {1e3 * c['recovery_s']:>14.1f} "
                f"{1e3 * c['caught_up_s']:>15.1f}"
            )
        print(
            "# recovery: from the death to the next completed step; caught up: until the job is back at the step it "
            "died in (redone steps included); both summed over the kills. The restart here forks warm processes; "
            "real torchrun starts fresh interpreters (benchmarks/elastic_torchrun.py measures it)."
        )
        if cfg.joins:
            print(
                "# the restart baseline runs --workers throughout (no joins); torchrun's agent would restart every "
                "worker on a join as well."
            )
    if args.check:
        ok = out["max_rel_loss_diff"] <= 1e-9 and out["max_rel_param_diff"] <= 1e-9
        print(
            f"# check: the failure-free run on the same global batches: max relative loss difference "
            f"{out['max_rel_loss_diff']:.1e}, parameters {out['max_rel_param_diff']:.1e} {'✓' if ok else '✗'}"
        )
    return 0


def _compare(cfg, inplace, every) -> dict:
    """The three recoveries, each as its summary, events and timeline (the ``--json`` object's ``compare``)."""
    from netmorph.elastic.recovery import compare

    keys = ("wall_s", "steps_redone", "recovery_s", "caught_up_s", "events", "timeline")
    return {name: {k: run[k] for k in keys} for name, run in compare(cfg, every, inplace).items()}
