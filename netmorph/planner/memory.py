"""Bytes per device: weights, gradients, optimizer state, activations.

Model states follow ZeRO (Rajbhandari et al. 2020, Table 1): with Ψ parameters on a
device, K = optimizer bytes per parameter and N_d the data-parallel degree, stage 1
shards the optimizer state (2Ψ + 2Ψ + KΨ/N_d with 16-bit gradients), stage 2 also the
gradients, stage 3 also the weights. Tensor parallelism divides every layer's
sharded weights by t (LayerNorms, row-parallel biases and the position embedding
stay whole); pipeline parallelism gives each stage l/p layers, the first stage also
the word embedding (V·h/t) and position embedding -- Megatron's
``num_parameters_on_most_loaded_model_shard``, counted exactly.

Activations follow Korthikanti et al. 2022 (Table 2), per layer and microbatch of b
sequences, 16-bit, in bytes (sbh = s·b·h, a = heads; 34 = 10 + 24 for f = 4h):

    no parallelism            sbh (34 + 5as/h)
    tensor parallel           sbh (10 + 24/t + 5as/(ht))
    + sequence parallel       sbh (34/t + 5as/(ht))
    + selective recompute     sbh (10 + 24/t),  with sequence parallel 34·sbh/t
    full recompute            2·sbh (the layer's input), with sequence parallel 2·sbh/t

The first pipeline stage holds the most: one microbatch's activations for all l
layers under 1F1B (p microbatches in flight x l/p layers), times (1 + (p-1)/(p·v))
under the interleaved schedule, fewer when there are fewer than p microbatches; plus
the embedding's dropout mask (s·b·h·p/t) and, when p = 1, the fp32 logits (4·s·b·V/t).
"""

from __future__ import annotations

import math

from netmorph.planner.config import ParallelConfig
from netmorph.planner.model import ModelSpec


def params_on_device(model: ModelSpec, c: ParallelConfig) -> float:
    """Parameters held by the most loaded device (first pipeline stage), before ZeRO.

    Exactly what Megatron's layout puts there (and ``netmorph train`` measures): per layer the
    column-parallel weights and biases and the row-parallel weights divided by t, the row-parallel
    biases and the two LayerNorms whole (6h); the vocab-parallel word embedding V·h/t and the
    positions s·h; with one stage also the final LayerNorm (2h)."""
    if model.bare:
        return model.params() / (c.tp * c.pp)
    layers = math.ceil(model.layers / c.pp)
    h, f, t = model.hidden, model.f, c.tp
    per_layer = (4 * h * h + 2 * h * f + 3 * h + f) / t + 6 * h
    emb = model.vocab * h / t + model.seq * h
    return layers * per_layer + emb + (2 * h if c.pp == 1 else 0)


def activation_bytes_per_layer(model: ModelSpec, c: ParallelConfig, recompute: str | None = None) -> float:
    """Korthikanti et al. 2022 Table 2, generalised to FFN width f."""
    rc = c.recompute if recompute is None else recompute
    s, b, h, a, t = model.seq, c.microbatch, model.hidden, model.heads, c.tp
    sbh = s * b * h
    total = 34 + 4 * (model.f - 4 * h) / h          # 10 unsplit + 24 split when f = 4h
    attn = 5 * a * s / h
    sp = c.sequence_parallel and t > 1
    if rc == "full":
        return 2 * sbh / (t if sp else 1)
    if rc == "selective":
        return sbh * total / t if sp else sbh * (10 + (total - 10) / t)
    return sbh * (total + attn) / t if sp else sbh * (10 + (total - 10) / t + attn / t)


def activation_bytes(model: ModelSpec, c: ParallelConfig) -> float:
    if model.bare:
        return 0.0
    m = c.microbatches
    in_flight = min(c.pp, max(m, 1)) / c.pp            # share of p microbatches the first stage holds
    interleave = 1 + (c.pp - 1) / (c.pp * c.interleave) if c.interleave > 1 else 1.0
    layers_worth = model.layers * in_flight * interleave
    act = activation_bytes_per_layer(model, c) * layers_worth
    s, b, h = model.seq, c.microbatch, model.hidden
    act += s * b * h * c.pp / c.tp                      # embedding dropout mask, p microbatches
    if c.pp == 1:
        act += 4 * s * b * model.vocab / c.tp           # fp32 logits for the cross-entropy
    return act


def memory(model: ModelSpec, c: ParallelConfig) -> dict:
    """{"params", "grads", "optimizer", "activations", "total"} in bytes for the most loaded device."""
    n = params_on_device(model, c)
    d = c.dp
    params = c.param_bytes * n / (d if c.zero >= 3 else 1)
    grads = c.grad_bytes * n / (d if c.zero >= 2 else 1)
    opt = c.optimizer_bytes * n / (d if c.zero >= 1 else 1)
    act = activation_bytes(model, c)
    return {"params": params, "grads": grads, "optimizer": opt, "activations": act,
            "total": params + grads + opt + act}
