"""Where every parameter of netmorph's GPT lives: one table, read by everything that splits, stores or moves it.

Stands in for a DTensor parallel plan (``torch.distributed.tensor.placement_types``: ``Shard(dim)``,
``Replicate()``) as torchtitan writes one for Llama (``parallelize_module`` with ``ColwiseParallel`` /
``RowwiseParallel``), and for the per-tensor placements ``torch.distributed.checkpoint`` records. Megatron's
split of a GPT layer, in those words:

=================  =========  ==========================================================
parameter          placement  Megatron module
=================  =========  ==========================================================
``wte``            Shard(0)   ``VocabParallelEmbedding`` (tied to the LM head)
``wpe``            Replicate  learned positions (first stage)
``ln1``, ``ln2``   Replicate  LayerNorm (SP: each rank trains it on its own tokens)
``qkv.w/b``        Shard(0)   ``ColumnParallelLinear``, rows grouped per head (heads, 3, hd)
``proj.w``         Shard(1)   ``RowParallelLinear``; its bias Replicate (added after the sum)
``fc.w/b``         Shard(0)   ``ColumnParallelLinear``
``fc2.w``          Shard(1)   ``RowParallelLinear``; its bias Replicate
``ln_f``           Replicate  the final LayerNorm (last stage)
=================  =========  ==========================================================

:func:`parameters` lists the 1-rank model's parameters in the order their initial values are drawn and their
elements are numbered (a reshard's global ids); :func:`rank_parameters` lists one pipeline rank's in the order
its modules register them -- the order of its flat buffer. The torch GPT, tensor parallelism, the state a run
returns, serving's tensor-parallel split and morph's element map all read these two lists.
"""

from __future__ import annotations

from dataclasses import dataclass

from netmorph.mesh.layout import Layout
from netmorph.mesh.shape import ModelShape


@dataclass(frozen=True)
class Shard:
    """Split over the tensor-parallel group along ``dim``, in contiguous equal pieces (rank r holds piece r)."""

    dim: int

    def __str__(self) -> str:
        return f"Shard({self.dim})"


@dataclass(frozen=True)
class Replicate:
    """Held whole by every tensor-parallel rank."""

    def __str__(self) -> str:
        return "Replicate()"


@dataclass(frozen=True)
class ExpertShard:
    """The experts' dimension (0) split over the expert-parallel group: ep rank r holds experts
    ``r·E/ep .. (r+1)·E/ep - 1`` whole, and every tensor-parallel rank holds the same ones (Megatron's expert
    tensor-parallel size 1)."""

    dim: int = 0

    def __str__(self) -> str:
        return "Shard(0) over ep"


REPLICATE = Replicate()
EXPERTS = ExpertShard()


def shard(tensor, dim: int, ways: int, rank: int):
    """Piece ``rank`` of ``ways`` contiguous equal pieces of ``tensor`` along ``dim`` (a view; numpy or torch):
    ``Shard(dim)``'s local tensor, as ``DTensor.from_local`` would take it back."""
    n = tensor.shape[dim] // ways
    return tensor[(slice(None),) * dim + (slice(rank * n, (rank + 1) * n),)]


