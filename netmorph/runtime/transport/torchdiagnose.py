"""What went wrong under a torch.distributed call, told from what gloo and NCCL report and what the peers posted.

gloo says little when a call fails: "Connection closed by peer", "Timed out". :class:`Diagnosis` turns that into
netmorph's errors, as NCCL's flight recorder and torch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` collective checks do
for a production job: a closed connection is :class:`PeerLost` of the root cause, found by following the failure
records each rank posts in the job's store (the dead node's rank rather than a healthy neighbour that gave up
first); a timeout walks the wait-for chain every rank on it posts (:mod:`~netmorph.runtime.transport.blame`)
to the rank that hung, a deadlock, or a :class:`CollectiveMismatch` a peer published, which every rank then
raises. :class:`~netmorph.runtime.transport.torchdist.TorchTransport` is one.
"""

from __future__ import annotations

import json
import os
import re
import time

from netmorph.runtime.transport import PeerLost, PeerTimeout, blame
from netmorph.runtime.transport import fingerprint as fpr
from netmorph.runtime.transport.errors import gloo_text as _text
from netmorph.runtime.transport.errors import torch_mismatch_text as _torch_mismatch

_MISMATCH_KEY = "netmorph/collective-mismatch"
# how long a rank that timed out waits for each rank on its wait-for chain to post what it waits for
WALK_WINDOW = 0.6
# how long a rank whose collective lost an unnamed peer waits for a member to stop beating (Diagnosis.stopped)
STOP_WINDOW = 1.0


def _same_host() -> bool:
    """Every rank on this host (a local launch, or torchrun on one node): a peer's pid means something
    in this host's /proc."""
    return os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE")) == os.environ.get("WORLD_SIZE")


