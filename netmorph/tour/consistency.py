"""The same least-squares problem on 4 workers under five consistency models (BSP, SSP, asynchronous parameter
server, Hogwild!, local SGD), without and with a 4x straggler."""

from __future__ import annotations

from dataclasses import dataclass

from netmorph.consistency import Config, compare

STEPS = 2
CASES = (("no straggler", None), ("worker 1 four times slower", (1, 4.0)))
WORKERS = 4


@dataclass
class Consistency:
    steps: int  # per worker
    workers: int
    runs: dict  # {case: every mode's summary row}


def run(tick=lambda: None, quick: bool = False) -> Consistency:
    """Every mode on each case; ``quick``: 50 steps a worker instead of 100."""
    runs, steps = {}, 50 if quick else 100
    for label, strag in CASES:
        cfg = Config(workers=WORKERS, steps=steps, model="convex", lr=40.0, compute_ms=2.0, straggler=strag)
        runs[label] = [r.summary for r in compare(cfg)]
        tick()
    return Consistency(steps, WORKERS, runs)
