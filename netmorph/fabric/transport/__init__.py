"""Transports move one rank's messages: the local shared-memory fabric and torch.distributed.

Both run the same per-rank programs (:mod:`netmorph.fabric.program`) through one
method, ``run_round(sends, recvs, ufunc, snapshot)``, plus torch-style
point-to-point ``send/recv/isend/irecv``.
"""

from __future__ import annotations


class FabricError(RuntimeError):
    """Base of the errors a rank sees when the fabric under it fails."""


class PeerLost(FabricError):
    """A peer died: raised on every rank with a pending operation, naming the dead rank."""

    def __init__(self, rank: int, detail: str = ""):
        self.rank = rank
        super().__init__(f"peer rank {rank} was lost" + (f" ({detail})" if detail else ""))


class PeerTimeout(FabricError):
    """A peer stopped answering: nothing arrived (or nothing was taken) within the timeout."""

    def __init__(self, rank: int, seconds: float, what: str):
        self.rank = rank
        super().__init__(f"timed out after {seconds:g} s waiting for rank {rank} ({what}); "
                         f"it is hung or far slower than its peers (raise timeout= to wait longer)")


class Work:
    """Handle of an asynchronous operation, as ``torch.distributed.Work``: ``wait()``, ``is_completed()``."""

    def __init__(self, transport, streams):
        self._t, self._streams = transport, streams

    def is_completed(self) -> bool:
        self._t.progress()
        return all(s.done for s in self._streams)

    def wait(self, timeout=None) -> bool:
        self._t.wait_for(self._streams)
        return True
