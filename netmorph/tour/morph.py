"""The control loop on 8 ranks over two emulated nodes while the link between them degrades, beside static
splits, and the plan of a reshard out of a sharded layout."""

from __future__ import annotations

from dataclasses import dataclass

from netmorph.mesh.layout import Layout
from netmorph.mesh.shape import ModelShape
from netmorph.morph.controller import Run, Trainer, calibrate, parse_scenario, run_adaptive, run_static
from netmorph.morph.reshard import Plan, plan
from netmorph.morph.scenario import Scenario

STEPS = 4
WORLD, BATCH, RUN_STEPS, SEGMENT = 8, 8, 24, 4


@dataclass
class Morph:
    scenario: Scenario
    segment: int
    start: Layout           # the split the calibration ranks first on the healthy cluster
    adaptive: Run
    statics: dict           # {layout tag: the same scenario on that split all along}: the start and one other
    moved: Plan             # tp2·pp2·dp2 -> dp8·zero3 of the default GPT


def run(tick=lambda: None, quick: bool = False) -> Morph:
    """``quick`` changes nothing: the loop needs its segments to look twice before it moves."""
    model = ModelShape(layers=4, hidden=32, heads=4, seq=16, vocab=64)
    scenario = parse_scenario(f"link-degrades@{RUN_STEPS // 3}")
    trainer = Trainer(model, BATCH, WORLD)
    cal = calibrate(trainer, scenario, RUN_STEPS, steps=3, max_tp=1)
    tick()
    start = cal.best(cal.beta0, WORLD, model.seq)
    adaptive = run_adaptive(trainer, cal, start, RUN_STEPS, SEGMENT, scenario, log=lambda *a, **k: None)
    tick()
    others = [lay for lay in cal.layouts(WORLD, model.seq) if lay != start][:1]
    statics = {lay.tag(): run_static(trainer, lay, RUN_STEPS, SEGMENT, scenario) for lay in [start, *others]}
    tick()
    moved = plan(model, Layout(tp=2, pp=2, dp=2), Layout(dp=8, zero=3))
    tick()
    return Morph(scenario, SEGMENT, start, adaptive, statics, moved)
