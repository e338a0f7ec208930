"""Context parallelism: the sequence split over cp ranks, attention made whole by one of Megatron-Core's three
``--cp-comm-type`` s (``megatron/core/transformer/dot_product_attention_context_parallel``, Transformer Engine's
``AttnFuncWithCPAndKVP2P``, DeepSpeed-Ulysses):

- ``p2p``: ring attention (Liu et al. 2023). Each rank keeps its queries; the K/V blocks pass around the ring,
  cp - 1 hops, while the block in hand is attended; partial results merge by their log-sum-exp (the online
  softmax of FlashAttention). The backward passes K/V around again beside a travelling dK/dV accumulator that
  ends at the block's owner (Transformer Engine's order): forward (cp-1) K/V blocks, backward 2(cp-1).
- ``all_gather``: K and V of the whole sequence gathered before attention, their gradients reduce-scattered
  after it (Llama 3's choice, sec. 3.3.2): (cp-1)/cp of the whole K/V each way.
- ``a2a``: Ulysses (Jacobs et al. 2023): an all-to-all trades the sequence split for a head split, each rank
  attends its heads over the whole sequence, and a second all-to-all trades back; q, k, v and the output each
  send (cp-1)/cp of themselves, forward and backward. Needs the heads (per tp rank) divisible by cp.

Causal load balance (Megatron's ``get_batch_on_this_cp_rank``, torchtitan's ``_HeadTailLoadBalancer``): the
sequence is cut into 2·cp chunks and rank r holds chunks r and 2·cp-1-r, a head and a tail, so that under the
causal mask every rank attends the same number of chunk pairs (2·cp + 1, counted in :attr:`ContextParallel.
blocks`); a contiguous split would give rank r 4r + 3 of them.
"""

from __future__ import annotations

import math
import time

import torch

from netmorph.errors import UsageError
from netmorph.parallel.algos import CollectiveAlgos

COMM_TYPES = ("p2p", "all_gather", "a2a")


def chunk_order(cp: int, balanced: bool = True) -> list:
    """The two sequence chunks (of 2·cp) each cp rank holds: head and tail, or contiguous."""
    return [(r, 2 * cp - 1 - r) if balanced else (2 * r, 2 * r + 1) for r in range(cp)]


