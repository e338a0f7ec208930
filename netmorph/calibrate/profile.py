"""A machine's profile: the planner's :class:`~netmorph.planner.hardware.Hardware` fields, measured, with the
raw measurements and the fit residuals beside them -- one JSON file that ``netmorph plan --hardware`` and
``netmorph simulate step --hardware`` read like a preset.

What maps to what:

- ``peak_flops``: the best GEMM rate one rank reached while every rank computed; ``gemm_table``: the
  efficiency (rate over that peak) by GEMM size, Calculon's bins -- small GEMMs run further from peak;
  ``gemm_efficiency``: the largest GEMMs' (the LM head's, the attention core's);
- ``hbm_bandwidth``: the elementwise pass's bytes per second per rank, every rank busy;
- ``op_overhead_s``: one operator's dispatch (a GPU's kernel launch), per rank, every rank busy, times the
  operator scale below;
- ``overlap``: the share of a ring all-reduce on a communication thread that hid behind GEMMs on the main
  thread (the trainer's DDP-style overlap), every rank at once;
- ``pipeline_hop_s``: what a pipeline send costs beyond the link's α and β because its receiver waited asleep
  (:mod:`netmorph.calibrate.relay`: GEMMs relayed along chains of ranks, every chain at once);
- ``alpha_intra`` / ``nvlink_bandwidth``: the same-node link's fitted α and 1/β, and ``collective_base_s`` the
  cost per call fitted beside them (ring all-reduces of several group sizes tell it from α); ``alpha_inter`` /
  ``nic_bandwidth``: the other node's (emulated with ``--inter-node-mbps``; the same-node link's when the
  profile has one node);
- ``optimizer_bandwidth``: the bytes per second of the trainer's own Adam step, every rank busy (a GPU's
  fused Adam streams at HBM speed; an eager one passes over its state several times);
- ``allreduce_algorithms``: ring only -- what netmorph's trainer calls (NCCL would pick a tree too); and
  ``multi_rail`` false: that one ring leaves a node on one link (NCCL would run a channel per NIC);
- ``compute_scale`` and the operator scale: two reference GPTs (:data:`~netmorph.calibrate.compute.REFERENCES`,
  no model ``validate local`` trains), forward and backward with every rank at once, calls back to back as a
  rank runs its microbatches, timed; the FLOP-and-byte part and the per-operator part of the planner's compute
  are scaled so that it gives both their measured times -- what the microbenchmarks miss when a real layer
  runs on ranks that share cores and caches (1 and 1 on a device per rank);
- ``core_sharing``: the first reference's time with every rank busy over its time on one rank, the two measured
  side by side in one launch (:func:`~netmorph.calibrate.compute.sharing_rank`; without that measurement, the
  busy phase's over the alone phase's) -- how much of a core a rank gets when all compute, and so how much faster
  the few that compute in a pipeline's bubble run;
- ``gpus_per_node``: ranks per (emulated) node; ``memory_bytes``: the machine's memory over its ranks.

Not measured yet, and said so in ``assumed``: ``elementwise_passes`` (the planner's default, fitted on the
calibration papers' A100 runs: :data:`~netmorph.planner.hardware.CALIBRATED_PASSES`) and
``attention_efficiency`` (taken as ``gemm_efficiency``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, replace

import numpy as np

from netmorph.calibrate.compute import ITEMSIZE, REFERENCE_MICROBATCH, REFERENCES
from netmorph.calibrate.relay import hop_seconds
from netmorph.mesh.layout import Batch, Layout, Precision
from netmorph.mesh.shape import ModelShape
from netmorph.planner.hardware import CALIBRATED_PASSES, PROFILE_FORMAT, Hardware
from netmorph.planner.timing import step_time

BINS = 6


def gemm_table(points) -> tuple[float, tuple]:
    """(peak FLOP/s, ((GFLOP upper bound, efficiency), ...)) from [(m, n, k, FLOP/s)]: the points sorted by
    size and cut into BINS bins of as many points each, each bin's efficiency the median of its points."""
    pts = sorted((2 * m * n * k / 1e9, r) for m, n, k, r in points)
    peak = max(r for _, r in pts)
    table = []
    for chunk in np.array_split(np.arange(len(pts)), min(BINS, len(pts))):
        bound = pts[chunk[-1]][0]
        eff = float(np.median([pts[i][1] for i in chunk])) / peak
        if table and bound <= table[-1][0]:
            continue
        table.append((bound, min(max(eff, 1e-6), 1.0)))
    return peak, tuple(table)


def reference_compute(hw: Hardware, dtype: str, shape: ModelShape) -> float:
    """Seconds the planner gives one forward and backward of a reference GPT on ``hw`` (one rank, one
    microbatch of 2): what its measured time is held against."""
    b = ITEMSIZE[dtype]
    lay = Layout(
        batch=Batch(micro_batch_size=REFERENCE_MICROBATCH, global_batch=REFERENCE_MICROBATCH),
        precision=Precision(param_bytes=b, grad_bytes=b, optimizer_bytes=2 * b, activation_bytes=b),
    )
    return step_time(shape, lay, hw).compute_s


def scales(hw: Hardware, dtype: str, measured) -> tuple[float, float]:
    """(operator scale, FLOP scale): what the microbenchmarks' per-operator cost and their FLOP and byte rates
    are multiplied by so that the planner gives the reference GPTs their measured times -- two unknowns, two
    references, one weighted by its operators and one by its FLOPs, solved exactly (least squares on the
    relative error if the two do not tell them apart, one scale for both)."""
    bare = replace(hw, op_overhead_s=0.0)
    flops = [reference_compute(bare, dtype, s) for s in REFERENCES]
    ops = [reference_compute(hw, dtype, s) - f for s, f in zip(REFERENCES, flops)]
    a = np.array([[o / t, f / t] for o, f, t in zip(ops, flops, measured)])
    try:
        k_ops, k_flops = np.linalg.solve(a, np.ones(len(measured)))
    except np.linalg.LinAlgError:
        k_ops = k_flops = -1.0
    if not (0.05 <= k_ops <= 100 and 0.05 <= k_flops <= 100):
        k = float(np.linalg.lstsq(a.sum(axis=1, keepdims=True), np.ones(len(measured)), rcond=None)[0][0])
        k_ops = k_flops = min(100.0, max(0.05, k))
    return float(k_ops), float(k_flops)


