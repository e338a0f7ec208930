"""Bytes per device: weights, gradients, optimizer state, activations -- on the most loaded stage.

Model states follow ZeRO (Rajbhandari et al. 2020, Table 1): with Ψ parameters on a
device, K = optimizer bytes per parameter and N_d the data-parallel degree, stage 1
shards the optimizer state (2Ψ + 2Ψ + KΨ/N_d with 16-bit gradients), stage 2 also the
gradients, stage 3 (FSDP) also the weights. The sharding group is the data-parallel group
together with the context-parallel one (Megatron's distributed optimizer shards over dp x cp);
expert weights shard over their own, smaller data-parallel group (dp·cp / ep). Tensor
parallelism divides every layer's sharded weights by t (norms, row-parallel biases and the
position embedding stay whole); expert parallelism gives each device E/ep experts; each
pipeline stage holds its own layers, the first also the word embedding (V·h/t) and the
positions, the last the output layer (untied; Megatron keeps a copy of a tied one there) and
the final norm -- Megatron's ``num_parameters_on_most_loaded_model_shard``, counted exactly.
Under FP8 Transformer Engine keeps an 8-bit copy of every weight beside the 16-bit one (+1 B
per parameter); master weights and the optimizer stay fp32.

Activations generalise Korthikanti et al. 2022 (Table 2) term by term, per layer and token,
16-bit (h_kv = K/V width, f = MLP width, a = heads):

    replicated under TP   4h (two norm inputs) + 2h (QKV input) + 2h (MLP input) + 2h (two dropout
                          masks, 1 byte per element; none for a model without dropout)
    split by t            2h (Q) + 4h_kv (K, V) + 2h (attention output) + MLP: 4f (GeLU: its input and
                          fc2's) or 6f (SwiGLU: gate, up, product)
    attention core        standard: 5as per token (scores, softmax, dropout mask; 4as without dropout;
                          split by t);
                          FlashAttention: only the softmax statistics, 4a bytes (fp32 per head)

which for MHA, f = 4h and standard attention is the paper's sbh(34 + 5as/h) (10 replicated + 24
split). Sequence parallelism splits the replicated part too; selective recomputation drops the
attention core, full recomputation keeps only the layer input (2h, /t with sequence
parallelism); context parallelism divides everything by cp (each rank holds s/cp tokens); FP8
stores the four linear layers' inputs in 8 bits; a mixture of experts stores the MLP part for
each of the top_k experts a token visits (times the capacity factor: the padding is stored too).

Microbatches in flight follow the schedule (:meth:`Layout.in_flight`): GPipe holds all m, 1F1B stage i
min(p - i, m), Megatron's interleaved schedule 2(p - i - 1) + (v - 1)·N + 1 chunks of 1/v of the stage
(p + (p-1)/v stages' worth on the first for N = p: Narayanan's 1 + (p-1)/(p·v) factor); the first stage
also the embedding's dropout mask (if any) for p microbatches and the last stage the fp32 logits
(4·s·b·V/t) of one.
"""

from __future__ import annotations

from functools import lru_cache

from netmorph.mesh.layout import SPLIT_BACKWARD, Layout, sharding_with
from netmorph.mesh.placement import model_state_bytes
from netmorph.mesh.schedules import levels, schedule
from netmorph.mesh.shape import ModelShape
from netmorph.planner.results import Memory


def _per_layer_params(model: ModelShape, c: Layout) -> tuple[float, float]:
    """(dense, expert) parameters of one layer on one device."""
    h, t = model.hidden, c.tp
    row_bias = h if model.bias else 0  # the output projection's and the MLP's down-projection's: whole
    attn_row = h if model.bias or model.attention_bias == "all" else 0
    dense = (
        (model.attn_weights() + model.attn_biases() - attn_row) / t
        + attn_row
        + model.attn_norms()
        + model.layer_norms * model.norm_params()
    )
    te = (c.expert_tp or t) if model.experts else t  # experts split over expert_tp ranks (Megatron: tp)
    expert = model.expert_weights() / te + ((model.expert_biases() - row_bias) / te + row_bias if model.bias else 0)
    if model.experts:  # shared experts are tp-split MLPs beside the router (Megatron's SharedExpertMLP)
        return dense + model.router_params() + model.shared_params() / t, model.experts / c.ep * expert
    return dense + expert, 0.0


