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
from netmorph.models.gpt import GPTConfig

# a block's parameters in registration order: (local name, full-name suffix, shard dim, shape(h, f))
_BLOCK = (("ln1.weight", "ln1.w", None, lambda h, f: (h,)), ("ln1.bias", "ln1.b", None, lambda h, f: (h,)),
          ("qkv.weight", "qkv.w", 0, lambda h, f: (3 * h, h)), ("qkv.bias", "qkv.b", 0, lambda h, f: (3 * h,)),
          ("proj.weight", "proj.w", 1, lambda h, f: (h, h)), ("proj.bias", "proj.b", None, lambda h, f: (h,)),
          ("ln2.weight", "ln2.w", None, lambda h, f: (h,)), ("ln2.bias", "ln2.b", None, lambda h, f: (h,)),
          ("fc.weight", "fc.w", 0, lambda h, f: (f, h)), ("fc.bias", "fc.b", 0, lambda h, f: (f,)),
          ("fc2.weight", "fc2.w", 1, lambda h, f: (h, f)), ("fc2.bias", "fc2.b", None, lambda h, f: (h,)))


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 0
    interleave: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(tp, pp, dp) rank of global ``rank``: tp innermost, then dp, then pp -- the mesh's order."""
        return rank % self.tp, rank // (self.tp * self.dp), (rank // self.tp) % self.dp

    def label(self) -> str:
        out = f"tp{self.tp}·pp{self.pp}·dp{self.dp}"
        return out + (f"·zero{self.zero}" if self.zero else "") + (f"·v{self.interleave}" if self.interleave > 1
                                                                    else "")

    def check(self, cfg: GPTConfig) -> None:
        if min(self.tp, self.pp, self.dp, self.interleave) < 1 or self.zero not in (0, 1, 2, 3):
            raise UsageError(f"layout {self}: tp, pp, dp, interleave >= 1 and zero in 0..3", "layout")
        if cfg.heads % self.tp or cfg.vocab % self.tp:
            raise UsageError(f"layout {self.label()}: tp {self.tp} must divide the heads ({cfg.heads}) and the "
                             f"vocabulary ({cfg.vocab})", "layout")
        if cfg.layers % (self.pp * self.interleave):
            raise UsageError(f"layout {self.label()}: pp x interleave must divide the {cfg.layers} layers", "layout")
        if self.zero >= 2 and self.pp > 1:
            raise UsageError(f"layout {self.label()}: ZeRO-2/3 with pipeline parallelism", "layout")


def full_shapes(cfg: GPTConfig) -> dict:
    """{full weight name: shape} in :func:`~netmorph.models.gpt.full_weights`'s order."""
    h, f = cfg.hidden, cfg.ffn
    out = {"wte": (cfg.vocab, h), "wpe": (cfg.seq, h), "ln_f.w": (h,), "ln_f.b": (h,)}
    for i in range(cfg.layers):
        for _, suffix, _, shape in _BLOCK:
            out[f"{i}.{suffix}"] = shape(h, f)
    return out


def global_ids(cfg: GPTConfig) -> dict:
    """{full weight name: int64 array of its elements' global ids, in its shape}."""
    out, base = {}, 0
    for name, shape in full_shapes(cfg).items():
        n = int(np.prod(shape))
        out[name] = np.arange(base, base + n, dtype=np.int64).reshape(shape)
        base += n
    return out


def grow_sources(old: GPTConfig, new: GPTConfig) -> dict:
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


def chunk_params(cfg: GPTConfig, layout: Layout, pp_rank: int) -> list:
    """[(full name, shard dim or None)] of a rank's parameters in its flat buffer's order."""
    stages = layout.pp * layout.interleave
    per = cfg.layers // stages
    out = []
    for c in range(layout.interleave):
        vs = c * layout.pp + pp_rank
        first, last = vs * per, (vs + 1) * per
        if first == 0 or last == cfg.layers:
            out.append(("wte", 0))
        if first == 0:
            out.append(("wpe", None))
        for i in range(first, last):
            out += [(f"{i}.{suffix}", dim) for _, suffix, dim, _ in _BLOCK]
        if last == cfg.layers:
            out += [("ln_f.w", None), ("ln_f.b", None)]
    return out


