"""Fault injection on real ranks: kill, hang, raise or delay one rank at its k-th communication call.

The chaos-engineering knob that NCCL lacks and production teams script around it
(``kill -9`` a worker, ``SIGSTOP`` it, inject a slow rank). A :class:`Fault` is
handed to ``launch(faults=[...])``; the rank's communicator triggers it as the
rank starts that call, so a failure lands at a reproducible point of the run.
"""

from __future__ import annotations

import os
import signal
import time

from netmorph.errors import UsageError


class Fault:
    """``Fault("kill", rank=1, at_op=3)`` SIGKILLs rank 1 as it starts its 3rd communication call;
    ``Fault("hang", ...)`` makes it stop answering (sleeps forever); ``Fault("stop", ...)`` SIGSTOPs it
    (the process is frozen, as ``kill -STOP`` or a debugger leaves it); ``Fault("raise", ...)`` raises
    an exception there; ``Fault("delay", ..., seconds=0.5)`` stalls it once (a straggler)."""

    KINDS = ("kill", "hang", "stop", "raise", "delay")

    def __init__(self, kind: str, rank: int, at_op: int = 1, seconds: float = 0.0, before=None):
        if kind not in self.KINDS:
            raise UsageError(f"fault {{kind}} must be one of {', '.join(self.KINDS)}, got {kind!r}", "kind")
        self.kind, self.rank, self.at_op, self.seconds = kind, rank, at_op, seconds
        self.before = before  # called as the fault fires (to stamp its time where others read it)

    def trigger(self, op_number: int) -> None:
        if op_number != self.at_op:
            return
        if self.before is not None:
            self.before()
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.kind == "hang":
            while True:
                time.sleep(3600)
        elif self.kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif self.kind == "raise":
            raise RuntimeError(f"injected fault on rank {self.rank} at op {op_number}")
        elif self.kind == "delay":
            time.sleep(self.seconds)

    def __repr__(self):
        return f"Fault({self.kind!r}, rank={self.rank}, at_op={self.at_op})"
