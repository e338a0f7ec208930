"""The control loop on 8 ranks over two emulated nodes while the link between them degrades, beside static
splits, and the plan of a reshard out of a sharded layout."""

from __future__ import annotations

from dataclasses import dataclass

from netmorph.calibrate.run import measure_links
from netmorph.mesh.layout import Layout
from netmorph.mesh.shape import ModelShape
from netmorph.morph.controller import Run, Trainer, parse_scenario, run_adaptive, run_static, twin_of
from netmorph.morph.reshard import Plan, plan
from netmorph.morph.scenario import Scenario

STEPS = 4
WORLD, BATCH = 8, 8
# (steps, segment, emulated compute ms per forward, inter-node MB/s): --quick runs two-thirds of the steps on
# a machine four times faster with links four times faster -- the same ratio of communication to compute
FULL, QUICK = (24, 4, 40.0, 50.0), (16, 4, 10.0, 200.0)


@dataclass
class Morph:
    scenario: Scenario
    segment: int
    start: Layout  # the split the twin ranks first on the healthy cluster
    predicted: dict  # {layout tag: the twin's step seconds on the healthy cluster}, fastest first
    adaptive: Run
    statics: dict  # {layout tag: the same scenario on that split all along}: the start and one other
    moved: Plan  # tp2·pp2·dp2 -> dp8·zero3 of the default GPT


def run(tick=lambda: None, quick: bool = False) -> Morph:
    """The link degrades a third of the way in (``quick``: a quarter), so the loop looks twice before it moves
    and trains on the new split after."""
    steps, segment, compute_ms, mbps = QUICK if quick else FULL
    model = ModelShape(layers=4, hidden=32, heads=4, seq=16, vocab=64)
    scenario = parse_scenario(f"link-degrades@{steps // 4 if quick else steps // 3}")
    trainer = Trainer(model, BATCH, WORLD, compute_ms=compute_ms, inter_mbps=mbps)
    twin = twin_of(trainer, measure_links(WORLD, trainer.base))
    ranked = twin.layouts(WORLD, model.seq)
    tick()
    start = ranked[0]
    adaptive = run_adaptive(trainer, twin, start, steps, segment, scenario, log=lambda *a, **k: None)
    tick()
    statics = {lay.tag(): run_static(trainer, lay, steps, segment, scenario) for lay in ranked[:2]}
    tick()
    moved = plan(model, Layout(tp=2, pp=2, dp=2), Layout(dp=8, zero=3))
    tick()
    return Morph(scenario, segment, start, {lay.tag(): twin.predict(lay) for lay in ranked}, adaptive, statics, moved)
