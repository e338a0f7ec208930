"""A progress counter the ranks bump and the launcher reads, in anonymous shared memory.

Made before the ranks fork, so every rank and the launcher map the same int64 per
rank without a message: workers count their steps, a thread in the launcher draws
the progress bar from the sum (what torchrun's agent cannot do without a store).
"""

from __future__ import annotations

import mmap
import threading
from contextlib import contextmanager

import numpy as np


class ProgressCounter:
    """An int64 per rank in anonymous shared memory, made before the ranks fork: workers count
    their steps, the launcher's thread draws a progress bar from the sum."""

    def __init__(self, n: int):
        self.mem = mmap.mmap(-1, max(8, 8 * n))
        self.arr = np.frombuffer(self.mem, np.int64, n)

    def bump(self, rank: int) -> None:
        if rank < len(self.arr):
            self.arr[rank] += 1

    def total(self) -> int:
        return int(self.arr.sum())

    def slowest(self) -> int:
        return int(self.arr.min())

    @contextmanager
    def watch(self, on_progress, done, total: int, every: float = 0.1):
        """While the block runs, call ``on_progress(done(self), total)`` every ``every`` seconds
        from a thread of the launcher (nothing when ``on_progress`` is None)."""
        stop = threading.Event()
        if on_progress is not None:

            def poll():
                while not stop.wait(every):
                    on_progress(min(done(self), total), total)

            threading.Thread(target=poll, daemon=True).start()
        try:
            yield self
        finally:
            stop.set()
