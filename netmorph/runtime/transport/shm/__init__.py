"""The local fabric: ranks as OS processes exchanging messages through shared memory.

Stands in for NCCL's intra-node SHM/P2P transports. One room per job:
``mapping`` (the shared mapping, arenas, abort word, doorbells), ``futex``
(sleeping in the kernel), ``channel`` (SPSC channels, pieces and descriptors),
``engine`` (per-peer FIFOs, waiting, blame), ``fused`` (the one-pass multi-peer
reduction), ``linkclock`` (per-link α/β emulation) and ``transport`` (one rank's
interface over them).
"""

from netmorph.runtime.transport.shm.mapping import ShmFabric
from netmorph.runtime.transport.shm.transport import ShmTransport

__all__ = ["ShmFabric", "ShmTransport"]
