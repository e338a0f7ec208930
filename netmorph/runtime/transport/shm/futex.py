"""Sleeping in the kernel on a word of the shared mapping: Linux ``futex(2)``.

A waiting rank sleeps on its doorbell word instead of spinning, which is what lets
4 ranks share 2 cores without thrashing (NCCL's proxy threads block the same way).
:meth:`Futex.make` returns None where futexes are unavailable; waiters then poll
with ``sched_yield`` and short sleeps.
"""

from __future__ import annotations

import ctypes
import platform
import sys

FUTEX_WAIT, FUTEX_WAKE = 0, 1


class Futex:
    _NR = {"x86_64": 202, "aarch64": 98, "arm64": 98}  # the futex syscall number

    def __init__(self):
        self.nr = self._NR.get(platform.machine())
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long

    @classmethod
    def make(cls) -> Futex | None:
        if not sys.platform.startswith("linux") or platform.machine() not in cls._NR:
            return None
        try:
            return cls()
        except OSError:
            return None

    def wait(self, addr: int, expected: int, seconds: float) -> None:
        """Sleep while the int32 at ``addr`` still equals ``expected``, at most ``seconds``."""
        ts = (ctypes.c_long * 2)(int(seconds), int((seconds % 1) * 1e9))
        self.libc.syscall(self.nr, ctypes.c_void_p(addr), FUTEX_WAIT, ctypes.c_int(expected), ctypes.byref(ts), None, 0)

    def wake(self, addr: int) -> None:
        """Wake every sleeper on ``addr``."""
        self.libc.syscall(self.nr, ctypes.c_void_p(addr), FUTEX_WAKE, ctypes.c_int(1 << 30), None, None, 0)
