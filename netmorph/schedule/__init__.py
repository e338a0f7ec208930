"""The ground floor: a collective algorithm as data, and what reads it without processes.

A :class:`Schedule` is an ordered list of rounds of point-to-point transfers held
as numpy arrays (how MSCCL/TACCL express collectives; NCCL hard-codes them). This
package holds the schedule itself and everything that reads it in one process:
the symbolic validator, the numpy oracle, the counter and the per-rank program a
transport runs. It imports only numpy and itself; every floor above builds on it.
"""

from netmorph.schedule.core import COPY, REDUCE, Round, Schedule
from netmorph.schedule.execute import REDOPS, Counts, count, execute
from netmorph.schedule.out_of_place import out_of_place
from netmorph.schedule.program import Msg, RankRound, rank_program
from netmorph.schedule.validate import ScheduleError, validate

__all__ = [
    "COPY",
    "REDUCE",
    "REDOPS",
    "Counts",
    "Msg",
    "RankRound",
    "Round",
    "Schedule",
    "ScheduleError",
    "count",
    "execute",
    "out_of_place",
    "rank_program",
    "validate",
]
