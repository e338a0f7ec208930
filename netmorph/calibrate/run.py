"""``calibrate()``: the measurements in their order -- compute on one rank alone, compute on every rank at
once, then the links -- and the profile built from them (:mod:`netmorph.calibrate.profile`).

Two ways to get the ranks: :func:`calibrate` launches them on this machine (the local fabric, or gloo), each
phase a fresh launch; :func:`calibrate_in_job` is one process's part of a job ``torchrun`` started (every node
of a cluster, NCCL between GPUs), the same rank functions run in turn on the job's communicator, and rank 0
builds the profile. On GPUs the GEMMs are the published models' layer shapes (:mod:`netmorph.calibrate.gpu`)
and the profile also carries their efficiency against the datasheet peak given."""

from __future__ import annotations

import importlib
import os

import numpy as np

from netmorph.calibrate import gpu
from netmorph.calibrate.compute import WINDOW, compute_rank, gemm_shapes, overlap_rank, sharing_rank
from netmorph.calibrate.device import device_of
from netmorph.calibrate.links import LOAD_S, RING_SIZES, SIZES, fit, fit_ring, pingpong_rank, ring_rank
from netmorph.calibrate.profile import build
from netmorph.calibrate.relay import SLOT_S, relay_rank
from netmorph.cost.topology import node_of, two_nodes
from netmorph.errors import UsageError
from netmorph.runtime.base import Group
from netmorph.runtime.launch import launch

PHASES = ("compute, one rank alone", "compute, every rank at once", "links, overlap and pipeline hops")
BACKENDS = ("local", "torch")
RING_LAUNCHES = 3  # launches of each group size's ring all-reduces (measure_links)


def calibrate(
    world: int = 4,
    backend: str = "local",
    dtype: str = "float32",
    inter_mbps: float | None = None,
    hidden=None,
    timeout: float = 60.0,
    on_phase=lambda name: None,
    window: float = WINDOW,
) -> dict:
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
        raise UsageError("{inter_mbps}: links are emulated on the local fabric only; use --backend local", "inter_mbps")
    shapes = gemm_shapes(**({"hidden": tuple(hidden)} if hidden else {}))
    # counting an autograd chain's operators enters a TorchDispatchMode, which imports torch._dynamo (1.4 s of
    # a core): once here, inherited by every rank forked below, instead of once in each of them
    importlib.import_module("torch._dynamo")
    alone = launch(compute_rank, 1, shapes, dtype, window, timeout=timeout)[0]
    on_phase(PHASES[0])
    busy = slowest(launch(compute_rank, world, shapes, dtype, window, timeout=timeout), shapes)
    on_phase(PHASES[1])
    topo = two_nodes(world, inter_mbps) if inter_mbps else None
    gpn = topo.gpus_per_node if topo else world
    quick = window < WINDOW
    links = measure_links(world, topo, backend, timeout, launches=1 if quick else RING_LAUNCHES)
    overlap = launch(overlap_rank, world, topology=topo, backend=backend, timeout=timeout)
    busy["overlap"] = {**overlap[0], "overlap": min(r["overlap"] for r in overlap)}
    busy["sharing"] = launch(sharing_rank, world, dtype, timeout=timeout)[0]
    # a pipeline's hop: GEMMs relayed along chains of 2 (and 4) consecutive ranks, every chain at once
    # (a quick profile, with a shorter window: shorter slots, two repeats)
    busy["relay"] = [
        launch(
            relay_rank,
            world,
            p,
            slot_s=SLOT_S * min(1.0, window / WINDOW),
            repeats=2 if quick else 5,
            topology=topo,
            backend=backend,
            timeout=timeout,
        )[0]
        for p in (2, 4)
        if p <= gpn and world % p == 0
    ]
    on_phase(PHASES[2])
    return build(world, dtype, backend, gpn, alone, busy, links, inter_mbps)


def slowest(ranks: list, shapes) -> dict:
    """Every rank's compute measurements as one: the slowest rank's rate and time (a step waits for it)."""
    busy = {"gemm": [(m, n, k, min(r["gemm"][i][3] for r in ranks)) for i, (m, n, k) in enumerate(shapes)]}
    for key in ranks[0]:
        if key.endswith("_per_s"):
            busy[key] = min(r[key] for r in ranks)
        elif key.endswith("_s"):
            busy[key] = max(r[key] for r in ranks)
    return busy


