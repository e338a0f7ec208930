"""Elastic membership: noticing a dead, hung or slow peer (the first floor of issue 13).

Rooms so far: ``detector`` (fixed timeout as torchelastic; φ accrual as Hayashibara
et al. and Akka), ``heartbeat`` (a worker's heartbeat thread and a monitor over a
torch store) and ``membership`` (epoch-numbered views agreed by compare_set: one
rule, no split brain). Re-forming the fabric in place and the training loop that
keeps going build on these.
"""

from netmorph.elastic.detector import FixedTimeout, PhiAccrual
from netmorph.elastic.heartbeat import Heartbeat, Monitor
from netmorph.elastic.membership import MembershipError, Rendezvous, View

__all__ = ["FixedTimeout", "Heartbeat", "MembershipError", "Monitor", "PhiAccrual", "Rendezvous", "View"]
