"""Cluster scale: one training step simulated on every rank (:mod:`netmorph.simulate.step`), its costs
taken from the planner's models (:func:`costs_for`), beside the planner's analytic estimate."""

from __future__ import annotations

import time

from netmorph.errors import UsageError
from netmorph.mesh.settings import V_SHAPED
from netmorph.planner.layers import layer_costs, tp_head_bytes, tp_head_costs
from netmorph.planner.memory import params_on_device
from netmorph.planner.search import check, estimate
from netmorph.planner.timing import bucketed, collective_time, optimizer_time, shared_slots
from netmorph.simulate.step import Costs, StepResult, simulate_step

__all__ = ["Costs", "StepResult", "check_simulated", "costs_for", "lend_bubble", "simulate_config", "simulate_step"]


def costs_for(model, c, hw) -> Costs:
    """Per-microbatch costs of one rank for configuration ``c``, from the same FLOP, memory-traffic and
    collective models the planner sums analytically (:func:`netmorph.planner.timing.step_time`)."""
    t, d = c.tp, c.dp * c.cp  # the gradients reduce over dp x cp (Megatron's group with cp)
    lc = layer_costs(model, c, hw)
    act = lc["activation_bytes"]
    layer_grads = model.layer_params() / t * c.precision.grad_bytes
    emb_grads = model.embedding_params() / t * c.precision.grad_bytes
    n = params_on_device(model, c)
    after_exposed = -1.0
    if c.sharding == 0:
        op, after = "allreduce", 0.0
        ring = 2 * (d - 1) / d
    else:
        op, ring = "reduce_scatter", (d - 1) / d
        after = collective_time(hw, "allgather", d, t, c.precision.param_bytes * n)
        if c.knobs.param_gather_overlap and c.knobs.dp_overlap:
            layers = model.layers // c.pp
            after_exposed = bucketed(after / layers, layers, lc["matmul_fwd"] + lc["elementwise_fwd"], hw.overlap)
    return Costs(
        fwd_layer=lc["matmul_fwd"] + lc["elementwise_fwd"],
        bwd_layer=lc["matmul_bwd"] + lc["elementwise_bwd"],
        fwd_logits=lc["logits_fwd"],
        bwd_logits=2 * lc["logits_fwd"],
        tp_allreduce=collective_time(hw, "allreduce", t, 1, act) if t > 1 else 0.0,
        tp_per_fwd=lc["tp_per_fwd"],
        tp_per_bwd=lc["tp_per_bwd"],
        cp_fwd=lc["cp_fwd"],
        cp_bwd=lc["cp_bwd"],
        wgrad_layer=lc["matmul_wgrad"],
        cp_bytes=cp_layer_bytes(model, c),
        **dict(
            zip(
                ("tp_embedding", "tp_head_fwd", "tp_head_bwd"),
                tp_head_costs(model, hw, t, act, c.precision.activation_bytes, c.knobs.sequence_parallel),
            )
        ),
        tp_head_bytes=tp_head_bytes(model, t, act, c.precision.activation_bytes, c.knobs.sequence_parallel),
        p2p_bytes=act / t,
        dp_layer=collective_time(hw, op, d, t, layer_grads),
        dp_embedding=collective_time(hw, op, d, t, emb_grads),
        dp_after=after,
        dp_after_exposed=after_exposed,
        dp_overlap=c.knobs.dp_overlap,
        optimizer=optimizer_time(n, c, hw),
        comm_slowdown=hw.comm_slowdown if c.knobs.dp_overlap else 0.0,
        dp_rounds=c.reduce_rounds,
        alpha_intra=hw.alpha_intra,
        alpha_inter=hw.alpha_inter,
        pipeline_hop=hw.pipeline_hop_s,
        bw_intra=hw.nvlink_bandwidth,
        bw_inter=hw.nic_bandwidth,
        gpus_per_node=hw.gpus_per_node,
        tp_bytes_sent=2 * (t - 1) / t * act,
        dp_bytes_layer=ring * layer_grads,
        dp_bytes_embedding=ring * emb_grads,
        dp_bytes_after=(d - 1) / d * c.precision.param_bytes * n if c.sharding else 0.0,
    )


def cp_layer_bytes(model, c) -> tuple:
    """(forward, backward) bytes one rank sends in one layer's context-parallel exchange, 16-bit K and V of
    ``h_kv`` per token (the planner's): ring attention passes cp - 1 K/V blocks forward and twice that back (K/V
    and their gradients), all_gather gathers (cp-1)/cp of the whole K/V and reduce-scatters its gradient,
    Ulysses sends (cp-1)/cp of q, k, v and the output each way."""
    cp = c.cp
    if cp == 1:
        return 0.0, 0.0
    tokens = c.batch.micro_batch_size * model.seq / cp / c.tp
    kv = 2 * tokens * model.h_kv * 2
    if c.knobs.cp_comm_type == "a2a":
        one = (cp - 1) / cp * (kv + 2 * tokens * model.hidden * 2)
        return one, one
    if c.knobs.cp_comm_type == "all_gather":
        return (cp - 1) * kv, (cp - 1) * kv
    return (cp - 1) * kv, 2 * (cp - 1) * kv


