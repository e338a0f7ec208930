"""Goodput against the checkpoint interval at 1k, 16k and 100k GPUs, the per-GPU MTBF from Llama 3's published
interruptions: the closed forms, and the Monte-Carlo at Daly's interval."""

from __future__ import annotations

from dataclasses import dataclass

from netmorph.failures import curve, daly, fleet, job_mtbf, monte_carlo

STEPS = 1
SIZES = (1024, 16384, 100_000)
COSTS = (60.0, 600.0, 60.0, 10.0)  # checkpoint write, restart, in-place recovery, step (s): assumptions


@dataclass
class Failures:
    run: dict  # Llama 3 405B's published failure record
    per_gpu_mtbf_s: float
    costs: tuple  # COSTS
    curves: list  # a netmorph.failures.Curve per size
    monte_carlo: dict  # {gpus: [(Daly's interval, mean goodput, its standard error)]} over 54 days


def run(tick=lambda: None, quick: bool = False) -> Failures:
    """Closed forms and 100 simulated 54-day runs per size (``quick`` changes nothing: under a second)."""
    f = fleet()["llama3-405b"]
    per_gpu = job_mtbf(f) * f["gpus"]
    C, R, r, s = COSTS
    curves, mc = [], {}
    for n in SIZES:
        M = per_gpu / n
        curves.append(curve(n, M, C, R, r, s))
        t = daly(C, M)
        g = monte_carlo(t, C, R, M, hours=54 * 24, trials=100, seed=1)
        mc[n] = [(t, float(g.mean()), float(g.std(ddof=1) / len(g) ** 0.5))]
    tick()
    return Failures(f, per_gpu, COSTS, curves, mc)
