"""Expert capacity: how many assignments an expert takes per batch, which ones it drops, and what
uniform routing is expected to drop.

Capacity (Switch Transformer, GShard; Megatron's ``get_capacity``): C = ceil(k·T/E · CF)
per expert per rank, for T tokens routed top-k over E experts with capacity factor CF.
An expert over capacity drops the rest; a dropped assignment contributes nothing to
its token's output, which passes through the residual unchanged. Two drop policies,
Megatron's ``--moe-token-drop-policy``: ``position`` keeps the earliest tokens (Switch's
cumsum order) and ``probs`` keeps the assignments with the highest gates.

``netmorph moe drops``: under uniformly random routing the load of one expert is
Binomial(T, k/E) (each token picks k distinct experts), so the expected dropped fraction
is E · E[max(0, X − C)] / (T·k), computed exactly from the binomial distribution and
beside it by throwing the balls into the bins ``trials`` times.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from netmorph.errors import UsageError

POLICIES = ("position", "probs")


MAX_DRAWS = 4e9  # tokens x experts x trials a drop simulation may draw


def check_routing(tokens: int, experts: int, top_k: int, trials: int = 1) -> None:
    """UsageError naming the field when a routing cannot be drawn: experts or top-k outside 1..4096, top-k above
    the experts, or more than :data:`MAX_DRAWS` draws for ``trials`` simulated routings."""
    for name, v in (("experts", experts), ("top_k", top_k)):
        if not 1 <= v <= 4096:
            raise UsageError(f"{{{name}}} must be in 1..4096, got {v}", name)
    if top_k > experts:
        raise UsageError(f"{{top_k}} {top_k} > {{experts}} {experts}", "top_k")
    if tokens * experts * trials > MAX_DRAWS:
        raise UsageError(
            f"{{tokens}} x {{experts}} x {{trials}} is more than {MAX_DRAWS:g} draws; lower {{trials}}", "trials"
        )


def capacity(tokens: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """C = ceil(k·T/E · CF)."""
    return math.ceil(top_k * tokens / experts * capacity_factor)


def keep_mask(
    experts: torch.Tensor, gates: torch.Tensor, num_experts: int, cap: int | None, policy: str = "position"
) -> torch.Tensor:
    """(T, k) bool: which routing assignments their expert takes (all of them when ``cap`` is None)."""
    t, k = experts.shape
    if cap is None:
        return torch.ones(t, k, dtype=torch.bool)
    flat = experts.reshape(-1)  # (T·k,) token-major
    n = flat.numel()
    if policy == "position":
        order = torch.arange(n)  # earliest token first
    elif policy == "probs":
        # highest gate first within each expert; ties by position
        order = torch.from_numpy(np.lexsort((np.arange(n), -gates.detach().reshape(-1).double().numpy())))
    else:
        raise ValueError(f"drop policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    e_sorted = flat[order]  # (T·k,)
    # rank of each assignment within its expert, in the policy's order
    onehot = torch.nn.functional.one_hot(e_sorted, num_experts)  # (T·k, E)
    rank_in_expert = (onehot.cumsum(0) * onehot).sum(1) - 1  # (T·k,)
    keep = torch.empty(n, dtype=torch.bool)
    keep[order] = rank_in_expert < cap
    return keep.reshape(t, k)


def exact_drop_fraction(tokens: int, experts: int, top_k: int, cap: int) -> float:
    """E · E[max(0, X − C)] / (T·k) with X ~ Binomial(T, k/E): uniform routing's expected drops."""
    p = top_k / experts
    x = np.arange(tokens + 1)
    logpmf = (
        np.array([math.lgamma(tokens + 1) - math.lgamma(i + 1) - math.lgamma(tokens - i + 1) for i in x])
        + x * math.log(p)
        + (tokens - x) * (math.log1p(-p) if p < 1 else 0.0)
    )
    if p == 1:
        logpmf = np.where(x == tokens, 0.0, -np.inf)
    excess = np.maximum(0, x - cap)
    return float(experts * np.sum(np.exp(logpmf) * excess) / (tokens * top_k))


def simulated_drop_fraction(tokens: int, experts: int, top_k: int, cap: int, trials: int, seed: int = 0) -> float:
    """Route ``tokens`` uniformly at random (k distinct experts each) ``trials`` times; the mean
    fraction of assignments over capacity."""
    rng = np.random.default_rng(seed)
    dropped = 0
    for _ in range(trials):
        picks = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k]  # (T, k) distinct experts
        load = np.bincount(picks.reshape(-1), minlength=experts)  # (E,)
        dropped += int(np.maximum(0, load - cap).sum())
    return dropped / (trials * tokens * top_k)
