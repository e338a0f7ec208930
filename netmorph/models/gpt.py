"""A small GPT in torch: pre-LN blocks, learned positions, GELU MLP, tied word embedding.

nanoGPT's model with Megatron-LM's parameter layout, so that every split of it is
the split Megatron makes: the QKV projection is one weight whose output rows are
grouped per head ``(heads, 3, head_dim)``, so a contiguous shard along the
output holds whole heads (``ColumnParallelLinear`` with ``gather_output=False``);
the word embedding is tied to the LM head, as Megatron's ``share_embeddings_and_
output_weights``. Parameters per layer: 4h² + 2hf + 9h + f (Narayanan et al. 2021,
eq. 2), plus (V + s)·h for the embeddings and 2h for the final LayerNorm.

Tensors run sequence-first, ``(T, B, h)``, as Megatron's do, so that sequence
parallelism splits the outermost dimension. One model, any layout: a stage
holds layers ``[first, last)`` (pipeline parallelism) and builds its linear
layers, embedding and loss through a *layers* object -- :class:`PlainLayers` here
(plain torch, one rank), :class:`netmorph.parallel.tensor_parallel.TensorParallel`
for Megatron's sharded ones. Every stage draws the same full initial weights from
one seed and keeps its slice, so any layout starts from the 1-rank model exactly.

Data: :func:`synthetic_batch` -- token sequences from a fixed random bigram
language (numpy, seeded per sample index), so every layout sees the same samples
in the same order, and there is something to learn (the loss falls towards the
bigram entropy). No network, no files.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from netmorph.mesh.placement import BLOCK, Shard, is_moe_layer, parameters
from netmorph.mesh.shape import ModelShape
from netmorph.models.capacity import capacity
from netmorph.models.moe import AuxLossScaler, MoELayer, Router
from netmorph.models.weight_grad import WeightGradStore, linear
from netmorph.runtime.base import Group


def full_weights(cfg: ModelShape, dtype=torch.float64) -> dict:
    """Every weight of the 1-rank model, drawn in :func:`~netmorph.mesh.placement.parameters`' order from
    ``cfg.seed`` (GPT-2's init: N(0, 0.02), residual projections scaled by 1/sqrt(2·layers), biases zero,
    LayerNorm 1/0)."""
    g = torch.Generator().manual_seed(cfg.seed)
    std = {"normal": 0.02, "residual": 0.02 / math.sqrt(2 * cfg.layers)}
    w = {}
    for p in parameters(cfg):
        if p.init in std:
            w[p.name] = (torch.randn(*p.shape, generator=g, dtype=torch.float64) * std[p.init]).to(dtype)
        else:
            w[p.name] = (torch.ones if p.init == "ones" else torch.zeros)(*p.shape, dtype=dtype)
    return w


def full_precision(logits: torch.Tensor) -> torch.Tensor:
    """16-bit logits as float32 for the cross-entropy (Megatron's ``vocab_parallel_cross_entropy(output.float())``
    unless ``--fp16-lm-cross-entropy``); wider ones as they are."""
    return logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits


class Linear(nn.Module):
    """``y = x Wᵀ + b`` holding given weights (nn.Linear without its own init); with a ``store``, its weight
    gradient can wait for a zero-bubble schedule's W slot (:mod:`netmorph.models.weight_grad`)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, store: WeightGradStore | None = None):
        super().__init__()
        self.weight = nn.Parameter(weight.clone())
        self.bias = None if bias is None else nn.Parameter(bias.clone())
        self.store = store

    def forward(self, x):
        return linear(x, self.weight, self.bias, self.store)


class LayerNorm(nn.Module):
    def __init__(self, weight, bias):
        super().__init__()
        self.weight, self.bias = nn.Parameter(weight.clone()), nn.Parameter(bias.clone())

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, 1e-5)


