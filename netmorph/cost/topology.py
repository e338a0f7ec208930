"""Modelled machines for the α-β-γ cost model (Hockney's α-β model plus a
reduction cost γ, as in Thakur, Rabenseifner & Gropp 2005, "Optimization of
Collective Communication Operations in MPICH").

A message of m bytes on a link costs ``α + m·β``; reducing m received bytes
costs ``m·γ`` at the receiver. A topology is *flat* (one α, β for every pair)
or *two-level*: ``gpus_per_node`` devices per node joined by an intra-node
fabric (NVLink/NVSwitch, α_intra, β_intra), nodes joined by a network where each
device's own NIC gives ``beta_inter`` and all devices of a node share
``node_bandwidth`` bytes/s each way (a node with one NIC for eight GPUs is where
that bites).

Presets, with their sources:

- ``flat``: α = 1 µs, β = 1 ns/B (1 GB/s), γ = 0 -- round numbers for reading formulas.
- ``local-shm``: the local shared-memory fabric of :mod:`netmorph.runtime.transport.shm`,
  roughly (Python per-message overhead ~10 µs, memory copy ~8 GB/s per core); what
  ``algo="auto"`` tunes for on real ranks. ``netmorph bench`` measures the real thing.
- ``dgx-a100`` / ``dgx-a100-cluster``: NVIDIA DGX A100 (as in Selene): 8 A100
  per node on NVSwitch, NVLink 3 at 600 GB/s bidirectional = 300 GB/s each way
  per GPU (A100 datasheet); 8 ConnectX-6 HDR InfiniBand NICs per node,
  200 Gb/s = 25 GB/s each (DGX A100 user guide), 200 GB/s per node.
  α: NCCL's per-hop latency model (``src/graph/tuning.cc`` ``hwLat``, LL128
  protocol: NVLink 1.9-2.5 µs, network 2.5-7.5 µs) -> 2 µs intra, 5 µs inter.
  γ: a reduction reads two bytes and writes one per byte of HBM2e at 2039 GB/s.
- ``dgx-h100-cluster``: DGX H100: NVLink 4 at 900 GB/s bidirectional = 450 GB/s
  each way; 8 ConnectX-7 NDR 400 Gb/s = 50 GB/s per GPU; HBM3 3.35 TB/s.
- ``pcie-ethernet-cluster``: 8 GPUs per node on PCIe Gen4 x16 (~25 GB/s each way
  per GPU, ~5 µs) and ONE 100 GbE NIC per node (12.5 GB/s shared, ~10 µs) -- the
  commodity cluster where the inter-node link is the bottleneck.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from netmorph.errors import UsageError
from netmorph.files import path_exists, read_json_object


def node_of(rank, per_node: int):
    """The node of ``rank`` (an int or a numpy array of ranks) when nodes hold ``per_node`` consecutive ranks
    (torchrun's ``--nproc-per-node``: LOCAL_RANK = rank mod per_node); one node when ``per_node`` <= 0. The one
    place netmorph decides node membership."""
    if per_node <= 0:
        return rank * 0
    return rank // per_node


@dataclass(frozen=True)
class Topology:
    """α in seconds, β and γ in seconds per byte, bandwidths in bytes per second."""

    name: str
    alpha: float  # intra-node (or every link, when flat)
    beta: float
    gamma: float = 0.0
    gpus_per_node: int = 0  # 0: flat
    alpha_inter: float = 0.0
    beta_inter: float = 0.0  # one device's own NIC
    node_bandwidth: float = 0.0  # shared by a node's devices, each way; 0: no extra limit
    nodes: int = 0  # 0: as many as the world needs
    description: str = ""

    @property
    def flat(self) -> bool:
        return self.gpus_per_node <= 0

    def check_world(self, world: int) -> None:
        if self.nodes and not self.flat and world > self.nodes * self.gpus_per_node:
            raise UsageError(
                f"{{world}} {world} exceeds the {self.nodes * self.gpus_per_node} devices of topology "
                f"{self.name!r}; pick a cluster preset (e.g. {self.name}-cluster) or a smaller world",
                "world",
            )

    def node_of(self, devices: np.ndarray) -> np.ndarray:
        return node_of(np.asarray(devices, dtype=np.int64), self.gpus_per_node)

    def with_flat(self, alpha=None, beta=None, gamma=None) -> Topology:
        """A copy with α, β, γ overridden (flat topologies only keep one link class)."""
        d = asdict(self)
        if alpha is not None:
            d["alpha"] = alpha
        if beta is not None:
            d["beta"] = beta
        if gamma is not None:
            d["gamma"] = gamma
        return Topology(**d)

    def describe(self) -> str:
        def bw(beta):
            return f"{1 / beta / 1e9:.3g} GB/s" if beta > 0 else "inf"

        if self.flat:
            return (
                f"{self.name if self.name == 'flat' else self.name + ' (flat)'}: α={self.alpha * 1e6:.3g} us, β={self.beta * 1e9:.3g} ns/B "
                f"({bw(self.beta)}), γ={self.gamma * 1e12:.3g} ps/B"
            )
        node = f", node NIC total {self.node_bandwidth / 1e9:.3g} GB/s" if self.node_bandwidth else ""
        return (
            f"{self.name} (two-level): {self.gpus_per_node} devices/node, intra α={self.alpha * 1e6:.3g} us "
            f"{bw(self.beta)}, inter α={self.alpha_inter * 1e6:.3g} us {bw(self.beta_inter)}/device{node}, "
            f"γ={self.gamma * 1e12:.3g} ps/B"
        )


_A100_GAMMA = 3 / 2039e9
_H100_GAMMA = 3 / 3350e9

PRESETS = {
    "flat": Topology(
        "flat", alpha=1e-6, beta=1e-9, gamma=0.0, description="one α, β for every link: α = 1 us, β = 1 ns/B"
    ),
    "local-shm": Topology(
        "local-shm",
        alpha=10e-6,
        beta=1 / 8e9,
        gamma=1 / 8e9,
        description="this machine's shared-memory fabric, roughly: ~10 us per message, "
        "~8 GB/s copy and reduce per core (used by algo='auto' on real ranks)",
    ),
    "dgx-a100": Topology(
        "dgx-a100",
        alpha=2e-6,
        beta=1 / 300e9,
        gamma=_A100_GAMMA,
        gpus_per_node=8,
        alpha_inter=5e-6,
        beta_inter=1 / 25e9,
        node_bandwidth=200e9,
        nodes=1,
        description="one DGX A100: 8 GPUs on NVSwitch, NVLink 3 300 GB/s each way",
    ),
    "dgx-a100-cluster": Topology(
        "dgx-a100-cluster",
        alpha=2e-6,
        beta=1 / 300e9,
        gamma=_A100_GAMMA,
        gpus_per_node=8,
        alpha_inter=5e-6,
        beta_inter=1 / 25e9,
        node_bandwidth=200e9,
        description="DGX A100 nodes (Selene-like): NVLink 3 inside, 8x HDR 200 Gb/s IB between",
    ),
    "dgx-h100-cluster": Topology(
        "dgx-h100-cluster",
        alpha=2e-6,
        beta=1 / 450e9,
        gamma=_H100_GAMMA,
        gpus_per_node=8,
        alpha_inter=5e-6,
        beta_inter=1 / 50e9,
        node_bandwidth=400e9,
        description="DGX H100 nodes: NVLink 4 450 GB/s inside, 8x NDR 400 Gb/s IB between",
    ),
    "pcie-ethernet-cluster": Topology(
        "pcie-ethernet-cluster",
        alpha=5e-6,
        beta=1 / 25e9,
        gamma=_A100_GAMMA,
        gpus_per_node=8,
        alpha_inter=10e-6,
        beta_inter=1 / 12.5e9,
        node_bandwidth=12.5e9,
        description="8 GPUs on PCIe per node, one 100 GbE NIC shared per node",
    ),
}


INTER_MBPS_RANGE = (0.01, 100_000.0)  # MB/s an emulated inter-node link may be set to (10 kB/s .. 100 GB/s)


def two_nodes(world: int, inter_mbps: float = 50.0) -> Topology:
    """The emulated cluster morph's scenarios happen on and calibrate measures: two nodes of world/2 ranks, fast
    links inside a node (10 µs, 2 GB/s), a slower one between (50 µs, ``inter_mbps`` MB/s), imposed per link
    by the local fabric (:mod:`netmorph.runtime.links`)."""
    return Topology(
        "two-node",
        alpha=10e-6,
        beta=1 / 2e9,
        gpus_per_node=world // 2,
        alpha_inter=50e-6,
        beta_inter=1 / (inter_mbps * 1e6),
    )


def load_topology(name_or_file: str) -> Topology:
    """A preset by name, or a JSON file with the :class:`Topology` fields."""
    if name_or_file in PRESETS:
        return PRESETS[name_or_file]
    path = Path(name_or_file)
    if not path_exists(path):
        raise UsageError(
            f"{{topology}}: {name_or_file!r} is neither a preset ({', '.join(PRESETS)}) nor a file", "topology"
        )
    data = read_json_object(path, "topology")
    fields = set(Topology.__dataclass_fields__)
    unknown = set(data) - fields
    if unknown:
        raise UsageError(
            f"{{topology}}: {name_or_file} has unknown keys {sorted(unknown)}; allowed: {sorted(fields)}", "topology"
        )
    data.setdefault("name", path.stem)
    try:
        topo = Topology(**data)
    except TypeError as e:
        raise UsageError(f"{{topology}}: {name_or_file}: {e}", "topology") from None
    for k, hi, what in (
        ("alpha", 1, "seconds"),
        ("alpha_inter", 1, "seconds"),
        ("beta", 1, "seconds per byte"),
        ("gamma", 1, "seconds per byte"),
        ("beta_inter", 1, "seconds per byte"),
        ("node_bandwidth", 1e15, "bytes per second"),
    ):
        v = getattr(topo, k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= hi:
            raise UsageError(f"{{topology}}: {name_or_file}: {k} must be {what} in 0..{hi:g}, got {v!r}", "topology")
    for k in ("name", "description"):
        if not isinstance(getattr(topo, k), str):
            raise UsageError(
                f"{{topology}}: {name_or_file}: {k} must be a string, got {getattr(topo, k)!r}", "topology"
            )
    for k in ("gpus_per_node", "nodes"):
        v = getattr(topo, k)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1 << 20:
            raise UsageError(f"{{topology}}: {name_or_file}: {k} must be a whole number >= 0, got {v!r}", "topology")
    if not topo.flat and (topo.beta_inter <= 0 and topo.node_bandwidth <= 0):
        raise UsageError(
            f"{{topology}}: {name_or_file}: a two-level topology needs beta_inter or node_bandwidth", "topology"
        )
    return topo
