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
from netmorph.runtime.native import NativeComm
from netmorph.runtime.transport.torchdist import TorchTransport, dist_module


def loopback_interface() -> str | None:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS), for ``GLOO_SOCKET_IFNAME``."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in names if n in ("lo", "lo0")), None)


def init_torch(rank: int, world: int, init_method: str, timeout: float, native: bool = False, faults=(),
               fingerprints: bool = True):
    """``init_process_group(init_method=...)`` (gloo on CPU) and a Comm over it."""
    dist = dist_module()
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))
    t = TorchTransport(rank, world, timeout)
    if native:
        return NativeComm(t, rank, world, faults, fingerprints)
    return Comm(t, rank, world, faults, tuner_topology=PRESETS["flat"], fingerprints=fingerprints)


def init_from_env(backend: str = "torch", timeout: float = 60.0):
    """Join a job started by ``torchrun``: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (LOCAL_RANK noted)."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise UsageError(f"not started by torchrun: {', '.join(missing)} unset (use netmorph.runtime.launch instead)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return init_torch(rank, world, f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", timeout,
                      native=(backend == "torch-native"))
