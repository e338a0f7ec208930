"""What a rank sees when the fabric under it fails: a lost peer, a silent peer."""

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
        who = f" waiting for rank {rank} ({what})" if rank >= 0 else f": {what}"
        super().__init__(f"timed out after {seconds:g} s{who}; "
                         f"it is hung or far slower than its peers (raise timeout= to wait longer)")
