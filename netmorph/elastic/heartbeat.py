"""Heartbeats over a store: each worker publishes a counter; a monitor turns fresh counters into arrivals.

Stands in for torchelastic's agent heartbeats (``TORCHELASTIC_...`` keepalives in the
rendezvous store): a worker's :class:`Heartbeat` thread sets ``netmorph/hb/<rank>``
to an increasing counter every ``interval`` seconds; a :class:`Monitor` polls the
keys of its peers every ``interval`` and feeds one detector per peer
(:class:`~netmorph.elastic.detector.PhiAccrual` or
:class:`~netmorph.elastic.detector.FixedTimeout`) with the time it *saw* each new
value. The store is anything with torch's ``set``/``get``/``check``: a ``TCPStore``
across machines, a ``FileStore`` on one. A thread beats for its process, so a
SIGSTOPped process falls silent as a dead one does.

A silent worker is fenced: :func:`fence` SIGKILLs its process (the pid each worker
published with :func:`publish_pid`), so it cannot wake up inside a view that no
longer holds it, and the launcher sees it exit. :class:`Watchdog` does both on its
own, all the time -- torchelastic's agent killing a worker whose keepalives stopped:
every pending call of the survivors then fails as if the worker had died.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

KEY = "netmorph/hb/{}"
DONE = "done"  # a worker's last word: it finished, it is not silent
PID = "netmorph/pid/{}"
HOST = "netmorph/host/{}"
FENCED = "netmorph/fenced/{}"  # seconds the rank had been silent when a watchdog fenced it


def publish_pid(store, rank: int) -> None:
    """Say which process is ``rank``, and on which host (for :func:`fence`)."""
    store.set(HOST.format(rank), socket.gethostname())
    store.set(PID.format(rank), str(os.getpid()))


def fence(store, ranks) -> list:
    """SIGKILL the processes of ``ranks`` (as they published them) that run on this host: a hung worker must not
    wake up inside the new view. A process already gone is left alone; one on another host is fenced by the view
    alone (it is no member of it, and a member that finds itself outside the view stops). Returns the ranks
    killed here."""
    here, killed = socket.gethostname(), []
    for r in ranks:
        try:
            if store.check([HOST.format(r)]) and store.get(HOST.format(r)).decode() != here:
                continue
            os.kill(int(store.get(PID.format(r))), signal.SIGKILL)
            killed.append(r)
        except (ProcessLookupError, ValueError):
            pass
    return killed


class Heartbeat:
    """Publish this rank's heartbeat every ``interval`` seconds until :meth:`stop`."""

    def __init__(self, store, rank: int, interval: float = 0.1):
        self.store, self.rank, self.interval = store, rank, interval
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"netmorph-heartbeat-{rank}", daemon=True)

    def start(self) -> Heartbeat:
        self._beat()
        self._thread.start()
        return self

    def _beat(self) -> None:
        self.count += 1
        self.store.set(KEY.format(self.rank), str(self.count))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._beat()
            except RuntimeError:  # the store is gone: the job is ending
                return

    def stop(self) -> None:
        """Stop beating, and say so (:data:`DONE`): a worker that finished is not a silent one."""
        self._stop.set()
        self._thread.join(2 * self.interval + 1)
        try:
            self.store.set(KEY.format(self.rank), DONE)
        except RuntimeError:
            pass