@dataclass(frozen=True)
class Param:
    name: str  # the 1-rank model's name: "wte", "wpe", "ln_f.w", "3.qkv.w"
    shape: tuple  # the whole parameter's shape
    placement: Shard | Replicate | ExpertShard  # over tp (ExpertShard: over ep)
    layer: int | None  # its transformer layer (None: embeddings, final norm)
    module: str  # the name inside its module: "qkv.weight", "wte", "ln_f.weight"
    init: str  # "normal" N(0, 0.02), "residual" N(0, 0.02/sqrt(2 layers)), "ones", "zeros"

    @property
    def is_expert(self) -> bool:
        return isinstance(self.placement, ExpertShard)

    def _ways(self, tp: int, ep: int) -> int:
        if isinstance(self.placement, Replicate):
            return 1
        return ep if self.is_expert else tp

    def local_shape(self, tp: int, ep: int = 1) -> tuple:
        """The shape one rank of a tp x ep grid holds."""
        ways = self._ways(tp, ep)
        if ways == 1:
            return self.shape
        d = self.placement.dim
        return self.shape[:d] + (self.shape[d] // ways,) + self.shape[d + 1 :]

    def piece(self, tensor, tp: int, rank: int, ep: int = 1, ep_rank: int = 0):
        """The piece of the whole ``tensor`` that tensor-parallel rank ``rank`` (expert-parallel rank
        ``ep_rank``) holds (a view; numpy or torch)."""
        ways = self._ways(tp, ep)
        if ways == 1:
            return tensor
        return shard(tensor, self.placement.dim, ways, ep_rank if self.is_expert else rank)


# a block's parameters in registration order: (module, parameter, full-name suffix, placement, shape, init)
_BLOCK = (
    ("ln1", "weight", "ln1.w", REPLICATE, lambda h, f: (h,), "ones"),
    ("ln1", "bias", "ln1.b", REPLICATE, lambda h, f: (h,), "zeros"),
    ("qkv", "weight", "qkv.w", Shard(0), lambda h, f: (3 * h, h), "normal"),
    ("qkv", "bias", "qkv.b", Shard(0), lambda h, f: (3 * h,), "zeros"),
    ("proj", "weight", "proj.w", Shard(1), lambda h, f: (h, h), "residual"),
    ("proj", "bias", "proj.b", REPLICATE, lambda h, f: (h,), "zeros"),
    ("ln2", "weight", "ln2.w", REPLICATE, lambda h, f: (h,), "ones"),
    ("ln2", "bias", "ln2.b", REPLICATE, lambda h, f: (h,), "zeros"),
    ("fc", "weight", "fc.w", Shard(0), lambda h, f: (f, h), "normal"),
    ("fc", "bias", "fc.b", Shard(0), lambda h, f: (f,), "zeros"),
    ("fc2", "weight", "fc2.w", Shard(1), lambda h, f: (h, f), "residual"),
    ("fc2", "bias", "fc2.b", REPLICATE, lambda h, f: (h,), "zeros"),
)

# {module.parameter inside a block: (full-name suffix, placement)}
BLOCK = {f"{m}.{p}": (suffix, place) for m, p, suffix, place, _, _ in _BLOCK}


# a mixture-of-experts layer's MLP (Megatron's MoELayer: E GeLU experts and their TopKRouter), in the order torch
# lists them (a module's own parameters before its submodules')
_MOE = (
    ("moe", "w1", "experts.w1", EXPERTS, lambda h, f, e: (e, h, f), "normal"),
    ("moe", "b1", "experts.b1", EXPERTS, lambda h, f, e: (e, f), "zeros"),
    ("moe", "w2", "experts.w2", EXPERTS, lambda h, f, e: (e, f, h), "residual"),
    ("moe", "b2", "experts.b2", EXPERTS, lambda h, f, e: (e, h), "zeros"),
    ("moe.router", "weight", "router.w", REPLICATE, lambda h, f, e: (h, e), "normal"),
)
BLOCK.update({f"{m}.{p}": (suffix, place) for m, p, suffix, place, _, _ in _MOE})


def is_moe_layer(model: ModelShape, i: int) -> bool:
    """Layer ``i`` routes to experts (:meth:`ModelShape.is_moe_layer`)."""
    return model.is_moe_layer(i)


def _block(model: ModelShape, i: int) -> list:
    h, f = model.hidden, model.f
    rows = [
        Param(f"{i}.{suffix}", shape(h, f), place, i, f"{m}.{p}", init) for m, p, suffix, place, shape, init in _BLOCK
    ]
    if not is_moe_layer(model, i):
        return rows
    moe = [
        Param(f"{i}.{suffix}", shape(h, model.ef, model.experts), place, i, f"{m}.{p}", init)
        for m, p, suffix, place, shape, init in _MOE
    ]
    return rows[:8] + moe  # ln1, qkv, proj, ln2; the experts instead of fc and fc2


def _wte(model: ModelShape) -> Param:
    return Param("wte", (model.vocab, model.hidden), Shard(0), None, "wte", "normal")


def _wpe(model: ModelShape) -> Param:
    return Param("wpe", (model.seq, model.hidden), REPLICATE, None, "wpe", "normal")


def _ln_f(model: ModelShape) -> list:
    h = model.hidden
    return [
        Param("ln_f.w", (h,), REPLICATE, None, "ln_f.weight", "ones"),
        Param("ln_f.b", (h,), REPLICATE, None, "ln_f.bias", "zeros"),
    ]


def parameters(model: ModelShape) -> list:
    """Every parameter of the 1-rank GPT, the tied embedding once: embeddings, the final norm, then the layers
    (the order the initial weights are drawn in and the elements are numbered in)."""
    out = [_wte(model), _wpe(model), *_ln_f(model)]
    for i in range(model.layers):
        out += _block(model, i)
    return out


def chunk_parameters(model: ModelShape, first: int, last: int) -> list:
    """Layers ``[first, last)`` as one model chunk registers them: the word embedding (first and last chunk of
    the model: the tied copy), the positions (first), each layer's, the final norm (last)."""
    out = [_wte(model)] if first == 0 or last == model.layers else []
    out += [_wpe(model)] if first == 0 else []
    for i in range(first, last):
        out += _block(model, i)
    return out + (_ln_f(model) if last == model.layers else [])


def rank_parameters(model: ModelShape, layout: Layout, pp_rank: int) -> list:
    """Pipeline rank ``pp_rank``'s parameters in its flat buffer's order: its chunks (virtual stages
    ``c·pp + pp_rank``) one after the other."""
    out = []
    for c in range(layout.interleave):
        out += chunk_parameters(model, *layout.chunk_layers(model.layers, pp_rank, c))
    return out


def stage_of(name: str, model: ModelShape, layout: Layout) -> list:
    """The pipeline ranks that hold parameter ``name`` (the tied embedding: the first and the last)."""
    return [p for p in range(layout.pp) if any(q.name == name for q in rank_parameters(model, layout, p))]


def table(model: ModelShape, layout: Layout) -> list:
    """[(name, shape, pipeline ranks, placement, shape on one rank)]: the whole plan, as ``netmorph`` prints
    it and a test reads it."""
    return [
        (p.name, p.shape, stage_of(p.name, model, layout), str(p.placement), p.local_shape(layout.tp, layout.ep))
        for p in parameters(model)
    ]


# ---------------------------------------------------------------- flat buffers and their model-state bytes


def flat_offsets(sizes, pad_to: int = 1) -> tuple[list, int]:
    """(offset of each of ``sizes`` elements in the buffer, the padded length): back to back in order, the
    end padded to a multiple of ``pad_to`` (the data-parallel degree: equal ZeRO shards). The one rule both
    :class:`FlatParams` and a reshard's element map (:func:`netmorph.mesh.elements.element_map`) lay out by."""
    offsets, n = [], 0
    for size in sizes:
        offsets.append(n)
        n += size
    return offsets, -(-max(n, 1) // pad_to) * pad_to


def shard_range(padded: int, dp: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of the flat buffer data-parallel rank ``rank`` owns under ZeRO (DeepSpeed's partition)."""
    n = padded // dp
    return rank * n, (rank + 1) * n


def stage_elements(model: ModelShape, layout: Layout, pp_rank: int) -> tuple[int, int]:
    """(dense, expert) elements one rank of pipeline stage ``pp_rank`` holds: its parameters' local shapes."""
    dense = expert = 0
    for p in rank_parameters(model, layout, pp_rank):
        n = 1
        for d in p.local_shape(layout.tp, layout.ep):
            n *= d
        if p.is_expert:
            expert += n
        else:
            dense += n
    return dense, expert


def model_state_bytes(
    model: ModelShape, layout: Layout, itemsize: int, grad_size: int | None = None, optimizer_size: int | None = None
) -> dict:
    """``{"params", "grads", "optimizer"}``: the bytes netmorph's trainer holds between steps on its most
    loaded rank (each field's maximum over the pipeline stages; every tp, ep and dp rank of a stage holds the
    same), counted from this table: per flat buffer (the dense parameters over the dp x cp group, the experts
    over the dp x cp / ep ranks that share them) n elements padded to a multiple of the group, Adam's two moments over
    the padded buffer, and under ZeRO stage s the optimizer (s >= 1), the gradients (s >= 2) and the
    parameters (s >= 3) as the rank's 1/group shard of it. Elements of ``itemsize`` bytes, gradients of
    ``grad_size`` and optimizer state of ``optimizer_size`` per element (bf16 mixed precision: 2, 4 and 12 --
    master, Adam's moments; default ``itemsize`` and two of it). What the trainer measures from its buffers, and
    what ``netmorph train`` holds against ``plan estimate``."""
    gsz = itemsize if grad_size is None else grad_size
    osz = 2 * itemsize if optimizer_size is None else optimizer_size
    best = {"params": 0, "grads": 0, "optimizer": 0}
    z = layout.zero
    for pp_rank in range(layout.pp):
        got = {"params": 0, "grads": 0, "optimizer": 0}
        dpc = layout.dp * layout.cp  # the dense replicas: dp x cp (Megatron's group with cp)
        for n, group in zip(stage_elements(model, layout, pp_rank), (dpc, max(dpc // layout.ep, 1))):
            if not n:
                continue
            shard = flat_offsets([n], group)[1] // group
            got["params"] += (shard if z >= 3 else n) * itemsize
            got["grads"] += (shard if z >= 2 else n) * gsz
            got["optimizer"] += (shard if z >= 1 else shard * group) * osz
        best = {k: max(best[k], got[k]) for k in best}
    return best
