"""Consistency models for data-parallel SGD on real ranks: the consistency ladder of
distributed systems (linearizable -> bounded staleness -> eventual) mapped onto training.

``bsp`` (DDP) · ``ssp`` (Petuum) · ``async`` (Downpour) · ``hogwild`` · ``local`` (local SGD / DiLoCo);
see :mod:`netmorph.consistency.runner` to run them.
"""

from netmorph.consistency.common import Config
from netmorph.consistency.runner import MODES, SYSTEMS, RunResult, compare, run

__all__ = ["Config", "MODES", "RunResult", "SYSTEMS", "compare", "run"]
