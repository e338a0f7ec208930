"""The flags that place a torchrun job in a cluster of them, shared by the subcommands that run as one
(``elastic``, ``morph``): what ``netmorph launch`` sets for each node."""

from __future__ import annotations

import os

from netmorph.cli.flags import int_in
from netmorph.errors import UsageError


def add_cluster_flags(p, sub: str, how: str):
    """The flags that place a torchrun job in a cluster (``--lighthouse``, ``--node-index``, ``--nodes``,
    ``--late-node``: what launch sets for each node), in a group of ``sub``'s parser; the group, for more."""
    c = p.add_argument_group("a cluster: every node its own torchrun job (netmorph launch starts them on one box)")
    c.add_argument(
        "--lighthouse",
        metavar="HOST:PORT",
        help="the lighthouse the nodes meet through (netmorph lighthouse --port P); under torchrun each "
        f"node runs: torchrun --nproc-per-node K --max-restarts R -m netmorph {sub} --lighthouse "
        f"HOST:P --node-index I --nodes N ...; {how}",
    )
    c.add_argument(
        "--node-index",
        dest="node",
        type=int_in(0, 1023),
        help="this torchrun job's node, 0..N-1 (with --lighthouse; not --node: torchrun's own parser "
        "reads that as an abbreviation of its --node-rank)",
    )
    c.add_argument("--nodes", type=int_in(1, 1024), help="nodes in the job, late ones included (with --lighthouse)")
    c.add_argument(
        "--late-node",
        dest="late_nodes",
        action="append",
        type=int_in(0, 1023),
        default=[],
        metavar="NODE",
        help="a node that starts after the others, not in the first view (repeatable; "
        "netmorph launch --join NODE@STEP sets it)",
    )
    return c


def in_cluster(args) -> bool:
    """Whether this run is a cluster's node (``--lighthouse``), after checking that the cluster flags come whole,
    name a node of the cluster, and run under torchrun; the flags without ``--lighthouse`` are one line."""
    if not args.lighthouse:
        if args.node is not None or args.nodes is not None or args.late_nodes:
            raise UsageError(
                "--node-index, --nodes and --late-node place a torchrun job in a cluster: add --lighthouse"
            )
        return False
    if args.node is None or args.nodes is None:
        raise UsageError("--lighthouse needs --node-index I and --nodes N (this job's node and how many there are)")
    if args.node >= args.nodes:
        raise UsageError(f"--node-index must be in 0..--nodes - 1 = {args.nodes - 1}")
    if "LOCAL_WORLD_SIZE" not in os.environ:
        raise UsageError("--lighthouse joins a cluster from a torchrun job: run it under torchrun (or netmorph launch)")
    return True


def report(args, code: int) -> int:
    """``code``, told to the lighthouse as the job's (:data:`~netmorph.elastic.lighthouse.EXIT`) by the worker that
    has just printed the job's result: what ``netmorph launch`` exits with, wherever that worker runs."""
    from netmorph.elastic.lighthouse import EXIT, LighthouseStore, parse_address

    host, port = parse_address(args.lighthouse)
    LighthouseStore(host, port, args.timeout).set(EXIT, str(code))
    return code