def measure_links(world: int, topo=None, backend: str = "local", timeout: float = 60.0, launches: int = 1) -> dict:
    """{"intra" (when a node holds 2 ranks or more), "inter" (on two nodes): {"alpha", "beta", ...}}: each link
    class's α and β as the training step sees them, fitted from ping-pongs and (inside a node) ring all-reduces
    under load, each group size's in ``launches`` launches (the median per size) -- ``calibrate``'s link phase
    (:data:`RING_LAUNCHES` of them), which morph's twin also runs on its own (one: it ranks layouts)."""
    gpn = topo.gpus_per_node if topo else world
    peers = link_peers(world, gpn)
    measured = launch(pingpong_rank, world, list(peers.values()), topology=topo, backend=backend, timeout=timeout)[0]
    groups = ring_groups(gpn)
    # each group size's rings in `launches` launches, the median per size: where ranks share cores, how the
    # scheduler lays a launch's processes on them holds for the launch -- rings of 2 at world 4 here took
    # 1.3-2.1 ms in one launch and 0.2-0.9 ms in the next -- so one launch is one draw of that
    runs = [
        [launch(ring_rank, world, g, topology=topo, backend=backend, timeout=timeout)[0] for _ in range(launches)]
        for g in groups
    ]
    links = fit_links(peers, gpn, measured, groups, [np.median(r, axis=0).tolist() for r in runs])
    if groups:
        links["intra"]["ring_launches_s"] = dict(zip(map(str, groups), runs))
    return links


def links_in_job(comm, gpn: int) -> dict | None:
    """:func:`measure_links` on ``comm``'s ranks as they already run (a torchrun job, a cluster of them), ``gpn``
    to a node: the fitted links on rank 0, None elsewhere."""
    peers = link_peers(comm.world, gpn)
    measured = pingpong_rank(comm, list(peers.values()))
    groups = ring_groups(gpn)
    rings = [ring_rank(comm, g) for g in groups]  # rank 0's: the others' are None
    return fit_links(peers, gpn, measured, groups, rings) if comm.rank == 0 else None


def link_peers(world: int, gpn: int) -> dict:
    """{link class: rank 0's peer}: the next rank inside a node ("intra", when a node holds two ranks or more),
    the first rank of the next node ("inter", with more than one node)."""
    peers = {}
    if gpn > 1:
        peers["intra"] = 1
    if world > gpn:
        peers["inter"] = gpn
    return peers


def ring_groups(gpn: int) -> list:
    """The ring all-reduces' group sizes: each divisor of a node's ranks from 2 (every size a layout uses)."""
    return [g for g in range(2, gpn + 1) if gpn % g == 0]


def fit_links(peers: dict, gpn: int, measured: dict, groups: list, rings: list) -> dict:
    """Each link class's α and β from the ping-pongs (``measured``: {peer: one-way seconds per size}) and,
    inside a node, from the ring all-reduces of each of ``groups`` (every group at once, every rank computing
    between two of them) -- the link as the training step sees it (the ping-pong, with idle neighbours, stays
    beside it as measured)."""
    links = {}
    for name, peer in peers.items():
        alpha, beta, residuals = fit(SIZES, measured[peer])
        links[name] = {
            "peer": peer,
            "same_node": node_of(peer, gpn) == 0,
            "sizes": list(SIZES),
            "one_way_s": measured[peer],
            "alpha": alpha,
            "beta": beta,
            "residuals": residuals,
            "fitted_from": "ping-pong, every pair at once",
        }
    if groups:
        base, alpha, beta, residuals = fit_ring(groups, [RING_SIZES] * len(groups), rings)
        links["intra"] = {
            **links["intra"],
            "base": base,
            "alpha": alpha,
            "beta": beta,
            "residuals": residuals,
            "ring_sizes": list(RING_SIZES),
            "ring_groups": groups,
            "ring_s": dict(zip(map(str, groups), rings)),
            "ring_load_s": LOAD_S,
            "pingpong_alpha": links["intra"]["alpha"],
            "pingpong_beta": links["intra"]["beta"],
            "pingpong_residuals": links["intra"]["residuals"],
            "fitted_from": f"ring all-reduces on groups of {', '.join(map(str, groups))} ranks, "
            "every group at once, every rank computing between two of them",
        }
    return links


