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

from netmorph.cost.topology import PRESETS
from netmorph.errors import UsageError
from netmorph.runtime.comm import Comm
from netmorph.runtime.native import NativeComm
from netmorph.runtime.transport.torchdist import TorchTransport, dist_module


def init_torch(rank: int, world: int, addr: str, port: int, timeout: float, native: bool = False, faults=()):
    """``init_process_group`` (gloo on CPU) and a Comm over it."""
    dist = dist_module()
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))
    t = TorchTransport(rank, world)
    if native:
        return NativeComm(t, rank, world, faults)
    return Comm(t, rank, world, faults, tuner_topology=PRESETS["flat"])


def init_from_env(backend: str = "torch", timeout: float = 60.0):
    """Join a job started by ``torchrun``: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (LOCAL_RANK noted)."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise UsageError(f"not started by torchrun: {', '.join(missing)} unset (use netmorph.runtime.launch instead)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return init_torch(rank, world, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout,
                      native=(backend == "torch-native"))
