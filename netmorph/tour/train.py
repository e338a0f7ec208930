"""A GPT trained split across real ranks: six pipeline schedules on 4 stages, tp2·pp2·dp2 ZeRO-1 against
the 1-rank run and its closed forms, and the model states each ZeRO stage keeps beside the planner's."""

from __future__ import annotations

from dataclasses import dataclass

from netmorph.mesh.shape import ModelShape
from netmorph.parallel.config import TrainConfig
from netmorph.parallel.run import TrainSummary, train
from netmorph.planner.memory import trainer_memory

STEPS = 3
SCHEDULES = (("afab", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zbv", 2), ("dualpipev", 2))


@dataclass
class Training:
    schedules: list  # (schedule, interleave, TrainSummary): pp 4, 8 microbatches, 15 ms emulated forward
    three_d: TrainSummary  # tp2 pp2 dp2 ZeRO-1, with the 1-rank reference
    zero_memory: list  # (stage, measured memory_bytes, the planner's model-state bytes) on dp 4, ZeRO 0-3
    params: int  # the default GPT's parameters


def run(tick=lambda: None, quick: bool = False) -> Training:
    """``quick``: two steps of each pipeline schedule instead of four."""
    small = ModelShape(layers=8, hidden=32, heads=4, seq=16, vocab=64)
    runs = []
    for name, v in SCHEDULES:
        cfg = TrainConfig.make(
            model=small, pp=4, schedule=name, interleave=v, microbatches=8, steps=2 if quick else 4, compute_ms=15.0
        )
        runs.append((name, v, train(cfg)))
    tick()
    three_d = train(TrainConfig.make(model=ModelShape(), tp=2, pp=2, dp=2, zero=1, microbatches=4, steps=2), check=True)
    tick()
    mems = []
    for z in (0, 1, 2, 3):
        cfg = TrainConfig.make(model=ModelShape(), dp=4, zero=z, microbatches=1, steps=1, dtype="float32")
        est = trainer_memory(cfg.model, cfg.layout, 4)
        mems.append((z, train(cfg).memory_bytes, est["params"] + est["grads"] + est["optimizer"]))
    tick()
    return Training(runs, three_d, mems, ModelShape().params())
