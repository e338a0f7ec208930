"""One elastic job (4 workers, 200 steps, two SIGKILLed) recovered in place, by rollback to the last commit,
and by restarting every worker from the last checkpoint."""

from __future__ import annotations

from netmorph.elastic.recovery import compare
from netmorph.elastic.train import ElasticConfig, train

STEPS = 3
KILLS = ((2, 60), (1, 140))
EVERY = 25


def run(tick=lambda: None, quick: bool = False) -> tuple[ElasticConfig, dict]:
    """(the job, :func:`netmorph.elastic.recovery.compare`'s runs, the in-place one checked against the
    failure-free run); ``quick`` changes nothing (the job takes about a second)."""
    cfg = ElasticConfig(workers=4, min_workers=2, steps=200, kills=KILLS)
    return cfg, compare(cfg, EVERY, train(cfg, check=True), tick)
