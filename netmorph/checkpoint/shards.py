"""What a rank holds of the 1-rank model, as the boxes torch.distributed.checkpoint records.

DCP describes a sharded tensor by its whole shape and, per shard, a box: ``ChunkStorageMetadata(offsets,
sizes)`` in the whole tensor's coordinates (a DTensor's local tensor under ``Shard(dim)``, a ``ShardedTensor``'s
shards). A rank of netmorph's trainer holds, for each parameter of its pipeline stage, its tensor-parallel piece
(:mod:`netmorph.mesh.placement`: a box already) in one flat buffer, and under ZeRO only a contiguous range of
that buffer for Adam's moments (and, at stage 3, the parameters): a range cuts a piece into at most a partial
row, whole rows and a partial row -- boxes again, as :func:`range_boxes` finds them, recursively per dimension.

Replicated state (a data-parallel replica's copy, a LayerNorm every tensor-parallel rank holds, the word
embedding tied on the first and last stage) is written once, by its lowest-numbered holder (``owned``): the
boxes of a checkpoint then tile every tensor exactly, which DCP's global plan validates. A rank resuming under
another layout asks for all the boxes it holds there (``owned=False``) and DCP's resharding finds the saved
boxes that overlap them.

Names are the 1-rank GPT's (``GPTStage.state_dict()``: ``wte``, ``blocks.3.qkv.weight``) under ``model.``, and
Adam's moments under ``optim.state.<name>.exp_avg`` / ``exp_avg_sq``, the flattened form of
``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` that torchtitan saves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from netmorph.mesh.layout import Layout
from netmorph.mesh.placement import Param, Shard, flat_offsets, rank_parameters
from netmorph.mesh.shape import ModelShape

# the state kinds of a rank's flat state (netmorph.parallel.replica's ``state()``) and their names in a checkpoint
NAMES = {"params": "model.{}", "m": "optim.state.{}.exp_avg", "v": "optim.state.{}.exp_avg_sq"}
STEP = "optim.state.{}.step"


def model_key(p: Param) -> str:
    """The 1-rank GPT's ``state_dict`` key of ``p``."""
    return p.module if p.layer is None else f"blocks.{p.layer}.{p.module}"


@dataclass(frozen=True)
class Box:
    """One box of one tensor a rank holds: where it sits in the whole tensor and in the rank's flat buffer."""

    fqn: str                # the checkpoint's name of the tensor
    kind: str               # "params", "m" or "v"
    shape: tuple            # the whole tensor's
    offsets: tuple          # the box in the whole tensor
    sizes: tuple
    start: int              # where the rank's piece of this tensor starts in its flat buffer
    local_shape: tuple      # the piece's shape
    local_offsets: tuple    # the box in the piece

    def view(self, flat: np.ndarray) -> np.ndarray:
        """The box's elements in ``flat`` (the rank's whole flat buffer of this kind), as a view."""
        n = math.prod(self.local_shape)
        piece = flat[self.start:self.start + n].reshape(self.local_shape)
        return piece[tuple(slice(o, o + s) for o, s in zip(self.local_offsets, self.sizes))]


def range_boxes(shape: tuple, a: int, b: int) -> list:
    """The boxes ``[(offsets, sizes)]`` covering row-major elements ``[a, b)`` of a tensor of ``shape``: a partial
    first row, the whole rows, a partial last row (each partial row split the same way one dimension down)."""
    if a >= b:
        return []
    if len(shape) <= 1:
        return [((a,), (b - a,))] if shape else [((), ())]
    inner = math.prod(shape[1:])
    out = []
    if a % inner:                                  # a partial first row
        row, end = a // inner, min(b, (a // inner + 1) * inner)
        out += [((row, *o), (1, *s)) for o, s in range_boxes(shape[1:], a - row * inner, end - row * inner)]
        a = end
    if a >= b:
        return out
    first, last = a // inner, b // inner           # whole rows [first, last)
    if last > first:
        out.append(((first,) + (0,) * (len(shape) - 1), (last - first, *shape[1:])))
    if b % inner:                                  # a partial last row
        out += [((last, *o), (1, *s)) for o, s in range_boxes(shape[1:], 0, b - last * inner)]
    return out


def _runs(mask: np.ndarray) -> list:
    """[start, end) of each run of True in ``mask``."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def owners(model: ModelShape, layout: Layout) -> dict:
    """{kind: for each global element id, the lowest rank that holds it}: who writes what."""
    from netmorph.mesh.elements import element_map
    maps = element_map(model, layout)
    n = int(max(m.flat.max() for m in maps)) + 1
    out = {}
    for kind in NAMES:
        owner = np.full(n, len(maps), dtype=np.int64)
        for r, m in enumerate(maps):
            lo, hi = m.params if kind == "params" else m.optimizer
            g = m.flat[lo:hi]
            g = g[g >= 0]
            owner[g[owner[g] == len(maps)]] = r
        out[kind] = owner
    return out


def rank_boxes(model: ModelShape, layout: Layout, rank: int, owned: bool = False, who: dict | None = None) -> list:
    """The :class:`Box` es rank ``rank`` of ``layout`` holds (``owned``: only those it writes; ``who``: the
    :func:`owners`, computed when not given)."""
    from netmorph.mesh.elements import element_map
    m = element_map(model, layout)[rank]
    c = layout.coords(rank)
    params = rank_parameters(model, layout, c["pp"])
    sizes = [math.prod(p.local_shape(layout.tp)) for p in params]
    starts, _ = flat_offsets(sizes, layout.dp)
    who = (who or owners(model, layout)) if owned else None
    out = []
    for kind, name in NAMES.items():
        lo, hi = m.params if kind == "params" else m.optimizer
        for p, s, n in zip(params, starts, sizes):
            a, b = max(s, lo), min(s + n, hi)
            if a >= b:
                continue
            runs = [(a, b)] if who is None else [(a + x, a + y) for x, y in _runs(who[kind][m.flat[a:b]] == rank)]
            local = p.local_shape(layout.tp)
            base = [0] * len(p.shape)
            if isinstance(p.placement, Shard) and local != p.shape:
                base[p.placement.dim] = c["tp"] * local[p.placement.dim]
            for x, y in runs:
                for off, size in range_boxes(local, x - s, y - s):
                    out.append(Box(name.format(model_key(p)), kind, p.shape, tuple(o + g for o, g in zip(off, base)),
                                   size, s, local, off))
    return out
