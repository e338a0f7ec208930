"""Megatron-LM tensor parallelism (``megatron/core/tensor_parallel``) on a netmorph communicator.

The conjugate pair that makes a sharded MLP or attention block equal the unsharded
one (Shoeybi et al. 2019, Fig. 3):

- ``f`` = :func:`copy_to_tensor_model_parallel_region`: identity forward, all-reduce
  of the gradient backward -- before a ``ColumnParallelLinear``;
- ``g`` = :func:`reduce_from_tensor_model_parallel_region`: all-reduce forward,
  identity backward -- after a ``RowParallelLinear``.

With sequence parallelism (Korthikanti et al. 2022) the residual stream between
them is split along the sequence, and the pair becomes
``gather_from_sequence_parallel_region`` (all-gather forward, reduce-scatter
backward) and ``reduce_scatter_to_sequence_parallel_region`` (reduce-scatter
forward, all-gather backward): the same bytes as the all-reduce, in two halves,
with LayerNorm and dropout working on 1/t of the tokens.

``VocabParallelEmbedding`` splits the (tied) word embedding by vocabulary; each
rank looks up the tokens it owns and the partial embeddings are summed (``g``, or
reduce-scattered with SP); the LM head multiplies by the same shard and the loss
is Megatron's vocab-parallel cross-entropy (``_VocabParallelCrossEntropy``): an
all-reduce of the max, of the sum of exponentials and of the target's logit --
logits are never gathered.

Every collective is a ring (NCCL's choice at these sizes) in the phase ``tp`` on the
TP group, so the ledger can be set against the closed forms
(:mod:`netmorph.parallel.traffic`).
"""

from __future__ import annotations

import torch

from netmorph.errors import UsageError
from netmorph.mesh.placement import shard
from netmorph.models.gpt import LayerNorm, Linear, expert_layer, full_precision
from netmorph.models.weight_grad import linear
from netmorph.parallel.algos import CollectiveAlgos
from netmorph.runtime.base import Group


