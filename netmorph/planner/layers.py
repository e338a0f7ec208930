"""What one transformer layer costs on one rank, and the vocabulary-parallel ends beside it.

Per layer and microbatch, under a layout's tp, cp, ep, micro-batch, knobs and precision: the GEMMs' seconds
(each GEMM's FLOPs at the efficiency its size gets, Calculon's bins), the memory-bound kernels' passes over the
activations (Korthikanti's sbh(34 + 5as/h)/t bytes), the attention core, and the tensor- and context-parallel
collectives Megatron's layer issues (its f and g all-reduces, or sequence parallelism's reduce-scatter and
all-gather; ring attention's KV exchanges or Ulysses' all-to-alls). The embedding and the LM head's
vocabulary-parallel collectives are :func:`tp_head_costs`. :func:`netmorph.planner.timing.step_time` assembles
the step from these; the step simulator plays the same per-layer costs rank by rank.
"""

from __future__ import annotations

from functools import lru_cache

from netmorph.mesh.kernels import HEAD_KERNELS, cp_kernels, layer_kernels
from netmorph.mesh.layout import Batch, Knobs, Layout, Precision
from netmorph.mesh.shape import ModelShape
from netmorph.planner.comm import collective_time, p2p_time
from netmorph.planner.hardware import Hardware
from netmorph.planner.memory import activation_bytes_per_layer


