"""One whole PTD-P training step played on every rank: ASTRA-sim's and SimAI's job, at laptop scale.

Every rank's program for one iteration is the pipeline schedule of
:mod:`netmorph.parallel.pipeline` (GPipe, 1F1B or interleaved 1F1B -- the very slots the
trainer runs) expanded layer by layer:

- a forward slot runs each layer's compute in two halves, each ended by a
  tensor-parallel all-reduce (Megatron's g after attention and after the MLP) that
  waits for the whole TP group; a backward slot does the same in reverse (two more
  all-reduces per layer under full recomputation); the last virtual stage adds the LM
  head and the loss;
- a slot's output (b·s·h/t activations forward, the same gradients backward: the
  scatter/gather optimisation) is sent to the neighbouring stage; a slot starts when
  its rank is free and its input has arrived;
- data-parallel gradient reduction: one bucket per layer, launched as the last
  microbatch's backward finishes the layer (Megatron's ``overlap_grad_reduce``) with
  ``dp_overlap``, else all after the last backward; ZeRO-1/2 reduce-scatter the
  gradients and all-gather the updated weights after the optimizer step;
- a rank's pipeline sends queue on its send port (as in :mod:`netmorph.cost.simulate`);
  the data-parallel buckets run in order on their own communicator; a send that
  leaves the node while a bucket is on the rank's NIC shares the NIC's bandwidth
  fairly with it (both at half rate while they overlap) -- the contention an
  analytic formula does not see.

Costs come from the planner's models, so the comparison with its analytic estimate
is like for like: compute from the same FLOP and memory-traffic counts
(:mod:`netmorph.planner.timing`), every collective from the collectives' schedules
simulated on the hardware's two-level topology with the group placed as the mesh
places it (tp innermost, then dp, then pp). The ranks of one pipeline stage run the
same slots, so the simulator advances them together as numpy arrays of shape (dp, tp):
every rank's spans are simulated and counted, in O(slots x layers) numpy operations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from netmorph.cost.topology import node_of
from netmorph.errors import UsageError
from netmorph.mesh.grid import Mesh
from netmorph.mesh.layout import Layout
from netmorph.mesh.schedules import V_SHAPED, schedule, stage_of


@dataclass
class Costs:
    """Seconds per microbatch on one rank (the compute of one layer, one all-reduce, ...)."""

    fwd_layer: float
    bwd_layer: float
    fwd_logits: float = 0.0
    bwd_logits: float = 0.0
    tp_allreduce: float = 0.0
    tp_per_fwd: int = 2  # TP all-reduces per layer forward (0 with tp = 1)
    tp_per_bwd: int = 2
    cp_fwd: float = 0.0  # a layer's exposed context-parallel exchange, forward (ring hops past the core,
    cp_bwd: float = 0.0  # an all-gather or Ulysses' all-to-alls) and backward
    cp_bytes: tuple = (0.0, 0.0)  # what a rank sends for them per layer, forward and backward
    wgrad_layer: float = 0.0  # of bwd_layer, the weight gradients' GEMMs: a zero-bubble schedule's W slot
    tp_head_fwd: float = 0.0  # the vocabulary-parallel cross-entropy's all-reduces (last stage, forward)
    tp_head_bwd: float = 0.0  # the logits' input gradient all-reduced (last stage, backward)
    tp_embedding: float = 0.0  # VocabParallelEmbedding's output all-reduced (first stage, forward)
    tp_head_bytes: tuple = (0.0, 0.0, 0.0)  # what a rank sends for those three (embedding, head fwd, head bwd)
    p2p_bytes: float = 0.0  # one activation (or its gradient) crossing a stage boundary
    dp_layer: float = 0.0  # one layer's gradient reduction on the DP group
    dp_embedding: float = 0.0  # the embedding's, on the first and the last stage
    dp_after: float = 0.0  # after the optimizer: ZeRO-1/2's all-gather of the weights
    dp_after_exposed: float = -1.0  # what of it the next forward does not hide (--overlap-param-gather, by the
    # planner's bucket mechanics: the next step is not played); < 0: all of it
    dp_overlap: bool = False
    dp_rounds: int = 1  # gradient reductions a step: 1, or every microbatch's (Llama 3's ZeRO-2 + pp)
    comm_slowdown: float = 0.0  # compute slows by this share of the DP time that ran beside it
    optimizer: float = 0.0
    alpha_intra: float = 0.0
    alpha_inter: float = 0.0
    pipeline_hop: float = 0.0  # a stage-to-stage send's cost beyond the link's (Hardware.pipeline_hop_s)
    bw_intra: float = math.inf  # B/s
    bw_inter: float = math.inf
    gpus_per_node: int = 8
    tp_bytes_sent: float = 0.0  # per rank per all-reduce (ring), for the link-class ledger
    dp_bytes_layer: float = 0.0  # per rank per layer bucket (ring)
    dp_bytes_embedding: float = 0.0
    dp_bytes_after: float = 0.0


@dataclass
class StepResult:
    step_time: float
    finish: np.ndarray  # (pp, dp, tp) seconds
    breakdown: dict  # of the rank that finishes last: compute, tp, cp, pp, dp, bubble, optimizer
    bytes_by_link_class: dict
    events: int
    ranks: int
    spans: list = field(default_factory=list)  # (rank, name, category, start, end) for the traced ranks


def simulate_step(
    layout: Layout, layers: int, costs: Costs, schedule_name: str | None = None, trace_ranks=()
) -> StepResult:
    """Play one iteration of ``layout`` (its tp, cp, pp, dp, microbatches and interleave; ``schedule_name``, or the
    layout's pipeline schedule) on all tp·cp·pp·dp ranks. ``trace_ranks``: global ranks whose spans to keep. The cp
    ranks of a (tp, pp, dp) coordinate run one program on the same clock (their exchanges are symmetric): the
    ranks of cp coordinate 0 are played, and stand for the others."""
    schedule_name = schedule_name or layout.pipeline_schedule
    if schedule_name in V_SHAPED and not layout.v_shaped:  # the V's placement and its two chunks
        layout = layout.replace(schedule=schedule_name)
    tp, pp, dp, v, m, cp = layout.tp, layout.pp, layout.dp, layout.interleave, layout.microbatches, layout.cp
    stages = pp * v
    if layers % stages:
        raise UsageError(
            f"the step simulator plays equal stages: pp x interleave = {stages} does not divide the "
            f"{layers} layers; change {{pp}} or {{interleave}} (`netmorph plan estimate` prices uneven "
            f"stages)",
            "pp",
        )
    per_chunk = layers // stages
    slots = schedule(schedule_name, pp, m, v)
    shape = (dp, tp)
    mesh = Mesh(tp * cp * dp * pp, tp=tp, pp=pp, dp=dp, cp=cp)
    grid = mesh.grid.reshape(pp, dp, cp, tp)  # the mesh's order: tp innermost, cp, dp, pp
    device = list(grid[:, :, 0, :])
    node = [node_of(d, costs.gpus_per_node) for d in device]
    traced = {int(g): tuple(mesh.coords(int(g))[k] for k in ("pp", "dp", "tp")) for g in trace_ranks}
    by_stage = {}
    for g, (r, a, b) in traced.items():
        by_stage.setdefault(r, []).append((g, a, b))
    spans = []

    free = [np.zeros(shape) for _ in range(pp)]
    nic = [np.zeros(shape) for _ in range(pp)]  # the pipeline send port: free from then on
    dpq = [np.zeros(shape) for _ in range(pp)]  # the DP stream: when its last bucket finishes
    acc = {k: [np.zeros(shape) for _ in range(pp)] for k in ("compute", "tp", "cp", "pp", "dp")}
    inbox: dict = {}
    nvlink = nic_bytes = 0.0
    events = 0
    pos = [0] * pp
    split = any(s.kind == "W" for row in slots for s in row)  # zero bubble: B and W apart, buckets after W
    last_b = [{} for _ in range(pp)]  # chunk -> index of its last slot that ends a backward
    for r in range(pp):
        for k, s in enumerate(slots[r]):
            if s.kind == ("W" if split else "B"):
                last_b[r][s.chunk] = k

    def record(r, name, cat, t0, t1):
        for g, a, b in by_stage.get(r, ()):
            spans.append((g, name, cat, float(t0[a, b]), float(t1[a, b])))

    def count_tp(nbytes):
        nonlocal nvlink, nic_bytes
        nic_bytes += nbytes * tp_nic
        nvlink += nbytes * (1 - tp_nic)

    def tp_collective(r, t, seconds, nbytes, name):
        """The TP group's lanes wait for their last, then run one collective of ``seconds``, each lane sending
        ``nbytes``."""
        nonlocal events
        t2 = np.repeat(t.max(axis=1, keepdims=True), tp, axis=1) + seconds
        record(r, name, "tp", t, t2)
        acc["tp"][r] += t2 - t
        events += t.size
        count_tp(nbytes * t.size)
        return t2

    def cp_exchange(r, t, seconds, nbytes):
        """One layer's context-parallel exchange: the same seconds on every cp rank, nothing to wait for."""
        nonlocal nvlink, nic_bytes
        if seconds > 0:  # ring hops wholly behind the attention core leave no span
            record(r, "cp exchange", "cp", t, t + seconds)
            acc["cp"][r] += seconds
        nic_bytes += nbytes * t.size * cp_nic
        nvlink += nbytes * t.size * (1 - cp_nic)
        return t + seconds

    def layer_pass(r, t, compute, n_ar, name, count=1, cp_s=0.0, cp_bytes=0.0):
        """``count`` layers' compute, each in ``n_ar`` parts ended by a TP all-reduce (none: one part, no
        collective), and after its first part (the attention) ``cp_s`` of context-parallel exchange. On a stage
        nobody traces, the parts after the first are added in one step: the first all-reduce leaves every lane
        of a TP group at the same time, so each later part adds exactly its compute and its all-reduce (the
        same events, bytes and busy times as playing them one by one)."""
        nonlocal events
        parts, part = max(n_ar, 1) * count, compute / max(n_ar, 1)
        if r in by_stage or parts == 1:
            for i in range(parts):
                t1 = t + part
                record(r, name, "compute", t, t1)
                acc["compute"][r] += part
                events += t.size
                if (cp_s or cp_bytes) and i % max(n_ar, 1) == 0:  # hidden or not, its bytes go
                    t1 = cp_exchange(r, t1, cp_s, cp_bytes)
                t = tp_collective(r, t1, costs.tp_allreduce, costs.tp_bytes_sent, "tp all-reduce") if n_ar else t1
            return t
        if cp_s or cp_bytes:  # every lane the same: the exchanges shift the pass, waiting for no one
            t = cp_exchange(r, t, cp_s * count, cp_bytes * count)
        acc["compute"][r] += part * parts
        events += t.size * parts
        if not n_ar:
            return t + part * parts
        t = tp_collective(r, t + part, costs.tp_allreduce, costs.tp_bytes_sent, "tp all-reduce")
        rest = parts - 1
        acc["tp"][r] += costs.tp_allreduce * rest
        events += t.size * rest
        count_tp(costs.tp_bytes_sent * t.size * rest)
        return t + (part + costs.tp_allreduce) * rest

    links = {}  # (stage, next stage) -> which lanes leave the node, ...

    def send(r, t_ready, dst_stage):
        """Stage r's lanes send one activation to ``dst_stage``: (arrival, transfer seconds). Sends queue
        on the rank's send port; a send that leaves the node while a DP bucket is on the NIC shares its
        bandwidth fairly with it (both progress at half rate while they overlap)."""
        nonlocal nvlink, nic_bytes, events
        events += t_ready.size
        link = links.get((r, dst_stage))
        if link is None:
            inter = node[r] != node[dst_stage]
            x = np.where(inter, costs.p2p_bytes / costs.bw_inter, costs.p2p_bytes / costs.bw_intra)
            link = links[r, dst_stage] = (
                inter,
                x,
                np.where(inter, costs.alpha_inter, costs.alpha_intra) + x + costs.pipeline_hop,
                int(inter.sum()),
            )
        inter, x, base, n_inter = link
        start = np.maximum(t_ready, nic[r])
        if n_inter:
            shared = np.where(inter, np.minimum(x, np.maximum(dpq[r] - start, 0.0) / 2), 0.0)
            dur = base + shared
            dpq[r] = np.where(dpq[r] > start, dpq[r] + shared, dpq[r])  # the bucket lost that much bandwidth
        else:
            dur = base
        nic[r] = start + dur
        nic_bytes += costs.p2p_bytes * n_inter
        nvlink += costs.p2p_bytes * (inter.size - n_inter)
        record(r, f"send to stage {dst_stage}", "pp", start, start + dur)
        return start + dur, dur

    def hand(r, t_ready, vs):
        """What virtual stage ``vs`` receives from stage r: a send, or in a V's bottom (vs on r itself) the
        tensor at once, nothing on a wire."""
        dst = layout.stage_rank(vs)
        return send(r, t_ready, dst) if dst != r else (t_ready, np.zeros_like(t_ready))

    def dp_bucket(r, t_ready, seconds, nbytes):
        nonlocal events
        if dp * cp == 1 or seconds <= 0:
            return
        events += t_ready.size
        start = np.maximum(t_ready, dpq[r])  # buckets in order, on their own communicator
        dpq[r] = start + seconds
        acc["dp"][r] += seconds
        _count_dp(nbytes * t_ready.size)
        record(r, "dp bucket", "dp", start, dpq[r])

    dp_nic = _ring_inter_fraction(np.sort(grid[0, :, :, 0].reshape(-1)), costs.gpus_per_node) if dp * cp > 1 else 0.0
    cp_nic = _ring_inter_fraction(grid[0, 0, :, 0], costs.gpus_per_node) if cp > 1 else 0.0
    tp_nic = _ring_inter_fraction(device[0][0, :], costs.gpus_per_node) if tp > 1 else 0.0

    def _count_dp(nbytes):
        nonlocal nvlink, nic_bytes
        nic_bytes += nbytes * dp_nic
        nvlink += nbytes * (1 - dp_nic)

    done = 0
    total = sum(len(s) for s in slots)
    while done < total:
        progressed = False
        for r in range(pp):
            while pos[r] < len(slots[r]):
                s = slots[r][pos[r]]
                vs = stage_of(r, s.chunk, pp, layout.v_shaped)
                key = (s.kind, vs, s.microbatch)
                local = (s.kind == "F" and vs == 0) or (s.kind == "B" and vs == stages - 1) or s.kind == "W"
                if not local and key not in inbox:
                    break
                t = free[r]
                if not local:
                    arrival, dur = inbox.pop(key)
                    wait = np.maximum(arrival - t, 0.0)
                    acc["pp"][r] += np.minimum(wait, dur)  # the rest of the wait is the bubble
                    t = np.maximum(t, arrival)
                t_slot = t
                if s.kind == "F":
                    if vs == 0 and costs.tp_embedding:
                        t = tp_collective(r, t, costs.tp_embedding, costs.tp_head_bytes[0], "tp embedding all-reduce")
                    t = layer_pass(
                        r,
                        t,
                        costs.fwd_layer,
                        costs.tp_per_fwd if tp > 1 else 0,
                        f"F{s.microbatch}",
                        per_chunk,
                        costs.cp_fwd,
                        costs.cp_bytes[0],
                    )
                    if vs == stages - 1 and costs.fwd_logits:
                        t = layer_pass(r, t, costs.fwd_logits, 0, f"F{s.microbatch} logits")
                        if costs.tp_head_fwd:
                            t = tp_collective(
                                r, t, costs.tp_head_fwd, costs.tp_head_bytes[1], "tp cross-entropy all-reduces"
                            )
                    if vs < stages - 1:
                        inbox[("F", vs + 1, s.microbatch)] = hand(r, t, vs + 1)
                elif s.kind == "W":  # the weight gradients: no collective
                    if (last_b[r][s.chunk] == pos[r] or costs.dp_rounds > 1) and costs.dp_overlap:
                        for _ in range(per_chunk):
                            t = layer_pass(r, t, costs.wgrad_layer, 0, f"W{s.microbatch}")
                            dp_bucket(r, t, costs.dp_layer, costs.dp_bytes_layer)
                    else:
                        t = layer_pass(r, t, costs.wgrad_layer, 0, f"W{s.microbatch}", per_chunk)
                else:
                    if vs == stages - 1 and costs.bwd_logits:
                        t = layer_pass(r, t, costs.bwd_logits, 0, f"B{s.microbatch} logits")
                        if costs.tp_head_bwd:
                            t = tp_collective(r, t, costs.tp_head_bwd, costs.tp_head_bytes[2], "tp logits all-reduce")
                    n_bwd = costs.tp_per_bwd if tp > 1 else 0
                    bwd = costs.bwd_layer - (costs.wgrad_layer if split else 0.0)
                    if not split and (last_b[r][s.chunk] == pos[r] or costs.dp_rounds > 1) and costs.dp_overlap:
                        for _ in range(per_chunk):  # a bucket after each layer
                            t = layer_pass(r, t, bwd, n_bwd, f"B{s.microbatch}", 1, costs.cp_bwd, costs.cp_bytes[1])
                            dp_bucket(r, t, costs.dp_layer, costs.dp_bytes_layer)
                    else:
                        t = layer_pass(r, t, bwd, n_bwd, f"B{s.microbatch}", per_chunk, costs.cp_bwd, costs.cp_bytes[1])
                    if vs > 0:
                        inbox[("B", vs - 1, s.microbatch)] = hand(r, t, vs - 1)
                record(r, f"{s.kind}{s.microbatch}" + (f".{s.chunk}" if v > 1 else ""), "slot", t_slot, t)
                free[r] = t
                pos[r] += 1
                done += 1
                progressed = True
        if not progressed:
            raise RuntimeError("the pipeline schedule deadlocks: no stage can run its next slot")

    finish = np.empty((pp, dp, tp))
    parts, slowdown = {}, {}
    for r in range(pp):
        end = free[r]
        if not costs.dp_overlap:
            for _ in range(per_chunk * v * costs.dp_rounds):
                dp_bucket(r, end, costs.dp_layer, costs.dp_bytes_layer)
        first_or_last = r == 0 or (r == pp - 1 and not layout.v_shaped)  # a V: both ends on rank 0
        if first_or_last:
            dp_bucket(r, np.maximum(end, dpq[r]), costs.dp_embedding, costs.dp_bytes_embedding)
        t = np.maximum(end, dpq[r])
        dp_exposed = t - end
        hidden = acc["dp"][r] - dp_exposed  # bucket time that ran beside the backward
        t_opt = t + costs.optimizer
        record(r, "optimizer", "compute", t, t_opt)
        events += t.size
        t = t_opt
        if costs.dp_after > 0 and dp * cp > 1:
            events += t.size
            _count_dp(costs.dp_bytes_after * t.size)
            after = costs.dp_after if costs.dp_after_exposed < 0 else costs.dp_after_exposed
            record(r, "zero all-gather", "dp", t, t + after)
            dp_exposed = dp_exposed + after
            hidden = hidden + costs.dp_after - after
            t = t + after
        slowed = costs.comm_slowdown * hidden
        if costs.comm_slowdown:
            record(r, "compute slowed beside comm", "compute", t, t + slowed)
        t = t + slowed
        slowdown[r] = slowed
        finish[r] = t
        parts[r] = dp_exposed
    r, a, b = np.unravel_index(int(np.argmax(finish)), finish.shape)
    busy = {k: float(acc[k][r][a, b]) for k in acc}
    step = float(finish[r, a, b])
    breakdown = {
        "compute": busy["compute"],
        "tp": busy["tp"],
        "cp": busy["cp"],
        "pp": busy["pp"],
        "dp": float(parts[r][a, b]),
        "optimizer": costs.optimizer,
        "slowdown": float(slowdown[r][a, b]),
    }
    breakdown["bubble"] = step - sum(breakdown.values())  # waiting for the pipeline: the rest
    # the bytes of the played ranks, cp coordinate 0, stand for each of the cp coordinates'
    return StepResult(
        step, finish, breakdown, {"nvlink": nvlink * cp, "nic": nic_bytes * cp}, events, tp * cp * pp * dp, spans
    )


def _ring_inter_fraction(devices, gpus_per_node: int) -> float:
    """Fraction of a ring's hops (member i to i+1) that leave the node: that share of a ring collective's
    bytes goes over the NICs."""
    nodes = node_of(np.asarray(devices).reshape(-1), gpus_per_node)
    return float(np.mean(nodes != np.roll(nodes, -1)))
