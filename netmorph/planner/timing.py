"""Time of one training iteration, broken down by kind.

Per microbatch and pipeline stage (the most loaded: l/p layers plus the logits):

- compute: the stage's matmul FLOPs (forward, backward = 2x forward, plus the
  recomputed forward under full recomputation or the attention core under selective)
  over ``peak x gemm_efficiency``, plus the memory-bound kernels: ``elementwise_passes``
  x the layer's activation bytes (Korthikanti's sbh(34 + 5as/h)/t) over HBM bandwidth;
- tensor parallel: 2 all-reduces forward and 2 backward per layer (2 more when the
  forward is recomputed) of b·s·h 16-bit values -- Megatron's f and g; with sequence
  parallelism each becomes a reduce-scatter + all-gather of the same bytes;
- pipeline: one activation send forward and one gradient send backward per stage
  boundary, b·s·h/t values each (the scatter/gather optimisation of Narayanan et al.),
  v times as many with the interleaved schedule.

The pipeline runs (m + (p-1)/v) microbatch slots -- 1F1B's bubble (p-1)/m, interleaved
(p-1)/(v·m). After it: the data-parallel gradient reduction (all-reduce; ZeRO 1/2:
reduce-scatter + all-gather), exposed unless overlapped with the last backward pass;
ZeRO-3 instead all-gathers the weights before every forward and backward of every
microbatch and reduce-scatters the gradients after every backward (ZeRO's 3Ψ per
microbatch); then the optimizer step streams its state through HBM once.

Every collective is timed by the foundation's event simulation on the hardware's
two-level topology (:mod:`netmorph.planner.comm`).
"""

from __future__ import annotations

import math
from functools import lru_cache

from netmorph.mesh.kernels import HEAD_KERNELS, cp_kernels, layer_kernels
from netmorph.mesh.layout import SPLIT_BACKWARD, Batch, Knobs, Layout, Precision, _stage_layers
from netmorph.mesh.shape import ModelShape
from netmorph.planner.comm import collective_time, p2p_time
from netmorph.planner.hardware import Hardware
from netmorph.planner.memory import activation_bytes_per_layer, params_on_device
from netmorph.planner.results import StepParts, StepTime
from netmorph.planner.slots import bucketed, shared_slots, zero_bubble_slots


def linear_gemms(model: ModelShape, tokens: float, t: int) -> list:
    """[(FLOPs of one GEMM, how many run)] of one layer's forward on one rank for ``tokens`` tokens: QKV, the
    output projection, the MLP's up (and gate) and down projections -- per expert, on the tokens routed to
    it, for a mixture of experts -- and the router. They sum to the layer's linear FLOPs."""
    h, f = model.hidden, model.f
    out = [(2 * tokens * model.qkv_weights() / t, 1), (2 * tokens * model.out_weights() / t, 1)]
    if model.experts:
        per_expert, f = tokens * model.top_k * model.capacity_factor / model.experts, model.ef
        out += [(2 * per_expert * h * (model.mlp_mats - 1) * f / t, model.experts),
                (2 * per_expert * f * h / t, model.experts), (2 * tokens * model.router_params(), 1)]
        if model.shared_experts:                   # every token through each shared expert, tp-split
            fs = model.shared_width
            out += [(2 * tokens * h * (model.mlp_mats - 1) * fs / t, model.shared_experts),
                    (2 * tokens * fs * h / t, model.shared_experts)]
    else:
        out += [(2 * tokens * h * (model.mlp_mats - 1) * f / t, 1), (2 * tokens * f * h / t, 1)]
    return out


def gemm_seconds(flops: float, peak: float, table: tuple, default: float) -> float:
    """One GEMM of ``flops`` at ``peak``: the efficiency of the first bin of ``table`` ((GFLOP upper bound,
    efficiency), ascending; measured by ``benchmarks/gemm_efficiency.py``) that holds it, the last bin's past
    its end, ``default`` when there is no table -- Calculon's approach: small GEMMs run further from peak."""
    if not table:
        return flops / (peak * default)
    g = flops / 1e9
    eff = next((e for bound, e in table if g <= bound), table[-1][1])
    return flops / (peak * eff)