class PlainLayers:
    """The 1-rank building blocks: what :class:`~netmorph.parallel.tensor_parallel.TensorParallel`
    shards. Same interface: heads per rank, column/row linears, the embedding, the LM head's loss."""

    tp, sequence_parallel = 1, False

    def heads(self, heads: int) -> int:
        return heads

    def column(self, weight, bias):
        return Linear(weight, bias)

    def row(self, weight, bias):
        return Linear(weight, bias)

    def embedding(self, weight):
        return nn.Parameter(weight.clone())

    def layer_norm(self, weight, bias):
        return LayerNorm(weight, bias)

    def embed(self, table, tokens, wpe):  # tokens (T, B) -> (T, B, h)
        return F.embedding(tokens, table) + wpe[: tokens.shape[0]].unsqueeze(1)

    def attention(self, q, k, v):  # each (B, nh, T, hd): causal over the T positions
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def logits_loss(self, x, table, targets):  # x (T, B, h), targets (T, B) -> mean loss
        logits = full_precision(x @ table.t())  # (T, B, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def replicated(self):
        """Parameters every TP rank holds whole whose gradients differ per rank (none without SP)."""
        return []

    def experts(self, w: dict, i: int, cfg: ModelShape, router: Router):
        """Layer ``i``'s router and every expert on this one rank."""
        return expert_layer(None, Group([0]), w, i, cfg, router)


def expert_layer(comm, ep_group, w: dict, i: int, cfg: ModelShape, router: Router, cp=None, alltoall: str = "pairwise"):
    """Layer ``i``'s :class:`~netmorph.models.moe.MoELayer` holding this ep rank's experts (a contiguous
    1/ep of them, as :class:`~netmorph.mesh.placement.ExpertShard` places them) and the whole router
    (``cp``: the :class:`~netmorph.parallel.context_parallel.ContextParallel` that splits its sequences)."""
    dtype = w[f"{i}.router.w"].dtype
    layer = MoELayer(
        comm,
        ep_group,
        cfg.hidden,
        cfg.ef,
        cfg.experts,
        cfg.top_k,
        None,
        router.drop_policy,
        router.pre_softmax,
        router.aux_loss_coeff,
        router.z_loss_coeff,
        router.jitter_eps,
        dtype,
        cp,
        alltoall,
    )
    lo, hi = layer.first, layer.first + layer.local
    with torch.no_grad():
        layer.router.weight.copy_(w[f"{i}.router.w"])
        for name in ("w1", "b1", "w2", "b2"):
            getattr(layer, name).copy_(w[f"{i}.experts.{name}"][lo:hi])
    return layer


