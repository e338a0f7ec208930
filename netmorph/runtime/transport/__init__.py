"""Transports move one rank's messages: the local shared-memory fabric and torch.distributed.

Both run the same per-rank programs (:mod:`netmorph.schedule.program`, driven by
:mod:`netmorph.runtime.interpreter`) through one method, ``run_round(sends, recvs, ufunc, snapshot)``, plus torch-style
point-to-point ``send/recv/isend/irecv``.
"""

from __future__ import annotations

import numpy as np

from netmorph.runtime.transport.errors import FabricError, PeerLost, PeerTimeout
from netmorph.runtime.transport.fingerprint import CollectiveMismatch

__all__ = ["CollectiveMismatch", "FabricError", "PeerLost", "PeerTimeout", "Work", "nbytes", "settle"]


def nbytes(a) -> int:
    """Bytes in a buffer a transport moves: a numpy array or a torch tensor (on any device)."""
    return a.nbytes if isinstance(a, np.ndarray) else a.numel() * a.itemsize


def settle(segments) -> list:
    """``[(views, flags)]`` of one round's receives with every accumulator applied once, when more than one
    receive reduces: each accumulator is copied into its destination first and the flag becomes True
    (reduce in place), so receives that land in any order -- several children reducing into one slot --
    count the send buffer exactly once. A lone reducing receive keeps its accumulator (one pass: the
    three-operand reduction). Returns the flag lists, in order."""
    flags = [list(f) for _, f in segments]
    if sum(any(f is not False for f in fl) for fl in flags) < 2:
        return flags
    for (views, _), fl in zip(segments, flags):
        for i, (v, f) in enumerate(zip(views, fl)):
            if f is not True and f is not False:
                v[:] = f
                fl[i] = True
    return flags


class Work:
    """Handle of an asynchronous operation, as ``torch.distributed.Work``: ``wait()``, ``is_completed()``."""

    def __init__(self, transport, streams):
        self._t, self._streams = transport, streams
        self.keep = None  # the caller's tensor, alive until the operation completes

    def is_completed(self) -> bool:
        self._t.progress()
        return all(s.done for s in self._streams)

    def wait(self, timeout=None) -> bool:
        self._t.wait_for(self._streams)
        return True