def layer_costs(model: ModelShape, c: Layout, hw: Hardware) -> dict:
    """What one layer costs under ``c``: :func:`_layer_costs` for the fields it depends on (cached, so a search
    prices each (tp, cp, ep, microbatch, knobs, precision) once)."""
    return dict(_layer_costs(model, hw, c.tp, c.cp, c.ep, c.batch.micro_batch_size, c.knobs, c.precision))


@lru_cache(maxsize=16384)
def _layer_costs(model: ModelShape, hw: Hardware, tp: int, cp: int, ep: int, microbatch: int, knobs: Knobs,
                 precision: Precision) -> dict:
    """Seconds of one layer's work per microbatch on one rank, forward and backward apart (the backward
    carries the recomputed forward under full recomputation, the attention core again under selective, and
    FlashAttention's own recompute of the scores: its backward is 2.5x its forward), the LM head's forward,
    one activation's bytes, the TP all-reduces per layer, the exposed ring-attention KV exchange (context
    parallel) and the MoE dispatch/combine all-to-alls: what the analytic step time sums and what
    :mod:`netmorph.simulate` plays slot by slot."""
    c = Layout(tp=tp, dp=ep, cp=cp, ep=ep, batch=Batch(micro_batch_size=microbatch, global_batch=microbatch * ep),
               knobs=knobs, precision=precision)
    sp, regather, cp_comm, act_bytes = knobs.sequence_parallel, knobs.sp_regather, knobs.cp_comm_type, \
        precision.activation_bytes
    t, b, cp = c.tp, c.batch.micro_batch_size, c.cp
    s, h = model.seq, model.hidden
    # under FP8 Transformer Engine runs the linear layers' GEMMs in FP8; attention and the logits stay 16-bit
    r16 = hw.peak_flops * hw.gemm_efficiency
    flash = model.attention == "flash"
    r_core = hw.peak_flops * hw.attention_efficiency if flash else r16     # a fused kernel's own efficiency
    linear_flops = model.layer_linear_flops_fwd(b)
    if c.precision.name == "fp8":
        peak_lin, table, eff = hw.fp8_flops, hw.fp8_gemm_table, hw.fp8_efficiency
    else:
        peak_lin, table, eff = hw.peak_flops, hw.gemm_table, hw.gemm_efficiency
    lin = (sum(n * gemm_seconds(f, peak_lin, table, eff) for f, n in linear_gemms(model, b * s / cp, t))
           if table else linear_flops / (t * cp) / (peak_lin * eff))
    core = (model.layer_flops_fwd(b, causal=flash) - linear_flops) / (t * cp) / r_core   # QKᵀ and attention·V
    full = c.knobs.recompute == "full"
    core_bwd = (2.5 if flash else 2.0) + (1.0 if full or (c.knobs.recompute == "selective" and not flash) else 0.0)
    elem = activation_bytes_per_layer(model, c, recompute="none") * hw.elementwise_passes / hw.hbm_bandwidth
    cast_fwd = cast_bwd = 0.0
    if c.precision.name == "fp8":
        # Transformer Engine casts each linear layer's input to FP8 in the forward (read 2 B, write 1 B per
        # element: QKV, output projection, fc1, fc2 inputs) and each output gradient in the backward
        tokens = b * s / (t * cp)
        h_, f_ = model.hidden, model.f * model.active_experts
        cast_fwd = 3 * tokens * (3 * h_ + f_) / hw.hbm_bandwidth
        cast_bwd = 3 * tokens * (3 * h_ + 2 * model.h_kv + (model.mlp_mats - 1) * f_) / hw.hbm_bandwidth
    # what every operator costs whatever its size (a kernel launch; eager PyTorch's dispatch and autograd):
    # nothing on the presets, the measured cost in a profile of netmorph's own ranks
    kf, kb = (k + x for k, x in zip(layer_kernels(model, c.ep), cp_kernels(cp, cp_comm)))
    launch_fwd, launch_bwd = kf * hw.op_overhead_s, (kb + (kf if full else 0)) * hw.op_overhead_s
    k = hw.compute_scale              # 1 on a device per rank; measured where ranks share a machine's cores
    out = {"matmul_fwd": k * (lin + core) + launch_fwd,
           "matmul_wgrad": k * lin,                 # of the backward, the weight gradients' GEMMs (ZB-H1's W)
           "matmul_bwd": k * ((3 if full else 2) * lin + core_bwd * core) + launch_bwd,
           "elementwise_fwd": k * (elem / 3 + cast_fwd),
           "elementwise_bwd": k * (elem * (1 if full else 2 / 3) + cast_bwd + (cast_fwd if full else 0.0)),
           # the head runs 3x its forward (forward, two backward GEMMs): its operators' cost spread the same way
           "logits_fwd": k * model.logit_flops_fwd(b) / (t * cp) / r16 + sum(HEAD_KERNELS) / 3 * hw.op_overhead_s,
           "activation_bytes": b * s * h * act_bytes / cp,         # one activation (16-bit: 2 bytes)
           # backward: the column-parallel layers' input-gradient all-reduces (reduce-scatters under SP), after the
           # recomputed forward's two under full recomputation; under sequence parallelism without it Megatron keeps
           # only each rank's sequence shard of the QKV and fc1 inputs and all-gathers them again for the weight
           # gradients (Korthikanti et al. 2022 sec. 4.2.2) -- two all-gathers, one all-reduce's bytes
           "tp_per_fwd": 2, "tp_per_bwd": 4 if full else (3 if sp and regather and t > 1 else 2),
           "cp_fwd": 0.0, "cp_bwd": 0.0,
           "moe_fwd": 0.0, "moe_bwd": 0.0}
    if cp > 1 and cp_comm == "all_gather":
        # Llama 3 (Dubey et al. 2024, sec. 3.3.2): every cp rank all-gathers K and V of the whole sequence before
        # its attention core and reduce-scatters their gradients after it -- "the all-gather communication latency
        # is exposed in the critical path" (K and V are small beside Q under GQA); kept for the backward, gathered
        # again only when the forward is recomputed
        kv = 2 * s * b * model.h_kv / t * 2
        gather = collective_time(hw, "allgather", cp, t, kv)
        out["cp_fwd"] = gather
        out["cp_bwd"] = collective_time(hw, "reduce_scatter", cp, t, kv) + (gather if full else 0.0)
    elif cp > 1 and cp_comm == "a2a":
        # DeepSpeed-Ulysses (Jacobs et al. 2023): all-to-alls of q, k and v (s/cp tokens, all heads -> s tokens,
        # heads/cp) before the core and of its output after it, each on the critical path; the backward runs the
        # same four on the gradients, and the forward's again when it is recomputed
        one = [collective_time(hw, "alltoall", cp, t, b * s / cp * w / t * 2) for w in (h, model.h_kv)]
        fwd = 2 * one[0] + 2 * one[1]                       # q and the output (h wide), k and v (h_kv)
        out["cp_fwd"] = fwd
        out["cp_bwd"] = fwd + (fwd if full else 0.0)
    elif cp > 1:
        # ring attention: cp - 1 steps, each passing one K and one V block of s/cp tokens (h_kv/t wide) to
        # the next rank while the attention core of the block in hand runs; the backward passes K, V and
        # their gradients. What the core does not cover is exposed.
        kv_block = 2 * (s / cp) * b * model.h_kv / t * 2
        hop = t if t * cp <= hw.gpus_per_node else max(t, hw.gpus_per_node)   # the ring's slowest hop
        step = p2p_time(hw, 0, hop, kv_block)
        per = core / cp                                         # the core's work per ring step
        out["cp_fwd"] = (cp - 1) * max(0.0, step - per)
        out["cp_bwd"] = (cp - 1) * max(0.0, 2 * step - core_bwd * per)
    if model.experts and c.ep > 1:
        # dispatch and combine: each token's hidden state to its top_k experts and back, forward and backward;
        # experts padded to their capacity send and receive the padding too
        a2a = collective_time(hw, "alltoall", c.ep, t * cp,
                              b * (s / cp) * h * 2 * model.top_k * model.capacity_factor / t)
        # before the dispatch, how many rows each rank sends to each expert: an all-to-all of E counts (int64)
        # -- Megatron's MoEAlltoAllTokenDispatcher preprocess, the trainer's moe.counts: latency, not bytes
        counts = collective_time(hw, "alltoall", c.ep, t * cp, 8 * model.experts)
        out["moe_fwd"] = 2 * a2a + counts
        out["moe_bwd"] = 2 * a2a * (2 if full else 1)
    if model.experts and cp > 1:
        # the microbatch's routing over cp (the trainer's moe.cp): dropless (capacity factor 1 here), the tokens
        # per expert all-reduced for the load-balancing loss (Megatron's tokens_per_expert, E + 1 int64);
        # with a capacity every token's k experts and gates gathered, as the drops need the whole microbatch's
        out["moe_fwd"] += (collective_time(hw, "allreduce", cp, t, 8 * (model.experts + 1))
                           if model.capacity_factor == 1 else
                           collective_time(hw, "allgather", cp, t, 2 * model.top_k * 8 * s * b))
    return out