class Monitor:
    """Watch ``peers``' heartbeats; ``detector()`` makes one detector per peer."""

    def __init__(self, store, peers, detector, interval: float = 0.1, clock=time.monotonic):
        self.store, self.interval, self.clock, self.make = store, interval, clock, detector
        self.detectors, self.seen = {}, {}
        self.add(peers)

    def add(self, peers) -> None:
        """Watch ``peers`` too (workers that joined), each with a fresh detector."""
        for p in peers:
            self.detectors[p], self.seen[p] = self.make(), None

    def forget(self, peers) -> None:
        """Stop watching ``peers`` (they left)."""
        for p in peers:
            self.detectors.pop(p, None)

    def poll(self) -> None:
        """Read every peer's counter once; a changed counter is a heartbeat arriving now. One round trip for all
        (``check`` then ``multi_get``) when every peer has beaten; key by key otherwise (a peer not up yet, a
        restarted lighthouse not yet told again: ``multi_get`` would wait for a missing key)."""
        now = self.clock()
        peers = list(self.detectors)
        keys = [KEY.format(p) for p in peers]
        if keys and self.store.check(keys):
            values = self.store.multi_get(keys)
        else:
            values = [self.store.get(k) if self.store.check([k]) else None for k in keys]
        for p, value in zip(peers, values):
            if value is None:
                continue
            if value == DONE.encode():  # it finished: nothing more to watch
                self.forget([p])
                continue
            if value != self.seen[p]:
                self.seen[p] = value
                self.detectors[p].heartbeat(now)

    def suspects(self) -> list:
        now = self.clock()
        return [p for p, det in self.detectors.items() if det.suspect(now)]

    def watch(self, seconds: float) -> dict:
        """Poll for ``seconds``; the first time each peer was suspected (relative to the start), or None."""
        t0 = self.clock()
        first = {p: None for p in self.detectors}
        while self.clock() - t0 < seconds:
            self.poll()
            for p in self.suspects():
                if first[p] is None:
                    first[p] = self.clock() - t0
            time.sleep(self.interval)
        return first


class Watchdog:
    """A thread that polls ``peers``' heartbeats every ``interval`` and fences (:func:`fence`) each one the detector
    (``detector()`` makes one per peer) suspects, once: a worker stopped mid-step stops beating, is suspected,
    killed, and the fabric's dead flag makes every survivor's pending call raise ``PeerLost``. ``fenced``: rank ->
    seconds it had been silent when this watchdog fenced it; the silence is also written to the store before the
    kill, so :meth:`silence` knows it whichever survivor's watchdog suspected the rank first."""

    def __init__(self, store, peers, detector, interval: float = 0.1, on_suspect=None):
        self.monitor = Monitor(store, peers, detector, interval)
        self.store, self.interval = store, interval
        self.on_suspect = on_suspect  # after the fence: what else a suspicion does (abort a group)
        self.fenced: dict = {}
        self._lock = threading.Lock()  # forget() comes from the rank's own thread
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="netmorph-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                with self._lock:
                    self.monitor.poll()
                    now = self.monitor.clock()
                    for p in self.monitor.suspects():
                        if p not in self.fenced:
                            self.fenced[p] = now - self.monitor.detectors[p].last
                            self.store.set(FENCED.format(p), repr(self.fenced[p]))
                            fence(self.store, [p])
                            if self.on_suspect is not None:
                                self.on_suspect(p)
            except RuntimeError:  # the store is gone: the job is ending
                return

    def silence(self, ranks) -> dict:
        """rank -> seconds it had been silent when fenced, for each of ``ranks`` some watchdog fenced (this one's
        own figure first, else the one the fencing watchdog wrote to the store)."""
        out = {}
        for r in ranks:
            if r in self.fenced:
                out[r] = self.fenced[r]
            elif self.store.check([FENCED.format(r)]):
                out[r] = float(self.store.get(FENCED.format(r)))
        return out

    def silent_for(self, rank: int) -> float | None:
        """Seconds since ``rank``'s heartbeat counter last moved, as this watchdog read it; None if it does not
        watch ``rank`` or has seen no beat from it yet."""
        with self._lock:
            det = self.monitor.detectors.get(rank)
            last = None if det is None else det.last
            return None if last is None else self.monitor.clock() - last

    def forget(self, ranks) -> None:
        """Stop watching ``ranks`` (they left the view)."""
        with self._lock:
            self.monitor.forget(ranks)

    def add(self, ranks) -> None:
        """Watch ``ranks`` (they joined the view, already beating); a rank fenced before may be fenced again."""
        with self._lock:
            self.monitor.add(ranks)
            for r in ranks:
                self.fenced.pop(r, None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2 * self.interval + 1)
