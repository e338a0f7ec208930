"""The layouts morph moves between on netmorph's trainer, and the maps a reshard plans on.

Where every element of the training state lives under a layout -- each rank's flat buffer in global ids, the
ranges it holds -- is :mod:`netmorph.mesh.elements` (a checkpoint reads the same map); a reshard's plan is array
work on two such maps (:mod:`netmorph.morph.reshard`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from netmorph.errors import UsageError
from netmorph.mesh.elements import global_ids
from netmorph.mesh.layout import Layout
from netmorph.mesh.shape import ModelShape
from netmorph.parallel.config import TrainConfig

MAX_RANKS = 16  # processes on one machine


def check_move(world: int, steps: int) -> None:
    """A reshard runs ``steps`` steps before and after the move on ``world`` local ranks, or the one line."""
    if not 1 <= world <= MAX_RANKS:
        raise UsageError(f"{{world}} must be in 1..{MAX_RANKS} (processes on this machine), got {world}", "world")
    if not 1 <= steps <= 1000:
        raise UsageError(f"{{steps}} must be in 1..1000, got {steps}", "steps")


def grow_sources(old: ModelShape, new: ModelShape) -> dict:
    """{"params" | "m" | "v": for each global id of ``new``, the global id of ``old`` it starts from, or -1 for a
    fresh zero} when the context grows from ``old.seq`` to ``new.seq`` positions and nothing else changes.

    The learned position table's new rows copy its trained rows over and over (row i starts as row i mod
    ``old.seq``: Longformer's initialisation when it took RoBERTa from 512 to 4,096 positions); Adam's moments
    start at zero for them, as for any new parameter. Every other element keeps its value."""
    if replace(old, seq=new.seq) != new or new.seq < old.seq:
        raise ValueError(f"only the sequence length may grow ({old} -> {new})")
    a, b = global_ids(old), global_ids(new)
    params = np.empty(sum(g.size for g in b.values()), dtype=np.int64)
    for name, g in b.items():
        src = a[name][np.arange(new.seq) % old.seq] if name == "wpe" else a[name]
        params[g.ravel()] = src.ravel()
    moments = params.copy()
    moments[b["wpe"][old.seq :].ravel()] = -1
    return {"params": params, "m": moments, "v": moments}


def parse_layout(text: str, world: int) -> Layout:
    """``"tp2,pp2"``, ``"dp4,zero3"``, ``"tp2,pp2,v2"``: :meth:`Layout.parse <netmorph.mesh.layout.Layout.parse>`."""
    return Layout.parse(text, world)


def train_config(
    model: ModelShape,
    layout: Layout,
    steps: int,
    global_batch: int,
    start: int = 0,
    compute_ms: float = 0.0,
    device_flops: float = 0.0,
):
    """The trainer's :class:`~netmorph.parallel.config.TrainConfig` for ``layout``: ``global_batch`` sequences a
    step as one-sequence microbatches over its dp ranks, from step ``start`` (a resumed or resharded run), on
    accelerators emulated as ``compute_ms`` a forward plus ``device_flops`` FLOP/s
    (:func:`~netmorph.parallel.slots.device_ms`)."""
    if global_batch % layout.dp:
        raise UsageError(
            f"{{global_batch}} {global_batch} does not split over dp {layout.dp} ({layout.tag()})", "global_batch"
        )
    if global_batch // layout.dp < layout.pp:
        raise UsageError(
            f"{{global_batch}} {global_batch}: {layout.tag()} needs at least pp x dp = "
            f"{layout.pp * layout.dp} sequences per step",
            "global_batch",
        )
    cfg = TrainConfig(
        model=model,
        layout=layout.replace(global_batch=global_batch, micro_batch_size=1, dp_overlap=False),
        steps=steps,
        start_step=start,
        compute_ms=compute_ms,
        device_flops=device_flops,
    )
    cfg.check()
    return cfg
