"""Where every element of the model's training state lives under a layout: the map a reshard plans on and a
checkpoint writes by.

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
- under ZeRO-3 only that shard of the parameters between steps;
- with a mixture of experts, its experts in a second flat buffer (each rank its ep piece of every expert
  tensor, dim 0), padded and sharded over the expert data-parallel ranks (dp / ep) instead.

Every element of the 1-rank model gets a global id: the parameters in :func:`full_weights`'s
order, each row-major. :func:`element_map` gives, per rank, the global id of each element of
its flat buffer (-1 for padding) and the ranges it holds: the plan a reshard needs is then
array work on these maps -- the same data Megatron's and torch.distributed.checkpoint's
resharding keep as per-tensor placements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from netmorph.errors import UsageError
from netmorph.mesh.layout import Layout, Rejection
from netmorph.mesh.placement import flat_offsets, parameters, rank_parameters, shard_range
from netmorph.mesh.rules import KERNEL_RULES
from netmorph.mesh.shape import ModelShape


def check(layout: Layout, cfg: ModelShape) -> None:
    """The layout runs ``cfg`` on netmorph's trainer, or the one line that says why not (its first
    :class:`~netmorph.mesh.layout.Rejection`)."""
    bad = [r for r in layout.check(cfg) if r.key != "batch" and r.key not in KERNEL_RULES]
    if not bad and cfg.vocab % layout.tp:  # the map's own needs: the vocabulary-parallel embedding's
        bad = [Rejection("map", "vocab", cfg.vocab, f"vocab {cfg.vocab} is not divisible by tp {layout.tp}")]
    if not bad and cfg.layers % layout.stages:  # pieces, and even stages (chunk_layers)
        bad = [
            Rejection(
                "map",
                "layers",
                cfg.layers,
                f"layers {cfg.layers} is not divisible by pp x interleave = {layout.stages}",
            )
        ]
    if bad:
        raise UsageError(f"layout {layout.tag()}: {bad[0].text}", "layout")


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


@dataclass
class RankMap:
    """One rank's state under a layout, in global ids."""

    flat: np.ndarray  # global id of each element of the padded flat buffer (-1: padding)
    params: tuple  # [lo, hi) of the flat buffer whose parameters persist between steps
    optimizer: tuple  # [lo, hi) of the flat buffer Adam's moments cover


BUFFERS = ("dense", "experts")


def element_map(cfg: ModelShape, layout: Layout, buffer: str = "dense") -> list:
    """A :class:`RankMap` for every rank of ``layout``: each rank's parameters as
    :func:`~netmorph.mesh.placement.rank_parameters` orders them, each its tensor-parallel piece. A mixture of
    experts keeps two flat buffers, as the trainer's two replicas do (:func:`netmorph.parallel.groups.replicas`):
    ``buffer="dense"`` every other parameter, over the data-parallel group (with cp, the dp x cp ranks, in rank
    order: cp varies fastest); ``"experts"`` the rank's experts (its ep piece, whole on every tp rank), padded and
    ZeRO-sharded over its expert data-parallel group (dp x cp / ep ranks, index ``edp``). A rank whose stage has
    no experts gets None for that buffer."""
    check(layout, cfg)
    gids = global_ids(cfg)
    experts = buffer == "experts"
    out = []
    for rank in range(layout.world):
        c = layout.coords(rank)
        rows = [p for p in rank_parameters(cfg, layout, c["pp"]) if p.is_expert == experts]
        if not rows:
            out.append(None)
            continue
        pieces = [p.piece(gids[p.name], layout.tp, c["tp"], layout.ep, c["ep"]).ravel() for p in rows]
        ways, index = (layout.dp // layout.ep, c["edp"]) if experts else (layout.dp, c["dp"])
        ways, index = ways * layout.cp, c["cp"] + layout.cp * index
        _, padded = flat_offsets([x.size for x in pieces], ways)
        flat = np.full(padded, -1, dtype=np.int64)
        flat[: sum(x.size for x in pieces)] = np.concatenate(pieces)
        shard = shard_range(padded, ways, index)
        out.append(RankMap(flat, shard if layout.zero >= 3 else (0, padded), shard if layout.zero else (0, padded)))
    return out
