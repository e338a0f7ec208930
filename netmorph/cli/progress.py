"""Progress of a long command, on stderr: a rich bar at a terminal, plain lines everywhere else.

``make demo 2>&1 | tee log``, CI and a job scheduler's log file are not terminals; a bar
drawn there is either nothing (rich disables itself) or a stream of control codes. So off a
terminal a line is printed at least every :data:`EVERY` seconds while a task runs, and one
when a task so reported ends, so a reader (or a watchdog) of the log always sees the
command alive; a command done sooner prints nothing (an error stays the one line)::

    netmorph tour: train: DP, ZeRO, TP and PP on real ranks: 1/3 (20 s)
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager

EVERY = 10.0  # seconds between plain progress lines at most


class Bar:
    """``with Bar("train", unit="steps") as bar, bar.task("training", 10) as t: bar.update(t, completed=3)``.
    ``total`` None: a task of unknown length (a spinner at a terminal, elapsed time in the lines)."""

    def __init__(
        self,
        command: str,
        unit: str = "",
        transient: bool = True,
        every: float = EVERY,
        tty: bool | None = None,
        width: int = 0,
    ):
        self.command, self.unit, self.transient, self.every = command, unit, transient, every
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.width = width
        self.tasks: dict[int, list] = {}  # id -> [label, done, total, started, finished, reported]
        self.lock = threading.Lock()
        self.last_line = time.monotonic()
        self.rich = None
        self.stop = threading.Event()
        self.thread = None

    # ------------------------------------------------------------------ context
    def __enter__(self):
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            unit = f" {self.unit}" if self.unit else ""
            self.rich = Progress(
                SpinnerColumn(),
                TextColumn(f"{{task.description:<{self.width}}}"),
                BarColumn(),
                TextColumn(f"{{task.completed}}/{{task.total}}{unit}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=self.transient,
            )
            self.rich.__enter__()
        else:
            self.thread = threading.Thread(target=self._tick, daemon=True, name="netmorph-progress")
            self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.rich is not None:
            self.rich.__exit__(*exc)
        self.stop.set()
        if self.thread is not None:
            self.thread.join(1.0)
        return False

    # ------------------------------------------------------------------ tasks
    def add(self, label: str, total: int | None = None) -> int:
        if self.rich is not None:
            return self.rich.add_task(label, total=total)
        with self.lock:
            tid = len(self.tasks)
            self.tasks[tid] = [label, 0, total, time.monotonic(), False, False]
        return tid

    def update(self, task: int, completed: int | None = None, advance: int = 0) -> None:
        if self.rich is not None:
            if completed is not None:
                self.rich.update(task, completed=completed)
            if advance:
                self.rich.advance(task, advance)
            return
        with self.lock:
            t = self.tasks[task]
            t[1] = completed if completed is not None else t[1] + advance
            done = t[2] is not None and t[1] >= t[2] and not t[4]
            if done:
                t[4] = True
            done = done and t[5]
        if done:
            self._line(task, "done")

    def finish(self, task: int) -> None:
        """The task ended (a task without a total, or one that stopped short of it)."""
        if self.rich is not None:
            t = self.rich.tasks[task] if task < len(self.rich.tasks) else None
            if t is not None and t.total is not None:
                self.rich.update(task, completed=t.total)
            return
        with self.lock:
            t = self.tasks[task]
            already, t[4] = t[4], True
            if t[2] is not None:
                t[1] = t[2]
        if not already and t[5]:
            self._line(task, "done")

    @contextmanager
    def task(self, label: str, total: int | None = None):
        """``with bar.task("serving", 40) as t:`` -- a task for the block, finished when it ends without
        an error (one that raises is not reported done)."""
        tid = self.add(label, total)
        yield tid
        self.finish(tid)

    # ------------------------------------------------------------------ plain lines
    def _text(self, tid: int, tail: str = "") -> str:
        label, done, total, started, *_ = self.tasks[tid]
        count = f" {done}/{total}{' ' + self.unit if self.unit else ''}" if total is not None else ""
        return f"netmorph {self.command}: {label}:{count} ({time.monotonic() - started:.0f} s){tail}"

    def _line(self, tid: int, state: str = "") -> None:
        with self.lock:
            text = self._text(tid, f" {state}" if state else "")
            self.tasks[tid][5] = True
            self.last_line = time.monotonic()
        print(text, file=sys.stderr, flush=True)

    def _tick(self) -> None:
        while not self.stop.wait(min(1.0, self.every)):
            if time.monotonic() - self.last_line < self.every:
                continue
            with self.lock:
                running = [tid for tid, t in self.tasks.items() if not t[4]]
            if running:
                self._line(running[-1])
            else:
                with self.lock:
                    self.last_line = time.monotonic()
                print(f"netmorph {self.command}: working", file=sys.stderr, flush=True)
