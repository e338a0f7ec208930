"""Which algorithm each of the trainer's collectives runs: NCCL's tuner picks per call (ring or tree, by size);
netmorph's trainer takes them from its configuration, ring by default as NCCL's bandwidth-bound choice, so that
``train --dp-algo`` / ``--tp-algo`` run any all-reduce the registry holds (:mod:`netmorph.collectives`) and
nothing in :mod:`netmorph.parallel` names one. The bytes an algorithm sends are its schedule's, counted
(:func:`sent`): for ring that is the closed form 2(g-1)/g·n·B the ledger is held to.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from netmorph.collectives import REGISTRY, build
from netmorph.errors import UsageError
from netmorph.schedule import count


@dataclass(frozen=True)
class CollectiveAlgos:
    dp: str = "ring"  # the gradient all-reduce over dp (an expert replica's over its edp group)
    tp: str = "ring"  # the tensor-parallel all-reduces (Megatron's f and g, the vocab-parallel loss)
    allgather: str = "ring"  # ZeRO's parameter gathers, sequence parallelism's gathers
    reduce_scatter: str = "ring"  # ZeRO's gradient scatter, sequence parallelism's scatters
    pair: str = "ring"  # the tied word embedding's 2-rank all-reduce (first and last stage)
    counts: str = "ring"  # the router's tokens per expert summed over cp (Megatron's tokens_per_expert)
    alltoall: str = "pairwise"  # the experts' dispatch, combine and counts, Ulysses' exchanges (NCCL's p2p pairs)

    def check(self, layout=None) -> None:
        """Every name one the registry holds for its op, and one the trainer can run on ``layout``, or the one
        line naming the field."""
        for field, op in (
            ("dp", "allreduce"),
            ("tp", "allreduce"),
            ("allgather", "allgather"),
            ("reduce_scatter", "reduce_scatter"),
            ("pair", "allreduce"),
            ("counts", "allreduce"),
            ("alltoall", "alltoall"),
        ):
            name = getattr(self, field)
            if name not in REGISTRY[op]:
                arg = f"{field}_algo"
                raise UsageError(
                    f"{{{arg}}}: {op} has no algorithm {name!r}; choose one of {', '.join(REGISTRY[op])}", arg
                )
        if layout is None:
            return
        if self.tp != CollectiveAlgos.tp and layout.knobs.sequence_parallel:
            raise UsageError(
                f"{{tp_algo}} {self.tp} with sequence parallelism: its collectives are all-gathers "
                "and reduce-scatters, not all-reduces; drop {sequence_parallel} or the algorithm",
                "tp_algo",
            )
        if self.dp != CollectiveAlgos.dp and layout.zero:
            raise UsageError(
                f"{{dp_algo}} {self.dp} with ZeRO-{layout.zero}: ZeRO reduces by reduce-scatter and "
                "all-gather, not an all-reduce; drop {zero} or the algorithm",
                "dp_algo",
            )


@lru_cache(maxsize=4096)
def sent(op: str, algo: str, n: int, g: int, r: int, isz: int) -> int:
    """Bytes member ``r`` of a group of ``g`` sends in ``algo``'s ``op`` of ``n`` elements of ``isz`` bytes."""
    if g <= 1 or n <= 0:
        return 0
    return int(count(build(op, algo, g, n, isz)).bytes_sent[r])
