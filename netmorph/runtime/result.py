"""What a launch returns (:func:`netmorph.runtime.launch.launch`, and a torchrun job's
:func:`netmorph.runtime.torchrun.run_in_job`)."""

from __future__ import annotations


class LaunchResult(list):
    """What every launch returns: the ranks' results in rank order (a list), with ``ledger`` (every message,
    with ``ledger=True``; else None) and ``deaths`` (``[(rank, monotonic time)]`` of the ranks an elastic launch
    lost; else []) -- one type whatever the flags."""

    def __init__(self, results, ledger=None, deaths=()):
        super().__init__(results)
        self.ledger, self.deaths = ledger, list(deaths)
