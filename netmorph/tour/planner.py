"""The planner over every split of GPT-3 175B on 1024 A100s (memory and best MFU of each tensor x pipeline
split, the plan), and the same search for Llama 3 405B on 16,384 H100s."""

from __future__ import annotations

import time
from dataclasses import dataclass

from netmorph.mesh.layout import Batch, Knobs, Layout
from netmorph.mesh.presets import PRESETS
from netmorph.planner.hardware import PRESETS as HW
from netmorph.planner.memory import memory
from netmorph.planner.search import SearchResult, search

STEPS = 2
MODEL, GPUS, BATCH = "gpt3-175b", 1024, 1536


@dataclass
class Planning:
    result: SearchResult  # GPT-3 175B on GPUS a100-80g
    seconds: float  # the search's wall time
    memory_bytes: float  # of one a100-80g
    splits: list  # (tp, pp, memory() at ZeRO-1 selective recompute, best MFU % or 0: nothing fits)
    layers: int
    big: SearchResult  # Llama 3 405B on 16,384 h100-80g, stages 7 layers short first and last
    big_seconds: float


def run(tick=lambda: None, quick: bool = False) -> Planning:
    """Both searches (``quick`` changes nothing: about a second)."""
    model, hw = PRESETS[MODEL], HW["a100-80g"]
    t0 = time.perf_counter()
    result = search(model, GPUS, hw, BATCH, top=1)
    elapsed = time.perf_counter() - t0
    tick()
    splits = []
    for t in (1, 2, 4, 8):
        for p in (1, 2, 4, 8, 16, 32):
            if model.layers % p:
                continue
            c = Layout(
                tp=t,
                pp=p,
                dp=GPUS // (t * p),
                zero=1,
                batch=Batch(global_batch=BATCH),
                knobs=Knobs(recompute="selective", sequence_parallel=t > 1),
            )
            here = [e for e in result.by_split if (e.layout.tp, e.layout.pp) == (t, p)]
            splits.append((t, p, memory(model, c), 100 * here[0].rates.mfu if here else 0.0))
    # today's model on today's cluster: GQA, SwiGLU, FlashAttention, uneven stages, cp and precision searched
    t0 = time.perf_counter()
    big = search(
        PRESETS["llama-3-405b"],
        16384,
        HW["h100-80g"],
        2048,
        top=1,
        base=Layout(knobs=Knobs(first_stage_layers=7, last_stage_layers=7)),
        fixed={"precision": "bf16"},
    )
    t_big = time.perf_counter() - t0
    tick()
    return Planning(result, elapsed, hw.memory_bytes, splits, model.layers, big, t_big)
