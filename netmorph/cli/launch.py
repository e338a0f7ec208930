"""``netmorph launch --nodes N --nproc-per-node K -- SUBCOMMAND ARGS``: a cluster of torchrun jobs on this box."""

from __future__ import annotations

import argparse
import sys

from netmorph.cli.flags import int_in, timeout_seconds
from netmorph.errors import Terminated, UsageError, require

RUNS = ("elastic", "morph")  # the subcommands that run as a cluster of torchrun jobs


def add_parser(sub) -> None:
    p = sub.add_parser(
        "launch",
        help="run a subcommand as N torchrun jobs (emulated nodes) and a lighthouse",
        description="Start the lighthouse and N torchrun jobs on 127.0.0.1, each an emulated node of "
        "K workers, running SUBCOMMAND as one cluster (netmorph elastic --lighthouse ...). "
        "Prints the per-node commands a cluster would run; the job's output is its rank 0's "
        "(--json included: node 0's, or a survivor's where the run lost node 0), and launch exits "
        "with the code that rank reports; Ctrl-C and SIGTERM reach every job.",
        usage="netmorph launch --nodes N --nproc-per-node K [--max-restarts R] [--join NODE@STEP] "
        "[--port P] -- SUBCOMMAND ARGS",
    )
    p.add_argument("--nodes", type=int_in(1, 64), required=True, help="nodes: torchrun jobs (1..64)")
    p.add_argument("--nproc-per-node", type=int_in(1, 64), required=True, help="workers per node (torchrun's)")
    p.add_argument(
        "--max-restarts",
        type=int_in(0, 100),
        default=3,
        help="torchrun --max-restarts: how often a node that lost a worker is started again (default 3)",
    )
    p.add_argument(
        "--join",
        action="append",
        default=[],
        metavar="NODE@STEP",
        help="start NODE only once the job has done STEP steps (a node added later; repeatable)",
    )
    p.add_argument("--port", type=int_in(0, 65535), default=0, help="the lighthouse's port (default: a free one)")
    p.add_argument("--wait", type=timeout_seconds, default=3600.0, help="seconds to wait for node 0 (default 3600)")
    p.add_argument(
        "subcommand",
        nargs=argparse.REMAINDER,
        metavar="-- SUBCOMMAND ARGS",
        help="the subcommand each node runs, and its arguments",
    )
    p.set_defaults(run=run)


def _joins(specs, nodes: int) -> dict:
    out = {}
    for spec in specs:
        node, sep, step = spec.partition("@")
        if not sep or not node.isdigit() or not step.isdigit():
            raise UsageError(f"--join must be NODE@STEP, e.g. 1@20, got {spec!r}")
        node, step = int(node), int(step)
        if not 0 < node < nodes:
            raise UsageError(f"--join {spec}: NODE must be in 1..--nodes - 1 = {nodes - 1} (node 0 starts the job)")
        if node in out:
            raise UsageError(f"--join: node {node} is given twice")
        out[node] = step
    return out


def _preflight(sub: str, argv: list, nodes: int, nproc: int, late: list, max_restarts: int) -> None:
    """The subcommand's own checks of its flags for this cluster, here, before any process starts."""
    from netmorph.cli import build_parser

    for flag in ("--lighthouse", "--node-index", "--nodes", "--late-node"):
        if any(a == flag or a.startswith(flag + "=") for a in argv):
            raise UsageError(f"{flag} is launch's to set for each node; leave it out")
    parser = build_parser()
    try:
        args = parser.parse_args([sub, *argv])
    except SystemExit as e:
        if e.code:
            raise UsageError(f"{sub} {' '.join(argv)}: the subcommand's arguments are refused (above)") from None
        raise
    if sub == "elastic":
        from netmorph.cli.elastic import cluster_config

        args.late_nodes = late
        cluster_config(args, nodes, nproc).check()
    if sub == "morph":
        from netmorph.cli.morph_run import cluster_check

        if late:
            raise UsageError(
                "--join: a cluster's morph starts every node at once; node 1 comes back by its "
                "scenario (--scenario node-lost@S,node-joins@T: the workers its torchrun restarts)"
            )
        cluster_check(args, nodes, nproc, max_restarts)


def run(args) -> int:
    require("torch", "netmorph launch")
    from netmorph.elastic.launcher import Cluster, Plan, free_port

    command = args.subcommand[1:] if args.subcommand[:1] == ["--"] else args.subcommand
    if not command:
        raise UsageError("give the subcommand after --, e.g. netmorph launch --nodes 2 --nproc-per-node 2 -- elastic")
    sub, argv = command[0], command[1:]
    if sub not in RUNS:
        raise UsageError(f"launch runs {', '.join(RUNS)} as a cluster of torchrun jobs, not {sub!r}")
    joins = _joins(args.join, args.nodes)
    _preflight(sub, argv, args.nodes, args.nproc_per_node, sorted(joins), args.max_restarts)
    plan = Plan(args.nodes, args.nproc_per_node, [sub, *argv], args.max_restarts, joins, free_port(args.port))
    print(
        f"# netmorph launch: {args.nodes} node(s) x {args.nproc_per_node} worker(s) on 127.0.0.1; a cluster runs:",
        file=sys.stderr,
    )
    for line in plan.commands():
        print(f"#   {line}", file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    with Cluster(plan, stdout=sys.stdout) as cluster:
        try:
            cluster.start()
            code = cluster.wait(args.wait)
        except (KeyboardInterrupt, Terminated):
            cluster.signal_all(__import__("signal").SIGTERM)
            raise
        except TimeoutError as e:
            raise UsageError(f"{e}; raise --wait") from None
        if code:
            node = next((n for n, _ in cluster.failed()), 0)
            tail = cluster.tail(node)
            why = cluster.reported or f"the job reported {code}"
            print(f"netmorph launch: {why}" + (f"; node {node}'s last lines:\n{tail}" if tail else ""), file=sys.stderr)
    return code