def tp_head_costs(model: ModelShape, hw: Hardware, t: int, act: float, act_bytes: int, sp: bool = False) -> tuple:
    """(embedding, head forward, head backward) seconds of the vocabulary-parallel ends' TP collectives per
    microbatch (Megatron's ``VocabParallelEmbedding`` and ``vocab_parallel_cross_entropy``): the embedding's
    output summed over the ranks on the first stage (all-reduced; with SP reduce-scattered); on the last, the
    cross-entropy's three all-reduces over the tokens (the max, the sum of exponentials, the target's logit;
    fp32 at least), and the logits' input all-reduced in the backward (with SP all-gathered in the forward
    and reduce-scattered in the backward), counted with the backward."""
    if t <= 1:
        return 0.0, 0.0, 0.0
    head_fwd = 3 * collective_time(hw, "allreduce", t, 1, _loss_vector_bytes(model, act, act_bytes))
    if sp:
        rs, ag = collective_time(hw, "reduce_scatter", t, 1, act), collective_time(hw, "allgather", t, 1, act)
        return rs, head_fwd, ag + rs
    one = collective_time(hw, "allreduce", t, 1, act)
    return one, head_fwd, one


def tp_head_bytes(model: ModelShape, t: int, act: float, act_bytes: int, sp: bool = False) -> tuple:
    """(embedding, head forward, head backward) bytes one rank sends for the collectives
    :func:`tp_head_costs` prices, by ring: an all-reduce 2(t-1)/t of its bytes, a reduce-scatter or an
    all-gather (t-1)/t."""
    ring = (t - 1) / t
    return ((1 if sp else 2) * ring * act, 3 * 2 * ring * _loss_vector_bytes(model, act, act_bytes), 2 * ring * act)