class ContextParallel:
    """This rank's place in its context-parallel ``group`` (no globals) and the attention over it."""

    def __init__(self, comm, group, comm_type: str = "p2p", balanced: bool = True, phase: str = "cp", algos=None):
        if comm_type not in COMM_TYPES:
            raise UsageError(
                f"{{cp_comm_type}} must be one of {', '.join(COMM_TYPES)}, got {comm_type!r}", "cp_comm_type"
            )
        self.comm, self.group, self.comm_type, self.phase = comm, group, comm_type, phase
        self.cp, self.rank = group.size(), group.index[comm.rank]
        self.algos = algos or CollectiveAlgos()  # all_gather's gather and scatter (ring by default)
        self.chunks = chunk_order(self.cp, balanced)
        self.blocks = 0  # chunk pairs attended by this rank's forwards (p2p, all_gather: the causal work)

    def positions(self, seq: int, device=None) -> torch.Tensor:
        """The sequence positions this rank holds, in the order it holds them (seq/cp of them)."""
        return self.positions_of(self.rank, seq, device)

    def positions_of(self, rank: int, seq: int, device=None) -> torch.Tensor:
        """The positions cp rank ``rank`` of the group holds."""
        return _positions(self.chunks[rank], seq // (2 * self.cp), device)

    def attend(self, q, k, v):
        """Causal attention of this rank's queries over the whole sequence: each (B, nh, T/cp, hd)."""
        if self.cp == 1:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.comm_type == "a2a":
            return self._ulysses(q, k, v)
        if self.comm_type == "all_gather":
            kv = _GatherKV.apply(torch.stack([k, v]).permute(3, 0, 1, 2, 4).contiguous(), self)
            n = kv.shape[0] // self.cp  # (cp·T/cp, 2, B, nh, hd) in rank order
            state = _Online(_wide(q), self.chunks[self.rank])  # softmax in float32, as a flash kernel's
            for j in range(self.cp):
                blk = _wide(kv[j * n : (j + 1) * n].permute(1, 2, 3, 0, 4))  # (2, B, nh, T/cp, hd)
                self.blocks += state.add(blk[0], blk[1], self.chunks[j])
            return state.result()[0].to(q.dtype)
        return _RingAttention.apply(q, k, v, self)

    def _ulysses(self, q, k, v):
        nh = q.shape[1]
        if nh % self.cp:
            raise UsageError(f"cp a2a needs the heads per tp rank ({nh}) divisible by cp {self.cp}", "cp")
        n = q.shape[2] // 2  # a chunk's tokens
        order = torch.cat([_positions(c, n, q.device) for c in self.chunks])  # the gathered sequence's positions
        inv = torch.argsort(order)
        # (B, nh, T/cp, hd) -> (B, nh/cp, T, hd): heads scattered, sequence gathered in rank order, then sorted
        q, k, v = (_AllToAll.apply(z, self, 1, 2).index_select(2, inv) for z in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return _AllToAll.apply(y.index_select(2, order), self, 2, 1)  # back to (B, nh, T/cp, hd)

    def exchange(self, send, recv_like):
        """One ring hop: ``send`` to the next rank, a tensor like ``recv_like`` from the previous one (K/V forward
        and backward, the dK/dV accumulator behind them: both travel the same way round)."""
        g, r, p = self.group.ranks, self.rank, self.cp
        to, frm = g[(r + 1) % p], g[(r - 1) % p]
        out = torch.empty_like(recv_like)
        led = self.comm.ledger.records
        at = len(led)
        with self.comm.phase(self.phase):
            sent = self.comm.isend(send.contiguous(), to)
            self.comm.irecv(out, frm).wait()  # the receive first: over gloo a send completes only once its peer
            sent.wait()  # has posted the payload's receive, which its own receive's wait does
        if len(led) > at:  # the hop's record spans its send to both ends' completion
            led[at] = led[at]._replace(t1=time.perf_counter())
        return out


def _wide(z: torch.Tensor) -> torch.Tensor:
    """A 16-bit tensor as float32 (the softmax and its sums, as a flash kernel keeps them); wider ones as they are."""
    return z.float() if z.dtype in (torch.bfloat16, torch.float16) else z


def _positions(chunks, n: int, device=None) -> torch.Tensor:
    return torch.cat([torch.arange(c * n, (c + 1) * n, device=device) for c in chunks])


class _Online:
    """FlashAttention's online softmax over the key blocks of one rank's queries, chunk pair by chunk pair:
    pairs above the causal diagonal are skipped, the diagonal masked, those below attended whole."""

    def __init__(self, q, chunks):
        self.q, self.chunks = q, chunks
        self.n = q.shape[2] // 2
        self.scale = 1.0 / math.sqrt(q.shape[-1])
        self.m = [None, None]  # per query chunk: running max, sum of exponentials, weighted sum
        self.l, self.acc = [None, None], [None, None]

    def add(self, k, v, kchunks) -> int:
        """Attend the key/value block holding chunks ``kchunks``; the chunk pairs computed."""
        done = 0
        for u, qc in enumerate(self.chunks):
            qu = self.q[:, :, u * self.n : (u + 1) * self.n]
            for w, kc in enumerate(kchunks):
                if kc > qc:
                    continue
                s = qu @ k[:, :, w * self.n : (w + 1) * self.n].transpose(-1, -2) * self.scale
                if kc == qc:
                    s = s.masked_fill(_upper(self.n, s.device), float("-inf"))
                vw = v[:, :, w * self.n : (w + 1) * self.n]
                m_new = s.amax(-1, keepdim=True) if self.m[u] is None else torch.maximum(self.m[u], s.amax(-1, True))
                p = torch.exp(s - m_new)
                if self.m[u] is None:
                    self.l[u], self.acc[u] = p.sum(-1, keepdim=True), p @ vw
                else:
                    decay = torch.exp(self.m[u] - m_new)
                    self.l[u] = self.l[u] * decay + p.sum(-1, keepdim=True)
                    self.acc[u] = self.acc[u] * decay + p @ vw
                self.m[u] = m_new
                done += 1
        return done

    def result(self):
        """(the attention output (B, nh, T/cp, hd), its log-sum-exp (B, nh, T/cp, 1))."""
        out = torch.cat([a / lv for a, lv in zip(self.acc, self.l)], dim=2)
        lse = torch.cat([m + lv.log() for m, lv in zip(self.m, self.l)], dim=2)
        return out, lse


def _upper(n: int, device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).triu(1)


def _pair_grads(q, k, v, do, lse, delta, qchunks, kchunks, scale):
    """FlashAttention's backward for one key/value block: (dq, dk, dv) from the saved log-sum-exp and
    delta = rowsum(dO ⊙ O), over the chunk pairs the forward attended."""
    n = q.shape[2] // 2
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for u, qc in enumerate(qchunks):
        qs = slice(u * n, (u + 1) * n)
        for w, kc in enumerate(kchunks):
            if kc > qc:
                continue
            ks = slice(w * n, (w + 1) * n)
            s = q[:, :, qs] @ k[:, :, ks].transpose(-1, -2) * scale
            if kc == qc:
                s = s.masked_fill(_upper(n, s.device), float("-inf"))
            p = torch.exp(s - lse[:, :, qs])  # the softmax's entries
            dv[:, :, ks] += p.transpose(-1, -2) @ do[:, :, qs]
            ds = p * (do[:, :, qs] @ v[:, :, ks].transpose(-1, -2) - delta[:, :, qs])
            dq[:, :, qs] += ds @ k[:, :, ks] * scale
            dk[:, :, ks] += ds.transpose(-1, -2) @ q[:, :, qs] * scale
    return dq, dk, dv


class _RingAttention(torch.autograd.Function):
    """Ring attention: K/V around the ring forward; K/V again and a dK/dV accumulator backward."""

    @staticmethod
    def forward(ctx, q, k, v, cp):
        state = _Online(_wide(q), cp.chunks[cp.rank])  # float32 inside; the blocks pass in their dtype
        kv = torch.stack([k, v])
        for i in range(cp.cp):
            src = (cp.rank - i) % cp.cp  # whose block is in hand
            cp.blocks += state.add(_wide(kv[0]), _wide(kv[1]), cp.chunks[src])
            if i < cp.cp - 1:
                kv = cp.exchange(kv, kv)
        out, lse = state.result()
        ctx.cp = cp
        ctx.save_for_backward(q, k, v, out, lse)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, do):
        cp = ctx.cp
        q, k, v, out, lse = ctx.saved_tensors
        dtype = q.dtype
        q, k, v, do = (_wide(z) for z in (q, k, v, do.contiguous()))
        delta = (do * out).sum(-1, keepdim=True)
        scale = 1.0 / math.sqrt(q.shape[-1])
        mine = cp.chunks[cp.rank]
        dq, dk, dv = _pair_grads(q, k, v, do, lse, delta, mine, mine, scale)
        kv, acc = torch.stack([k, v]).to(dtype), None  # K/V and their accumulator on the wire in the dtype
        for i in range(1, cp.cp):
            kv = cp.exchange(kv, kv)  # the block of rank r - i
            if acc is not None:  # its accumulator, from the rank that held it last
                acc = _wide(cp.exchange(acc, acc))
            _, bk, bv = g = _pair_grads(
                q, _wide(kv[0]), _wide(kv[1]), do, lse, delta, mine, cp.chunks[(cp.rank - i) % cp.cp], scale
            )
            dq += g[0]
            acc = torch.stack([bk, bv]) if acc is None else acc + torch.stack([bk, bv])
            acc = acc.to(dtype)
        if acc is not None:
            acc = _wide(cp.exchange(acc, acc))  # home: the accumulator of this rank's own block
            dk, dv = dk + acc[0], dv + acc[1]
        return dq.to(dtype), dk.to(dtype), dv.to(dtype), None


class _GatherKV(torch.autograd.Function):
    """K/V of every cp rank, stacked along the sequence (all-gather); the gradients reduce-scattered back."""

    @staticmethod
    def forward(ctx, kv, cp):
        ctx.cp = cp
        out = kv.new_empty((kv.shape[0] * cp.cp,) + tuple(kv.shape[1:]))
        with cp.comm.phase(cp.phase):
            cp.comm.all_gather_into_tensor(out, kv, group=cp.group, algo=cp.algos.allgather)
        return out

    @staticmethod
    def backward(ctx, grad):
        cp = ctx.cp
        grad = grad.contiguous()
        out = grad.new_empty((grad.shape[0] // cp.cp,) + tuple(grad.shape[1:]))
        with cp.comm.phase(cp.phase):
            cp.comm.reduce_scatter_tensor(out, grad, group=cp.group, algo=cp.algos.reduce_scatter)
        return out, None


class _AllToAll(torch.autograd.Function):
    """DeepSpeed-Ulysses' ``_SeqAllToAll``: ``x`` split along ``scatter`` into cp pieces, piece i to rank i, the
    pieces received joined along ``gather`` in rank order; the backward is the same exchange the other way."""

    @staticmethod
    def forward(ctx, x, cp, scatter: int, gather: int):
        ctx.cp, ctx.dims = cp, (scatter, gather)
        return _all_to_all(cp, x, scatter, gather)

    @staticmethod
    def backward(ctx, grad):
        scatter, gather = ctx.dims
        return _all_to_all(ctx.cp, grad, gather, scatter), None, None, None


def _all_to_all(cp, x, scatter: int, gather: int):
    inp = torch.stack(x.chunk(cp.cp, dim=scatter)).contiguous()  # (cp, ...): piece i for rank i
    out = torch.empty_like(inp)
    with cp.comm.phase(cp.phase):
        cp.comm.all_to_all_single(out, inp, group=cp.group, algo=cp.algos.alltoall)
    return torch.cat(out.unbind(0), dim=gather)
