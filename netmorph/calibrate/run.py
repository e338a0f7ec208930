"""``calibrate()``: the measurements in their order -- compute on one rank alone, compute on every rank at
once, then the links -- and the profile built from them (:mod:`netmorph.calibrate.profile`)."""

from __future__ import annotations

import importlib

from netmorph.calibrate.compute import WINDOW, compute_rank, gemm_shapes, overlap_rank
from netmorph.calibrate.links import LOAD_S, RING_SIZES, SIZES, fit, fit_ring, pingpong_rank, ring_rank
from netmorph.calibrate.profile import build
from netmorph.calibrate.relay import SLOT_S, relay_rank
from netmorph.cost.topology import node_of, two_nodes
from netmorph.errors import UsageError
from netmorph.runtime.launch import launch

PHASES = ("compute, one rank alone", "compute, every rank at once", "links, overlap and pipeline hops")
BACKENDS = ("local", "torch")


def calibrate(world: int = 4, backend: str = "local", dtype: str = "float32", inter_mbps: float | None = None,
              hidden=None, timeout: float = 60.0, on_phase=lambda name: None, window: float = WINDOW) -> dict:
    """Measure ``world`` ranks of this machine (``backend`` local: the shared-memory fabric; torch: gloo) and
    return the profile; ``on_phase(name)`` after each of :data:`PHASES`; ``window``: seconds each compute
    measurement runs (shorter: a rougher profile, sooner)."""
    if backend not in BACKENDS:
        raise UsageError(f"{{backend}} must be one of {', '.join(BACKENDS)}, got {backend!r}", "backend")
    if not 2 <= world <= 64:
        raise UsageError(f"{{world}} must be in 2..64 (one rank has no link to measure), got {world}", "world")
    if inter_mbps is not None and (world < 2 or world % 2):
        raise UsageError(f"{{inter_mbps}}: two emulated nodes need an even world >= 2, got {world}", "inter_mbps")
    if inter_mbps is not None and backend != "local":
        raise UsageError("{inter_mbps}: links are emulated on the local fabric only; use --backend local",
                         "inter_mbps")
    shapes = gemm_shapes(**({"hidden": tuple(hidden)} if hidden else {}))
    # counting an autograd chain's operators enters a TorchDispatchMode, which imports torch._dynamo (1.4 s of
    # a core): once here, inherited by every rank forked below, instead of once in each of them
    importlib.import_module("torch._dynamo")
    alone = launch(compute_rank, 1, shapes, dtype, window, timeout=timeout)[0]
    on_phase(PHASES[0])
    busy_ranks = launch(compute_rank, world, shapes, dtype, window, timeout=timeout)
    # the slowest rank's rate: a step waits for it
    busy = {"gemm": [(m, n, k, min(r["gemm"][i][3] for r in busy_ranks))
                     for i, (m, n, k) in enumerate(shapes)]}
    for key in busy_ranks[0]:
        if key.endswith("_per_s"):
            busy[key] = min(r[key] for r in busy_ranks)
        elif key.endswith("_s"):
            busy[key] = max(r[key] for r in busy_ranks)
    on_phase(PHASES[1])
    topo = two_nodes(world, inter_mbps) if inter_mbps else None
    gpn = topo.gpus_per_node if topo else world
    links = measure_links(world, topo, backend, timeout)
    overlap = launch(overlap_rank, world, topology=topo, backend=backend, timeout=timeout)
    busy["overlap"] = {**overlap[0], "overlap": min(r["overlap"] for r in overlap)}
    # a pipeline's hop: GEMMs relayed along chains of 2 (and 4) consecutive ranks, every chain at once
    # (a quick profile, with a shorter window: shorter slots, two repeats)
    quick = window < WINDOW
    busy["relay"] = [launch(relay_rank, world, p, slot_s=SLOT_S * min(1.0, window / WINDOW),
                            repeats=2 if quick else 5, topology=topo, backend=backend, timeout=timeout)[0]
                     for p in (2, 4) if p <= gpn and world % p == 0]
    on_phase(PHASES[2])
    return build(world, dtype, backend, gpn, alone, busy, links, inter_mbps)


def measure_links(world: int, topo=None, backend: str = "local", timeout: float = 60.0) -> dict:
    """{"intra" (when a node holds 2 ranks or more), "inter" (on two nodes): {"alpha", "beta", ...}}: each link
    class's α and β as the training step sees them, fitted from ping-pongs and (inside a node) ring all-reduces
    under load -- ``calibrate``'s link phase, which morph's twin also runs on its own."""
    gpn = topo.gpus_per_node if topo else world
    peers = {}
    if gpn > 1:
        peers["intra"] = 1
    if topo is not None:
        peers["inter"] = gpn
    links = {}
    measured = launch(pingpong_rank, world, list(peers.values()), topology=topo, backend=backend,
                      timeout=timeout)[0]
    for name, peer in peers.items():
        alpha, beta, residuals = fit(SIZES, measured[peer])
        links[name] = {"peer": peer, "same_node": node_of(peer, gpn) == 0, "sizes": list(SIZES),
                       "one_way_s": measured[peer], "alpha": alpha, "beta": beta, "residuals": residuals,
                       "fitted_from": "ping-pong, every pair at once"}
    if gpn > 1:
        # inside a node the link is priced as the training step sees it: fitted from ring all-reduces on groups
        # of every size a layout of the node's ranks uses (each divisor of the node's size from 2), every group at
        # once, every rank computing between two of them (the ping-pong, with idle neighbours, stays as measured)
        groups = [g for g in range(2, gpn + 1) if gpn % g == 0]
        rings = [launch(ring_rank, world, g, topology=topo, backend=backend, timeout=timeout)[0]
                 for g in groups]
        base, alpha, beta, residuals = fit_ring(groups, [RING_SIZES] * len(groups), rings)
        links["intra"] = {**links["intra"], "base": base, "alpha": alpha, "beta": beta, "residuals": residuals,
                          "ring_sizes": list(RING_SIZES), "ring_groups": groups,
                          "ring_s": dict(zip(map(str, groups), rings)), "ring_load_s": LOAD_S,
                          "pingpong_alpha": links["intra"]["alpha"], "pingpong_beta": links["intra"]["beta"],
                          "pingpong_residuals": links["intra"]["residuals"],
                          "fitted_from": f"ring all-reduces on groups of {', '.join(map(str, groups))} ranks, "
                                         "every group at once, every rank computing between two of them"}
    return links