def _loss_vector_bytes(model: ModelShape, act: float, act_bytes: int) -> float:
    """One of the vocabulary-parallel cross-entropy's all-reduced vectors: a number per token, fp32 at least."""
    return act / (model.hidden * act_bytes) * max(4, act_bytes)


def optimizer_time(n_params: float, c: Layout, hw: Hardware) -> float:
    """The optimizer step streams its shard's state once: at HBM speed (a fused Adam), or at the rate measured
    for the ranks' own optimizer (``optimizer_bandwidth``)."""
    shard = n_params / (c.dp * c.cp if c.sharding >= 1 else 1)
    p = c.precision
    return shard * (2 * p.optimizer_bytes + p.grad_bytes + 2 * p.param_bytes) / (hw.optimizer_bandwidth or
                                                                                 hw.hbm_bandwidth)


def step_time(model: ModelShape, c: Layout, hw: Hardware) -> StepTime:
    """Seconds per iteration and its parts (they sum to it)."""
    p, v, m = c.pp, c.interleave, c.microbatches
    gemm, elementwise, tp_comm, cp_comm, moe_comm, pp_comm = _microbatch(
        model, hw, c.tp, c.cp, c.pp, c.dp, c.ep, v, c.batch.micro_batch_size, c.knobs, c.precision)
    per_mb = gemm + elementwise + tp_comm + cp_comm + moe_comm + pp_comm
    if c.pipeline_schedule in SPLIT_BACKWARD and p > 1 and m:
        # the weight gradients of the slowest stage's layers fill the bubble, as the schedule played says
        held = max(_stage_layers(model.layers, p, c.knobs.first_stage_layers, c.knobs.last_stage_layers))
        w = held * _layer_costs(model, hw, c.tp, c.cp, c.ep, c.batch.micro_batch_size, c.knobs,
                                c.precision)["matmul_wgrad"]
        slots = zero_bubble_slots(m, p, per_mb, w, hw.core_sharing, c.pipeline_schedule)
        bubble = zero_bubble_slots(m, p, per_mb, w, 1.0, c.pipeline_schedule) / m - 1
    else:
        slots = shared_slots(m, p, v, hw.core_sharing)
        bubble = (p - 1) / (v * m) if m else float("inf")
    pipeline = slots * per_mb
    dp_comm, gather, optimizer = _after(model, hw, c.tp, c.cp, c.pp, c.dp, c.ep, c.sharding, c.reduce_rounds,
                                        c.knobs, c.precision)
    if gather:
        # FSDP FULL_SHARD / DeepSpeed stage 3 keep no unsharded gradient to accumulate into, so every
        # microbatch's backward reduce-scatters its gradients
        dp_comm *= m
    hidden = 0.0
    if c.knobs.dp_overlap and c.dp * c.cp > 1:
        dp_exposed, zero3, hidden = _overlapped(model, c, hw, dp_comm, gather)
    else:
        dp_exposed, zero3 = dp_comm, m * gather
    # what ran beside compute slowed it (NCCL's kernels take SMs and HBM bandwidth): Hardware.comm_slowdown
    slowdown = hw.comm_slowdown * hidden
    sp_grads = 0.0
    if c.knobs.sequence_parallel and c.tp > 1:
        # Megatron's _allreduce_layernorm_grads: under SP every TP rank holds the norms (and the row-parallel
        # biases) whole but trains them on its own tokens; their gradients, coalesced, are all-reduced once a step
        held = max(_stage_layers(model.layers, p, c.knobs.first_stage_layers, c.knobs.last_stage_layers))
        n = held * (2 * model.norm_params() + (2 * model.hidden if model.bias else 0))
        sp_grads = collective_time(hw, "allreduce", c.tp, 1, n * c.precision.grad_bytes)
    parts = StepParts(matmul=m * gemm, elementwise=m * elementwise, bubble=pipeline - m * per_mb,
                      tensor_parallel=m * tp_comm + sp_grads, context_parallel=m * cp_comm,
                      expert_parallel=m * moe_comm, pipeline_p2p=m * pp_comm, data_parallel=dp_exposed,
                      zero3_gather=zero3, optimizer=optimizer, overlap_slowdown=slowdown)
    return StepTime(pipeline + dp_exposed + zero3 + optimizer + sp_grads + slowdown, parts, bubble, hidden,
                    m * (gemm + elementwise))


