"""The progress engine of the local fabric: per-peer FIFOs, waiting, sleeping and blame.

One engine per rank serves collectives and point-to-point alike (NCCL's proxy
thread plays this part for network sends): streams queue per peer in posting
order, and every call advances the head stream of each queue, so ``isend``/``recv``
pairs never deadlock on full slots.

Waiting spins briefly, then sleeps on the rank's doorbell (a futex) until a peer
rings it, re-checking first so no ring is missed. Every wait checks the abort
word the launcher sets when a rank dies (-> :class:`PeerLost` naming it) and a
deadline since the last progress. Before it sleeps a rank writes on the mapping's
wait board which call it is in and which peer it waits for; at the deadline it
walks that board (:mod:`netmorph.runtime.transport.blame`) to name the rank the
chain ends at (-> :class:`PeerTimeout`), two ranks that disagree on a call (->
:class:`CollectiveMismatch`) or a cycle (-> :class:`Deadlock`).

Messages nobody received: as it goes to sleep a rank also looks at the head of
each idle inbound channel; a message there from a call of a group it has already
moved past was never received -- the peer was in a different call (ranks that each
``broadcast(x, src=own rank)`` only send) -- and is a :class:`CollectiveMismatch`
at once, not after the timeout. The launcher looks the same way at every channel
when all ranks have returned (:meth:`ProgressEngine.trail` names their calls).
"""

from __future__ import annotations

import os
import time
from collections import deque

from netmorph.runtime.transport import blame
from netmorph.runtime.transport.blame import Deadlock, Waiting
from netmorph.runtime.transport.errors import PeerLost, PeerTimeout
from netmorph.runtime.transport.fingerprint import CollectiveMismatch, same_call, slot
from netmorph.runtime.transport.shm.channel import InStream, OutStream
from netmorph.runtime.transport.shm.mapping import FAILED, IDLE, RETURNED, WAITING, address

TRAIL = 16  # calls remembered per group, to name a call a peer's message was from


