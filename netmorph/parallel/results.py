"""What one training rank hands back: what it holds, kept apart from what it measured.

torchrun collects nothing of the kind; Megatron's ranks write checkpoints (one file per (tp, pp) rank, tensors
under the full model's names) and log timers. Here a rank returns a :class:`RankReport` -- its coordinates,
losses, step times, bytes by phase and their closed forms, memory, its pipeline timeline -- holding a
:class:`RankState`: its pieces of the 1-rank model by name (what ``--check`` assembles) and its flat buffer
with Adam's moments and their real index (what morph reshards). The job's result, from every rank's report,
is :class:`netmorph.parallel.run.TrainSummary`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class RankState:
    """A rank's training state when its steps end."""

    pieces: dict  # {full weight name: (this rank's piece, dim split over tp, "ep", or None)}
    flat: dict  # {"params": the flat buffer, "m", "v": Adam's moments over its range, "t": its step}
    index: dict  # the buffer's real layout: {"params": {name: (offset, length)}, "padding",
    # "optimizer_range": (lo, hi)}


def _coordinate(dim: str) -> property:
    """A read-only view of one of a report's mesh coordinates (``report.tp`` is ``report.coords["tp"]``)."""
    return property(lambda self: self.coords[dim], doc=f"the rank's {dim} coordinate")


@dataclass
class RankReport:
    """One rank's run (:func:`netmorph.parallel.hybrid.train_rank`)."""

    rank: int
    coords: dict  # its place on the mesh, Layout.coords(rank): tp, cp, ep, dp (the whole
    # data-parallel index), pp, and edp (its expert data-parallel index)
    losses: list | None  # the step losses, on the rank that computes them (else None)
    step_times: list  # seconds per step
    step_bounds: list  # (t0, t1) of each step, perf_counter
    idle_fraction: list  # per step: the share of the pipeline's time it waited
    in_flight_peak: int  # the most microbatches it held at once
    memory_bytes: dict  # model states and activations at the peak
    timeline: list  # (kind, microbatch, chunk, t0, t1) of the last step's slots
    bytes_by_step: list  # {phase: bytes it sent} per step, from the ledger
    predicted: dict  # {phase: (bytes per step, the closed form)}
    params: int  # elements of its flat buffer
    state: RankState
    busy_s: list = field(default_factory=list)  # per step: seconds in its forward and backward slots (compute
    # and the TP collectives inside them): the rest is waiting
    phases_s: list = field(default_factory=list)  # per step: {compute, tp, cp, ep, dp, optimizer, rest: seconds}
    # (netmorph.parallel.phases.split_step), adding up to the step
    ledger: list | None = None  # every message it sent (with trace)
    predicted_by_step: list | None = None  # the routing's closed forms, step by step (a mixture of experts)
    experts: list | None = None  # the router's log, step by step
    checkpoints: list | None = None  # rank 0 of a --save run: one row per checkpoint written

    tp = _coordinate("tp")
    pp = _coordinate("pp")
    dp = _coordinate("dp")
    ep = _coordinate("ep")
    edp = _coordinate("edp")

    def to_json(self) -> dict:
        """Everything but the tensors, as JSON types."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("state", "ledger")}