def _candidates(stages: list) -> list:
    """The stages that can be the most loaded: the first, the last, and the first and last of each run of equal
    layer counts (along a run the microbatches in flight fall and a zero-bubble schedule's weight-gradient
    stash grows, each linearly: the most is at one of its ends)."""
    out = {0, len(stages) - 1}
    for i in range(1, len(stages)):
        if stages[i] != stages[i - 1]:
            out |= {i - 1, i}
    return sorted(out)


def stage_params(model: ModelShape, c: Layout, which: list | None = None) -> list:
    """[(dense parameters, expert parameters)] held by one device of each pipeline stage (or of the stages
    ``which``), before ZeRO."""
    if model.bare:
        return [(model.params() / (c.tp * c.pp), 0.0)]
    h, t = model.hidden, c.tp
    dense, experts = _per_layer_params(model, c)
    stages = c.stage_layers(model.layers)
    out = []
    for i in range(len(stages)) if which is None else which:
        n = stages[i]
        d = n * dense
        if i == 0:
            d += model.vocab * h / t + ((model.seq + model.extra_positions) * h if model.position == "learned" else 0)
        if i == (0 if c.v_shaped else len(stages) - 1):
            d += model.norm_params()
            if c.pp > 1 and not c.v_shaped or not model.tied:  # a V's rank 0 holds both ends: one copy
                d += model.vocab * h / t
        out.append((d, n * experts))
    return out


def params_on_device(model: ModelShape, c: Layout) -> float:
    """Parameters held by the most loaded device, before ZeRO.

    For the 2021 GPT exactly what Megatron's layout puts there (and ``netmorph train`` measures):
    per layer the column-parallel weights and biases and the row-parallel weights divided by t, the
    row-parallel biases and the two LayerNorms whole (6h); the vocab-parallel word embedding V·h/t and
    the positions s·h; with one stage also the final LayerNorm (2h)."""
    which = None if model.bare else _candidates(c.stage_layers(model.layers))
    return max(d + e for d, e in stage_params(model, c, which))


def activation_bytes_per_layer(model: ModelShape, c: Layout, recompute: str | None = None) -> float:
    """One layer's stored activations for one microbatch on one device (the terms above)."""
    rc = c.knobs.recompute if recompute is None else recompute
    s, b, h, a, t = model.seq, c.batch.micro_batch_size, model.hidden, model.heads, c.tp
    sb = s * b / c.cp
    sp = c.knobs.sequence_parallel and t > 1
    if rc == "full":
        return 2 * sb * h / (t if sp else 1)
    lin = 1 if c.precision.name == "fp8" else 2  # bytes of a stored linear-layer input
    k = model.active_experts * (model.capacity_factor if model.experts else 1.0)  # MLP rows per token
    masks = 2 * h if model.dropout else 0
    replicated = 4 * h + lin * h + lin * h * k + masks

    def mlp_bytes(f):
        return (2 * 2 if model.ffn_type == "swiglu" else 2) * f + lin * f

    kw, vw = model.kv_widths
    shared = model.shared_experts * mlp_bytes(model.shared_width) if model.experts else 0
    split = 2 * model.q_width + 2 * (kw + vw) + lin * model.o_width + k * mlp_bytes(model.ef) + shared
    if rc == "none":
        split += (5 if model.dropout else 4) * a * s if model.attention == "standard" else 4 * a
    return sb * (replicated / t + split / t if sp else replicated + split / t)


