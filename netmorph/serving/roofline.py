"""Prefill against decode on the roofline: why prefill is compute-bound and decode bandwidth-bound.

For a forward pass over ``n`` new tokens per sequence, ``batch`` sequences, with ``context``
tokens already cached: matmul FLOPs are 2 · (non-embedding weights) per token plus the
LM head's 2 · vocab · hidden for the last token; attention adds 4 · layers · heads ·
head_dim FLOPs per (query, key) pair (QKᵀ and the weighted sum of V). Bytes read from
HBM: every weight once per pass (shared by the batch) plus the KV cache each sequence
attends over, plus the KV it writes. Arithmetic intensity = FLOPs / bytes; the
hardware's ridge point = peak FLOP/s / HBM bytes/s (Williams, Waterman & Patterson
2009). Below the ridge a pass is memory-bound: its time is bytes / bandwidth.
"""

from __future__ import annotations

from netmorph.mesh.shape import ModelShape
from netmorph.serving.kv import DTYPE_BYTES


def flops_and_bytes(m: ModelShape, items) -> tuple[float, float]:
    """FLOPs and HBM bytes of one forward pass over ``items`` = [(new tokens, tokens already in context)], one
    per sequence: the weights are read once for the whole batch, each sequence reads its own KV and writes
    its new tokens' KV, and each produces logits for its last token."""
    h = m.hidden
    # the layers' weights, dense and shared ones whole; a token multiplies through its top-k routed experts, and
    # a pass reads only the experts some token was routed to: with T tokens routed uniformly E·(1 - (1 - k/E)^T)
    # of the E (vLLM's fused MoE kernel skips an expert with no tokens) -- k at batch 1, all E for a big batch
    outside = m.embedding_params() + m.norm_params()
    active = m.active_params() - outside
    weights = active
    if m.experts:
        tokens = sum(new for new, _ in items)
        hit = m.experts * (1 - (1 - m.top_k / m.experts) ** tokens)
        weights += m.moe_layers * (hit - m.top_k) * (m.expert_weights() + m.expert_biases())
    kv = m.kv_bytes_per_token(DTYPE_BYTES)
    flops, nbytes = 0.0, (weights + m.vocab * h) * DTYPE_BYTES
    for new, ctx in items:
        pairs = new * ctx + new * (new + 1) / 2  # causal (query, key) pairs
        flops += 2 * active * new + 2 * m.layers * (m.q_width + m.o_width) * pairs + 2 * m.vocab * h
        nbytes += ctx * kv + new * kv
    return flops, nbytes


def phase(m: ModelShape, hw, batch: int, new: int, context: int) -> dict:
    """FLOPs, bytes, intensity and roofline time of one forward pass of ``batch`` sequences."""
    flops, nbytes = flops_and_bytes(m, [(new, context)] * batch)
    intensity = flops / nbytes
    return {
        "flops": flops,
        "bytes": nbytes,
        "intensity": intensity,
        "time_s": _roof(hw, flops, nbytes),
        "bound": "compute" if intensity >= hw.peak_flops / hw.hbm_bandwidth else "memory",
    }


def roofline(m: ModelShape, hw, batch: int = 1, prompt: int = 512, context: int = 512) -> dict:
    """Prefill of ``prompt`` tokens and one decode step at ``context`` cached tokens, both at ``batch``."""
    return {
        "model": m.name,
        "hardware": hw.name,
        "batch": batch,
        "ridge_flops_per_byte": hw.peak_flops / hw.hbm_bandwidth,
        "prefill": phase(m, hw, batch, prompt, 0),
        "decode": phase(m, hw, batch, 1, context),
    }


def iteration_time(m: ModelShape, hw, items) -> float:
    """Roofline time of one serving iteration of model ``m`` on ``hw`` over ``items`` (see
    :func:`flops_and_bytes`): the weights are read once for the whole batch -- why batching decodes is nearly
    free until the pass turns compute-bound."""
    return _roof(hw, *flops_and_bytes(m, items))


def _roof(hw, flops: float, nbytes: float) -> float:
    return max(flops / hw.peak_flops, nbytes / hw.hbm_bandwidth)
