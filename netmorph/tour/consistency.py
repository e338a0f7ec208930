"""The same least-squares problem on 4 workers under five consistency models (BSP, SSP, asynchronous parameter
server, Hogwild!, local SGD), without and with a 4x straggler."""

from __future__ import annotations

from netmorph.consistency import Config, compare

STEPS = 2
CASES = (("no straggler", None), ("worker 1 four times slower", (1, 4.0)))


def run(tick=lambda: None, quick: bool = False) -> dict:
    """{case: every mode's summary row} (``quick`` changes nothing: about 3 s a case)."""
    runs = {}
    for label, strag in CASES:
        cfg = Config(workers=4, steps=100, model="convex", lr=40.0, compute_ms=2.0, straggler=strag)
        runs[label] = [r.summary for r in compare(cfg)]
        tick()
    return runs
