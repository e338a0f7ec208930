"""What torchrun put in this process's environment (no torch import needed to ask).

torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` for every worker it starts; a command that
finds them joins the job instead of forking its own ranks.
"""

from __future__ import annotations

import os

_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def torchrun_world() -> int | None:
    """torchrun's WORLD_SIZE when this process was started by it, else None."""
    if all(k in os.environ for k in _KEYS):
        return int(os.environ["WORLD_SIZE"])
    return None


def torchrun_rank() -> int:
    """This worker's global RANK (0 outside torchrun)."""
    return int(os.environ.get("RANK", "0"))