def linear_gemms(model: ModelShape, tokens: float, t: int) -> list:
    """[(FLOPs of one GEMM, how many run)] of one layer's forward on one rank for ``tokens`` tokens: QKV, the
    output projection, the MLP's up (and gate) and down projections -- per expert, on the tokens routed to
    it, for a mixture of experts -- and the router. They sum to the layer's linear FLOPs."""
    h, f = model.hidden, model.f
    out = [(2 * tokens * model.qkv_weights() / t, 1), (2 * tokens * model.out_weights() / t, 1)]
    if model.experts:
        per_expert, f = tokens * model.top_k * model.capacity_factor / model.experts, model.ef
        out += [
            (2 * per_expert * h * (model.mlp_mats - 1) * f / t, model.experts),
            (2 * per_expert * f * h / t, model.experts),
            (2 * tokens * model.router_params(), 1),
        ]
        if model.shared_experts:  # every token through each shared expert, tp-split
            fs = model.shared_width
            out += [
                (2 * tokens * h * (model.mlp_mats - 1) * fs / t, model.shared_experts),
                (2 * tokens * fs * h / t, model.shared_experts),
            ]
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
def _layer_costs(
    model: ModelShape, hw: Hardware, tp: int, cp: int, ep: int, microbatch: int, knobs: Knobs, precision: Precision
) -> dict:
    """Seconds of one layer's work per microbatch on one rank, forward and backward apart (the backward
    carries the recomputed forward under full recomputation, the attention core again under selective, and
    FlashAttention's own recompute of the scores: its backward is 2.5x its forward), the LM head's forward,
    one activation's bytes, the TP all-reduces per layer, the exposed ring-attention KV exchange (context
    parallel) and the MoE dispatch/combine all-to-alls: what the analytic step time sums and what
    :mod:`netmorph.simulate` plays slot by slot."""
    c = Layout(
        tp=tp,
        dp=ep,
        cp=cp,
        ep=ep,
        batch=Batch(micro_batch_size=microbatch, global_batch=microbatch * ep),
        knobs=knobs,
        precision=precision,
    )
    sp, regather, cp_comm, act_bytes = (
        knobs.sequence_parallel,
        knobs.sp_regather,
        knobs.cp_comm_type,
        precision.activation_bytes,
    )
    t, b, cp = c.tp, c.batch.micro_batch_size, c.cp
    s, h = model.seq, model.hidden
    # under FP8 Transformer Engine runs the linear layers' GEMMs in FP8; attention and the logits stay 16-bit
    r16 = hw.peak_flops * hw.gemm_efficiency
    flash = model.attention == "flash"
    r_core = hw.peak_flops * hw.attention_efficiency if flash else r16  # a fused kernel's own efficiency
    linear_flops = model.layer_linear_flops_fwd(b)
    if c.precision.name == "fp8":
        peak_lin, table, eff = hw.fp8_flops, hw.fp8_gemm_table, hw.fp8_efficiency
    else:
        peak_lin, table, eff = hw.peak_flops, hw.gemm_table, hw.gemm_efficiency
    lin = (
        sum(n * gemm_seconds(f, peak_lin, table, eff) for f, n in linear_gemms(model, b * s / cp, t))
        if table
        else linear_flops / (t * cp) / (peak_lin * eff)
    )
    core = (model.layer_flops_fwd(b, causal=flash) - linear_flops) / (t * cp) / r_core  # QKᵀ and attention·V
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
    k = hw.compute_scale  # 1 on a device per rank; measured where ranks share a machine's cores
    out = {
        "matmul_fwd": k * (lin + core) + launch_fwd,
        "matmul_wgrad": k * lin,  # of the backward, the weight gradients' GEMMs (ZB-H1's W)
        "matmul_bwd": k * ((3 if full else 2) * lin + core_bwd * core) + launch_bwd,
        "elementwise_fwd": k * (elem / 3 + cast_fwd),
        "elementwise_bwd": k * (elem * (1 if full else 2 / 3) + cast_bwd + (cast_fwd if full else 0.0)),
        # the head runs 3x its forward (forward, two backward GEMMs): its operators' cost spread the same way
        "logits_fwd": k * model.logit_flops_fwd(b) / (t * cp) / r16 + sum(HEAD_KERNELS) / 3 * hw.op_overhead_s,
        "activation_bytes": b * s * h * act_bytes / cp,  # one activation (16-bit: 2 bytes)
        # backward: the column-parallel layers' input-gradient all-reduces (reduce-scatters under SP), after the
        # recomputed forward's two under full recomputation; under sequence parallelism without it Megatron keeps
        # only each rank's sequence shard of the QKV and fc1 inputs and all-gathers them again for the weight
        # gradients (Korthikanti et al. 2022 sec. 4.2.2) -- two all-gathers, one all-reduce's bytes
        "tp_per_fwd": 2,
        "tp_per_bwd": 4 if full else (3 if sp and regather and t > 1 else 2),
        "cp_fwd": 0.0,
        "cp_bwd": 0.0,
        "moe_fwd": 0.0,
        "moe_bwd": 0.0,
    }
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
        fwd = 2 * one[0] + 2 * one[1]  # q and the output (h wide), k and v (h_kv)
        out["cp_fwd"] = fwd
        out["cp_bwd"] = fwd + (fwd if full else 0.0)
    elif cp > 1:
        # ring attention: cp - 1 steps, each passing one K and one V block of s/cp tokens (h_kv/t wide) to
        # the next rank while the attention core of the block in hand runs; the backward passes K, V and
        # their gradients. What the core does not cover is exposed.
        kv_block = 2 * (s / cp) * b * model.h_kv / t * 2
        hop = t if t * cp <= hw.gpus_per_node else max(t, hw.gpus_per_node)  # the ring's slowest hop
        step = p2p_time(hw, 0, hop, kv_block)
        per = core / cp  # the core's work per ring step
        out["cp_fwd"] = (cp - 1) * max(0.0, step - per)
        out["cp_bwd"] = (cp - 1) * max(0.0, 2 * step - core_bwd * per)
    if model.experts and c.ep > 1:
        # dispatch and combine: each token's hidden state to its top_k experts and back, forward and backward;
        # experts padded to their capacity send and receive the padding too
        a2a = collective_time(
            hw, "alltoall", c.ep, t * cp, b * (s / cp) * h * 2 * model.top_k * model.capacity_factor / t
        )
        # before the dispatch, how many rows each rank sends to each expert: an all-to-all of E counts (int64)
        # -- Megatron's MoEAlltoAllTokenDispatcher preprocess, the trainer's moe.counts: latency, not bytes
        counts = collective_time(hw, "alltoall", c.ep, t * cp, 8 * model.experts)
        out["moe_fwd"] = 2 * a2a + counts
        out["moe_bwd"] = 2 * a2a * (2 if full else 1)
    if model.experts and cp > 1:
        # the microbatch's routing over cp (the trainer's moe.cp): dropless (capacity factor 1 here), the tokens
        # per expert all-reduced for the load-balancing loss (Megatron's tokens_per_expert, E + 1 int64);
        # with a capacity every token's k experts and gates gathered, as the drops need the whole microbatch's
        out["moe_fwd"] += (
            collective_time(hw, "allreduce", cp, t, 8 * (model.experts + 1))
            if model.capacity_factor == 1
            else collective_time(hw, "allgather", cp, t, 2 * model.top_k * 8 * s * b)
        )
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
