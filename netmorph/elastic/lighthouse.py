"""The lighthouse: the store every node's members agree through, and a member's connection that survives it.

Stands in for torchft's lighthouse (``torchft_lighthouse``: the quorum server its replica groups' Managers
heartbeat to) with netmorph's own membership on top (:mod:`netmorph.elastic.membership`: epoch-numbered views
agreed by ``compare_set``, heartbeats, join announcements). The server is torch's ``TCPStore`` (``netmorph
lighthouse --port P``); it keeps nothing a member cannot give back. A member talks to it through
:class:`LighthouseStore`, which reconnects when the server is gone (a restarted lighthouse, or one on another
host after a failover) and re-publishes what this member knows -- its process, the views it agreed, its
announcement -- so a lighthouse restarted mid-run is re-derived from the members, and loses nothing: better than a
quorum server that is a single point of failure.
"""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time

from netmorph.errors import UsageError

# what a member writes back after a reconnection: its own records, and the views every member agreed
OWNED = (
    "netmorph/pid/",
    "netmorph/host/",
    "netmorph/hb/",
    "netmorph/join/",
    "netmorph/progress/",
    "netmorph/result/",
    "netmorph/killed/",
    "netmorph/hung/",
)
SHARED = ("netmorph/view/",)
# the job's exit code, set by the worker that printed its result (the final view's rank 0) once it has: what
# netmorph launch exits with, wherever that worker ran (re-published: under "netmorph/result/")
EXIT = "netmorph/result/exit"
_NETWORK_ERRORS = ("Connection", "connect", "recv", "send", "Broken pipe", "closed", "reset", "refused")


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); UsageError naming ``lighthouse`` otherwise."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UsageError(f"{{lighthouse}} must be HOST:PORT with a port in 1..65535, got {text!r}", "lighthouse")
    return host, int(port)


def listen(port: int, host: str = "0.0.0.0"):
    """The lighthouse's store listening on ``port``: torch's TCPStore server, served by its own thread in this
    process for as long as the returned object lives. A port that cannot be listened on is a UsageError."""
    import torch.distributed as dist

    try:
        return dist.TCPStore(host, port, None, True, datetime.timedelta(seconds=30), False)
    except RuntimeError as e:  # the port is taken: one line, exit 2
        raise UsageError(f"{{port}} {port} cannot be listened on: {str(e).splitlines()[0][:160]}", "port") from None


def serve(port: int, host: str = "0.0.0.0", ready=None, stop: threading.Event | None = None) -> None:
    """Run the lighthouse's store on ``port`` until SIGTERM or SIGINT (or ``stop``) (:func:`listen`).
    ``ready()`` is called once it listens."""
    server = listen(port, host)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    if ready is not None:
        ready()
    try:
        while not stop.wait(0.2):
            pass
    finally:
        del server


class LighthouseStore:
    """A member's connection to the lighthouse: torch's store methods (``set``, ``get``, ``check``, ``add``,
    ``compare_set``), retried over a fresh connection when the server went away, until ``timeout`` seconds
    without one. After a reconnection :meth:`republish`'s records are written back (``compare_set`` where every
    member writes the same, so the first write wins and the rest agree)."""

    def __init__(self, host: str, port: int, timeout: float = 60.0):
        self.host, self.port, self.timeout = host, port, timeout
        self.lock = threading.RLock()
        self.owned: dict[str, str] = {}  # what this member re-publishes: key -> value (set)
        self.shared: dict[str, str] = {}  # what every member agrees on: key -> value (compare_set)
        self.reconnects = 0
        self.raw = self._connect()

    def _connect(self):
        import torch.distributed as dist

        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return dist.TCPStore(self.host, self.port, None, False, datetime.timedelta(seconds=self.timeout))
            except RuntimeError as e:
                if time.monotonic() > deadline:
                    raise ConnectionError(
                        f"no lighthouse at {self.host}:{self.port} within {self.timeout:g} s: "
                        f"{str(e).splitlines()[0][:120]}"
                    ) from None
                time.sleep(0.1)

    def _call(self, name: str, *args):
        with self.lock:
            for attempt in range(2):
                try:
                    return getattr(self.raw, name)(*args)
                except RuntimeError as e:  # DistNetworkError is a RuntimeError
                    if attempt or not any(w in str(e) for w in _NETWORK_ERRORS):
                        raise
                    self.raw = self._connect()
                    self.reconnects += 1
                    self._replay()

    def _replay(self) -> None:
        for k, v in self.owned.items():
            self.raw.set(k, v)
        for k, v in self.shared.items():
            self.raw.compare_set(k, "", v)

    def republish(self, key: str, value: str, shared: bool = False) -> None:
        """Remember ``key`` to write back after a reconnection (``shared``: every member holds the same)."""
        with self.lock:
            (self.shared if shared else self.owned)[key] = value

    # torch's Store interface, as the membership code calls it
    def set(self, key, value):
        if str(key).startswith(OWNED):
            self.republish(key, value)
        return self._call("set", key, value)

    def get(self, key):
        return self._call("get", key)

    def check(self, keys):
        return self._call("check", keys)

    def multi_get(self, keys):
        return self._call("multi_get", keys)

    def add(self, key, n):
        return self._call("add", key, n)

    def compare_set(self, key, expected, desired):
        got = self._call("compare_set", key, expected, desired)
        if str(key).startswith(SHARED):  # an agreed view: the stored one, whoever wrote it
            self.republish(key, got.decode() if isinstance(got, bytes) else got, shared=True)
        return got

    def delete_key(self, key):
        return self._call("delete_key", key)


def lighthouse_from_env() -> str | None:
    """``NETMORPH_LIGHTHOUSE`` (what ``netmorph launch`` sets for its jobs), or None."""
    return os.environ.get("NETMORPH_LIGHTHOUSE") or None