def _overlapped(model: ModelShape, c: Layout, hw: Hardware, dp_comm: float, gather: float) -> tuple:
    """(data-parallel seconds exposed, ZeRO-3 gather seconds exposed, seconds that ran beside compute) with
    ``dp_overlap``, from the mechanics rather than a flag: the buckets of :func:`bucketed`, one a layer of the
    most loaded stage.

    - DDP / Megatron (ZeRO 0-2): each layer's gradient bucket is launched as the last microbatch's backward
      finishes it; the embedding's bucket comes after the last layer and is exposed; the distributed
      optimizer's parameter all-gather follows the step, exposed unless ``param_gather_overlap`` (Megatron's
      --overlap-param-gather) launches it bucket by bucket behind the next forward. With ``reduce_rounds`` > 1
      (Llama 3's sharded gradients under a pipeline) every microbatch's backward reduce-scatters its buckets:
      each round hides behind its own backward as the last does, the earlier rounds' tails behind the next
      microbatch's compute.
    - FSDP (ZeRO-3): every microbatch gathers each layer's weights one layer ahead of its forward and of its
      backward, and reduce-scatters each layer's gradients one layer behind its backward; per microbatch the
      first gather and the last reduce-scatter are exposed, and a layer whose gather (and reduce-scatter)
      outlasts its compute exposes the difference. With one microbatch there is one backward to hide behind."""
    lc = _layer_costs(model, hw, c.tp, c.cp, c.ep, c.batch.micro_batch_size, c.knobs, c.precision)
    layers = max(_stage_layers(model.layers, c.pp, c.knobs.first_stage_layers, c.knobs.last_stage_layers))
    tp_ar = collective_time(hw, "allreduce", c.tp, 1, lc["activation_bytes"]) if c.tp > 1 else 0.0
    fwd = lc["matmul_fwd"] + lc["elementwise_fwd"] + lc["tp_per_fwd"] * tp_ar
    bwd = lc["matmul_bwd"] + lc["elementwise_bwd"] + lc["tp_per_bwd"] * tp_ar
    o, m, group, t, rounds = hw.overlap, c.microbatches, c.dp * c.cp, c.tp, c.reduce_rounds
    if gather:
        g, r = gather / 2 / layers, dp_comm / m / layers
        per_mb = g + r + (layers - 1) * (max(0.0, g - o * fwd) + max(0.0, g + r - o * bwd))
        exposed = min(m * per_mb, m * gather + dp_comm)
        zero3 = min(exposed, m * gather)
        return exposed - zero3, zero3, m * gather + dp_comm - exposed
    op = "allreduce" if c.sharding == 0 else "reduce_scatter"
    on_device = params_on_device(model, c)
    if c.knobs.dp_bucket_mb:
        # buckets of a size over the flat buffer (DDP's bucket_cap_mb): as many as the gradients fill, each
        # launched once the backward has produced it -- its share of the stage's backward
        total = c.precision.grad_bytes * on_device
        n = max(1, math.ceil(total / (c.knobs.dp_bucket_mb * 2 ** 20)))
        bucket = collective_time(hw, op, group, t, total / n)
        grads = bucketed(bucket, n, bwd * layers / n, o)
        embedding = 0.0
    else:
        bucket, n = collective_time(hw, op, group, t, c.precision.grad_bytes * model.layer_params() / t), layers
        embedding = collective_time(hw, op, group, t, c.precision.grad_bytes * model.embedding_params() / t)
        grads = bucketed(bucket, layers, bwd, o) + embedding
    params = 0.0
    if c.sharding:
        params = collective_time(hw, "allgather", group, t, c.precision.param_bytes * on_device)
    total = rounds * (n * bucket + embedding)
    if rounds > 1:
        # the earlier rounds queue on the same stream behind the later microbatches' compute: what the stream
        # needs beyond the compute from the first backward to the last is exposed too
        grads = max(grads, total - o * layers * ((rounds - 1) * (fwd + bwd) + bwd))
    shown = grads + (bucketed(params / layers, layers, fwd, o) if c.knobs.param_gather_overlap else params)
    return shown, 0.0, max(0.0, total + params - shown)