def wgrad_stash_elements(model: ModelShape, c: Layout) -> tuple[float, float]:
    """(linear inputs, output gradients): the elements one layer's weight-gradient GEMMs keep for one microbatch
    between its B and its W on one device, what a :class:`~netmorph.models.weight_grad.WeightGradStore` holds.
    Column-parallel layers (QKV, the MLP's up-projections) keep their whole input (gathered under sequence
    parallelism) and their output gradient split by t; row-parallel ones (the attention's output projection,
    the MLP's down-projection) their input split by t and their whole output gradient. A gated MLP's two
    up-projections share their input; a mixture of experts keeps the MLP part for each of the top_k experts a
    token visits (times the capacity factor)."""
    h, t = model.hidden, c.tp
    tokens = model.seq * c.batch.micro_batch_size / c.cp
    kw, vw = model.kv_widths
    ups = 2 if model.ffn_type == "swiglu" else 1
    k = model.active_experts * (model.capacity_factor if model.experts else 1.0)

    def mlp(f, n=1.0):
        return n * (h + f / t), n * (ups * f / t + h)

    ins, grads = h + model.o_width / t, (model.q_width + kw + vw) / t + h
    for i, g in (mlp(model.ef, k), mlp(model.shared_width, model.shared_experts if model.experts else 0)):
        ins, grads = ins + i, grads + g
    return tokens * ins, tokens * grads


def _split_peak(name: str, p: int, m: int, v: int, i: int, act: float, stash: float) -> float:
    """The most rank ``i`` of a zero-bubble schedule holds as its slots run: ``act`` for each stage's worth of
    microbatches between F and B, ``stash`` for each owed its W -- the two peaks need not coincide (ZB-H1's
    stash is fullest in the drain, when few microbatches are in flight), so the schedule is walked; past 3p
    microbatches the peak no longer grows."""
    return max(a * act + b * stash for a, b in _held_and_owed(name, p, m, v, i))


@lru_cache(maxsize=4096)
def _held_and_owed(name: str, p: int, m: int, v: int, i: int) -> tuple:
    """The (in flight, owed W) pairs, in stage units, that rank ``i`` passes through and no other pair
    dominates."""
    seen = {(held / v, owed / v) for held, owed in levels(schedule(name, p, m, v)[i])}
    return tuple(x for x in seen if not any(y != x and y[0] >= x[0] and y[1] >= x[1] for y in seen))


def stage_activations(model: ModelShape, c: Layout, which: list | None = None) -> list:
    """Activation bytes of one device on each pipeline stage (or on the stages ``which``): the microbatches in
    flight, and under a zero-bubble schedule beside them the weight-gradient stash of those whose W waits
    (:func:`wgrad_stash_elements`: 16-bit, the inputs 8-bit under FP8), the most of the two together as the
    schedule runs (each alone: :meth:`Layout.in_flight`, :meth:`Layout.w_stash`)."""
    if model.bare:
        return [0.0]
    p = c.pp
    per_layer = activation_bytes_per_layer(model, c)
    ins, grads = wgrad_stash_elements(model, c) if c.pipeline_schedule in SPLIT_BACKWARD else (0.0, 0.0)
    stash = (1 if c.precision.name == "fp8" else 2) * ins + 2 * grads
    s, b, h = model.seq / c.cp, c.batch.micro_batch_size, model.hidden
    out = []
    stages = c.stage_layers(model.layers)
    head = 0 if c.v_shaped else len(stages) - 1  # a V's loss is on the first rank
    for i in range(len(stages)) if which is None else which:
        if stash:
            act = _split_peak(
                c.pipeline_schedule,
                p,
                min(c.microbatches, 3 * p),
                c.interleave,
                i,
                per_layer * stages[i],
                stash * stages[i],
            )
        else:
            act = per_layer * stages[i] * c.in_flight(i)
        if i == 0 and model.dropout:
            act += s * b * h * p / c.tp  # embedding dropout mask, p microbatches
        if i == head:
            act += 4 * s * b * model.vocab / c.tp  # fp32 logits for the cross-entropy
        out.append(act)
    return out


def activation_bytes(model: ModelShape, c: Layout) -> float:
    return max(stage_activations(model, c))


def largest_module(model: ModelShape, c: Layout) -> float:
    """The parameters of the largest single module on a device (DeepSpeed's ``largest_layer_params``: the
    biggest ``nn.Module``'s own weights -- the word embedding or the LM head, else an MLP matrix), split by tp."""
    if model.bare:
        return 0.0
    return max(model.vocab * model.hidden, model.hidden * max(model.f, model.ef)) / c.tp


def memory_parts(model: ModelShape, c: Layout) -> list:
    """[(dense parameters, expert parameters, activation bytes, largest module)] of the stages that can be the
    most loaded: what :func:`memory` weighs, apart so a search can try every ZeRO stage on one computation."""
    which = None if model.bare else _candidates(c.stage_layers(model.layers))
    big = largest_module(model, c)
    return [(d, e, a, big) for (d, e), a in zip(stage_params(model, c, which), stage_activations(model, c, which))]