def lend_bubble(step: float, breakdown: dict, sharing: float, m: int = 1, p: int = 1, v: int = 1) -> tuple:
    """(step, breakdown) of the rank that finishes last once its pipeline's bubble is lent to the ranks not in
    it, as the planner lends it (:func:`netmorph.planner.timing.shared_slots`), where ranks share a node's cores
    (``sharing``: how many times slower a rank computes with every rank busy than alone; 1 on a device per
    rank, where nothing changes): its busy time (``m`` microbatches, ``p`` stages of ``v`` chunks) stretched to
    the planner's slots, the simulated bubble scaled as the planner's is. The schedule is played on a device
    per rank; the spans of the trace stay so."""
    if sharing <= 1:
        return step, breakdown
    busy = breakdown["compute"] + breakdown["tp"] + breakdown.get("cp", 0.0) + breakdown["pp"]
    pipeline = busy + breakdown["bubble"]
    ideal = m + (p - 1) / v  # the slots the played schedule's bubble stands for
    lent = max(busy, pipeline * shared_slots(m, p, v, sharing) / ideal)
    return step - pipeline + lent, {**breakdown, "bubble": lent - busy}


MAX_RANKS = 1 << 16  # every rank's events are kept: beyond this a step takes minutes and gigabytes
MAX_LAYER_PASSES = 1_000_000  # forward and backward layer passes of one rank


def check_simulated(model, c, schedule_name: str | None = None) -> None:
    """UsageError naming the field when ``c`` is beyond what the simulator plays (the planner prices it)."""
    if c.sharding >= 3:
        raise UsageError("{zero} 3 is not simulated yet (its per-layer weight all-gathers); use 0, 1 or 2", "zero")
    if c.gpus > MAX_RANKS:
        raise UsageError(f"tp x pp x dp = {c.gpus:,} ranks: at most {MAX_RANKS:,} are simulated; lower {{dp}}", "dp")
    if 2 * c.microbatches * model.layers > MAX_LAYER_PASSES:
        raise UsageError(
            f"{c.microbatches:,} microbatches x {model.layers} layers is more than a million layer passes "
            "per rank to simulate; lower {global_batch} (or raise {microbatch})",
            "global_batch",
        )
    if schedule_name and schedule_name not in ("interleaved",) + V_SHAPED and c.interleave > 1:
        raise UsageError(f"{{interleave}} {c.interleave} needs {{schedule}} interleaved", "interleave")
    if c.batch.microbatch_group:
        raise UsageError(
            "{microbatch_group}: the simulator plays the trainer's interleaved schedule, whose group "
            "is pp (Megatron's default); the planner (plan estimate) prices other groups",
            "microbatch_group",
        )


def simulate_config(model, c, hw, schedule_name: str | None = None, trace_ranks=()) -> dict:
    """Simulate one step of ``c`` on every rank; the figures ``netmorph simulate step --json`` prints."""
    check_simulated(model, c, schedule_name)
    why = check(model, c, hw)
    if why and not why.soft:
        raise UsageError(f"{why}; change {why.flag}")
    name = schedule_name or c.pipeline_schedule
    t0 = time.perf_counter()
    res = simulate_step(c, model.layers, costs_for(model, c, hw), name, trace_ranks)
    wall = time.perf_counter() - t0
    plan = estimate(model, c, hw)
    st, part = plan.step, plan.step.parts
    step, breakdown = lend_bubble(res.step_time, res.breakdown, hw.core_sharing, c.microbatches, c.pp, c.interleave)
    return {
        "ranks": res.ranks,
        "schedule": name,
        "step_time_s": step,
        "breakdown_s": breakdown,
        "bytes_by_link_class": res.bytes_by_link_class,
        "planner_step_time_s": st.step_time_s,
        "planner_breakdown_s": {
            "compute": st.compute_s,
            "tp": part.tensor_parallel,
            "cp": part.context_parallel,
            "pp": part.pipeline_p2p,
            "dp": part.data_parallel,
            "bubble": part.bubble,
            "optimizer": part.optimizer,
            "slowdown": part.overlap_slowdown,
        },
        "events": res.events,
        "sim_wall_s": wall,
        "fits": plan.fits,
        "spans": res.spans,
    }