class ProgressEngine:
    def __init__(self, fabric, rank: int, timeout: float, channels, clock, arena_range):
        self.f, self.rank, self.timeout = fabric, rank, timeout
        self.channels, self.clock = channels, clock
        self.arena_range = arena_range  # descriptors for sends from our registered arena
        self.outq: dict[int, deque] = {}  # peer -> deque[OutStream]
        self.inq: dict[int, deque] = {}  # peer -> deque[InStream]
        self.ppid = os.getppid()
        # more ranks than cores: a waiting rank must hand its core over at once, not spin
        self.spins = 64 if fabric.world <= (os.cpu_count() or 1) else 2
        self.bell = address(fabric.doorbell[rank : rank + 1])
        self.failed = None  # the error that broke this rank's fabric: raised again on every call
        self.acked_deaths = 0  # elastic: deaths this rank has already re-formed around
        self.trail: dict[tuple, dict] = {}  # fingerprint.slot -> {call index: fingerprint}, the last TRAIL
        self._last_fp = None
        fabric.set_state(rank, IDLE, os.getpid())

    def enqueue(self, sends, recvs, fp=None) -> list:
        """Queue ``[(peer, [views])]`` sends and ``[(peer, [views], [reduce?])]`` receives, each
        message under the fingerprint ``fp`` (None: no header); the live streams."""
        if self.failed is not None:
            raise self.failed
        if fp is not None and fp is not self._last_fp:
            self._remember(fp)
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
            self._break(e)
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
        except (PeerLost, PeerTimeout, CollectiveMismatch, Deadlock) as e:
            self._break(e)
            raise

    def _wait(self, streams, ready, pull, blame_as) -> None:
        spins = 0
        last = time.perf_counter()
        on_board = fresh = False  # our row on the wait board: written at all, and up to date
        try:
            while True:
                if self.progress(pull):
                    spins = 0
                    last = time.perf_counter()
                    fresh = False  # what we wait for may have changed
                if ready() if ready is not None else all(s.done for s in streams):
                    return
                spins += 1
                if spins < self.spins:
                    continue
                if not fresh:  # going to sleep: say on the board what we wait for
                    self.f.post_wait(self.rank, *self._waiting(streams, blame_as))
                    on_board = fresh = True
                    self._unreceived()
                self._check()
                idle = time.perf_counter() - last
                if idle > self.timeout:
                    raise self._diagnose(streams, blame_as)
                self._sleep(idle, pull)
        except BaseException:
            if on_board:  # failed while waiting: not silent, and whom it waited for
                self.f.set_state(self.rank, FAILED)  # stays readable for the chain
                on_board = False
            raise
        finally:
            if on_board:
                self.f.set_state(self.rank, IDLE)

    def _waiting(self, streams, blame_as):
        """(peer, what, fingerprint) of the first unfinished stream: what this rank waits for."""
        for st in streams:
            if not st.done:
                return st.peer, 0 if isinstance(st, InStream) else 1, st.fp
        if blame_as is not None:
            return blame_as[0], 2, None
        return -1, 0, None

    def _diagnose(self, streams, blame_as):
        """The error for a wait that timed out: walk the wait board from the peer we waited for."""
        peer, what, fp = self._waiting(streams, blame_as)
        if peer < 0 and blame_as is not None:
            return PeerTimeout(-1, self.timeout, blame_as[1])
        f = self.f

        def wait_of(r):
            state, p, w, theirs, _ = f.wait_of(r)
            return Waiting(theirs, p, w) if state in (WAITING, FAILED) else None

        def state_of(r):
            state, *_, pid = f.wait_of(r)
            if state == RETURNED:
                return "returned"
            return blame.process_state(pid) or ("gone" if pid > 0 and blame.process_state(os.getpid()) else "")

        def stopped():
            return [r for r in range(f.world) if blame.process_state(f.wait_of(r)[4]) in ("T", "t")]

        err = blame.walk(
            self.rank,
            Waiting(fp, peer, what),
            self.timeout,
            wait_of,
            state_of,
            settle=min(0.5, self.timeout / 4),
            stopped=stopped,
        )
        if isinstance(err, CollectiveMismatch):
            f.report_mismatch(err)
        return err

    def _remember(self, fp) -> None:
        self._last_fp = fp
        calls = self.trail.setdefault(slot(fp), {})
        calls[int(fp[1])] = fp.copy()
        if len(calls) > TRAIL:
            del calls[min(calls)]

    def _unreceived(self) -> None:
        """A message at the head of an idle inbound channel from a call of a group this rank has already
        moved past was never received by it: raise the mismatch now (it would otherwise only end in a
        timeout, or in silence when nobody waits)."""
        f = self.f
        for src in range(f.world):
            if src == self.rank or self.inq.get(src):
                continue
            head = self.channels.peek_header(src)
            if head is None:
                continue
            calls = self.trail.get(slot(head))
            if not calls or max(calls) <= head[1]:
                continue  # a call we have not reached yet: it will be received
            mine = calls.get(int(head[1]))
            if mine is not None and same_call(mine, head):
                continue
            err = CollectiveMismatch(self.rank, src, mine, head, sent=True)
            f.report_mismatch(err)
            self._break(err)
            raise err

    def reform(self, epoch: int) -> None:
        """Elastic: forget every queued stream (of the collective that failed), acknowledge the deaths
        so far and move to epoch ``epoch``'s fresh channels. Stale pieces stay in the old ones."""
        self.outq.clear()
        self.inq.clear()
        # the calls made so far were on the old channels: a group re-formed on the same ranks (the survivors of a
        # lost node can be one of its old groups) counts its calls from 1 again, and must not be matched against them
        self.trail.clear()
        self.failed = None
        # every death marked so far: the launcher sets a rank's dead flag before it counts the event, so a rank
        # that saw the flag (and re-forms without it) must not take the count's late increment for a new death
        self.acked_deaths = max(self.f.deaths, int((self.f.dead != 0).sum()))
        self.f.set_epoch(epoch)

    def _check(self) -> None:
        m = self.f.mismatch
        if m is not None:
            raise CollectiveMismatch(*m)
        lost = self.f.aborted
        if lost is not None:
            raise PeerLost(
                lost, "it stopped answering; the launcher ended it" if self.f.aborted_silent else "it exited or raised"
            )
        if self.f.deaths > self.acked_deaths:  # elastic: a member died; re-form to go on
            dead = [r for r in range(self.f.world) if self.f.dead[r]]
            raise PeerLost(dead[-1], f"it died; dead so far: {dead} (elastic: agree on a new view and re-form)")
        if os.getppid() != self.ppid:
            raise PeerLost(-1, "the launcher exited")

    def _break(self, err) -> None:
        """This rank's fabric failed: every later call raises ``err``, and the launcher knows that
        messages left in the channels are the failed calls' pieces, not sends nobody received."""
        self.failed = err
        self.f.hdr[27] = 1

    def finish(self) -> None:
        """This rank's function returned: peers that wait for it find it on the board as returned."""
        self.f.set_state(self.rank, RETURNED)

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
            nap = self.clock.nap(0.05)  # emulated links: the next piece shows by the clock, not a ring
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
