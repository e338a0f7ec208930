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
two-level topology (:mod:`netmorph.planner.comm`); what one layer costs is :mod:`netmorph.planner.layers`'s,
and this module assembles the step from it.
"""

from __future__ import annotations

import math
from functools import lru_cache

from netmorph.mesh.layout import SPLIT_BACKWARD, Knobs, Layout, Precision, _stage_layers
from netmorph.mesh.shape import ModelShape
from netmorph.planner.comm import collective_time, p2p_time
from netmorph.planner.hardware import Hardware
from netmorph.planner.layers import _layer_costs, tp_head_costs
from netmorph.planner.memory import params_on_device
from netmorph.planner.results import StepParts, StepTime
from netmorph.planner.slots import bucketed, shared_slots, zero_bubble_slots


def optimizer_time(n_params: float, c: Layout, hw: Hardware) -> float:
    """The optimizer step streams its shard's state once: at HBM speed (a fused Adam), or at the rate measured
    for the ranks' own optimizer (``optimizer_bandwidth``)."""
    shard = n_params / (c.dp * c.cp if c.sharding >= 1 else 1)
    p = c.precision
    return (
        shard
        * (2 * p.optimizer_bytes + p.grad_bytes + 2 * p.param_bytes)
        / (hw.optimizer_bandwidth or hw.hbm_bandwidth)
    )


def step_time(model: ModelShape, c: Layout, hw: Hardware) -> StepTime:
    """Seconds per iteration and its parts (they sum to it)."""
    p, v, m = c.pp, c.interleave, c.microbatches
    gemm, elementwise, tp_comm, cp_comm, moe_comm, pp_comm = _microbatch(
        model, hw, c.tp, c.cp, c.pp, c.dp, c.ep, v, c.batch.micro_batch_size, c.knobs, c.precision
    )
    per_mb = gemm + elementwise + tp_comm + cp_comm + moe_comm + pp_comm
    if c.pipeline_schedule in SPLIT_BACKWARD and p > 1 and m:
        # the weight gradients of the slowest stage's layers fill the bubble, as the schedule played says
        held = max(_stage_layers(model.layers, p, c.knobs.first_stage_layers, c.knobs.last_stage_layers))
        w = (
            held
            * _layer_costs(model, hw, c.tp, c.cp, c.ep, c.batch.micro_batch_size, c.knobs, c.precision)["matmul_wgrad"]
        )
        slots = zero_bubble_slots(m, p, per_mb, w, hw.core_sharing, c.pipeline_schedule)
        bubble = zero_bubble_slots(m, p, per_mb, w, 1.0, c.pipeline_schedule) / m - 1
    else:
        slots = shared_slots(m, p, v, hw.core_sharing)
        bubble = (p - 1) / (v * m) if m else float("inf")
    pipeline = slots * per_mb
    dp_comm, gather, optimizer = _after(
        model, hw, c.tp, c.cp, c.pp, c.dp, c.ep, c.sharding, c.reduce_rounds, c.knobs, c.precision
    )
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
    parts = StepParts(
        matmul=m * gemm,
        elementwise=m * elementwise,
        bubble=pipeline - m * per_mb,
        tensor_parallel=m * tp_comm + sp_grads,
        context_parallel=m * cp_comm,
        expert_parallel=m * moe_comm,
        pipeline_p2p=m * pp_comm,
        data_parallel=dp_exposed,
        zero3_gather=zero3,
        optimizer=optimizer,
        overlap_slowdown=slowdown,
    )
    return StepTime(
        pipeline + dp_exposed + zero3 + optimizer + sp_grads + slowdown, parts, bubble, hidden, m * (gemm + elementwise)
    )


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
        n = max(1, math.ceil(total / (c.knobs.dp_bucket_mb * 2**20)))
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
def _microbatch(
    model: ModelShape,
    hw: Hardware,
    t: int,
    cp: int,
    p: int,
    d: int,
    ep: int,
    v: int,
    mb: int,
    knobs: Knobs,
    precision: Precision,
) -> tuple:
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
            tp_comm += embedding  # the first stage's: with one stage, the same rank's
    cp_comm = layers * (lc["cp_fwd"] + lc["cp_bwd"])
    moe_comm = layers * (lc["moe_fwd"] + lc["moe_bwd"])
    pp_comm = 2 * v * (p2p_time(hw, 0, t * cp * d, act / t) + hw.pipeline_hop_s) if p > 1 else 0.0
    if knobs.tp_overlap:
        tp_comm = max(0.0, tp_comm - gemm)
    if knobs.pp_overlap:
        pp_comm = max(0.0, pp_comm - 2 * v * per_layer_gemm)
    return gemm, elementwise, tp_comm, cp_comm, moe_comm, pp_comm


@lru_cache(maxsize=65536)
def _after(
    model: ModelShape,
    hw: Hardware,
    t: int,
    cp: int,
    p: int,
    d: int,
    ep: int,
    zero: int,
    rounds: int,
    knobs: Knobs,
    precision: Precision,
) -> tuple:
    """(data-parallel gradient reduction, one microbatch's ZeRO-3 weight gathers, optimizer) seconds; ``rounds``
    reduce-scatters a step where the gradients stay sharded under a pipeline (Layout.reduce_rounds)."""
    c = Layout(tp=t, pp=p, dp=d, cp=cp, ep=ep, zero=zero, knobs=knobs, precision=precision)
    param_bytes, grad_bytes = precision.param_bytes, precision.grad_bytes
    n = params_on_device(model, c)
    group = d * cp  # gradients reduce over data- and context-parallel ranks
    if zero == 0:
        dp_comm = collective_time(hw, "allreduce", group, t, grad_bytes * n)
    elif zero >= 3:
        # ZeRO-3 / FSDP: the updated shard stays put -- the next forward's gather fetches it -- so the step
        # is the gradient reduce-scatter alone (ZeRO's 3Ψ: two gathers per microbatch and this)
        dp_comm = collective_time(hw, "reduce_scatter", group, t, grad_bytes * n)
    else:
        dp_comm = rounds * collective_time(hw, "reduce_scatter", group, t, grad_bytes * n) + collective_time(
            hw, "allgather", group, t, param_bytes * n
        )
    gather = 2 * collective_time(hw, "allgather", group, t, param_bytes * n) if zero >= 3 and group > 1 else 0.0
    return dp_comm, gather, optimizer_time(n, c, hw)