@lru_cache(maxsize=65536)
def _microbatch(model: ModelShape, hw: Hardware, t: int, cp: int, p: int, d: int, ep: int, v: int, mb: int,
                knobs: Knobs, precision: Precision) -> tuple:
    """(matmul, elementwise, TP, CP, MoE, PP p2p) seconds of one microbatch on the slowest pipeline stage; with
    ``tp_overlap`` (Megatron's --tp-comm-overlap: the TP collectives split into chunks pipelined with the
    GEMMs that produce and consume them) only what the stage's linear-layer GEMMs do not cover is exposed,
    with ``pp_overlap`` (--overlap-p2p-communication) only what one layer's compute does not cover."""
    stages = _stage_layers(model.layers, p, knobs.first_stage_layers, knobs.last_stage_layers)
    lc = _layer_costs(model, hw, t, cp, ep, mb, knobs, precision)
    sp, act_bytes = knobs.sequence_parallel, precision.activation_bytes
    per_layer_gemm = lc["matmul_fwd"] + lc["matmul_bwd"]
    # the slowest stage sets the pipeline's pace: the most layers, or the last stage's with the output layer
    head = 3 * lc["logits_fwd"]
    last = (stages[-1], stages[-1] * per_layer_gemm + head)
    layers, gemm = max(last, (max(stages), max(stages) * per_layer_gemm), key=lambda x: x[1])
    elementwise = layers * (lc["elementwise_fwd"] + lc["elementwise_bwd"])
    act = lc["activation_bytes"]
    n_tp = (lc["tp_per_fwd"] + lc["tp_per_bwd"]) * layers
    tp_comm = 0.0
    if t > 1:
        embedding, head_fwd, head_bwd = tp_head_costs(model, hw, t, act, act_bytes, sp)
        tp_comm = n_tp * collective_time(hw, "allreduce", t, 1, act)
        if (layers, gemm) == last:
            tp_comm += head_fwd + head_bwd
        if p == 1:
            tp_comm += embedding    # the first stage's: with one stage, the same rank's
    cp_comm = layers * (lc["cp_fwd"] + lc["cp_bwd"])
    moe_comm = layers * (lc["moe_fwd"] + lc["moe_bwd"])
    pp_comm = 2 * v * (p2p_time(hw, 0, t * cp * d, act / t) + hw.pipeline_hop_s) if p > 1 else 0.0
    if knobs.tp_overlap:
        tp_comm = max(0.0, tp_comm - gemm)
    if knobs.pp_overlap:
        pp_comm = max(0.0, pp_comm - 2 * v * per_layer_gemm)
    return gemm, elementwise, tp_comm, cp_comm, moe_comm, pp_comm


