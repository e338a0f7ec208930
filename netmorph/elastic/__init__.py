"""Elastic membership: noticing a dead, hung or slow peer (the first floor of issue 13).

Rooms so far: ``detector`` (fixed timeout as torchelastic; φ accrual as Hayashibara
et al. and Akka) and ``heartbeat`` (a worker's heartbeat thread and a monitor over a
torch store). Membership epochs, rendezvous and in-place re-forming build on these.
"""

from netmorph.elastic.detector import FixedTimeout, PhiAccrual
from netmorph.elastic.heartbeat import Heartbeat, Monitor

__all__ = ["FixedTimeout", "Heartbeat", "Monitor", "PhiAccrual"]
