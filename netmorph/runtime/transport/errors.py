"""What a rank sees when the fabric under it fails: a lost peer, a silent peer."""

from __future__ import annotations

import re


class FabricError(RuntimeError):
    """Base of the errors a rank sees when the fabric under it fails."""


class PeerLost(FabricError):
    """A peer died: raised on every rank with a pending operation, naming the dead rank."""

    def __init__(self, rank: int, detail: str = ""):
        self.rank = rank
        super().__init__(f"peer rank {rank} was lost" + (f" ({detail})" if detail else ""))


class PeerTimeout(FabricError):
    """A peer stopped answering: nothing arrived (or nothing was taken) within the timeout.

    ``rank`` is the rank to blame -- the end of the wait-for chain
    (:mod:`netmorph.runtime.transport.blame`), which need not be ``waited_for``, the peer this
    rank itself waited on; ``via`` says how the chain led from one to the other."""

    def __init__(
        self,
        rank: int,
        seconds: float,
        what: str,
        waited_for: int | None = None,
        via: str = "",
        why: str = "it is hung or far slower than its peers",
    ):
        self.rank = rank
        self.waited_for = rank if waited_for is None else waited_for
        self.seconds = seconds
        who = f" waiting for rank {self.waited_for} ({what})" if self.waited_for >= 0 else f": {what}"
        if rank >= 0 and rank != self.waited_for:
            tail = f"{via}; rank {rank} is the one they wait on: {why}"
        else:
            tail = f"{via}; {why}"
        super().__init__(f"timed out after {seconds:g} s{who}{tail} (raise timeout= to wait longer)")


def gloo_text(e) -> str:
    """gloo's error text, trimmed to what happened: '[.../pair.cc:553] Connection closed by peer ...'."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text.split("] ", 1)[-1].split(". This is typically")[0]


def torch_mismatch_text(text: str) -> str:
    """torch's ProcessGroupWrapper report, on one line without the TensorOptions dump: "Rank 1 is
    running collective: CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[1000],
    TensorDtypes=Float), but Rank 0 is running collective: ...(TensorShape=[10] ...)"."""
    text = text.split("] ", 1)[-1] if text.startswith("[") else text
    text = re.sub(r", TensorDeviceTypes=TensorOptions\((?:[^()]|\([^()]*\))*\)", "", text)
    text = text.replace("Detected mismatch between collectives on ranks. ", "")
    return " ".join(text.split())[:600]
