"""The progress engine of the local fabric: per-peer FIFOs, waiting, sleeping and blame.

One engine per rank serves collectives and point-to-point alike (NCCL's proxy
thread plays this part for network sends): streams queue per peer in posting
order, and every call advances the head stream of each queue, so ``isend``/``recv``
pairs never deadlock on full slots.

Waiting spins briefly, then sleeps on the rank's doorbell (a futex) until a peer
rings it, re-checking first so no ring is missed. Every wait checks the abort
word the launcher sets when a rank dies (-> :class:`PeerLost` naming it) and a
deadline since the last progress (-> :class:`PeerTimeout` naming the silent peer).
"""

from __future__ import annotations

import os
import time
from collections import deque

from netmorph.runtime.transport.errors import PeerLost, PeerTimeout
from netmorph.runtime.transport.fingerprint import CollectiveMismatch, compare_window, same_call
from netmorph.runtime.transport.shm.channel import InStream, OutStream
from netmorph.runtime.transport.shm.mapping import address


class ProgressEngine:
    def __init__(self, fabric, rank: int, timeout: float, channels, clock, arena_range):
        self.f, self.rank, self.timeout = fabric, rank, timeout
        self.channels, self.clock = channels, clock
        self.arena_range = arena_range        # descriptors for sends from our registered arena
        self.outq: dict[int, deque] = {}      # peer -> deque[OutStream]
        self.inq: dict[int, deque] = {}       # peer -> deque[InStream]
        self.ppid = os.getppid()
        # more ranks than cores: a waiting rank must hand its core over at once, not spin
        self.spins = 64 if fabric.world <= (os.cpu_count() or 1) else 2
        self.bell = address(fabric.doorbell[rank:rank + 1])
        self.failed = None                    # the error that broke this rank's fabric: raised again on every call
        self.acked_deaths = 0                 # elastic: deaths this rank has already re-formed around

    def enqueue(self, sends, recvs, fp=None) -> list:
        """Queue ``[(peer, [views])]`` sends and ``[(peer, [views], [reduce?])]`` receives, each
        message under the fingerprint ``fp`` (None: no header); the live streams."""
        if self.failed is not None:
            raise self.failed
        outs, ins = [], []
        for peer, views in sends:
            st = OutStream(peer, views, self.arena_range, fp)
            if not st.done:
                self.outq.setdefault(peer, deque()).append(st)
                outs.append(st)
        for peer, views, flags in recvs:
            st = InStream(peer, views, flags, fp)
            if not st.done:
                self.inq.setdefault(peer, deque()).append(st)
                ins.append(st)
        return outs + ins

    def progress(self, pull: bool = True) -> bool:
        if self.failed is not None:
            raise self.failed
        try:
            moved = _drain(self.outq, self.channels.push)
            if pull:
                moved |= _drain(self.inq, self.channels.pull)
        except CollectiveMismatch as e:
            self.failed = e
            raise
        return moved

    def wait_for(self, streams, ready=None, pull: bool = True, blame=None) -> None:
        """Progress until every stream is done (or ``ready()`` holds), or fail naming the peer
        (``blame``: (rank, what) to name when no stream is in flight).

        A failure is final: the queues may hold half-moved messages, so every later call
        raises the same error instead of reading stale state.
        """
        if self.failed is not None:
            raise self.failed
        try:
            self._wait(streams, ready, pull, blame)
        except (PeerLost, PeerTimeout, CollectiveMismatch) as e:
            self.failed = e
            raise

    def _wait(self, streams, ready, pull, blame) -> None:
        spins = 0
        last = time.perf_counter()
        while True:
            if self.progress(pull):
                spins = 0
                last = time.perf_counter()
            if ready() if ready is not None else all(s.done for s in streams):
                return
            spins += 1
            if spins < self.spins:
                continue
            self._check()
            idle = time.perf_counter() - last
            if idle > self.timeout:
                peer, what = _blame(streams) if blame is None else blame
                self._compare_calls(streams, peer)
                raise PeerTimeout(peer, self.timeout, what)
            self._sleep(idle, pull)

    def reform(self, epoch: int) -> None:
        """Elastic: forget every queued stream (of the collective that failed), acknowledge the deaths
        so far and move to epoch ``epoch``'s fresh channels. Stale pieces stay in the old ones."""
        self.outq.clear()
        self.inq.clear()
        self.failed = None
        self.acked_deaths = self.f.deaths
        self.f.set_epoch(epoch)

    def _check(self) -> None:
        m = self.f.mismatch
        if m is not None:
            raise CollectiveMismatch(*m)
        lost = self.f.aborted
        if lost is not None:
            raise PeerLost(lost, "it exited or raised")
        if self.f.deaths > self.acked_deaths:          # elastic: a member died; re-form to go on
            dead = [r for r in range(self.f.world) if self.f.dead[r]]
            raise PeerLost(dead[-1], f"it died; dead so far: {dead} (elastic: agree on a new view and re-form)")
        if os.getppid() != self.ppid:
            raise PeerLost(-1, "the launcher exited")

    def _compare_calls(self, streams, peer: int) -> None:
        """At a timeout: post the call we are in and, if the peer we waited for posts a different
        one within :func:`compare_window` (it timed out waiting too), raise the mismatch -- a deadlock of ranks
        that disagree, not a hung peer."""
        fp = next((s.fp for s in streams if not s.done and s.fp is not None), None)
        if fp is None or peer < 0:
            return
        f = self.f
        f.post_call(self.rank, fp)
        deadline = time.perf_counter() + compare_window(self.timeout)
        while time.perf_counter() < deadline:
            theirs = f.call_of(peer)
            if theirs is not None:
                if same_call(fp, theirs):
                    return
                err = CollectiveMismatch(self.rank, peer, fp, theirs, sent=False)
                f.report_mismatch(err)
                raise err
            if f.mismatch is not None:
                raise CollectiveMismatch(*f.mismatch)
            time.sleep(0.01)

    def _sleep(self, idle: float, pull: bool) -> None:
        """Block until a peer rings our doorbell (futex), re-checking first to never miss a ring."""
        f = self.f
        if f.futex is None:
            if idle < 50e-3:
                os.sched_yield()
            else:
                time.sleep(min(5e-4, idle / 20))
            return
        me = self.rank
        seen = int(f.doorbell[me])
        f.sleeping[me] = 1
        try:
            if self.progress(pull) or f.hdr[0] or f.deaths > self.acked_deaths:
                return
            nap = self.clock.nap(0.05)        # emulated links: the next piece shows by the clock, not a ring
            if nap > 0:
                f.futex.wait(self.bell, seen, nap)
        finally:
            f.sleeping[me] = 0


def _drain(queues, step) -> bool:
    """Advance the head stream of every per-peer FIFO, popping those that finish."""
    moved = False
    for q in queues.values():
        while q:
            moved |= step(q[0])
            if not q[0].done:
                break
            q.popleft()
    return moved


def _blame(streams):
    """The peer of the first unfinished stream, and what we were waiting for from it."""
    for s in streams:
        if not s.done:
            return s.peer, ("no data arrived" if isinstance(s, InStream) else "its receive slots stayed full")
    return -1, "nothing in flight"
