"""Elastic membership: notice a dead, hung or slow peer, agree on a new view, re-form in place, go on.

Rooms: ``detector`` (fixed timeout as torchelastic; φ accrual as Hayashibara et al.
and Akka), ``heartbeat`` (a worker's heartbeat thread, a monitor over a torch
store, and the watchdog that fences a worker gone silent), ``membership`` (epoch-numbered views agreed by compare_set: one rule, no
split brain), ``agent`` (what a member does around a change of view: fence the hung, agree after a
loss, admit joiners), ``train`` (BSP training that survives killed workers in place, beside
Horovod-style rollback), ``gpt`` (the same on ``netmorph train``'s GPT trainer) and ``restart``
(torchrun-style restart-all on the least-squares job). The fabric side is
``launch(elastic=True)`` and ``comm.reform(members, epoch[, renumber])`` (ncclCommShrink/Grow).
"""

from netmorph.elastic.detector import FixedTimeout, PhiAccrual
from netmorph.elastic.heartbeat import Heartbeat, Monitor, Watchdog, fence, publish_pid
from netmorph.elastic.membership import MembershipError, Rendezvous, View

__all__ = [
    "FixedTimeout",
    "Heartbeat",
    "MembershipError",
    "Monitor",
    "PhiAccrual",
    "Rendezvous",
    "View",
    "Watchdog",
    "fence",
    "publish_pid",
]
