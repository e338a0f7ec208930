"""Where every element of the model's training state lives under a layout: the map a reshard plans on.

A layout is the trainer's (tp, pp, dp, ZeRO stage, interleave) for one GPT. Under it each rank
holds, as :func:`netmorph.parallel.hybrid.train_rank` lays them out:

- its chunks' parameters in one flat buffer (:class:`~netmorph.parallel.flat.FlatParams`),
  in the modules' registration order -- the word embedding (first and last stage: the tied
  copy), the positions (first), each block's ln1, qkv, proj, ln2, fc, fc2 (weight then bias),
  the final LayerNorm (last) -- each the rank's Megatron shard: column-parallel weights and
  biases split along dim 0, row-parallel weights along dim 1, the vocabulary-parallel word
  embedding along dim 0; padded to a multiple of dp;
- Adam's two moments over the whole buffer, or under ZeRO over its shard
  ``[r·n, (r+1)·n)`` of the padded buffer (n = padded / dp);
- under ZeRO-3 only that shard of the parameters between steps.

Every element of the 1-rank model gets a global id: the parameters in :func:`full_weights`'s
order, each row-major. :func:`element_map` gives, per rank, the global id of each element of
its flat buffer (-1 for padding) and the ranges it holds: the plan a reshard needs is then
array work on these maps -- the same data Megatron's and torch.distributed.checkpoint's
resharding keep as per-tensor placements.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from netmorph.errors import UsageError
from netmorph.mesh.layout import Layout
from netmorph.mesh.placement import flat_offsets, parameters, rank_parameters, shard_range
from netmorph.mesh.shape import ModelShape
from netmorph.parallel.hybrid import TrainConfig


def check(layout: Layout, cfg: ModelShape) -> None:
    """The layout runs ``cfg`` on netmorph's trainer, or the one line that says why not (its first
    :class:`~netmorph.mesh.layout.Rejection`)."""
    bad = [r for r in layout.check(cfg, trainer=True) if r.key != "batch"]
    if bad:
        raise UsageError(f"layout {layout.tag()}: {bad[0].text}", "layout")


MAX_RANKS = 16          # processes on one machine


def check_move(world: int, steps: int) -> None:
    """A reshard runs ``steps`` steps before and after the move on ``world`` local ranks, or the one line."""
    if not 1 <= world <= MAX_RANKS:
        raise UsageError(f"{{world}} must be in 1..{MAX_RANKS} (processes on this machine), got {world}", "world")
    if not 1 <= steps <= 1000:
        raise UsageError(f"{{steps}} must be in 1..1000, got {steps}", "steps")


def full_shapes(cfg: ModelShape) -> dict:
    """{full weight name: shape} in :func:`~netmorph.mesh.placement.parameters`' order."""
    return {p.name: p.shape for p in parameters(cfg)}


def global_ids(cfg: ModelShape) -> dict:
    """{full weight name: int64 array of its elements' global ids, in its shape}."""
    out, base = {}, 0
    for name, shape in full_shapes(cfg).items():
        n = int(np.prod(shape))
        out[name] = np.arange(base, base + n, dtype=np.int64).reshape(shape)
        base += n
    return out


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
    moments[b["wpe"][old.seq:].ravel()] = -1
    return {"params": params, "m": moments, "v": moments}


@dataclass
class RankMap:
    """One rank's state under a layout, in global ids."""

    flat: np.ndarray        # global id of each element of the padded flat buffer (-1: padding)
    params: tuple           # [lo, hi) of the flat buffer whose parameters persist between steps
    optimizer: tuple        # [lo, hi) of the flat buffer Adam's moments cover


def element_map(cfg: ModelShape, layout: Layout) -> list:
    """A :class:`RankMap` for every rank of ``layout``: each rank's parameters as
    :func:`~netmorph.mesh.placement.rank_parameters` orders them, each its tensor-parallel piece."""
    check(layout, cfg)
    gids = global_ids(cfg)
    out = []
    for rank in range(layout.world):
        c = layout.coords(rank)
        t, d = c["tp"], c["dp"]
        pieces = [p.piece(gids[p.name], layout.tp, t).ravel() for p in rank_parameters(cfg, layout, c["pp"])]
        _, padded = flat_offsets([x.size for x in pieces], layout.dp)
        flat = np.full(padded, -1, dtype=np.int64)
        flat[:sum(x.size for x in pieces)] = np.concatenate(pieces)
        shard = shard_range(padded, layout.dp, d)
        out.append(RankMap(flat, shard if layout.zero >= 3 else (0, padded), shard if layout.zero else (0, padded)))
    return out


def parse_layout(text: str, world: int) -> Layout:
    """``"tp2,pp2"``, ``"dp4,zero3"``, ``"tp2,pp2,v2"``: :meth:`Layout.parse <netmorph.mesh.layout.Layout.parse>`."""
    return Layout.parse(text, world)


def train_config(model: ModelShape, layout: Layout, steps: int, global_batch: int, start: int = 0,
                 compute_ms: float = 0.0, device_flops: float = 0.0):
    """The trainer's :class:`~netmorph.parallel.hybrid.TrainConfig` for ``layout``: ``global_batch`` sequences a
    step as one-sequence microbatches over its dp ranks, from step ``start`` (a resumed or resharded run), on
    accelerators emulated as ``compute_ms`` a forward plus ``device_flops`` FLOP/s
    (:func:`~netmorph.parallel.slots.device_ms`)."""
    if global_batch % layout.dp:
        raise UsageError(f"{{global_batch}} {global_batch} does not split over dp {layout.dp} ({layout.tag()})",
                         "global_batch")
    if global_batch // layout.dp < layout.pp:
        raise UsageError(f"{{global_batch}} {global_batch}: {layout.tag()} needs at least pp x dp = "
                         f"{layout.pp * layout.dp} sequences per step", "global_batch")
    cfg = TrainConfig(model=model, layout=replace(layout, global_batch=global_batch, micro_batch_size=1,
                                                  dp_overlap=False),
                      steps=steps, start_step=start, compute_ms=compute_ms, device_flops=device_flops)
    cfg.check()
    return cfg