@dataclass
class RankMap:
    """One rank's state under a layout, in global ids."""

    flat: np.ndarray        # global id of each element of the padded flat buffer (-1: padding)
    params: tuple           # [lo, hi) of the flat buffer whose parameters persist between steps
    optimizer: tuple        # [lo, hi) of the flat buffer Adam's moments cover


def element_map(cfg: GPTConfig, layout: Layout) -> list:
    """A :class:`RankMap` for every rank of ``layout``."""
    layout.check(cfg)
    gids = global_ids(cfg)
    out = []
    for rank in range(layout.world):
        t, p, d = layout.coords(rank)
        pieces = []
        for name, dim in chunk_params(cfg, layout, p):
            g = gids[name]
            pieces.append((np.split(g, layout.tp, axis=dim)[t] if dim is not None and layout.tp > 1 else g).ravel())
        flat = np.concatenate(pieces)
        padded = -(-max(flat.size, 1) // layout.dp) * layout.dp
        flat = np.concatenate([flat, np.full(padded - flat.size, -1, dtype=np.int64)])
        n = padded // layout.dp
        shard = (d * n, (d + 1) * n)
        out.append(RankMap(flat, shard if layout.zero >= 3 else (0, padded), shard if layout.zero else (0, padded)))
    return out


def parse_layout(text: str, world: int) -> Layout:
    """``"tp2,pp2"``, ``"dp4,zero3"``, ``"tp2,pp2,v2"``: a layout on ``world`` ranks (dp from the rest)."""
    fields = {}
    for part in text.replace(" ", "").split(","):
        key = part.rstrip("0123456789")
        num = part[len(key):]
        if key not in ("tp", "pp", "dp", "zero", "v") or not num:
            raise UsageError(f"{text!r}: write it as tpN,ppN,dpN,zeroN,vN (e.g. tp2,pp2 or dp4,zero3)",
                             "layout")
        name = "interleave" if key == "v" else key
        if name in fields:
            raise UsageError(f"{text!r}: {key} is given twice", "layout")
        fields[name] = int(num)
    tp, pp = fields.get("tp", 1), fields.get("pp", 1)
    if tp < 1 or pp < 1 or world % (tp * pp):
        raise UsageError(f"{text!r}: tp x pp must divide the {world} ranks", "layout")
    dp = fields.get("dp", world // (tp * pp))
    if tp * pp * dp != world:
        raise UsageError(f"{text!r}: tp x pp x dp = {tp * pp * dp}, not the {world} ranks", "layout")
    return Layout(tp, pp, dp, fields.get("zero", 0), fields.get("interleave", 1))


def train_config(model: GPTConfig, layout: Layout, steps: int, global_batch: int, start: int = 0,
                 compute_ms: float = 0.0):
    """The trainer's :class:`~netmorph.parallel.hybrid.TrainConfig` for ``layout``: ``global_batch`` sequences a
    step as one-sequence microbatches over its dp ranks, from step ``start`` (a resumed or resharded run)."""
    from netmorph.parallel.hybrid import TrainConfig
    if global_batch % layout.dp:
        raise UsageError(f"{{global_batch}} {global_batch} does not split over dp {layout.dp} ({layout.label()})",
                         "global_batch")
    mbs = global_batch // layout.dp
    if mbs < layout.pp:
        raise UsageError(f"{{global_batch}} {global_batch}: {layout.label()} needs at least pp x dp = "
                         f"{layout.pp * layout.dp} sequences per step", "global_batch")
    cfg = TrainConfig(model=model, tp=layout.tp, pp=layout.pp, dp=layout.dp, zero=layout.zero, steps=steps,
                      microbatches=mbs, micro_batch_size=1, start_step=start, overlap=False, compute_ms=compute_ms,
                      schedule="interleaved" if layout.interleave > 1 else "1f1b", interleave=layout.interleave)
    cfg.check()
    return cfg