class Block(nn.Module):
    """Pre-LN transformer layer: x + attn(ln1(x)), then + mlp(ln2(x)) -- the MLP a mixture of experts on the
    layers :func:`~netmorph.mesh.placement.is_moe_layer` names (Megatron's ``MoELayer``: route each token to its
    top-k experts over the expert-parallel group)."""

    def __init__(self, w: dict, i: int, cfg: ModelShape, L, router: Router = Router()):
        super().__init__()
        self.L = L
        h, nh = cfg.hidden, cfg.heads
        self.hd = h // nh
        self.nh = L.heads(nh)  # heads on this rank
        self.ln1 = L.layer_norm(w[f"{i}.ln1.w"], w[f"{i}.ln1.b"])
        self.qkv = _linear(L, w, i, "qkv")  # h -> 3h / t
        self.proj = _linear(L, w, i, "proj")  # h / t -> h
        self.ln2 = L.layer_norm(w[f"{i}.ln2.w"], w[f"{i}.ln2.b"])
        self.moe = None
        if is_moe_layer(cfg, i):
            self.moe = L.experts(w, i, cfg, router)  # E_local experts of this ep rank
            self.capacity_factor, self.top_k, self.dropless = cfg.capacity_factor, cfg.top_k, router.dropless
            self.layer, self.seed, self.jitter = i, cfg.seed, router.jitter_eps
            self.aux_scale = 1.0  # 1/m under a pipeline of m microbatches
            self.key = 0  # the global microbatch: seeds the jitter
            self.stats, self.aux = [], []  # every forward's LayerStats, (aux, z)
        else:
            self.fc = _linear(L, w, i, "fc")  # h -> 4h / t
            self.fc2 = _linear(L, w, i, "fc2")  # 4h / t -> h

    def mlp(self, z):  # z (T', B, h) -> (T', B, h)
        if self.moe is None:
            return self.fc2(F.gelu(self.fc(z)))
        T, B, h = z.shape
        tokens = T * B * self.moe.cp_size  # the microbatch's, on every cp rank
        cap = None if self.dropless else capacity(tokens, self.moe.num_experts, self.top_k, self.capacity_factor)
        g = None
        if self.jitter:  # the same noise for the same microbatch and layer, whichever rank routes it
            g = torch.Generator().manual_seed(((self.seed * 1_000_003 + self.key) * 1009 + self.layer) & 0x7FFFFFFF)
        y, r, stats = self.moe(z.reshape(T * B, h), cap, g, B)  # (T·B, h)
        self.stats.append(stats)
        self.aux.append((float(r.aux_loss.detach()), float(r.z_loss.detach())))
        y = AuxLossScaler.apply(y, r.aux_loss + r.z_loss, self.aux_scale)
        return y.view(T, B, h)

    def forward(self, x, attend=None):  # x (T', B, h); T' = T / t with SP
        """``attend(q, k, v) -> y``, each (B, nh, T, hd): the attention itself, the layers object's (causal over
        the sequence, its context-parallel ring or all-to-all under cp) unless an attention backend is passed
        (serving's paged KV cache: :mod:`netmorph.serving.model`)."""
        a = self.qkv(self.ln1(x))  # (T, B, 3h/t)
        T, B, _ = a.shape
        q, k, v = a.view(T, B, self.nh, 3, self.hd).unbind(3)  # each (T, B, nh, hd)
        q, k, v = (z.permute(1, 2, 0, 3) for z in (q, k, v))  # (B, nh, T, hd)
        y = (attend or self.L.attention)(q, k, v)  # (B, nh, T, hd)
        y = y.permute(2, 0, 1, 3).reshape(T, B, self.nh * self.hd)  # (T, B, h/t)
        x = x + self.proj(y)  # (T', B, h)
        x = x + self.mlp(self.ln2(x))  # (T', B, h)
        return x


def _linear(L, w: dict, i: int, module: str):
    """Layer ``i``'s ``module`` as its placement says: column-parallel when its weight is Shard(0) over tp,
    row-parallel when Shard(1) (:data:`netmorph.mesh.placement.BLOCK`)."""
    wname, place = BLOCK[f"{module}.weight"]
    bname, _ = BLOCK[f"{module}.bias"]
    make = L.column if place == Shard(0) else L.row
    return make(w[f"{i}.{wname}"], w[f"{i}.{bname}"])


class GPTStage(nn.Module):
    """Layers ``[first, last)`` of the GPT; the first stage embeds, the last computes the loss.

    With one stage this is the whole model. ``layers`` builds the linears, the embedding and
    the loss (:class:`PlainLayers` or Megatron's tensor-parallel ones).
    """

    def __init__(
        self,
        cfg: ModelShape,
        first: int = 0,
        last: int | None = None,
        layers=None,
        dtype=torch.float64,
        router: Router = Router(),
    ):
        super().__init__()
        last = cfg.layers if last is None else last
        L = layers or PlainLayers()
        self.cfg, self.L, self.first, self.last = cfg, L, first, last
        self.is_first, self.is_last = first == 0, last == cfg.layers
        w = full_weights(cfg, dtype)
        if self.is_first or self.is_last:  # the tied word embedding lives on both ends
            self.wte = L.embedding(w["wte"])
        if self.is_first:
            self.wpe = nn.Parameter(w["wpe"].clone())
        self.blocks = nn.ModuleList(Block(w, i, cfg, L, router) for i in range(first, last))
        if self.is_last:
            self.ln_f = L.layer_norm(w["ln_f.w"], w["ln_f.b"])

    def forward(self, x, targets=None):
        """First stage: ``x`` are tokens (T, B); else the residual stream (T', B, h). Last stage
        returns the mean cross-entropy against ``targets`` (T, B); others the stream."""
        if self.is_first:
            x = self.L.embed(self.wte, x, self.wpe)  # (T', B, h)
        for blk in self.blocks:
            x = blk(x)  # (T', B, h)
        if not self.is_last:
            return x
        return self.L.logits_loss(self.ln_f(x), self.wte, targets)  # () mean over T x B tokens


