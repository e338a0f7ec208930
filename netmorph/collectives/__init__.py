"""Collective algorithms, naive beside real, one signature per operation.

Each builder is ``f(world, count, itemsize=4, **options) -> Schedule``; ``build``
dispatches by name and turns bad requests into :class:`~netmorph.errors.UsageError`.
"""

from __future__ import annotations

from functools import lru_cache

from netmorph.collectives import allgather, allreduce, alltoall, broadcast, reduce, reduce_scatter
from netmorph.errors import UsageError
from netmorph.schedule import Schedule

ALGORITHMS = {
    "allreduce": {
        "naive": allreduce.naive,
        "ring": allreduce.ring,
        "recursive_doubling": allreduce.recursive_doubling,
        "rabenseifner": allreduce.rabenseifner,
        "binomial": allreduce.binomial,
        "double_binary_tree": allreduce.double_binary_tree,
        "one_shot": allreduce.one_shot,
        "two_shot": allreduce.two_shot,
    },
    "allgather": {
        "ring": allgather.ring,
        "recursive_doubling": allgather.recursive_doubling,
        "bruck": allgather.bruck,
    },
    "reduce_scatter": {
        "ring": reduce_scatter.ring,
        "pairwise": reduce_scatter.pairwise,
        "recursive_halving": reduce_scatter.recursive_halving,
    },
    "broadcast": {
        "naive": broadcast.naive,
        "binomial": broadcast.binomial,
        "scatter_ring": broadcast.scatter_ring,
        "scatter_recursive_doubling": broadcast.scatter_recursive_doubling,
    },
    "reduce": {
        "naive": reduce.naive,
        "binomial": reduce.binomial,
    },
    "alltoall": {
        "naive": alltoall.naive,
        "pairwise": alltoall.pairwise,
        "bruck": alltoall.bruck,
    },
}
OPS = tuple(ALGORITHMS)
ROOTED = ("broadcast", "reduce")

# nccl-tests' bus-bandwidth factor: busbw = algbw * factor(p)
BUSBW_FACTOR = {
    "allreduce": lambda p: 2 * (p - 1) / p,
    "allgather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "alltoall": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
}



def bandwidths(op: str, nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s, nccl-tests' definitions: algbw = size / time, busbw = algbw x factor."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * BUSBW_FACTOR[op](world)


_ALIASES = {"all_reduce": "allreduce", "all_gather": "allgather", "reducescatter": "reduce_scatter",
            "bcast": "broadcast", "all_to_all": "alltoall", "alltoallv": "alltoall"}


def canonical_op(op: str) -> str:
    name = _ALIASES.get(op.lower().replace("-", "_"), op.lower().replace("-", "_"))
    if name not in ALGORITHMS:
        raise UsageError(f"unknown op {op!r}: choose one of {', '.join(OPS)}", "op")
    return name


@lru_cache(maxsize=256)
def check_algo(op: str, algo: str, also=("auto", "all")) -> str:
    """The canonical name of ``algo`` for ``op`` -- the one validator of algorithm names.

    ``also`` lists the extra choices the caller accepts, for the message only."""
    op = canonical_op(op)
    name = algo.lower().replace("-", "_")
    if name not in ALGORITHMS[op]:
        extra = f", {' or '.join(also)}" if also else ""
        raise UsageError(f"{{algo}}: {op} has no algorithm {algo!r}; choose one of "
                         f"{', '.join(ALGORITHMS[op])}{extra}", "algo")
    return name


def check_request(op: str, mode: str, world: int, sizes, itemsize: int, root: int = 0,
                  segments: int | None = None, dtype: str = "") -> list:
    """The algorithms a request names (``mode``: one of ``op``'s, or ``all``/``auto``: every one) for buffers of
    ``sizes`` bytes, or the one line that says which argument to change: each size a whole number of
    ``itemsize``-byte elements (of ``dtype``, named in the line), ``root`` a rank (of ``world`` for broadcast and reduce), ``segments`` only for
    the double binary tree's pipelining (NCCL's chunking of each tree)."""
    op = canonical_op(op)
    algos = list(ALGORITHMS[op]) if mode.lower() in ("all", "auto") else [check_algo(op, mode)]
    for n in sizes:
        if n % itemsize:
            raise UsageError(f"{{nbytes}} {n} is not a whole number of {dtype + ' ' if dtype else ''}elements "
                             f"({itemsize} B each)", "nbytes")
    if not 0 <= root < (world if op in ROOTED else 1 << 20):          # a rank, whatever the op
        raise UsageError(f"{{root}} must be in 0..{world - 1}, got {root}", "root")
    if segments is not None and (op != "allreduce" or "double_binary_tree" not in algos):
        raise UsageError("{segments} applies only to allreduce {algo} double_binary_tree (or all/auto)", "segments")
    return algos


def build(op: str, algo: str, world: int, count: int, itemsize: int = 4, root: int = 0,
          splits=None, **options) -> Schedule:
    """The schedule of ``algo`` for ``op`` on ``world`` ranks and ``count`` elements."""
    op = canonical_op(op)
    algo = check_algo(op, algo)
    if world < 1:
        raise UsageError(f"{{world}} must be >= 1, got {world}", "world")
    if count < 0:
        raise UsageError(f"{{count}} must be >= 0, got {count} elements", "count")
    fn = ALGORITHMS[op][algo]
    kw = dict(options)
    if op in ROOTED:
        if not 0 <= root < world:
            raise UsageError(f"{{root}} must be in 0..{world - 1}, got {root}", "root")
        kw["root"] = root
    if op == "alltoall" and splits is not None:
        kw["splits"] = splits
    return fn(world, count, itemsize, **kw)
