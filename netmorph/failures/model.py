"""Checkpoint/restart economics in closed form: Young's and Daly's intervals, goodput, lost work.

The job fails as a Poisson process with mean time between failures ``M`` (the *job*
MTBF: with N GPUs failing independently, ``M = per-GPU MTBF / N``). A
checkpoint-restart job (torchrun's recovery, Megatron's and DeepSpeed's
``save_checkpoint`` every K steps) computes for ``tau`` seconds, writes a checkpoint
for ``C`` seconds, and repeats; a failure throws away the work since the last
completed checkpoint and costs ``R`` seconds to restart (reschedule, fresh
processes, rendezvous, load the checkpoint) before computing again.

- Young (1974): the interval that minimises the first-order waste
  ``C/tau + (tau/2 + R)/M`` is ``tau = sqrt(2 C M)``.
- Daly (2006), "A higher order estimate of the optimum checkpoint interval for
  restart dumps": ``tau = sqrt(2 C M) [1 + (1/3) sqrt(C/(2M)) + (1/9) C/(2M)] - C``
  for ``C < 2M``, else ``tau = M``.
- Daly's complete model for exponential failures (failures may also strike during a
  checkpoint or a restart): the expected wall time to finish one segment of ``tau``
  useful seconds is ``M e^(R/M) (e^((tau + C)/M) - 1)``, so the goodput (useful
  fraction of wall time) is ``tau / (M e^(R/M) (e^((tau + C)/M) - 1))``.

In-place recovery (netmorph elastic; TorchFT, Oobleck, Bamboo) needs no periodic
checkpoint for a single failure: the survivors restore from the surviving replicas
and redo at most the step in flight. It is the same model with a "checkpoint" every
step ``s`` at no cost and recovery ``r`` instead of the restart: goodput
``s / (M e^(r/M) (e^(s/M) - 1))``. (Assumes a spare takes the failed rank's place at the next
step boundary, as Llama 3's and BLOOM's spare nodes did; the time the job runs one
replica short is not counted.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from netmorph.errors import UsageError

MAX_FAILURES = 5e7  # failures a Monte Carlo run may simulate (all trials)


def human_time(seconds: float) -> str:
    """``0.3 s``, ``1.5 min``, ``3.10 h``, ``2.0 years``: a duration at the scale failure economics speaks in
    (seconds for a replay's scaled costs)."""
    h = seconds / 3600
    if h >= 24 * 365:
        return f"{h / (24 * 365):.1f} years"
    if h >= 1:
        return f"{h:.2f} h"
    if seconds < 60:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.1f} min"


def check_job(M: float, C: float, s: float, days: float, trials: int) -> None:
    """UsageError naming the field when a job cannot be modelled: a checkpoint write ``C`` or a step ``s`` not
    shorter than the job MTBF ``M`` (it would fail before either completes), or more than
    :data:`MAX_FAILURES` failures for ``trials`` runs of ``days`` to simulate."""
    if C >= M:
        raise UsageError(
            f"{{checkpoint_write}} {human_time(C)} is not shorter than the job MTBF {human_time(M)}: "
            "the job would fail before a checkpoint completes",
            "checkpoint_write",
        )
    if s >= M:
        raise UsageError(f"{{step_time}} {human_time(s)} is not shorter than the job MTBF {human_time(M)}", "step_time")
    if days * 86400 / M * trials > MAX_FAILURES:
        raise UsageError(
            f"{{days}} {days:g} x {{trials}} {trials} at a job MTBF of {human_time(M)} is more than "
            f"{MAX_FAILURES / 1e6:g} million failures to simulate; lower {{trials}} or {{days}}",
            "trials",
        )


def young(C: float, M: float) -> float:
    """Young's interval ``sqrt(2 C M)`` (seconds of compute between checkpoints)."""
    return math.sqrt(2 * C * M)


def daly(C: float, M: float) -> float:
    """Daly's higher-order estimate of the optimum interval."""
    if C >= 2 * M:
        return M
    x = C / (2 * M)
    return math.sqrt(2 * C * M) * (1 + math.sqrt(x) / 3 + x / 9) - C


def goodput(tau: float, C: float, R: float, M: float) -> float:
    """Useful fraction of wall time for interval ``tau``, checkpoint ``C``, restart ``R``, job MTBF ``M``
    (Daly's complete model, exponential failures)."""
    if (R + tau + C) / M > 700:  # e^700: the job (almost) never completes a segment
        return 0.0
    return tau / (M * math.exp(R / M) * math.expm1((tau + C) / M))


def inplace_goodput(step: float, r: float, M: float) -> float:
    """In-place recovery: at most the step in flight redone, recovery ``r`` per failure, no checkpoints."""
    return goodput(step, 0.0, r, M)


def lost_per_failure(tau: float, R: float) -> float:
    """First-order expected loss per failure: half an interval of work redone, plus the restart."""
    return tau / 2 + R


def optimum(C: float, R: float, M: float) -> float:
    """The interval that maximises :func:`goodput` exactly (golden-section search on log tau)."""
    lo, hi = math.log(max(C, 1e-3) * 1e-3), math.log(100 * M)
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = goodput(math.exp(a), C, R, M), goodput(math.exp(b), C, R, M)
    for _ in range(200):
        if fa > fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = goodput(math.exp(a), C, R, M)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = goodput(math.exp(b), C, R, M)
    return math.exp((lo + hi) / 2)


@dataclass
class Curve:
    """Goodput against the checkpoint interval for one job MTBF: restart at each of ``taus``, in place, and
    Daly's interval with its goodput (what ``netmorph failures --plot`` and the tour draw)."""

    gpus: int
    mtbf_s: float
    taus: np.ndarray
    restart: np.ndarray
    inplace: float
    daly_s: float
    daly_goodput: float


def curve(gpus: int, M: float, C: float, R: float, r: float, s: float, taus: np.ndarray | None = None) -> Curve:
    """:class:`Curve` of ``gpus`` GPUs whose job MTBF is ``M``: checkpoint ``C``, restart ``R``; in place
    recovery ``r`` and step ``s`` (default intervals: 1 min to 48 h)."""
    taus = np.geomspace(60, 48 * 3600, 300) if taus is None else taus
    t = daly(C, M)
    return Curve(
        gpus, M, taus, np.array([goodput(x, C, R, M) for x in taus]), inplace_goodput(s, r, M), t, goodput(t, C, R, M)
    )
