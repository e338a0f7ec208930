"""Collective algorithms, naive beside real, one signature per operation.

Each builder is ``f(world, count, itemsize=4, **options) -> Schedule``; ``build``
dispatches by name and turns bad requests into :class:`~netmorph.errors.UsageError`.
Every algorithm is one :class:`Algorithm` record in :data:`REGISTRY` (builder, closed forms, how the planner
extrapolates it, label, colour); :func:`register` adds one that every command then offers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache, partial

from netmorph.collectives import allgather, allreduce, alltoall, broadcast, reduce, reduce_scatter
from netmorph.collectives.formulas import builtin_form
from netmorph.errors import UsageError
from netmorph.schedule import Schedule


@dataclass(frozen=True)
class Algorithm:
    """One collective algorithm, the one record every part reads: ``collective`` and ``bench`` build and run
    it, the tuner prices it, the planner extrapolates it to groups larger than it simulates, hardware files
    name it, the report and the tour draw it.

    ``build(world, count, itemsize=4, **options) -> Schedule``; ``form(p, n, alpha, beta, gamma)`` its closed
    forms (:class:`~netmorph.collectives.formulas.Formula`, or None: the simulator is the reference); ``growth``
    how its cost grows past the simulated group sizes ("linear": p - 1 steps, a ring's; "log": tree depth);
    ``planner`` whether the planner considers it by default (NCCL's tuner: ring and double binary tree for an
    all-reduce)."""

    op: str
    name: str
    build: Callable
    label: str = ""
    color: str = "#7f7f7f"
    growth: str = "linear"
    planner: bool = False
    form: Callable | None = None

    def closed_form(self, p: int, n: float, alpha: float, beta: float, gamma: float):
        return self.form(p, n, alpha, beta, gamma) if self.form is not None else None


# {op: {name: Algorithm}}, and the builders alone by the same keys (the view most callers index)
REGISTRY: dict = {}
ALGORITHMS: dict = {}
# every algorithm name, in the order first registered (never reordered: the fabric's message headers code by it)
NAMES: list = []


def register(alg: Algorithm) -> Algorithm:
    """Make ``alg`` known to every part of netmorph (a builtin's name is refused: pick a new one)."""
    if alg.name in REGISTRY.get(alg.op, {}):
        raise ValueError(f"{alg.op} already has an algorithm {alg.name!r}")
    if alg.growth not in ("linear", "log"):
        raise ValueError(f"growth must be linear or log, got {alg.growth!r}")
    rec = replace(alg, label=alg.label or alg.name.replace("_", " "))
    REGISTRY.setdefault(alg.op, {})[alg.name] = rec
    ALGORITHMS.setdefault(alg.op, {})[alg.name] = alg.build
    if alg.name not in NAMES:
        NAMES.append(alg.name)
    check_algo.cache_clear()
    return rec


def unregister(op: str, name: str) -> None:
    """Forget an algorithm (a test's own; its name keeps its header code)."""
    del REGISTRY[op][name], ALGORITHMS[op][name]
    check_algo.cache_clear()


def planner_algorithms(op: str) -> tuple:
    """The algorithms the planner prices ``op`` with by default (the cheaper per size, as NCCL's tuner)."""
    return tuple(a.name for a in REGISTRY[op].values() if a.planner)


def _builtin(op, name, fn, color, growth="linear", planner=False):
    register(Algorithm(op, name, fn, color=color, growth=growth, planner=planner, form=partial(builtin_form, op, name)))


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


_ALIASES = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "reducescatter": "reduce_scatter",
    "bcast": "broadcast",
    "all_to_all": "alltoall",
    "alltoallv": "alltoall",
}


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
        raise UsageError(
            f"{{algo}}: {op} has no algorithm {algo!r}; choose one of {', '.join(ALGORITHMS[op])}{extra}", "algo"
        )
    return name


def check_request(
    op: str, mode: str, world: int, sizes, itemsize: int, root: int = 0, segments: int | None = None, dtype: str = ""
) -> list:
    """The algorithms a request names (``mode``: one of ``op``'s, or ``all``/``auto``: every one) for buffers of
    ``sizes`` bytes, or the one line that says which argument to change: each size a whole number of
    ``itemsize``-byte elements (of ``dtype``, named in the line), ``root`` a rank (of ``world`` for broadcast and reduce), ``segments`` only for
    the double binary tree's pipelining (NCCL's chunking of each tree)."""
    op = canonical_op(op)
    algos = list(ALGORITHMS[op]) if mode.lower() in ("all", "auto") else [check_algo(op, mode)]
    for n in sizes:
        if n % itemsize:
            raise UsageError(
                f"{{nbytes}} {n} is not a whole number of {dtype + ' ' if dtype else ''}elements ({itemsize} B each)",
                "nbytes",
            )
    if not 0 <= root < (world if op in ROOTED else 1 << 20):  # a rank, whatever the op
        raise UsageError(f"{{root}} must be in 0..{world - 1}, got {root}", "root")
    if segments is not None and (op != "allreduce" or "double_binary_tree" not in algos):
        raise UsageError("{segments} applies only to allreduce {algo} double_binary_tree (or all/auto)", "segments")
    return algos


def build(
    op: str, algo: str, world: int, count: int, itemsize: int = 4, root: int = 0, splits=None, **options
) -> Schedule:
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


# the colours are matplotlib's tab10, one per all-reduce (the tour's figures put them side by side)
for _op, _name, _fn, _color, _kw in (
    ("allreduce", "naive", allreduce.naive, "#999999", {}),
    ("allreduce", "ring", allreduce.ring, "#1f77b4", {"planner": True}),
    ("allreduce", "recursive_doubling", allreduce.recursive_doubling, "#ff7f0e", {"growth": "log"}),
    ("allreduce", "rabenseifner", allreduce.rabenseifner, "#2ca02c", {"growth": "log"}),
    ("allreduce", "binomial", allreduce.binomial, "#9467bd", {"growth": "log"}),
    ("allreduce", "double_binary_tree", allreduce.double_binary_tree, "#d62728", {"growth": "log", "planner": True}),
    ("allreduce", "one_shot", allreduce.one_shot, "#8c564b", {}),
    ("allreduce", "two_shot", allreduce.two_shot, "#17becf", {}),
    ("allgather", "ring", allgather.ring, "#1f77b4", {"planner": True}),
    ("allgather", "recursive_doubling", allgather.recursive_doubling, "#ff7f0e", {"growth": "log"}),
    ("allgather", "bruck", allgather.bruck, "#2ca02c", {"growth": "log"}),
    ("reduce_scatter", "ring", reduce_scatter.ring, "#1f77b4", {"planner": True}),
    ("reduce_scatter", "pairwise", reduce_scatter.pairwise, "#ff7f0e", {}),
    ("reduce_scatter", "recursive_halving", reduce_scatter.recursive_halving, "#2ca02c", {"growth": "log"}),
    ("broadcast", "naive", broadcast.naive, "#999999", {}),
    ("broadcast", "binomial", broadcast.binomial, "#9467bd", {"growth": "log"}),
    ("broadcast", "scatter_ring", broadcast.scatter_ring, "#1f77b4", {}),
    ("broadcast", "scatter_recursive_doubling", broadcast.scatter_recursive_doubling, "#ff7f0e", {"growth": "log"}),
    ("reduce", "naive", reduce.naive, "#999999", {}),
    ("reduce", "binomial", reduce.binomial, "#9467bd", {"growth": "log"}),
    ("alltoall", "naive", alltoall.naive, "#999999", {}),
    ("alltoall", "pairwise", alltoall.pairwise, "#1f77b4", {"planner": True}),
    ("alltoall", "bruck", alltoall.bruck, "#2ca02c", {"growth": "log"}),
):
    _builtin(_op, _name, _fn, _color, **_kw)
OPS = tuple(ALGORITHMS)
