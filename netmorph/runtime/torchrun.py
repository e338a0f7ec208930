"""Joining a torch.distributed job: ``init_process_group`` and a communicator over it.

Stands in for the first lines of every torchrun script (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT`` from the environment, then
``dist.init_process_group``). :func:`init_from_env` joins a job ``torchrun``
started; :func:`init_torch` is what :func:`netmorph.runtime.launch.launch` calls
in each child for ``backend="torch"`` / ``"torch-native"``.
"""

from __future__ import annotations

import datetime
import os
import socket

from netmorph.cost.topology import PRESETS
from netmorph.errors import UsageError
from netmorph.runtime.comm import Comm
from netmorph.runtime.heap import freeze_heap
from netmorph.runtime.native import NativeComm
from netmorph.runtime.result import LaunchResult
from netmorph.runtime.transport.tensors import dist_module
from netmorph.runtime.transport.torchdist import TorchTransport


def loopback_interface() -> str | None:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS), for ``GLOO_SOCKET_IFNAME``."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in names if n in ("lo", "lo0")), None)


def gloo_on_loopback() -> None:
    """Bind gloo's sockets to the loopback interface (``GLOO_SOCKET_IFNAME``, unless the user set it): a
    local launch exposes nothing beyond this host."""
    lo = loopback_interface()
    if lo and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = lo


def init_torch(
    rank: int,
    world: int,
    init_method: str | None,
    timeout: float,
    native: bool = False,
    faults=(),
    fingerprints: bool = True,
    store=None,
):
    """``init_process_group(init_method=...)`` and a Comm over it: gloo for CPU tensors, and NCCL for
    CUDA tensors where there is a GPU (torch's ``"cpu:gloo,cuda:nccl"``: one process group, the
    backend chosen by each tensor's device). ``store``: a store to rendezvous over instead of ``init_method``."""
    dist = dist_module()
    if native and fingerprints and "TORCH_DISTRIBUTED_DEBUG" not in os.environ:
        # torch's own cross-rank check of every collective (ProcessGroupWrapper, what
        # TORCH_DISTRIBUTED_DEBUG=DETAIL turns on): a call that differs in shape or type is a named
        # error, not a gloo abort (SIGABRT) mid-transfer. netmorph's fingerprints cover the rest.
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    if not dist.is_initialized():
        dist.init_process_group(
            process_group_backend(),
            init_method=None if store else init_method,
            store=store,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout),
        )
    t = TorchTransport(rank, world, timeout)
    if native:
        return NativeComm(t, rank, world, faults, fingerprints)
    return Comm(t, rank, world, faults, tuner_topology=PRESETS["flat"], fingerprints=fingerprints)


def process_group_backend() -> str:
    """``"cpu:gloo,cuda:nccl"`` where CUDA and NCCL are there, else ``"gloo"``."""
    import torch

    if torch.cuda.is_available() and dist_module().is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def init_from_env(backend: str = "torch", timeout: float = 60.0):
    """Join a job started by ``torchrun``: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and LOCAL_RANK --
    with GPUs, this rank's device is ``cuda:LOCAL_RANK`` (``torch.cuda.set_device``, as every
    torchrun script does first); ``comm.local_rank`` and ``comm.device`` say which."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise UsageError(
            f"not started by torchrun: {', '.join(missing)} unset (use netmorph.runtime.launch "
            f"or netmorph.launch instead)"
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    import torch

    device = torch.device("cpu")
    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise UsageError(
                f"LOCAL_RANK {local_rank} but this node has {torch.cuda.device_count()} GPU(s): "
                f"start at most that many processes per node (--nproc-per-node)"
            )
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    comm = init_torch(
        rank, world, None, timeout, native=(backend == "torch-native"), store=attempt_store(rank, world, timeout)
    )
    comm.local_rank, comm.device = local_rank, device
    freeze_heap()
    return comm


def attempt_store(rank: int, world: int, timeout: float):
    """torchrun's store (MASTER_ADDR:MASTER_PORT, hosted by its agent), under a prefix of this attempt's own
    (``TORCHELASTIC_RESTART_COUNT``). The agent's store outlives a restart with ``--max-restarts``: without the
    prefix, a restarted worker's gloo reads the dead attempt's addresses and fails to connect -- and the job
    restarts again, until a race lets it through."""
    dist = dist_module()
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    tcp = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=not agent and rank == 0,
        timeout=datetime.timedelta(seconds=timeout),
        multi_tenant=not agent,
    )
    return dist.PrefixStore(f"/netmorph/attempt_{attempt}", tcp)


def join_gloo(rank: int, world: int, init_method: str, timeout: float) -> None:
    """torch.distributed's default process group over gloo on loopback, in a rank that already talks over
    netmorph's local fabric: for a baseline that runs torch's own collectives (DDP) in the same processes
    (``launch(..., torch_group=True)``)."""
    gloo_on_loopback()
    dist_module().init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout)
    )


def run_in_job(fn, world: int, *args, timeout: float = 60.0, ledger: bool = False, backend: str = "torch", **kwargs):
    """``launch(fn, world, ..., backend="job")``: this process is one rank of the torchrun job; run ``fn(comm,
    *args, **kwargs)`` here and gather every rank's result (and ledger) to rank 0 (``all_gather_object``), as
    every torchrun script ends. Rank 0 gets what :func:`~netmorph.runtime.launch.launch` returns (results in rank
    order, a :class:`~netmorph.runtime.result.LaunchResult`, its ledger with ``ledger``); the other ranks get None. The job's WORLD_SIZE must be
    ``world``: the command's ranks are the job's."""
    from netmorph.runtime.ledger import Ledger

    job = int(os.environ["WORLD_SIZE"])
    if job != world:
        raise UsageError(
            f"this run takes {world} rank(s) but torchrun's WORLD_SIZE is {job}: start it with "
            f"--nproc-per-node {world} (x nodes)"
        )
    comm = init_from_env(backend, timeout)
    try:
        result = fn(comm, *args, **kwargs)
        everyone = [None] * comm.world
        dist_module().all_gather_object(everyone, (result, comm.ledger if ledger else None))
    finally:
        comm.transport.close()
    if comm.rank != 0:
        return None
    return LaunchResult([r for r, _ in everyone], Ledger.merge([led for _, led in everyone]) if ledger else None)
