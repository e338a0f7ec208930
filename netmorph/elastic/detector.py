"""Failure detectors: is a peer that has gone quiet dead, hung, or only slow?

Two detectors over the same heartbeat stream (arrival times ``heartbeat(t)``),
asked ``suspect(t)`` at any time:

:class:`FixedTimeout` -- torchelastic's semantics: a peer is suspected once no
heartbeat has arrived for ``timeout`` seconds. Checked every ``interval``, it
fires between ``timeout`` and ``timeout + interval`` after the last beat.

:class:`PhiAccrual` -- Hayashibara, Défago, Yared and Katayama, "The φ Accrual
Failure Detector" (SRDS 2004), with the parameters of Akka's
``PhiAccrualFailureDetector``: ``threshold`` (8.0), ``max_sample_size`` (1000
inter-arrival times kept), ``min_std_deviation`` (0.1 s: a floor, so perfectly
regular beats do not make the detector hair-triggered), ``acceptable_heartbeat_pause``
(added to the mean: a pause that long is not yet suspicious) and
``first_heartbeat_estimate`` (1 s: the prior before two beats have arrived, with
σ = μ/4 as Akka seeds it). Instead of a yes/no it outputs

    φ(t) = −log10( P[next inter-arrival > t − t_last] ),  inter-arrival ~ N(μ + pause, max(σ, σ_min)²)

-- the suspicion on a log scale: φ = 1 means a 10% chance the peer is merely late,
φ = 8 one in 10⁸. Here the tail is the exact normal one, ½·erfc(y/√2) with
y = (Δ − μ')/σ' (Akka uses a logistic approximation of it, within about 0.1 of φ
for φ ≤ 10). A hung (SIGSTOPped) peer's φ grows without bound, as a dead one's
does; a slow peer whose beats are late but keep coming moves μ and σ and is not
suspected at the default threshold.
"""

from __future__ import annotations

import math
from collections import deque


class FixedTimeout:
    """Suspect a peer ``timeout`` seconds after its last heartbeat."""

    def __init__(self, timeout: float):
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self.timeout = timeout
        self.last: float | None = None

    def heartbeat(self, t: float) -> None:
        self.last = t

    def suspect(self, t: float) -> bool:
        return self.last is not None and t - self.last > self.timeout


class PhiAccrual:
    def __init__(
        self,
        threshold: float = 8.0,
        max_sample_size: int = 1000,
        min_std_deviation: float = 0.1,
        acceptable_heartbeat_pause: float = 0.0,
        first_heartbeat_estimate: float = 1.0,
    ):
        if not (
            threshold > 0
            and max_sample_size >= 2
            and min_std_deviation > 0
            and acceptable_heartbeat_pause >= 0
            and first_heartbeat_estimate > 0
        ):
            raise ValueError(
                "threshold, min_std_deviation and first_heartbeat_estimate must be > 0, "
                "max_sample_size >= 2, acceptable_heartbeat_pause >= 0"
            )
        self.threshold, self.min_std = threshold, min_std_deviation
        self.pause = acceptable_heartbeat_pause
        self.intervals: deque = deque(maxlen=max_sample_size)
        self._sum = self._squares = 0.0  # running sums of the kept intervals (Akka's HeartbeatHistory)
        # Akka's prior: two intervals of mean ± σ with σ = mean / 4
        std = first_heartbeat_estimate / 4
        for x in (first_heartbeat_estimate - std, first_heartbeat_estimate + std):
            self._keep(x)
        self.last: float | None = None

    def _keep(self, x: float) -> None:
        if len(self.intervals) == self.intervals.maxlen:
            old = self.intervals[0]
            self._sum -= old
            self._squares -= old * old
        self.intervals.append(x)
        self._sum += x
        self._squares += x * x

    def heartbeat(self, t: float) -> None:
        if self.last is not None:
            self._keep(t - self.last)
        self.last = t

    def mean_std(self) -> tuple[float, float]:
        """μ and σ of the inter-arrival times seen (population σ, from running sums as Akka's history keeps
        them: a watchdog asks every poll, for every peer)."""
        n = len(self.intervals)
        mean = self._sum / n
        return mean, math.sqrt(max(self._squares / n - mean * mean, 0.0))

    def phi(self, t: float) -> float:
        """φ at time ``t``: −log10 of the normal model's probability that a beat is still to come."""
        if self.last is None:
            return 0.0
        mean, std = self.mean_std()
        mean += self.pause
        std = max(std, self.min_std)
        y = (t - self.last - mean) / std
        tail = 0.5 * math.erfc(y / math.sqrt(2))
        if tail <= 0.0:  # beyond double precision: ~ y²/2 / ln 10
            return (y * y / 2 + math.log(y * math.sqrt(2 * math.pi))) / math.log(10)
        return -math.log10(tail)

    def suspect(self, t: float) -> bool:
        return self.phi(t) > self.threshold
