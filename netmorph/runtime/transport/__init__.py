"""Transports move one rank's messages: the local shared-memory fabric and torch.distributed.

Both run the same per-rank programs (:mod:`netmorph.schedule.program`, driven by
:mod:`netmorph.runtime.interpreter`) through one method, ``run_round(sends, recvs, ufunc, snapshot)``, plus torch-style
point-to-point ``send/recv/isend/irecv``.
"""

from __future__ import annotations

import numpy as np

from netmorph.runtime.transport.errors import FabricError, PeerLost, PeerTimeout
from netmorph.runtime.transport.fingerprint import CollectiveMismatch

__all__ = ["CollectiveMismatch", "FabricError", "PeerLost", "PeerTimeout", "Work", "nbytes"]


def nbytes(a) -> int:
    """Bytes in a buffer a transport moves: a numpy array or a torch tensor (on any device)."""
    return a.nbytes if isinstance(a, np.ndarray) else a.numel() * a.itemsize


class Work:
    """Handle of an asynchronous operation, as ``torch.distributed.Work``: ``wait()``, ``is_completed()``."""

    def __init__(self, transport, streams):
        self._t, self._streams = transport, streams
        self.keep = None                      # the caller's tensor, alive until the operation completes

    def is_completed(self) -> bool:
        self._t.progress()
        return all(s.done for s in self._streams)

    def wait(self, timeout=None) -> bool:
        self._t.wait_for(self._streams)
        return True
