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


def step_time(model: ModelSpec, c: ParallelConfig, hw: Hardware) -> dict:
    """Seconds per iteration and its parts."""
    t, p, d, v, b = c.tp, c.pp, c.dp, c.interleave, c.microbatch
    m = c.microbatches
    s, h = model.seq, model.hidden
    layers = math.ceil(model.layers / p)
    rate = hw.peak_flops * hw.gemm_efficiency

    fwd = model.layer_flops_fwd(b) / t
    passes = 4 if c.recompute == "full" else 3
    extra = 4 * b * s * s * h / t if c.recompute == "selective" else 0.0
    flops = layers * (passes * fwd + extra) + 3 * model.logit_flops_fwd(b) / t
    gemm = flops / rate
    traffic = activation_bytes_per_layer(model, c, recompute="none") * layers * hw.elementwise_passes
    if c.recompute == "full":
        traffic *= 4 / 3
    elementwise = traffic / hw.hbm_bandwidth

    act = b * s * h * 2                                   # one 16-bit activation, bytes
    n_tp = (6 if c.recompute == "full" else 4) * layers
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
    shard = n / (d if c.zero >= 1 else 1)
    optimizer = shard * (2 * c.optimizer_bytes + c.grad_bytes + 2 * c.param_bytes) / hw.hbm_bandwidth
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