class Diagnosis:
    """A torch transport's failure diagnosis: needs ``rank``, ``timeout``, ``group`` (its ``store()`` and
    ``abort()``), ``current`` and ``current_what`` (the call in flight), and keeps the first failure in
    ``failed``. ``stopped(rank)``, where a cluster sets it, says a peer has stopped beating: the walk then stops
    waiting for it to post what it waits for (a dead peer never does)."""

    stopped = None

    def failure(self, peer: int, e: BaseException):
        """The netmorph error for a torch.distributed error while talking to ``peer`` (-1: unknown)."""
        text = _text(e)
        published = self._published_mismatch()
        if published is not None:
            err = published
        elif getattr(self.group, "aborted", False):
            # this epoch's group was aborted under us (a watchdog suspected a member, or a peer failed first):
            # every connection is closed, so two healthy peers in one call see each other go -- not a deadlock
            root = self._root_of(peer)
            err = PeerLost(
                root,
                f"torch.distributed: {text}; the membership epoch's group was aborted"
                + (f" (rank {peer} failed because it lost rank {root})" if root != peer else ""),
            )
        elif "Detected mismatch between collectives" in text:  # TORCH_DISTRIBUTED_DEBUG=DETAIL
            err = fpr.CollectiveMismatch(self.rank, -1, None, None, text=_torch_mismatch(str(e)))
        elif "Timed out" in text or "timed out" in text:
            err = self._walk(peer, WALK_WINDOW)
        else:
            # gloo closes the connection of an op that timed out: the peer that timed out may be
            # posting the (different) call it was in right now
            err = self._walk(peer, 0.5, only_mismatch=True)
            if err is None:
                root = self._root_of(peer if peer >= 0 else self._stopped_member(STOP_WINDOW))
                via = f"; rank {peer} failed because it lost rank {root}" if root != peer else ""
                err = PeerLost(root, f"torch.distributed: {text}{via}")
        if err is None:
            seconds = float(m.group(1)) / 1000 if (m := re.search(r"(\d+)ms", text)) else self.timeout
            err = PeerTimeout(
                peer,
                seconds,
                f"torch.distributed: {text}"
                if peer >= 0
                else f"torch.distributed: {text} (torch does not say which peer)",
            )
        self.failed = err
        self._post_failure(err)
        self.group.abort()  # an epoch's group: every peer blocked on us fails now, not later
        return err

    def _stopped_member(self, window: float) -> int:
        """Which peer a collective lost when torch does not say (its own collectives name no peer): the member of
        this epoch's group that has stopped beating, waited for up to ``window`` seconds (a dead peer's silence
        reaches the threshold a moment after its connections close); -1 when none does, or nothing says."""
        members = [m for m in getattr(self.group, "members", ()) if m != self.rank]
        if self.stopped is None or not members:
            return -1
        deadline = time.monotonic() + window
        while True:
            for m in members:
                if self.stopped(m):
                    return m
            if time.monotonic() >= deadline:
                return -1
            time.sleep(0.01)

    def _post_failure(self, err) -> None:
        """Say in the store whom this rank lost, so a rank that then loses *us* can name the root:
        across nodes, the dead node's ranks rather than a healthy neighbour that gave up first."""
        store = self._store()
        try:
            if store is not None:
                store.set(f"netmorph/failed/{self.rank}", json.dumps([type(err).__name__, err.rank]))
        except RuntimeError:
            pass

    def _root_of(self, peer: int) -> int:
        """Follow the failure records from ``peer``: a rank that only lost a peer points at it; the end
        of the chain is a rank that died without a word (killed, its node gone) -- the root cause."""
        store = self._store()
        seen = {self.rank}
        try:
            while store is not None and peer >= 0 and peer not in seen:
                seen.add(peer)
                if not store.check([f"netmorph/failed/{peer}"]):
                    break
                kind, blamed = json.loads(store.get(f"netmorph/failed/{peer}"))
                if kind not in ("PeerLost", "PeerTimeout") or blamed < 0 or blamed in seen:
                    break
                peer = blamed
        except (RuntimeError, ValueError):
            pass
        return peer

    def _publish(self, e: fpr.CollectiveMismatch) -> None:
        store = self._store()
        if store is None:
            return
        try:
            store.set(
                _MISMATCH_KEY,
                json.dumps(
                    [e.receiver, e.sender, None if e.mine is None else e.mine.tolist(), e.theirs.tolist(), e.sent]
                ),
            )
        except RuntimeError:
            pass

    def _walk(self, peer: int, window: float, only_mismatch: bool = False):
        """At a timeout: post what this rank waits for to the store and walk the wait-for chain from
        ``peer`` (:mod:`netmorph.runtime.transport.blame`), giving each rank on it ``window`` seconds
        to post its own (it times out too, a little later if it entered its call later). The error
        to raise, or None (no store, nothing to walk; with ``only_mismatch``, anything but a mismatch
        or a deadlock)."""
        store = self._store()
        if store is None or peer < 0:
            return None
        try:
            fp = None if self.current is None else self.current.tolist()
            store.set(f"netmorph/wait/{self.rank}", json.dumps([peer, fp, os.getpid(), self.current_what]))
        except RuntimeError:
            return None
        deadline = time.monotonic() + window
        posted = {}

        def read(r):
            if r not in posted:
                try:
                    while True:
                        if store.check([f"netmorph/wait/{r}"]):
                            posted[r] = json.loads(store.get(f"netmorph/wait/{r}"))
                            break
                        if time.monotonic() >= deadline or (self.stopped is not None and self.stopped(r)):
                            posted[r] = None
                            break
                        time.sleep(0.01)
                except (RuntimeError, ValueError):
                    posted[r] = None
            return posted[r]

        def wait_of(r):
            row = read(r)
            return None if row is None else blame.Waiting(row[1], row[0], row[3])

        def state_of(r):
            # a rank posts its wait only when its own call fails: one that exited after posting (it lost us
            # when gloo closed our timed-out op) waited for what it posted, so only a stopped one is stale
            row = read(r)
            state = blame.process_state(row[2]) if row is not None and _same_host() else ""
            return state if state in ("T", "t") else ""

        err = blame.walk(self.rank, blame.Waiting(fp, peer, self.current_what), self.timeout, wait_of, state_of)
        if isinstance(err, fpr.CollectiveMismatch):
            self._publish(err)
            return err
        return None if only_mismatch and not isinstance(err, blame.Deadlock) else err

    def _published_mismatch(self):
        store = self._store()
        try:
            if store is None or not store.check([_MISMATCH_KEY]):
                return None
            receiver, sender, mine, theirs, sent = json.loads(store.get(_MISMATCH_KEY))
        except (RuntimeError, ValueError):  # the store's host is gone too
            return None
        return fpr.CollectiveMismatch(receiver, sender, mine, theirs, sent)

    def _store(self):
        return self.group.store()
