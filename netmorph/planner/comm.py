"""What a collective or a send costs on a :class:`~netmorph.planner.hardware.Hardware`.

Every collective is timed by the foundation's event simulation on the hardware's two-level topology, with the
group placed as the mesh places it (tp innermost: a TP group is consecutive devices, a DP group strides by t, a
PP group by t·d). Time is linear in bytes for a fixed schedule, so each (op, group size, stride) is simulated
at two sizes once and cached as α_eff + n·β_eff: the planner's search then costs microseconds per
configuration. An operation takes the cheapest per size of the algorithms the registry marks for the planner
(an all-reduce: ring and double binary tree, as NCCL's tuner picks), or what ``Hardware.allreduce_algorithms``
names; a group larger than the simulation runs is extrapolated as the record's ``growth`` says.
"""

from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

from netmorph.collectives import REGISTRY, build, planner_algorithms
from netmorph.cost.simulate import simulate
from netmorph.cost.topology import node_of
from netmorph.planner.hardware import Hardware

SIMULATED = 64  # the largest group the event simulation runs; larger ones are extrapolated from it


@lru_cache(maxsize=4096)
def _fit(hw: Hardware, op: str, algo: str, p: int, stride: int) -> tuple[float, float]:
    """(intercept s, slope s/byte) of ``op`` on p devices 0, stride, 2·stride, ...

    Up to :data:`SIMULATED` devices, from the event simulation on the hardware's topology, with as many
    rails out of a node as the group has members there (NCCL's channels each take their own NIC), at two
    sizes (time is linear in bytes for a fixed schedule). A larger group (the data-parallel group of a
    16k-GPU run) would cost the simulation O(p²) messages, so it is extrapolated from the simulated groups of
    SIMULATED/2 and SIMULATED devices at
    the same stride: a ring's latency grows linearly in its p - 1 steps and its bandwidth term as
    (p - 1)/p; a tree's latency and its pipelined bandwidth term by what one more level of depth (log2 p)
    added between the two simulated sizes."""
    return _fit_links(hw.topology(), hw.gpus_per_node, hw.multi_rail, op, algo, p, stride)


@lru_cache(maxsize=4096)
def _fit_links(topo, gpus_per_node: int, multi_rail: bool, op: str, algo: str, p: int, stride: int):
    """:func:`_fit` by what it depends on, the links: hardware that differs only in compute (a calibration
    grid's efficiencies) shares the simulations."""
    if p > SIMULATED:
        a1, b1 = _fit_links(topo, gpus_per_node, multi_rail, op, algo, SIMULATED // 2, stride)
        a2, b2 = _fit_links(topo, gpus_per_node, multi_rail, op, algo, SIMULATED, stride)
        if REGISTRY[op][algo].growth == "log":
            steps = math.log2(p) - math.log2(SIMULATED)  # tree depth added (the two sizes differ by 1)
            return a2 + (a2 - a1) * steps, b2 + (b2 - b1) * steps
        per = (a2 - a1) / (SIMULATED - SIMULATED // 2)
        return a2 + per * (p - SIMULATED), b2 * ((p - 1) / p) / ((SIMULATED - 1) / SIMULATED)
    # NCCL runs one ring (channel) per NIC: with c members of the group on a node, the hop that leaves the
    # node is c rails wide, not one NIC (the node's total still caps it); netmorph's own ring takes one
    c = max(1, min(p, gpus_per_node // stride)) if stride < gpus_per_node and multi_rail else 1
    if c > 1:
        topo = dataclasses.replace(topo, beta_inter=topo.beta_inter / c)
    placement = [i * stride for i in range(p)]
    n1, n2 = 1 << 20, 1 << 26
    t1 = simulate(build(op, algo, p, n1 // 2, 2), topo, placement).time
    t2 = simulate(build(op, algo, p, n2 // 2, 2), topo, placement).time
    slope = (t2 - t1) / (n2 - n1)
    return max(t1 - slope * n1, 0.0), slope


def collective_time(hw: Hardware, op: str, p: int, stride: int, nbytes: float) -> float:
    """Seconds for ``op`` of nbytes (nccl-tests' convention) on a group of p with the given stride: the
    schedule's steps on the links, and once per call the hardware's ``collective_base_s``."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    algos = hw.allreduce_algorithms if op == "allreduce" and hw.allreduce_algorithms else planner_algorithms(op)
    return hw.collective_base_s + min(a + b * nbytes for a, b in (_fit(hw, op, algo, p, stride) for algo in algos))


def p2p_time(hw: Hardware, src: int, dst: int, nbytes: float) -> float:
    same = node_of(src, hw.gpus_per_node) == node_of(dst, hw.gpus_per_node)
    if same:
        return hw.alpha_intra + nbytes / hw.nvlink_bandwidth
    return hw.alpha_inter + nbytes / hw.nic_bandwidth
