"""The MoE layer over expert-parallel ranks: route, drop over capacity, all-to-all, experts, all-to-all back.

Stands in for Megatron-core's ``MoELayer`` with ``MoEAlltoAllTokenDispatcher``
(``megatron/core/transformer/moe/token_dispatcher.py``):

1. route (:class:`~netmorph.models.router.TopKRouter`) and drop over capacity
   (:mod:`netmorph.models.capacity`);
2. permute: this rank's kept assignments sorted by expert, so the rows for the
   experts of EP rank j form one contiguous block;
3. exchange the per-expert counts (an all-to-all of E integers: every rank must
   know how many rows it will receive from each -- Megatron does the same before
   the tokens), then ``all_to_all_single`` with the split sizes this batch produced;
4. the local experts (a GELU MLP each) run on the rows received for them, grouped
   by expert across source ranks;
5. ``all_to_all_single`` back, unpermute, weight by the gate and sum a token's k
   outputs. A dropped assignment adds nothing: its token passes through the residual.

Both all-to-alls are autograd functions (backward: the same exchange reversed), so
the ledger's phases are ``moe.dispatch``, ``moe.combine`` and their ``.bwd``
gradients, plus ``moe.counts``. The all-to-alls run the direct ``pairwise``
schedule, so the bytes on each link are exactly the router's traffic matrix times
h times the element size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from netmorph.models.capacity import keep_mask
from netmorph.models.router import TopKRouter


class _AllToAll(torch.autograd.Function):
    """Rows ``x`` (n, h): ``send[j]`` rows to group rank j, ``recv[j]`` rows from it; backward reversed."""

    @staticmethod
    def forward(ctx, x, comm, group, send, recv, phase, bwd_phase, clock, algo):
        ctx.args = (comm, group, send, recv, bwd_phase, clock, algo)
        return _exchange(comm, group, x, send, recv, phase, clock, algo)

    @staticmethod
    def backward(ctx, g):
        comm, group, send, recv, bwd_phase, clock, algo = ctx.args
        return (_exchange(comm, group, g, recv, send, bwd_phase, clock, algo),) + (None,) * 8


def _exchange(comm, group, x, send, recv, phase, clock, algo):
    """One all-to-all of rows (``algo``: one with uneven splits; pairwise, NCCL's p2p pairs); ``clock[0]``
    accumulates the seconds spent in it."""
    h = x.shape[1]
    x = x.contiguous()  # (sum send, h)
    out = x.new_empty((sum(recv), h))  # (sum recv, h)
    if group.size() == 1:
        out.copy_(x)
        return out
    t0 = time.perf_counter()
    with comm.phase(phase):
        comm.all_to_all_single(
            out.view(-1), x.view(-1), [r * h for r in recv], [s * h for s in send], group=group, algo=algo
        )
    clock[0] += time.perf_counter() - t0
    return out


@dataclass(frozen=True)
class Router:
    """How a mixture of experts routes and what it adds to the loss: Megatron-core's ``moe_*`` options of
    ``TransformerConfig`` (``--moe-router-pre-softmax``, ``--moe-aux-loss-coeff``, ``--moe-z-loss-coeff``,
    ``--moe-input-jitter-eps``, ``--moe-token-drop-policy``, and no ``--moe-expert-capacity-factor``:
    dropless). The capacity factor itself is the model's (:attr:`ModelShape.capacity_factor`)."""

    pre_softmax: bool = False
    aux_loss_coeff: float = 0.01
    z_loss_coeff: float = 0.0
    jitter_eps: float = 0.0
    drop_policy: str = "position"
    dropless: bool = False


class AuxLossScaler(torch.autograd.Function):
    """Megatron-core's ``MoEAuxLossAutoScaler``: returns ``out`` unchanged and, in backward, starts the router's
    auxiliary loss's gradient at ``scale`` (1/m for m microbatches) -- so a layer on any pipeline stage adds its
    load-balancing loss to the objective without that loss travelling to the last stage."""

    @staticmethod
    def forward(ctx, out, aux, scale):
        ctx.scale = scale
        ctx.save_for_backward(aux)
        return out

    @staticmethod
    def backward(ctx, grad):
        (aux,) = ctx.saved_tensors
        return grad, torch.ones_like(aux) * ctx.scale, None


@dataclass
class LayerStats:
    routed: np.ndarray  # (E,) assignments routed to each expert, before capacity
    kept: np.ndarray  # (E,) assignments each expert took
    send_rows: list  # rows sent to each EP rank (index in the EP group)
    capacity: int | None
    recv_rows: list | None = None  # rows received from each EP rank


class MoELayer(nn.Module):
    """E experts over the EP group ``ep_group`` (this rank holds E/ep of them, contiguous)."""

    def __init__(
        self,
        comm,
        ep_group,
        hidden: int,
        ffn: int,
        num_experts: int,
        top_k: int,
        capacity_factor: float | None,
        drop_policy: str = "position",
        pre_softmax: bool = False,
        aux_loss_coeff: float = 0.01,
        z_loss_coeff: float = 0.0,
        jitter_eps: float = 0.0,
        dtype=torch.float64,
        cp=None,
        alltoall: str = "pairwise",
    ):
        super().__init__()
        self.comm, self.group, self.alltoall = comm, ep_group, alltoall  # the all-to-alls' algorithm
        # under context parallelism (a ContextParallel) each rank holds part of every sequence: what routing
        # decides over the whole microbatch -- the load-balancing loss's fractions, a capacity's drops -- is
        # decided over the cp group (_sequence)
        self.cp = cp if cp is not None and cp.cp > 1 else None
        self.cp_size = self.cp.cp if self.cp is not None else 1
        self.ep = ep_group.size()
        self.ep_rank = ep_group.index[comm.rank] if comm is not None else 0
        self.num_experts, self.top_k = num_experts, top_k
        self.local = num_experts // self.ep
        self.first = self.ep_rank * self.local  # global id of this rank's first expert
        self.capacity_factor, self.drop_policy = capacity_factor, drop_policy
        self.clock = [0.0]  # seconds in this layer's all-to-alls (fwd + bwd)
        self.router = TopKRouter(
            hidden, num_experts, top_k, pre_softmax, aux_loss_coeff, z_loss_coeff, jitter_eps, dtype
        )
        self.w1 = nn.Parameter(torch.zeros(self.local, hidden, ffn, dtype=dtype))  # (E_local, h, f)
        self.b1 = nn.Parameter(torch.zeros(self.local, ffn, dtype=dtype))  # (E_local, f)
        self.w2 = nn.Parameter(torch.zeros(self.local, ffn, hidden, dtype=dtype))  # (E_local, f, h)
        self.b2 = nn.Parameter(torch.zeros(self.local, hidden, dtype=dtype))  # (E_local, h)

    def expert_parameters(self):
        return [self.w1, self.b1, self.w2, self.b2]

    def forward(self, x: torch.Tensor, capacity: int | None, generator=None, batch: int = 1):
        """``x`` (T, h) -> (y (T, h), routing, stats); ``x``'s rows are (position, sequence) token-major over
        ``batch`` sequences, and under cp ``capacity`` is the whole microbatch's."""
        E, el = self.num_experts, self.local
        if self.cp is None:
            r = self.router(x, generator)
            keep = keep_mask(r.experts, r.gates, E, capacity, self.drop_policy)  # (T, k)
        else:
            where = self._rows(x.shape[0] // batch, batch)  # (cp, T)
            mine = where[self.cp.rank]
            seq = {}
            r = self.router(x, generator, lambda e, g: self._sequence(e, g, capacity, where, seq), mine, where.numel())
            keep = (
                keep_mask(r.experts, r.gates, E, None)
                if capacity is None
                else keep_mask(seq["experts"], seq["gates"], E, capacity, self.drop_policy)[mine]
            )
        tok, slot = keep.nonzero(as_tuple=True)  # kept, token-major
        exp = r.experts[tok, slot]  # (n,)
        order = torch.argsort(exp, stable=True)
        tok, exp, gate = tok[order], exp[order], r.gates[tok[order], slot[order]]  # (n,) each, by expert
        counts = torch.bincount(exp, minlength=E)  # (E,)
        send = counts.view(self.ep, el).sum(1).tolist()  # rows per EP rank
        recv_counts = self._exchange_counts(counts)  # (ep, E_local)
        recv = recv_counts.sum(1).tolist()
        rows = x[tok]  # (n, h) permuted
        got = _AllToAll.apply(
            rows, self.comm, self.group, send, recv, "moe.dispatch", "moe.dispatch.bwd", self.clock, self.alltoall
        )
        out = self._experts(got, recv_counts)  # (sum recv, h)
        back = _AllToAll.apply(
            out, self.comm, self.group, recv, send, "moe.combine", "moe.combine.bwd", self.clock, self.alltoall
        )
        y = torch.zeros_like(x).index_add(0, tok, back * gate[:, None])  # (T, h)
        routed = torch.bincount(r.experts.reshape(-1), minlength=E).numpy()
        return y, r, LayerStats(routed, counts.numpy(), send, capacity, recv)

    def _rows(self, t: int, batch: int) -> torch.Tensor:
        """(cp, t·batch): where each cp rank's tokens sit in the whole microbatch's token-major order (the
        1-rank run's ``position·batch + sequence``), from the positions each rank holds."""
        seq = t * self.cp_size
        pos = torch.stack([self.cp.positions_of(j, seq) for j in range(self.cp_size)])  # (cp, t)
        return (pos[:, :, None] * batch + torch.arange(batch)).reshape(self.cp_size, -1)

    def _sequence(self, experts: torch.Tensor, gates: torch.Tensor, capacity, rows, seq: dict) -> tuple:
        """(assignments per expert (E,), tokens) over the whole microbatch, from the cp group (phase moe.cp).
        Dropless, one all-reduce of the counts and the token count (E + 1 int64; Megatron all-reduces
        ``tokens_per_expert`` over tp x cp). With a capacity, whose drops depend on every token's routing, one
        all-gather of each token's experts and gates (2k float64 a token): ``seq`` keeps them, in the whole
        microbatch's order, for the keep mask every cp rank then computes as the 1-rank run does."""
        E, g = self.num_experts, self.cp.group
        if capacity is None:
            both = torch.cat(
                [torch.bincount(experts.reshape(-1), minlength=E), experts.new_tensor([experts.shape[0]])]
            ).to(torch.int64)
            with self.comm.phase("moe.cp"):
                self.comm.all_reduce(both, group=g, algo=self.cp.algos.counts)
            return both[:-1], int(both[-1])
        mine = torch.cat([experts.double(), gates.detach().double()], dim=1)  # (T, 2k)
        every = mine.new_empty((self.cp_size,) + mine.shape)  # (cp, T, 2k)
        with self.comm.phase("moe.cp"):
            self.comm.all_gather_into_tensor(every, mine, group=g, algo=self.cp.algos.allgather)
        whole = torch.empty((rows.numel(), mine.shape[1]), dtype=torch.float64, device=mine.device)
        whole[rows.reshape(-1).to(mine.device)] = every.reshape(-1, mine.shape[1])  # (cp·T, 2k)
        k = experts.shape[1]
        seq["experts"], seq["gates"] = whole[:, :k].long(), whole[:, k:]
        return torch.bincount(seq["experts"].reshape(-1), minlength=E), whole.shape[0]

    def _exchange_counts(self, counts: torch.Tensor) -> np.ndarray:
        """(ep, E_local): how many rows each EP rank sends to each of this rank's experts."""
        mine = counts.numpy().astype(np.int64)  # (E,)
        if self.ep == 1:
            return mine.reshape(1, -1)
        got = np.empty_like(mine)
        with self.comm.phase("moe.counts"):
            self.comm.all_to_all_single(got, mine, group=self.group, algo=self.alltoall)
        return got.reshape(self.ep, self.local)

    def _experts(self, rows: torch.Tensor, recv_counts: np.ndarray) -> torch.Tensor:
        """Run each local expert on its rows: received grouped by source, then by expert."""
        ep, el = recv_counts.shape
        starts = np.concatenate([[0], np.cumsum(recv_counts.reshape(-1))])[:-1].reshape(ep, el)
        idx = [
            np.concatenate([np.arange(starts[s, e], starts[s, e] + recv_counts[s, e]) for s in range(ep)])
            for e in range(el)
        ]
        perm = torch.from_numpy(np.concatenate(idx).astype(np.int64)) if idx else torch.zeros(0, dtype=torch.long)
        grouped = rows[perm]  # (m, h) by expert
        outs, at = [], 0
        for e in range(el):
            n = len(idx[e])
            z = grouped[at : at + n]  # (n_e, h)
            hdn = F.gelu(z @ self.w1[e] + self.b1[e])  # (n_e, f)
            outs.append(hdn @ self.w2[e] + self.b2[e])  # (n_e, h)
            at += n
        done = torch.cat(outs) if outs else rows.new_zeros((0, rows.shape[1]))  # (m, h)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(len(perm))
        return done[inv]  # (m, h) back in received order