def _all_reduce(ctx_tp, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    out = t.detach().contiguous().clone()
    with ctx_tp.comm.phase(ctx_tp.phase):
        ctx_tp.comm.all_reduce(out, op=op, group=ctx_tp.group, algo=ctx_tp.algos.tp)
    return out


def _all_gather_seq(ctx_tp, t: torch.Tensor) -> torch.Tensor:
    """(T/t, ...) on every rank -> (T, ...) in rank order."""
    t = t.detach().contiguous()
    out = t.new_empty((t.shape[0] * ctx_tp.tp,) + tuple(t.shape[1:]))
    with ctx_tp.comm.phase(ctx_tp.phase):
        ctx_tp.comm.all_gather_into_tensor(out, t, group=ctx_tp.group, algo=ctx_tp.algos.allgather)
    return out


def _reduce_scatter_seq(ctx_tp, t: torch.Tensor) -> torch.Tensor:
    """(T, ...) partial sums on every rank -> this rank's (T/t, ...) block of the sum."""
    t = t.detach().contiguous()
    out = t.new_empty((t.shape[0] // ctx_tp.tp,) + tuple(t.shape[1:]))
    with ctx_tp.comm.phase(ctx_tp.phase):
        ctx_tp.comm.reduce_scatter_tensor(out, t, group=ctx_tp.group, algo=ctx_tp.algos.reduce_scatter)
    return out


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(ctx.tp, grad), None


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp):
        return _all_reduce(tp, x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return _all_gather_seq(tp, x)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_seq(ctx.tp, grad), None


class _Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return _reduce_scatter_seq(tp, x)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_seq(ctx.tp, grad), None


def copy_to_tensor_model_parallel_region(x, tp):
    """f: identity forward, all-reduce backward."""
    return _Copy.apply(x, tp)


def reduce_from_tensor_model_parallel_region(x, tp):
    """g: all-reduce forward, identity backward."""
    return _Reduce.apply(x, tp)


def gather_from_sequence_parallel_region(x, tp):
    """SP's f: all-gather along the sequence forward, reduce-scatter backward."""
    return _Gather.apply(x, tp)


def reduce_scatter_to_sequence_parallel_region(x, tp):
    """SP's g: reduce-scatter along the sequence forward, all-gather backward."""
    return _Scatter.apply(x, tp)


class ColumnParallelLinear(Linear):
    """``Y = X Aᵀ`` with A's output rows split over the TP ranks (``gather_output=False``)."""

    def __init__(self, weight, bias, tp):
        r, t = tp.rank, tp.tp  # Shard(0): the placement table's split
        super().__init__(shard(weight, 0, t, r), None if bias is None else shard(bias, 0, t, r), tp.weight_store)
        self.tp = tp

    def forward(self, x):  # x (T', B, h_in)
        x = tp_enter(x, self.tp)  # (T, B, h_in), whole on every rank
        return super().forward(x)  # (T, B, h_out / t)


class RowParallelLinear(Linear):
    """``Y = X Aᵀ`` with A's input columns split; partial products summed by ``g`` (or reduce-scattered)."""

    def __init__(self, weight, bias, tp):
        r, t = tp.rank, tp.tp  # Shard(1); the bias Replicate()
        super().__init__(shard(weight, 1, t, r), None, tp.weight_store)
        self.bias = torch.nn.Parameter(bias.clone())  # whole on every rank, added after the sum
        self.tp = tp

    def forward(self, x):  # x (T, B, h_in / t)
        y = linear(x, self.weight, None, self.store)  # (T, B, h_out) partial sums
        y = tp_exit(y, self.tp)  # (T', B, h_out)
        return y + self.bias


def tp_enter(x, tp):
    """Into a column-parallel layer: f (or SP's all-gather)."""
    if tp.tp == 1:
        return x
    return (
        gather_from_sequence_parallel_region(x, tp)
        if tp.sequence_parallel
        else copy_to_tensor_model_parallel_region(x, tp)
    )


def tp_exit(y, tp):
    """Out of a row-parallel layer: g (or SP's reduce-scatter)."""
    if tp.tp == 1:
        return y
    return (
        reduce_scatter_to_sequence_parallel_region(y, tp)
        if tp.sequence_parallel
        else reduce_from_tensor_model_parallel_region(y, tp)
    )


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron's cross-entropy over logits split by vocabulary: three all-reduces, no gather."""

    @staticmethod
    def forward(ctx, logits, targets, tp):  # logits (N, V/t), targets (N,)
        lo = tp.rank * logits.shape[1]
        hi = lo + logits.shape[1]
        m = _all_reduce(tp, logits.max(dim=1).values, "max")  # (N,) the global max, for stability
        z = logits - m.unsqueeze(1)  # (N, V/t)
        e = z.exp()
        sum_e = _all_reduce(tp, e.sum(dim=1))  # (N,)
        mine = (targets >= lo) & (targets < hi)
        local = (targets - lo).clamp(0, logits.shape[1] - 1)
        tz = torch.where(mine, z.gather(1, local.unsqueeze(1)).squeeze(1), torch.zeros_like(m))
        tz = _all_reduce(tp, tz)  # (N,) the target's shifted logit
        loss = sum_e.log() - tz  # (N,)
        ctx.save_for_backward(e / sum_e.unsqueeze(1), mine, local)
        return loss.mean()

    @staticmethod
    def backward(ctx, grad):
        softmax, mine, local = ctx.saved_tensors  # (N, V/t)
        g = softmax.clone()
        rows = torch.arange(g.shape[0], device=g.device)
        g[rows[mine], local[mine]] -= 1.0
        return g * (grad / g.shape[0]), None, None


class TensorParallel:
    """The building blocks of :class:`~netmorph.models.gpt.GPTStage`, sharded over a TP group.

    ``comm`` and ``group`` are the communicator and this rank's TP group (no globals);
    ``phase`` tags the ledger.
    """

    def __init__(
        self,
        comm,
        group,
        sequence_parallel: bool = False,
        phase: str = "tp",
        ep_group=None,
        algos=None,
        cp=None,
        weight_store=None,
    ):
        self.comm, self.group, self.phase = comm, group, phase
        self.weight_store = weight_store  # a zero-bubble schedule's: the linears' weight gradients wait for W
        self.cp = cp  # a ContextParallel: this rank holds seq/cp positions, attends over all
        self.algos = algos or CollectiveAlgos()  # which all-reduce, all-gather, reduce-scatter (default ring)
        self.ep_group = ep_group if ep_group is not None else Group([comm.rank])  # the experts' all-to-all group
        self.tp = group.size()
        self.rank = group.index[comm.rank]
        self.sequence_parallel = sequence_parallel and self.tp > 1
        self._replicated = []  # nn.Parameters; compared by identity

    def heads(self, heads: int) -> int:
        if heads % self.tp:
            raise UsageError(f"{{heads}} {heads} is not divisible by tp {self.tp}", "heads")
        return heads // self.tp

    def column(self, weight, bias):
        if weight.shape[0] % self.tp:
            raise UsageError(
                f"a column-parallel weight of {weight.shape[0]} rows does not split over tp {self.tp}", "hidden"
            )
        return ColumnParallelLinear(weight, bias, self)

    def row(self, weight, bias):
        lin = RowParallelLinear(weight, bias, self)
        if self.sequence_parallel:
            self._replicated.append(lin.bias)
        return lin

    def embedding(self, weight):
        if weight.shape[0] % self.tp:
            raise UsageError(f"{{vocab}} {weight.shape[0]} is not divisible by tp {self.tp}", "vocab")
        return torch.nn.Parameter(shard(weight, 0, self.tp, self.rank).clone())  # Shard(0) over the vocabulary

    def embed(self, table, tokens, wpe):  # tokens (T, B) -> (T', B, h)
        """``VocabParallelEmbedding``: look up the tokens this rank owns, sum over ranks (g, or
        reduce-scatter along the sequence with SP), then add the positions of this rank's tokens (under cp: the
        sequence positions its context-parallel rank holds)."""
        T, base = tokens.shape[0], wpe
        if self.cp is not None:
            wpe = wpe[self.cp.positions(T * self.cp.cp, wpe.device)]
        lo = self.rank * table.shape[0]
        mine = (tokens >= lo) & (tokens < lo + table.shape[0])
        x = torch.nn.functional.embedding((tokens - lo).clamp(0, table.shape[0] - 1), table)  # (T, B, h)
        x = tp_exit(x * mine.unsqueeze(-1).to(x.dtype), self)  # (T', B, h)
        if self.sequence_parallel:
            n = T // self.tp
            if not any(q is base for q in self._replicated):
                self._replicated.append(base)
            return x + wpe[self.rank * n : (self.rank + 1) * n].unsqueeze(1)
        return x + wpe[:T].unsqueeze(1)

    def attention(self, q, k, v):  # each (B, nh/t, T/cp, hd)
        if self.cp is not None:
            return self.cp.attend(q, k, v)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    def layer_norm(self, weight, bias):
        ln = LayerNorm(weight, bias)
        if self.sequence_parallel:
            self._replicated += [ln.weight, ln.bias]
        return ln

    def logits_loss(self, x, table, targets):  # x (T', B, h)
        x = tp_enter(x, self)  # (T, B, h)
        logits = full_precision(x @ table.t())  # (T, B, V/t), float32 under bf16
        if self.tp == 1:
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return _VocabParallelCrossEntropy.apply(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), self)

    def experts(self, w: dict, i: int, cfg, router):
        """Layer ``i``'s experts over this rank's expert-parallel group, whole on every tensor-parallel rank
        (Megatron's expert tensor parallelism 1): without SP every tp rank routes the same tokens the same way.
        Under cp what the router decides over the whole microbatch it decides over the cp group."""
        return expert_layer(self.comm, self.ep_group, w, i, cfg, router, self.cp, self.algos.alltoall)

    def replicated(self):
        """With SP, parameters every TP rank holds whole but trains on its own tokens: their
        gradients are all-reduced over the TP group after backward (Megatron's
        ``allreduce_sequence_parallel_grads``)."""
        return list(self._replicated)
