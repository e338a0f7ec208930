"""A machine's profile: the planner's :class:`~netmorph.planner.hardware.Hardware` fields, measured, with the
raw measurements and the fit residuals beside them -- one JSON file that ``netmorph plan --hardware`` and
``netmorph simulate step --hardware`` read like a preset.

What maps to what:

- ``peak_flops``: the best GEMM rate one rank reached while every rank computed; ``gemm_table``: the
  efficiency (rate over that peak) by GEMM size, Calculon's bins -- small GEMMs run further from peak;
  ``gemm_efficiency``: the largest GEMMs' (the LM head's, the attention core's);
- ``hbm_bandwidth``: the elementwise pass's bytes per second per rank, every rank busy;
- ``op_overhead_s``: one operator's dispatch (a GPU's kernel launch), per rank, every rank busy;
- ``overlap``: the share of a ring all-reduce on a communication thread that hid behind GEMMs on the main
  thread (the trainer's DDP-style overlap), every rank at once;
- ``alpha_intra`` / ``nvlink_bandwidth``: the same-node link's fitted α and 1/β; ``alpha_inter`` /
  ``nic_bandwidth``: the other node's (emulated with ``--inter-node-mbps``; the same-node link's when the
  profile has one node);
- ``gpus_per_node``: ranks per (emulated) node; ``memory_bytes``: the machine's memory over its ranks.

Not measured yet, and said so in ``assumed``: ``elementwise_passes`` (the planner's 6) and
``attention_efficiency`` (taken as ``gemm_efficiency``).
"""

from __future__ import annotations

import os
from dataclasses import asdict

import numpy as np

from netmorph.planner.hardware import PROFILE_FORMAT, Hardware

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


def build(world: int, dtype: str, backend: str, gpn: int, alone: dict, busy: dict, links: dict,
          inter_mbps: float | None) -> dict:
    """The profile object: ``hardware`` (the planner's fields), ``machine``, ``compute`` (alone and busy, raw),
    ``links`` (per class: sizes, one-way seconds, α, β, residuals) and ``assumed``."""
    peak, table = gemm_table(busy["gemm"])
    alone_peak = max(r for *_, r in alone["gemm"])
    intra = links.get("intra") or links["inter"]
    inter = links.get("inter") or intra
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        memory = 8 << 30
    hw = Hardware(name=f"local-{world}x-{dtype}", peak_flops=peak, memory_bytes=float(memory) / world,
                  hbm_bandwidth=busy["elementwise_bytes_per_s"], gpus_per_node=gpn,
                  nvlink_bandwidth=1 / intra["beta"], nic_bandwidth=1 / inter["beta"],
                  alpha_intra=intra["alpha"], alpha_inter=inter["alpha"], gemm_efficiency=table[-1][1],
                  attention_efficiency=table[-1][1], gemm_table=table, op_overhead_s=busy["op_s"],
                  overlap=busy["overlap"]["overlap"],
                  description=f"measured by netmorph calibrate: {world} {backend} ranks on {os.cpu_count()} "
                              f"cores, {dtype}" + (f", two nodes at {inter_mbps:g} MB/s" if inter_mbps else ""))
    return {
        "format": PROFILE_FORMAT,
        "hardware": {k: (list(map(list, v)) if k.endswith("_table") else v) for k, v in asdict(hw).items()
                     if v != ()},                         # no FP8 table: absent, as in a hand-written file
        "machine": {"cores": os.cpu_count(), "ranks": world, "ranks_per_node": gpn, "dtype": dtype,
                    "backend": backend, "threads_per_rank": 1, "inter_node_mbps": inter_mbps},
        "compute": {"alone": alone, "busy": busy,
                    # what sharing the cores costs one rank: its best GEMM rate alone over with everyone busy
                    "sharing_slowdown": alone_peak / peak,
                    "elementwise_slowdown": alone["elementwise_bytes_per_s"] / busy["elementwise_bytes_per_s"]},
        "links": links,
        "assumed": {"elementwise_passes": "the planner's 6, not measured",
                    "attention_efficiency": "gemm_efficiency, not measured"},
    }