def build(
    world: int,
    dtype: str,
    backend: str,
    gpn: int,
    alone: dict,
    busy: dict,
    links: dict,
    inter_mbps: float | None,
    device=None,
    preset: Hardware | None = None,
) -> dict:
    """The profile object: ``hardware`` (the planner's fields), ``machine``, ``compute`` (alone and busy, raw),
    ``links`` (per class: sizes, one-way seconds, α, β, residuals) and ``assumed``. ``device``: the ranks' (a
    GPU's memory is the device's own; the CPU's is the machine's over its ranks). With no link measured (one
    rank: no peer), the links and the overlap are ``preset``'s, and ``assumed`` says so."""
    peak, table = gemm_table(busy["gemm"])
    alone_peak = max(r for *_, r in alone["gemm"])
    assumed = {}
    if not links:  # one rank: the links a preset gives, said so
        intra = {"alpha": preset.alpha_intra, "beta": 1 / preset.nvlink_bandwidth}
        inter = {"alpha": preset.alpha_inter, "beta": 1 / preset.nic_bandwidth}
        gpn = preset.gpus_per_node
        assumed["links"] = f"the {preset.name} preset's: one rank has no peer to measure"
        assumed["overlap"] = f"the {preset.name} preset's {preset.overlap:g}: one rank has no peer to reduce with"
        busy = {**busy, "overlap": {"overlap": preset.overlap}}
    else:
        intra = links.get("intra") or links["inter"]
        inter = links.get("inter") or intra
    where = f"{os.cpu_count()} cores"
    if device is not None and device.type == "cuda":
        import torch

        props = torch.cuda.get_device_properties(device)
        memory, where = float(props.total_memory) * world, f"{props.name} GPUs"
    else:
        try:
            memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            memory = 8 << 30
    hw = Hardware(
        name=f"local-{world}x-{dtype}",
        peak_flops=peak,
        memory_bytes=float(memory) / world,
        hbm_bandwidth=busy["elementwise_bytes_per_s"],
        gpus_per_node=gpn,
        nvlink_bandwidth=1 / intra["beta"],
        nic_bandwidth=1 / inter["beta"],
        alpha_intra=intra["alpha"],
        alpha_inter=inter["alpha"],
        collective_base_s=intra.get("base", 0.0),
        gemm_efficiency=table[-1][1],
        attention_efficiency=table[-1][1],
        gemm_table=table,
        op_overhead_s=busy["op_s"],
        overlap=busy["overlap"]["overlap"],
        allreduce_algorithms=("ring",),
        multi_rail=False,
        optimizer_bandwidth=busy["optimizer_bytes_per_s"],
        description=f"measured by netmorph calibrate: {world} {backend} ranks on {where}, {dtype}"
        + (f", two nodes at {inter_mbps:g} MB/s" if inter_mbps else ""),
    )
    k_ops, k_flops = scales(hw, dtype, busy["reference_s"])
    side = busy.get("sharing")
    sharing = side["busy_s"] / side["alone_s"] if side else busy["reference_s"][0] / alone["reference_s"][0]
    hw = replace(
        hw, op_overhead_s=hw.op_overhead_s * k_ops, compute_scale=k_flops, core_sharing=min(1e4, max(1.0, sharing))
    )
    if busy.get("relay"):
        link = hw.alpha_intra + busy["relay"][0]["nbytes"] / hw.nvlink_bandwidth
        hw = replace(hw, pipeline_hop_s=min(1.0, hop_seconds(busy["relay"], link, hw.core_sharing)))
    return {
        "format": PROFILE_FORMAT,
        "hardware": {
            k: (list(map(list, v)) if k.endswith("_table") else list(v) if isinstance(v, tuple) else v)
            for k, v in asdict(hw).items()
            if v != ()
        },  # no FP8 table: absent, as in a hand-written file
        "machine": {
            "cores": os.cpu_count(),
            "ranks": world,
            "ranks_per_node": gpn,
            "dtype": dtype,
            "device": "cpu" if device is None else str(device.type),
            "backend": backend,
            "threads_per_rank": 1,
            "inter_node_mbps": inter_mbps,
        },
        "compute": {
            "alone": alone,
            "busy": busy,
            # what sharing the cores costs one rank: its best GEMM rate alone over with everyone busy
            "sharing_slowdown": alone_peak / peak,
            "elementwise_slowdown": alone["elementwise_bytes_per_s"] / busy["elementwise_bytes_per_s"],
            # the reference GPTs timed (reference_s) and what their times made of the rates measured
            "references": [
                {
                    "layers": r.layers,
                    "hidden": r.hidden,
                    "heads": r.heads,
                    "seq": r.seq,
                    "vocab": r.vocab,
                    "micro_batch": REFERENCE_MICROBATCH,
                }
                for r in REFERENCES
            ],
            "operator_scale": k_ops,
            "op_s_measured": busy["op_s"],
        },
        "links": links,
        "assumed": {
            "elementwise_passes": f"the planner's {CALIBRATED_PASSES:g} (fitted on the calibration "
            "papers' A100 runs), not measured",
            "attention_efficiency": "gemm_efficiency, not measured",
            **assumed,
        },
    }
