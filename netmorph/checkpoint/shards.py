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
from netmorph.mesh.placement import Param, flat_offsets, rank_parameters
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

    fqn: str  # the checkpoint's name of the tensor
    kind: str  # "params", "m" or "v"
    buffer: str  # the flat buffer it sits in: "dense" or (a mixture of experts') "experts"
    shape: tuple  # the whole tensor's
    offsets: tuple  # the box in the whole tensor
    sizes: tuple
    start: int  # where the rank's piece of this tensor starts in its flat buffer
    local_shape: tuple  # the piece's shape
    local_offsets: tuple  # the box in the piece

    @property
    def key(self) -> tuple:
        """(buffer, kind): which of a rank's flat buffers (:func:`flats`) the box is a view of."""
        return self.buffer, self.kind

    def view(self, flat: np.ndarray) -> np.ndarray:
        """The box's elements in ``flat`` (the rank's whole flat buffer of this buffer and kind), as a view."""
        n = math.prod(self.local_shape)
        piece = flat[self.start : self.start + n].reshape(self.local_shape)
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
    if a % inner:  # a partial first row
        row, end = a // inner, min(b, (a // inner + 1) * inner)
        out += [((row, *o), (1, *s)) for o, s in range_boxes(shape[1:], a - row * inner, end - row * inner)]
        a = end
    if a >= b:
        return out
    first, last = a // inner, b // inner  # whole rows [first, last)
    if last > first:
        out.append(((first,) + (0,) * (len(shape) - 1), (last - first, *shape[1:])))
    if b % inner:  # a partial last row
        out += [((last, *o), (1, *s)) for o, s in range_boxes(shape[1:], 0, b - last * inner)]
    return out


def _runs(mask: np.ndarray) -> list:
    """[start, end) of each run of True in ``mask``."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def maps(model: ModelShape, layout: Layout) -> dict:
    """{buffer: every rank's :class:`~netmorph.mesh.elements.RankMap` of it} (a dense model: the dense one)."""
    from netmorph.mesh.elements import BUFFERS, element_map

    return {b: element_map(model, layout, b) for b in (BUFFERS if model.experts else BUFFERS[:1])}


def owners(model: ModelShape, layout: Layout, master: bool = False) -> dict:
    """{kind: for each global element id, the lowest rank that holds it}: who writes what (the buffers' ids
    are disjoint: one array covers both). ``master``: the parameters are a mixed-precision run's float32 master,
    which under ZeRO only the shard's owner holds -- it writes them, as Megatron's distributed optimizer saves
    its shards of the main parameters."""
    every = maps(model, layout)
    world = layout.world
    n = int(max(m.flat.max() for ms in every.values() for m in ms if m is not None)) + 1
    out = {}
    for kind in NAMES:
        owner = np.full(n, world, dtype=np.int64)
        for ms in every.values():
            for r, m in enumerate(ms):
                if m is None:
                    continue
                lo, hi = m.params if kind == "params" and not master else m.optimizer
                g = m.flat[lo:hi]
                g = g[g >= 0]
                owner[g[owner[g] == world]] = r
        out[kind] = owner
    return out


def rank_boxes(model: ModelShape, layout: Layout, rank: int, owned: bool = False, who: dict | None = None) -> list:
    """The :class:`Box` es rank ``rank`` of ``layout`` holds (``owned``: only those it writes; ``who``: the
    :func:`owners`, computed when not given)."""
    c = layout.coords(rank)
    who = (who or owners(model, layout)) if owned else None
    out, written = [], set()
    for buffer, ms in maps(model, layout).items():
        m = ms[rank]
        if m is None:
            continue
        experts = buffer == "experts"
        params = [p for p in rank_parameters(model, layout, c["pp"]) if p.is_expert == experts]
        sizes = [math.prod(p.local_shape(layout.tp, layout.ep)) for p in params]
        starts, _ = flat_offsets(sizes)
        for kind, name in NAMES.items():
            lo, hi = m.params if kind == "params" else m.optimizer
            for p, s, n in zip(params, starts, sizes):
                a, b = max(s, lo), min(s + n, hi)
                if a >= b:
                    continue
                runs = [(a, b)] if who is None else [(a + x, a + y) for x, y in _runs(who[kind][m.flat[a:b]] == rank)]
                local = p.local_shape(layout.tp, layout.ep)
                base = [0] * len(p.shape)
                if local != p.shape:  # its tp piece (Megatron's shard), or its ep piece of the experts
                    base[p.placement.dim] = (c["ep"] if experts else c["tp"]) * local[p.placement.dim]
                for x, y in runs:
                    for off, size in range_boxes(local, x - s, y - s):
                        box = Box(
                            name.format(model_key(p)),
                            kind,
                            buffer,
                            p.shape,
                            tuple(o + g for o, g in zip(off, base)),
                            size,
                            s,
                            local,
                            off,
                        )
                        if owned and (box.fqn, box.offsets) in written:
                            continue  # a V's rank 0 holds the tied embedding twice: it writes it once
                        written.add((box.fqn, box.offsets))
                        out.append(box)
    return out


def flats(states: dict, rank_maps: dict) -> dict:
    """{(buffer, kind): the rank's whole flat buffer} from its flat state (``{"params", "m", "v", "t"}``, a
    mixture of experts' expert buffer under ``"experts"``) and its :class:`RankMap` per buffer: Adam's
    moments placed at their range, zero elsewhere."""
    out = {}
    for buffer, m in rank_maps.items():
        state = states if buffer == "dense" else states["experts"]
        params = np.asarray(state["params"])
        lo, hi = m.optimizer
        out[buffer, "params"] = params
        for kind in ("m", "v"):
            out[buffer, kind] = np.zeros(m.flat.size, dtype=params.dtype)
            out[buffer, kind][lo:hi] = state[kind]
    return out


def rank_maps(model: ModelShape, layout: Layout, rank: int) -> dict:
    """{buffer: rank ``rank``'s RankMap} for the buffers it holds."""
    return {b: ms[rank] for b, ms in maps(model, layout).items() if ms[rank] is not None}
