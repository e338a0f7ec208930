"""Real ranks: processes, transports and the communicator model code calls.

Stands in for the runtime under a training job -- ``torchrun`` (launch, failure
semantics, rendezvous from the environment), ``torch.distributed``'s process
group API, and NCCL's transports -- on one machine (the shared-memory fabric) or
across machines (torch.distributed). It runs the schedules of
:mod:`netmorph.collectives`, tunes with :mod:`netmorph.cost`, and records every
message in a ledger.

Rooms: ``base`` + ``comm`` (the API) over ``interpreter`` (schedule -> transport),
``native`` (torch's own collectives), ``launch`` (processes, root cause),
``torchrun`` (joining a torch.distributed job), ``faults``, ``links`` (link
emulation), ``ledger``, ``bench`` (nccl-tests-style measurement) and
``transport/`` (``shm/`` the local fabric, ``torchdist`` torch point-to-point).
"""

from netmorph.runtime.base import Group, ReduceOp
from netmorph.runtime.faults import Fault
from netmorph.runtime.launch import LaunchError, RankFailure, launch
from netmorph.runtime.ledger import Ledger
from netmorph.runtime.transport import CollectiveMismatch, FabricError, PeerLost, PeerTimeout


def init_from_env(backend: str = "torch", timeout: float = 60.0):
    """Join a job started by ``torchrun`` (see :func:`netmorph.runtime.torchrun.init_from_env`)."""
    from netmorph.runtime.torchrun import init_from_env as join

    return join(backend, timeout)


__all__ = [
    "CollectiveMismatch",
    "FabricError",
    "Fault",
    "Group",
    "ReduceOp",
    "LaunchError",
    "Ledger",
    "PeerLost",
    "PeerTimeout",
    "RankFailure",
    "init_from_env",
    "launch",
]