@lru_cache(maxsize=65536)
def _after(model: ModelShape, hw: Hardware, t: int, cp: int, p: int, d: int, ep: int, zero: int, rounds: int,
           knobs: Knobs, precision: Precision) -> tuple:
    """(data-parallel gradient reduction, one microbatch's ZeRO-3 weight gathers, optimizer) seconds; ``rounds``
    reduce-scatters a step where the gradients stay sharded under a pipeline (Layout.reduce_rounds)."""
    c = Layout(tp=t, pp=p, dp=d, cp=cp, ep=ep, zero=zero, knobs=knobs, precision=precision)
    param_bytes, grad_bytes = precision.param_bytes, precision.grad_bytes
    n = params_on_device(model, c)
    group = d * cp                                   # gradients reduce over data- and context-parallel ranks
    if zero == 0:
        dp_comm = collective_time(hw, "allreduce", group, t, grad_bytes * n)
    elif zero >= 3:
        # ZeRO-3 / FSDP: the updated shard stays put -- the next forward's gather fetches it -- so the step
        # is the gradient reduce-scatter alone (ZeRO's 3Ψ: two gathers per microbatch and this)
        dp_comm = collective_time(hw, "reduce_scatter", group, t, grad_bytes * n)
    else:
        dp_comm = (rounds * collective_time(hw, "reduce_scatter", group, t, grad_bytes * n)
                   + collective_time(hw, "allgather", group, t, param_bytes * n))
    gather = 2 * collective_time(hw, "allgather", group, t, param_bytes * n) if zero >= 3 and group > 1 else 0.0
    return dp_comm, gather, optimizer_time(n, c, hw)
