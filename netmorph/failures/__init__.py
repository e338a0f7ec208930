"""Failure economics at scale: checkpoint intervals, goodput of restart vs in-place recovery.

``model``: Young's and Daly's intervals and Daly's complete model (closed forms);
``montecarlo``: the same run failure by failure; ``fleet``: published failure counts of
large runs (``fleet.json``, with sources).
"""

from __future__ import annotations

import json
from pathlib import Path

from netmorph.failures.model import Curve, curve, daly, goodput, inplace_goodput, lost_per_failure, optimum, young
from netmorph.failures.montecarlo import run as monte_carlo

__all__ = [
    "Curve",
    "curve",
    "daly",
    "fleet",
    "goodput",
    "inplace_goodput",
    "job_mtbf",
    "lost_per_failure",
    "monte_carlo",
    "optimum",
    "young",
]


def fleet() -> dict:
    """The published runs: name -> raw inputs (gpus, days, interruptions, what, source)."""
    data = json.loads((Path(__file__).with_name("fleet.json")).read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def job_mtbf(run: dict) -> float:
    """Seconds between interruptions of a published run (its days over its count); times its GPU count, the
    per-GPU MTBF that predicts any other size."""
    return run["days"] * 86400 / run["interruptions"]