def bigram_table(vocab: int, seed: int = 1234) -> np.ndarray:
    """A fixed random bigram language: each token has a handful of likely successors."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((vocab, vocab)) * 3.0
    p = np.exp(logits - logits.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True)


TABLE_VOCAB = 4096  # up to this vocabulary the language is one V x V table; past it, rows drawn as met
ROWS_CACHED = 1024


def synthetic_data_bytes(vocab: int) -> int:
    """Bytes the synthetic language holds per process at most: the V x V table (three float64 V x V arrays
    while it is built), or past :data:`TABLE_VOCAB` the cached rows (and one row's temporaries)."""
    return 3 * 8 * vocab * vocab if vocab <= TABLE_VOCAB else 8 * vocab * (ROWS_CACHED + 3)


@lru_cache(maxsize=8)
def _successor_cdf(vocab: int) -> np.ndarray:
    """Each row of the bigram table summed up (read-only): drawn once per process, as a data loader opens its
    dataset once, not at every batch."""
    cum = np.cumsum(bigram_table(vocab), axis=1)
    cum.flags.writeable = False
    return cum


@lru_cache(maxsize=ROWS_CACHED)
def _successor_row(vocab: int, token: int, seed: int = 1234) -> np.ndarray:
    """Past :data:`TABLE_VOCAB` (a V x V table of GPT-2's 50,257 would be 20 GB): token's successor CDF alone,
    drawn from a generator seeded by the token -- the same kind of language, a row at a time, as met."""
    logits = np.random.default_rng((seed, vocab, token)).standard_normal(vocab) * 3.0
    p = np.exp(logits - logits.max())
    cum = np.cumsum(p / p.sum())
    cum.flags.writeable = False
    return cum


def _successors(vocab: int, tokens: np.ndarray) -> np.ndarray:
    """The successor CDF of each of ``tokens``: (len(tokens), V)."""
    if vocab <= TABLE_VOCAB:
        return _successor_cdf(vocab)[tokens]
    return np.stack([_successor_row(vocab, int(t)) for t in tokens])


def synthetic_batch(cfg: ModelShape, indices) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples ``indices`` (global sample numbers) as (tokens, targets), each (T, B) int64.

    Sample i is a walk through the bigram language seeded by i alone: the same sample for
    every layout, whichever rank draws it."""
    out = np.empty((len(indices), cfg.seq + 1), dtype=np.int64)
    u = np.empty((len(indices), cfg.seq))
    for j, i in enumerate(indices):
        rng = np.random.default_rng((cfg.seed, int(i)))
        u[j] = rng.random(cfg.seq)
        out[j, 0] = rng.integers(cfg.vocab)
    for k in range(cfg.seq):  # every sample's walk one step on: the successor is where u falls in its CDF
        nxt = (_successors(cfg.vocab, out[:, k]) < u[:, k, None]).sum(axis=1)  # np.searchsorted, row by row
        out[:, k + 1] = np.minimum(nxt, cfg.vocab - 1)
    seqs = torch.from_numpy(out).t().contiguous()  # (T + 1, B)
    return seqs[:-1], seqs[1:]
