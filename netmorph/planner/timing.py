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
ZeRO-3 also all-gathers the weights before every forward and backward of every
microbatch; then the optimizer step streams its state through HBM once.

Every collective is timed by the foundation's event simulation on the hardware's
two-level topology, with the group placed as the mesh places it (tp innermost: a TP
group is consecutive devices, a DP group strides by t, a PP group by t·d). Time is
linear in bytes for a fixed schedule, so each (op, group size, stride) is simulated at
two sizes once and cached as α_eff + n·β_eff: the search then costs microseconds per
configuration.
"""

from __future__ import annotations

import math
from functools import lru_cache

from netmorph.collectives import build
from netmorph.cost.simulate import simulate
from netmorph.planner.config import ParallelConfig
from netmorph.planner.hardware import Hardware
from netmorph.planner.memory import activation_bytes_per_layer, params_on_device
from netmorph.planner.model import ModelSpec

ALGOS = {"allreduce": ("ring", "double_binary_tree"), "reduce_scatter": ("ring",), "allgather": ("ring",)}


@lru_cache(maxsize=4096)
def _fit(hw: Hardware, op: str, algo: str, p: int, stride: int) -> tuple[float, float]:
    """(intercept s, slope s/byte) of ``op`` on p devices 0, stride, 2·stride, ..."""
    topo = hw.topology()
    placement = [i * stride for i in range(p)]
    n1, n2 = 1 << 20, 1 << 26
    t1 = simulate(build(op, algo, p, n1 // 2, 2), topo, placement).time
    t2 = simulate(build(op, algo, p, n2 // 2, 2), topo, placement).time
    slope = (t2 - t1) / (n2 - n1)
    return max(t1 - slope * n1, 0.0), slope


def collective_time(hw: Hardware, op: str, p: int, stride: int, nbytes: float) -> float:
    """Seconds for ``op`` of nbytes (nccl-tests' convention) on a group of p with the given stride."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    return min(a + b * nbytes for a, b in (_fit(hw, op, algo, p, stride) for algo in ALGOS[op]))


def p2p_time(hw: Hardware, src: int, dst: int, nbytes: float) -> float:
    same = src // hw.gpus_per_node == dst // hw.gpus_per_node
    if same:
        return hw.alpha_intra + nbytes / hw.nvlink_bandwidth
    return hw.alpha_inter + nbytes / hw.nic_bandwidth


def layer_costs(model: ModelSpec, c: ParallelConfig, hw: Hardware) -> dict:
    """Seconds of one layer's work per microbatch on one rank, forward and backward apart (the backward
    carries the recomputed forward under full recomputation, the attention core again under selective),
    the LM head's forward, one activation's bytes and the TP all-reduces per layer: what the analytic
    step time sums and what :mod:`netmorph.simulate` plays slot by slot."""
    t, b = c.tp, c.microbatch
    s, h = model.seq, model.hidden
    rate = hw.peak_flops * hw.gemm_efficiency
    fwd = model.layer_flops_fwd(b) / t
    full = c.recompute == "full"
    extra = 4 * b * s * s * h / t if c.recompute == "selective" else 0.0
    elem = activation_bytes_per_layer(model, c, recompute="none") * hw.elementwise_passes / hw.hbm_bandwidth
    return {"matmul_fwd": fwd / rate, "matmul_bwd": ((3 if full else 2) * fwd + extra) / rate,
            "elementwise_fwd": elem / 3, "elementwise_bwd": elem * (1 if full else 2 / 3),
            "logits_fwd": model.logit_flops_fwd(b) / t / rate,
            "activation_bytes": b * s * h * 2,                      # one 16-bit activation
            "tp_per_fwd": 2, "tp_per_bwd": 4 if full else 2}


def optimizer_time(n_params: float, c: ParallelConfig, hw: Hardware) -> float:
    """The optimizer step streams its shard's state through HBM once."""
    shard = n_params / (c.dp if c.zero >= 1 else 1)
    return shard * (2 * c.optimizer_bytes + c.grad_bytes + 2 * c.param_bytes) / hw.hbm_bandwidth


def step_time(model: ModelSpec, c: ParallelConfig, hw: Hardware) -> dict:
    """Seconds per iteration and its parts."""
    t, p, d, v = c.tp, c.pp, c.dp, c.interleave
    m = c.microbatches
    layers = math.ceil(model.layers / p)
    lc = layer_costs(model, c, hw)
    gemm = layers * (lc["matmul_fwd"] + lc["matmul_bwd"]) + 3 * lc["logits_fwd"]
    elementwise = layers * (lc["elementwise_fwd"] + lc["elementwise_bwd"])

    act = lc["activation_bytes"]
    n_tp = (lc["tp_per_fwd"] + lc["tp_per_bwd"]) * layers
    tp_comm = n_tp * collective_time(hw, "allreduce", t, 1, act) if t > 1 else 0.0

    pp_comm = 0.0
    if p > 1:
        stride = t * d
        pp_comm = 2 * v * p2p_time(hw, 0, stride, act / t)

    per_mb = gemm + elementwise + tp_comm + pp_comm
    slots = m + (p - 1) / v
    pipeline = slots * per_mb
    bubble = (p - 1) / (v * m) if m else float("inf")

    n = params_on_device(model, c)
    grad_bytes = c.grad_bytes * n
    if c.zero == 0:
        dp_comm = collective_time(hw, "allreduce", d, t, grad_bytes)
    else:
        dp_comm = (collective_time(hw, "reduce_scatter", d, t, grad_bytes)
                   + collective_time(hw, "allgather", d, t, c.param_bytes * n))
    dp_exposed = max(0.0, dp_comm - (2 / 3) * per_mb) if c.dp_overlap else dp_comm
    zero3 = 0.0
    if c.zero >= 3 and d > 1:
        zero3 = m * 2 * collective_time(hw, "allgather", d, t, c.param_bytes * n)
    optimizer = optimizer_time(n, c, hw)
    total = pipeline + dp_exposed + zero3 + optimizer
    return {
        "step_time_s": total, "bubble_fraction": bubble,
        # the parts add up: matmul + elementwise + TP + PP (m microbatches) + bubble ((p-1)/v slots) + the rest
        "compute_s": m * (gemm + elementwise), "matmul_s": m * gemm, "elementwise_s": m * elementwise,
        "bubble_s": (slots - m) * per_mb,
        "comm_s": {"tensor_parallel": m * tp_comm, "pipeline_p2p": m * pp_comm,
                   "data_parallel": dp_exposed, "zero3_gather": zero3},
        "optimizer_s": optimizer,
    }
