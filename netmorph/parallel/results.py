"""What one training rank hands back -- what it holds, kept apart from what it measured -- and what the job
returns once every rank has.

torchrun collects nothing of the kind; Megatron's ranks write checkpoints (one file per (tp, pp) rank, tensors
under the full model's names) and log timers. Here a rank returns a :class:`RankReport` -- its coordinates,
losses, step times, bytes by phase and their closed forms, memory, its pipeline timeline -- holding a
:class:`RankState`: its pieces of the 1-rank model by name (what ``--check`` assembles) and its flat buffer
with Adam's moments and their real index (what morph reshards). The job's result is a :class:`TrainSummary`
(what ``netmorph train`` prints; its ``to_json()`` is ``--json``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from netmorph.parallel.hybrid import TrainConfig


@dataclass
class RankState:
    """A rank's training state when its steps end."""

    pieces: dict          # {full weight name: (this rank's piece, dim split over tp, "ep", or None)}
    flat: dict            # {"params": the flat buffer, "m", "v": Adam's moments over its range, "t": its step}
    index: dict           # the buffer's real layout: {"params": {name: (offset, length)}, "padding",
                          # "optimizer_range": (lo, hi)}


def _coordinate(dim: str) -> property:
    """A read-only view of one of a report's mesh coordinates (``report.tp`` is ``report.coords["tp"]``)."""
    return property(lambda self: self.coords[dim], doc=f"the rank's {dim} coordinate")


@dataclass
class RankReport:
    """One rank's run (:func:`netmorph.parallel.hybrid.train_rank`)."""

    rank: int
    coords: dict                           # its place on the mesh, Layout.coords(rank): tp, cp, ep, dp (the whole
                                           # data-parallel index), pp, and edp (its expert data-parallel index)
    losses: list | None                    # the step losses, on the rank that computes them (else None)
    step_times: list                       # seconds per step
    step_bounds: list                      # (t0, t1) of each step, perf_counter
    idle_fraction: list                    # per step: the share of the pipeline's time it waited
    in_flight_peak: int                    # the most microbatches it held at once
    memory_bytes: dict                     # model states and activations at the peak
    timeline: list                         # (kind, microbatch, chunk, t0, t1) of the last step's slots
    bytes_by_step: list                    # {phase: bytes it sent} per step, from the ledger
    predicted: dict                        # {phase: (bytes per step, the closed form)}
    params: int                            # elements of its flat buffer
    state: RankState
    ledger: list | None = None             # every message it sent (with trace)
    predicted_by_step: list | None = None  # the routing's closed forms, step by step (a mixture of experts)
    experts: list | None = None            # the router's log, step by step

    tp = _coordinate("tp")
    pp = _coordinate("pp")
    dp = _coordinate("dp")
    ep = _coordinate("ep")
    edp = _coordinate("edp")

    def to_json(self) -> dict:
        """Everything but the tensors, as JSON types."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("state", "ledger")}


@dataclass
class TrainSummary:
    """A training job's result, from every rank's :class:`RankReport` (:func:`netmorph.parallel.run.summarise`).

    Per-phase figures are bytes each rank sent per step, the maximum over ranks, beside the closed form."""

    config: TrainConfig                    # what ran: the model, the layout and the run's options
    backend: str
    losses: list                           # per step
    step_times_s: list                     # per step, the slowest rank's
    step_time_s: float                     # the median after the first step
    tokens_per_s: float
    bytes_per_rank_by_phase: dict          # {phase: measured} (a routed phase: its last step)
    predicted_bytes_per_rank_by_phase: dict
    traffic_exact: dict                    # {phase: every rank sent its closed form, every step}
    formulas: dict                         # {phase: the closed form, as text}
    in_flight_peak: dict                   # {pp rank: the most microbatches it held}
    bubble_fraction: dict                  # {"theory": (p-1)/(v·m+p-1), "measured": the share of time waited}
    memory_bytes: dict                     # params, grads, optimizer, activations_peak: the most loaded rank
    timeline: dict                         # {rank: its last step's slots}, the ranks of tp 0 and dp 0
    pp_rank: dict                          # {rank: its pipeline stage}
    step_bytes_by_phase: list              # per step {phase: bytes}
    experts_by_rank: dict | None = None    # with experts: {rank: (tp, pp, dp, the router's log)}
    bytes_by_rank: list | None = None      # with experts: every rank's bytes by step
    reference_losses: list | None = None   # with --check: the 1-rank run
    reference_kept: list | None = None     # with --check and experts: the 1-rank run's kept tokens by step
    max_rel_loss_diff: float | None = None
    max_abs_weight_diff: float | None = None
    trace: dict | None = None              # with --trace: the last step as Trace Event Format
    baseline: dict | None = None           # with --baseline ddp: PyTorch DDP and the no-communication bound

    def to_json(self) -> dict:
        """The ``--json`` object: the layout's fields first, then every result that was computed (no trace)."""
        cfg, lay = self.config, self.config.layout
        out = {"world": cfg.world, "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "zero": lay.zero,
               "schedule": lay.pipeline_schedule, "interleave": lay.interleave, "microbatches": lay.microbatches,
               "micro_batch_size": lay.micro_batch_size, "global_batch": lay.global_batch, "steps": cfg.steps,
               "backend": self.backend, "dtype": cfg.dtype, "sequence_parallel": lay.sequence_parallel,
               "dp_mode": cfg.dp_mode, "model": {**asdict(cfg.model), "params": cfg.model.params()}}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in ("config", "backend", "trace") and value is not None:
                out[f.name] = value
        return out
