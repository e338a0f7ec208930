"""Three recoveries of one elastic job compared -- in place (netmorph elastic), rollback to the last in-memory
commit (Horovod Elastic), and restart of every worker from the last checkpoint (torchrun's elastic agent) --
with what each recovery cost: wall time, time to the next step, time to catch up, steps redone."""

from __future__ import annotations

from dataclasses import replace

from netmorph.elastic.restart import restart_all
from netmorph.elastic.train import ElasticConfig, train

RECOVERIES = ("inplace", "rollback", "restart")


def caught_up(run) -> float:
    """Seconds from each death until the job has again completed as many steps as when it died (what a
    recovery costs in wall time, redone steps included), summed over the deaths."""
    total = 0.0
    for e in run["events"]:
        if e.get("kind") == "join":
            continue
        total += next(t for t, s, n in run["timeline"] if t > e["at_s"] and n > 0 and s > e["step"]) - e["at_s"]
    return total


def recovery_summary(run) -> dict:
    """One recovery's figures over its deaths (joins are not recoveries): wall time, recovery (death to the next
    completed step: ``resumed_after_s`` in place, ``recovery_s`` for a restart), steps redone, caught up."""
    kills = [e for e in run["events"] if e.get("kind") != "join"]
    return {
        "wall_s": run["wall_s"],
        "steps_redone": sum(e["steps_redone"] for e in kills),
        "recovery_s": sum(e["resumed_after_s"] if "resumed_after_s" in e else e["recovery_s"] for e in kills),
        "caught_up_s": caught_up(run),
    }


def compare(cfg: ElasticConfig, every: int, inplace: dict | None = None, tick=lambda: None) -> dict:
    """{recovery: its run with its :func:`recovery_summary`} for the same job and deaths, the rollback's commits
    and the restart's checkpoints every ``every`` steps (``inplace``: that run, if it was already made)."""
    inplace = inplace if inplace is not None else train(cfg)
    tick()
    rollback = train(replace(cfg, commit_every=every))
    tick()
    restart = restart_all(replace(cfg, commit_every=every))
    tick()
    return {name: {**run, **recovery_summary(run)} for name, run in zip(RECOVERIES, (inplace, rollback, restart))}