def _state_bytes(c: Layout, zero: int) -> tuple[tuple, tuple, float]:
    """Bytes per parameter of (weights, gradients, optimizer state) on one device under ZeRO stage ``zero``: for
    the dense parameters (sharded over dp x cp) and for the expert parameters (over their dp x cp / ep); and the
    bytes per parameter of the largest module held live.

    ``zero_memory`` "paper" is Rajbhandari et al.'s Table 1 (2Ψ + 2Ψ + KΨ, each sharded from its stage on).
    "deepspeed" is what DeepSpeed allocates, term by term as its estimators count it
    (``estimate_zero2_model_states_mem_needs``: 4Ψ + 16Ψ/N for stages 1 and 2 -- the 16-bit weights and the
    16-bit gradients whole, the fp32 gradient partition beside the fp32 master copy and Adam's states;
    ``estimate_zero3_model_states_mem_needs``: 4·largest layer + 18Ψ/N -- the 16-bit weights sharded, the
    largest module's 16-bit weights and gradients live)."""
    shard = c.dp * c.cp
    wbytes = c.precision.param_bytes + (1 if c.precision.name == "fp8" else 0)
    deepspeed = c.knobs.zero_memory == "deepspeed"
    zero = sharding_with(zero, c.pp)  # FSDP2 with a pipeline: Layout.sharding

    def per(group):
        grads = c.precision.grad_bytes / (group if zero >= 2 else 1)
        if deepspeed and zero in (1, 2):
            grads = c.precision.param_bytes + c.precision.grad_bytes / group  # 16-bit whole + the 32-bit partition
        return (wbytes / (group if zero >= 3 else 1), grads, c.precision.optimizer_bytes / (group if zero >= 1 else 1))

    live = 2 * c.precision.param_bytes if deepspeed and zero >= 3 else 0.0
    return per(shard), per(max(shard // c.ep, 1)), live


def memory_total(c: Layout, parts: list, zero: int) -> float:
    """The most loaded device's bytes under ZeRO stage ``zero``: :func:`memory`'s total, for a search's inner
    loop."""
    dense, expert, live = _state_bytes(c, zero)
    dense, expert = sum(dense), sum(expert)
    return max(dn * dense + en * expert + act + live * big for dn, en, act, big in parts)


def memory(model: ModelShape, c: Layout) -> Memory:
    """The bytes of the most loaded device (``as_dict()``: {"params", "grads", "optimizer", "activations",
    "total"})."""
    dense, expert, live = _state_bytes(c, c.zero)
    best = None
    for dn, en, act, big in memory_parts(model, c):
        params, grads, opt = (dn * d + en * e for d, e in zip(dense, expert))
        params, grads = params + live / 2 * big, grads + live / 2 * big  # the live layer's weights, grads
        here = Memory(params, grads, opt, act)
        if best is None or here.total > best.total:
            best = here
    return best


def trainer_memory(
    model: ModelShape, layout: Layout, itemsize: int, grad_size: int | None = None, optimizer_size: int | None = None
) -> dict:
    """What the planner says the most loaded rank of netmorph's own trainer holds, in that run's element sizes:
    the model states counted from the placement table (:func:`~netmorph.mesh.placement.model_state_bytes`: each
    field's most loaded stage, the flat buffers' padding and ZeRO's shards included -- one count, the
    trainer's), and the activations of :func:`memory` with weights of ``itemsize`` bytes, gradients of
    ``grad_size`` and ``optimizer_size`` of optimizer state per parameter (default: ``itemsize``, and Adam's two
    states with no master copy; bf16 mixed precision 2, 4 and 12: TrainConfig.state_sizes); no recomputation."""
    gsz = itemsize if grad_size is None else grad_size
    osz = 2 * itemsize if optimizer_size is None else optimizer_size
    est = memory(model, layout.replace(recompute="none", param_bytes=itemsize, grad_bytes=gsz, optimizer_bytes=osz))
    return {**model_state_bytes(model, layout, itemsize, gsz, osz), "activations": est.activations}
