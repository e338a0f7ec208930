"""The same all-reduce every way the registry holds (eight builtin), priced by the cost model: a tensor-parallel and a data-parallel placement
on one DGX A100 cluster, who wins over world size x message size on two clusters, and each schedule's rounds
and bytes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from netmorph.collectives import ALGORITHMS, build
from netmorph.cost.simulate import simulate
from netmorph.cost.topology import PRESETS
from netmorph.cost.tuner import predict


def color(name: str, op: str = "allreduce") -> str:
    """The algorithm's colour in every figure (its registry record's)."""
    from netmorph.collectives import REGISTRY

    return REGISTRY[op][name].color


def algos() -> list:
    """Every all-reduce the registry holds (one registered later is drawn too)."""
    return list(ALGORITHMS["allreduce"])


SIZES = [1 << e for e in range(10, 31)]  # 1 KiB .. 1 GiB
WORLDS = [2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256]
MAP_SIZES = [1 << e for e in range(10, 31, 2)]
GROUPS = {
    "TP group: 8 GPUs of one node (devices 0..7, NVLink)": list(range(8)),
    "DP group: GPU 0 of 8 nodes (devices 0, 8, .., 56, InfiniBand)": list(range(0, 64, 8)),
}
MAP_CLUSTERS = ("dgx-a100-cluster", "pcie-ethernet-cluster")
STEPS = len(GROUPS) + len(WORLDS) + 1


@dataclass
class Collectives:
    algos: list  # the all-reduces compared, in the registry's order
    curves: dict  # {placement label: {algorithm: predicted seconds per size of SIZES}} at p = 8
    maps: dict  # {cluster: (WORLDS x MAP_SIZES) index into algos of the fastest}
    flat: list  # each algorithm's Prediction for 8 MiB on 8 ranks of the flat topology


def winners(curves: dict) -> list:
    """The fastest algorithm at each size of ``curves`` ({algorithm: times})."""
    names = list(curves)
    stack = np.array([curves[a] for a in names])
    return [names[i] for i in stack.argmin(axis=0)]


def run(tick=lambda: None, quick: bool = False) -> Collectives:
    """The predictions the section draws (simulated: ``quick`` changes nothing)."""
    cluster = PRESETS["dgx-a100-cluster"]
    names = algos()
    curves = {}
    for label, pl in GROUPS.items():
        curves[label] = {
            a: np.array([predict("allreduce", a, 8, n, cluster, 4, pl).time for n in SIZES]) for a in names
        }
        tick()
    maps = {name: np.zeros((len(WORLDS), len(MAP_SIZES)), dtype=int) for name in MAP_CLUSTERS}
    for i, p in enumerate(WORLDS):
        for j, n in enumerate(MAP_SIZES):
            schedules = [build("allreduce", a, p, n // 4, 4) for a in names]  # one schedule, both clusters
            for name, grid in maps.items():
                grid[i, j] = int(np.argmin([simulate(s, PRESETS[name]).time for s in schedules]))
        tick()
    flat = [predict("allreduce", a, 8, 8 << 20, PRESETS["flat"], 4) for a in names]
    tick()
    return Collectives(names, curves, maps, flat)