def calibrate_in_job(
    comm, dtype: str = "float32", hidden=None, window: float = WINDOW, preset=None, on_phase=lambda name: None
) -> dict | None:
    """This process's part of a calibration ``torchrun`` started: the phases of :func:`calibrate` on the job's
    ranks (rank 0 alone first, the others waiting; then every rank; then the links, the overlap and the
    pipeline hops), on each rank's device -- its GPU under NCCL, where the GEMMs are the published models'
    shapes and, with a ``preset`` (:class:`~netmorph.planner.hardware.Hardware`: its datasheet peaks), their
    efficiency table and the attention core's go into the profile as the presets carry them. Rank 0 returns
    the profile, the others None. A node is ``LOCAL_WORLD_SIZE`` ranks (torchrun's), the world its nodes; a
    job of one rank (one GPU) measures no link and takes the preset's."""
    from netmorph.runtime.transport.tensors import dist_module

    world, dev = comm.world, device_of(comm)
    gpn = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world % gpn:
        raise UsageError(f"torchrun's WORLD_SIZE {world} is not whole nodes of LOCAL_WORLD_SIZE {gpn}", "world")
    if world == 1 and preset is None:
        raise UsageError("one rank has no link to measure: run two or more, or give {preset} for the links", "preset")
    peak, fp8_peak = (preset.peak_flops, preset.fp8_flops) if preset is not None else (0.0, 0.0)
    cuda = dev.type == "cuda"
    # on GPUs every rank at once times 104 of the published shapes (2k and 8k tokens, tp 1 and 8: the profile's
    # own table, six bins), and rank 0 alone all 340 against the datasheet (gpu.measure, the presets' table)
    shapes = (
        [(m, n, k) for m, k, n in gpu.shapes((2048, 8192), (1, 8))]
        if cuda
        else gemm_shapes(**({"hidden": tuple(hidden)} if hidden else {}))
    )
    alone = compute_rank(comm, shapes, dtype, window, group=Group([0])) if comm.rank == 0 else None
    comm.barrier()
    on_phase(PHASES[0])
    mine = compute_rank(comm, shapes, dtype, window)
    everyone = [None] * world
    dist_module().all_gather_object(everyone, mine)
    busy = slowest(everyone, shapes)
    on_phase(PHASES[1])
    links, busy["relay"] = {}, []
    if world > 1:
        links = links_in_job(comm, gpn) or {}
        overlap = [None] * world
        dist_module().all_gather_object(overlap, overlap_rank(comm))
        busy["overlap"] = {**overlap[0], "overlap": min(r["overlap"] for r in overlap)}
        busy["sharing"] = sharing_rank(comm, dtype)  # rank 0's: the others' are None
        busy["relay"] = [
            relay_rank(comm, p, repeats=2 if window < WINDOW else 5) for p in (2, 4) if p <= gpn and world % p == 0
        ]
    measured_gpu = gpu.measure(dev, peak, fp8_peak) if cuda and peak and comm.rank == 0 else None
    comm.barrier()
    on_phase(PHASES[2])
    if comm.rank != 0:
        return None
    prof = build(world, dtype, "torch", gpn, alone, busy, links, None, device=dev, preset=preset)
    if measured_gpu:
        # the fields a preset takes (efficiency against the datasheet), kept whole for the presets; the
        # profile's own GEMM table stays against its measured peak (its compute scale was fitted on it), the
        # attention core's achieved rate re-expressed against that peak, FP8 priced at its datasheet peak
        rows = measured_gpu.pop("rows")
        prof["preset_fields"] = {"peak_flops": peak, "fp8_flops": fp8_peak, **measured_gpu}
        hw = prof["hardware"]
        hw["attention_efficiency"] = min(1.0, measured_gpu["attention_efficiency"] * peak / hw["peak_flops"])
        if "fp8_gemm_table" in measured_gpu:
            hw["fp8_flops"], hw["fp8_gemm_table"] = fp8_peak, [list(r) for r in measured_gpu["fp8_gemm_table"]]
        prof["compute"]["datasheet_rows"] = rows
        prof["assumed"].pop("attention_efficiency", None)
    return prof
