"""A Monte-Carlo of the same run, failure by failure, beside the closed forms.

Between two failures the job has ``x`` seconds of uptime (a renewal process: ``x``
drawn i.i.d. from the failure distribution). It first spends ``R`` restarting (none
before the first failure); whatever is left runs whole segments of ``tau`` compute +
``C`` checkpoint, and the segment a failure interrupts is lost. With exponential ``x``
the long-run useful fraction is exactly Daly's complete model
(:func:`netmorph.failures.model.goodput`); ``weibull`` draws ``x`` from a Weibull with
the same mean and shape ``k`` (k < 1: failures cluster -- infant mortality, a bad node
failing again soon -- the regime field studies of GPU clusters report), for which no
closed form is claimed.
"""

from __future__ import annotations

import math

import numpy as np


def uptimes(rng, n: int, M: float, dist: str = "exponential", shape: float = 1.0) -> np.ndarray:
    """``n`` times between failures with mean ``M``."""
    if dist == "exponential":
        return rng.exponential(M, n)
    scale = M / math.gamma(1 + 1 / shape)  # Weibull with mean M
    return scale * rng.weibull(shape, n)


def run(
    tau: float,
    C: float,
    R: float,
    M: float,
    hours: float,
    trials: int,
    seed: int = 0,
    dist: str = "exponential",
    shape: float = 1.0,
) -> np.ndarray:
    """Goodput of ``trials`` runs of ``hours`` wall-clock hours each (one value per run)."""
    rng = np.random.default_rng(seed)
    T = hours * 3600
    out = np.empty(trials)
    seg = tau + C
    for i in range(trials):
        n = max(16, int(2 * T / M) + 16)
        x = uptimes(rng, n, M, dist, shape)
        while x.sum() < T:  # enough failures to cover the run
            x = np.concatenate([x, uptimes(rng, n, M, dist, shape)])
        start = np.concatenate([[0.0], np.cumsum(x)[:-1]])
        live = start < T
        x, start = x[live], start[live]
        x = np.minimum(x, T - start)  # the last uptime ends with the run
        restart = np.where(np.arange(len(x)) == 0, 0.0, R)
        work = np.floor(np.maximum(x - restart, 0.0) / seg) * tau
        out[i] = work.sum() / T
    return out
