"""Index arithmetic on (offset, length) segments, shared by the validator, the oracle and the counter."""

from __future__ import annotations

import numpy as np


def expand_ranges(offs: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenate ``arange(o, o + l)`` for every (o, l) pair, vectorised."""
    lens = np.asarray(lens, dtype=np.int64)
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.cumsum(lens) - lens
    return np.repeat(np.asarray(offs, dtype=np.int64) - starts, lens) + np.arange(total, dtype=np.int64)
