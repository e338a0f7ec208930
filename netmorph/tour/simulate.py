"""One step of GPT-3 175B on 1024 A100s (tp 8, pp 8, dp 16, 1F1B, gradient buckets overlapped), every rank
simulated, rank 0 of every pipeline stage traced."""

from __future__ import annotations

from netmorph.mesh.layout import Batch, Knobs, Layout
from netmorph.mesh.presets import PRESETS as MODELS
from netmorph.planner.hardware import PRESETS as HARDWARE
from netmorph.simulate import simulate_config

STEPS = 1
LAYOUT = Layout(tp=8, pp=8, dp=16, batch=Batch(global_batch=1536), knobs=Knobs(recompute="full", dp_overlap=True))


def run(tick=lambda: None, quick: bool = False) -> dict:
    """:func:`netmorph.simulate.simulate_config`'s result (``quick`` changes nothing: about a second)."""
    c = LAYOUT
    stage = c.tp * c.dp
    out = simulate_config(MODELS["gpt3-175b"], c, HARDWARE["a100-80g"], "1f1b", [r * stage for r in range(c.pp)])
    tick()
    return out
