"""The learned router: which experts each token goes to, with what weight, and its auxiliary losses.

Stands in for Megatron-core's ``TopKRouter`` (``megatron/core/transformer/moe/router.py``)
with the conventions it documents:

- logits = x · W_router (no bias), ``W_router`` of shape (h, E);
- softmax *after* top-k by default (softmax over the k chosen logits, so a token's
  gates sum to 1, as Mixtral); ``pre_softmax=True`` is Megatron's
  ``--moe-router-pre-softmax``: softmax over all E experts, then top-k, gates not
  renormalised (Switch Transformer, GShard). top-1 is Switch, top-2 GShard;
- router jitter (Switch, Fedus et al. 2021): the router input multiplied by
  U(1 − ε, 1 + ε) noise while training (``--moe-input-jitter-eps``);
- load-balancing loss, Switch Transformer eq. 4 in Megatron's form
  (``switch_load_balancing_loss_func``): α · E · Σ_i f_i · P_i, with f_i the
  fraction of the T·k routing assignments that chose expert i (before capacity
  drops) and P_i the mean over tokens of the full softmax probability of expert i.
  Exactly uniform routing gives α for any E and k; every token sent to one expert
  with probability 1 (top-1) gives α·E;
- router z-loss (ST-MoE, Zoph et al. 2022, eq. 5; Megatron ``z_loss_func``):
  β · mean_t (logsumexp_i logits_ti)².

Everything is computed on this rank's tokens (Megatron's per-micro-batch aux loss), but for the expert
fractions of a context-parallel rank, which are its whole microbatch's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Routing:
    experts: torch.Tensor  # (T, k) int64: the chosen experts, best first
    gates: torch.Tensor  # (T, k): their weights in the combine
    probs: torch.Tensor  # (T, E): softmax over every expert (what the aux loss averages)
    logits: torch.Tensor  # (T, E)
    aux_loss: torch.Tensor  # scalar, already times α
    z_loss: torch.Tensor  # scalar, already times β


def load_balancing_loss(
    probs: torch.Tensor, experts: torch.Tensor, num_experts: int, coeff: float, totals=None
) -> torch.Tensor:
    """α · E · Σ_i f_i · P_i (Switch eq. 4; Megatron's ``switch_load_balancing_loss_func``).

    ``probs`` (T, E) is the full softmax, ``experts`` (T, k) the routing assignments; f_i counts
    assignments (not tokens), so top-k routing is normalised by T·k. ``totals`` = (assignments per expert (E,),
    tokens) of the whole sequence, when this rank holds part of it (context parallelism): f_i is then the
    sequence's and P_i this rank's mean, so the cp ranks' losses, averaged as their gradients are, are the whole
    sequence's."""
    t, k = experts.shape
    if totals is None:
        raw = torch.bincount(experts.reshape(-1), minlength=num_experts)  # (E,)
    else:
        raw, t = totals
    f = raw.to(probs.dtype) / (t * k)  # (E,)
    p = probs.mean(dim=0)  # (E,)
    return coeff * num_experts * torch.sum(f * p)


def z_loss(logits: torch.Tensor, coeff: float) -> torch.Tensor:
    """β · mean over tokens of logsumexp(logits)² (ST-MoE's router z-loss)."""
    return coeff * torch.logsumexp(logits, dim=-1).square().mean()


class TopKRouter(nn.Module):
    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int = 2,
        pre_softmax: bool = False,
        aux_loss_coeff: float = 0.01,
        z_loss_coeff: float = 0.0,
        jitter_eps: float = 0.0,
        dtype=torch.float32,
    ):
        super().__init__()
        self.num_experts, self.top_k, self.pre_softmax = num_experts, top_k, pre_softmax
        self.aux_loss_coeff, self.z_loss_coeff, self.jitter_eps = aux_loss_coeff, z_loss_coeff, jitter_eps
        self.weight = nn.Parameter(torch.zeros(hidden, num_experts, dtype=dtype))  # (h, E)

    def forward(
        self,
        x: torch.Tensor,
        generator: torch.Generator | None = None,
        sequence=None,
        rows: torch.Tensor | None = None,
        total: int = 0,
    ) -> Routing:
        """``x`` (T, h) -> :class:`Routing`. ``generator`` seeds the jitter (same noise on every layout). Under
        context parallelism ``x`` is part of a microbatch of ``total`` tokens, ``rows`` its tokens' places in
        it (the noise is the whole microbatch's, these rows of it), and ``sequence(experts, gates)`` gives the
        whole microbatch's (assignments per expert, tokens) for :func:`load_balancing_loss`."""
        if self.training and self.jitter_eps > 0:
            shape = (total, x.shape[1]) if rows is not None else x.shape
            noise = torch.empty(shape, dtype=torch.float64).uniform_(
                1 - self.jitter_eps, 1 + self.jitter_eps, generator=generator
            )
            x = x * (noise if rows is None else noise[rows]).to(x.dtype)  # (T, h)
        logits = x @ self.weight  # (T, E)
        probs = torch.softmax(logits, dim=-1)  # (T, E)
        if self.pre_softmax:
            gates, experts = torch.topk(probs, self.top_k, dim=-1)  # (T, k) each
        else:
            top, experts = torch.topk(logits, self.top_k, dim=-1)  # (T, k) each
            gates = torch.softmax(top, dim=-1)  # (T, k)
        totals = sequence(experts, gates) if sequence is not None else None
        aux = load_balancing_loss(probs, experts, self.num_experts, self.aux_loss_coeff, totals)
        zl = z_loss(logits, self.z_loss_coeff) if self.z_loss_coeff else logits.new_zeros(())
        return Routing(experts, gates, probs, logits, aux, zl)
