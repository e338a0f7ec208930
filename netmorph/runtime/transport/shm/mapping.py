"""The shared mapping of the local fabric: its layout, the registered arenas, the abort word, doorbells.

Stands in for the memory NCCL's intra-node SHM/P2P transports set up
(``src/transport/shm.cc``, ``p2p.cc``): every directed pair of ranks owns a
channel of ``K`` slots of ``S`` bytes (NCCL's ``NCCL_STEPS`` buffers), with two
counters, ``posted`` (the sender's ``head``) and ``consumed`` (the receiver's
``tail``). Each rank also owns a registered arena (``ncclMemAlloc`` +
``ncclCommRegister``) that peers read in place.

The mapping is anonymous (``mmap(-1, ...)``) and created before the ranks fork:
no name exists in ``/dev/shm``, so nothing can leak -- the kernel frees it when
the last process holding it exits, on every exit path, SIGKILL included.

Layout (int64 words unless noted): a header ([0] abort flag, [1] aborted rank,
[2] world, [3] K, [4] S, [5] mismatch flag, [6] its receiver, [7] its sender,
[8:16] and [16:24] their fingerprints, [24] its kind: 1 a message, 0 a call posted at a
timeout, [25] deaths seen by an elastic launch, [26] why the aborted rank is gone: 0 it exited
or raised, 1 it stopped answering and the launcher ended it, [27] some rank's fabric failed), the wait board (``waits[p, 12]``:
state -- 0 in no call, 1 waiting, 2 returned, 3 failed while waiting --, the peer waited for, what for, the call's
fingerprint, the pid; :mod:`netmorph.runtime.transport.blame` reads it), ``dead[p]``
(elastic); per membership epoch
(one unless the launch is elastic) ``posted[p*p]``, ``consumed[p*p]``,
``piece_bytes[p*p*K]`` (negative: a descriptor), ``not_before[p*p*K]`` (float64,
emulated links) and the page-aligned slot data; int32 ``doorbell[p]`` and
``sleeping[p]``; then the arenas.
"""

from __future__ import annotations

import mmap
import sys

import numpy as np

from netmorph.runtime.transport.fingerprint import HEADER_BYTES
from netmorph.runtime.transport.shm.futex import Futex

_HDR = 32
WAIT_WORDS = 12  # the wait board's row: state, peer, what, fingerprint (8), pid
IDLE, WAITING, RETURNED, FAILED = 0, 1, 2, 3  # FAILED: raised while waiting (the row says on what)
_MAP_NORESERVE = 0x4000 if sys.platform.startswith("linux") else 0


def default_arena_bytes(world: int) -> int:
    """Each rank's registered memory unless ``launch(arena_bytes=)`` says otherwise: 1 GiB, or 8 GiB
    shared by the ranks (reserved, not committed: the mapping is MAP_NORESERVE)."""
    return min(1 << 30, (8 << 30) // world)


def address(a: np.ndarray) -> int:
    """The address of an array's first byte."""
    return a.__array_interface__["data"][0]


class ShmFabric:
    """The shared mapping for ``world`` ranks; created once in the launcher before the ranks start."""

    def __init__(
        self, world: int, slots: int = 4, slot_bytes: int | None = None, arena_bytes: int | None = None, epochs: int = 1
    ):
        if slot_bytes is None:
            slot_bytes = 1 << 20 if world <= 8 else max(64 << 10, (8 << 20) // world)
        slot_bytes -= slot_bytes % 64
        if arena_bytes is None:
            arena_bytes = default_arena_bytes(world)
        arena_bytes -= arena_bytes % 4096
        self.world, self.K, self.S, self.A = world, slots, slot_bytes, arena_bytes
        self.epochs, self.epoch = epochs, 0
        p2 = world * world
        e = epochs
        sizes = [
            _HDR * 8,
            e * p2 * 8,
            e * p2 * 8,
            e * p2 * slots * 8,
            e * p2 * slots * 8,
            2 * world * 4 + 8,
            world * WAIT_WORDS * 8,
            world * 8,
        ]
        offs = np.cumsum([0] + sizes)
        data_off = int(-(-offs[-1] // 4096) * 4096)
        arena_off = data_off + e * p2 * slots * slot_bytes
        total = arena_off + world * arena_bytes
        self.mem = mmap.mmap(-1, total, flags=mmap.MAP_SHARED | _MAP_NORESERVE)
        buf = self.mem
        self.hdr = np.frombuffer(buf, np.int64, _HDR, 0)
        # one set of channels per membership epoch (elastic re-forming moves to a fresh set)
        self._posted = np.frombuffer(buf, np.int64, e * p2, int(offs[1])).reshape(e, p2)
        self._consumed = np.frombuffer(buf, np.int64, e * p2, int(offs[2])).reshape(e, p2)
        self._piece_bytes = np.frombuffer(buf, np.int64, e * p2 * slots, int(offs[3])).reshape(e, -1)
        self._not_before = np.frombuffer(buf, np.float64, e * p2 * slots, int(offs[4])).reshape(e, -1)
        self._data = np.frombuffer(buf, np.uint8, e * p2 * slots * slot_bytes, data_off).reshape(e, -1)
        # per rank: a doorbell word peers bump when they post to it or free its slots, and a sleeping flag
        self.doorbell = np.frombuffer(buf, np.int32, world, int(offs[5]))
        self.sleeping = np.frombuffer(buf, np.int32, world, int(offs[5]) + 4 * world)
        self.waits = np.frombuffer(buf, np.int64, world * WAIT_WORDS, int(offs[6])).reshape(world, WAIT_WORDS)
        self.dead = np.frombuffer(buf, np.int64, world, int(offs[7]))  # elastic: ranks known dead
        self.futex = Futex.make()
        self.set_epoch(0)
        self.arenas = np.frombuffer(buf, np.uint8, world * arena_bytes, arena_off)
        self.hdr[2:5] = (world, slots, slot_bytes)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s channels from now on (in this process; every member switches itself)."""
        if not 0 <= epoch < self.epochs:
            raise RuntimeError(f"membership epoch {epoch}: the fabric was built for {self.epochs} epochs")
        self.epoch = epoch
        self.posted, self.consumed = self._posted[epoch], self._consumed[epoch]
        self.piece_bytes, self.not_before = self._piece_bytes[epoch], self._not_before[epoch]
        self.data = self._data[epoch]

    def mark_dead(self, rank: int) -> None:
        """Elastic launches: ``rank`` is gone, but the job is not -- every waiting rank raises PeerLost once
        (``deaths`` counts the events), then may re-form without it."""
        if not self.dead[rank]:
            self.dead[rank] = 1
            self.hdr[25] += 1
        for r in range(self.world):
            self.ring(r)

    def revive(self, rank: int) -> None:
        """Elastic launches: a new process takes dead ``rank``'s slot (a node back, as torchelastic starts a worker
        in a lost one's place). It is a member again from the epoch it re-forms on: the channels of every epoch
        after its predecessor died are untouched by it. ``deaths`` keeps counting the events."""
        self.dead[rank] = 0
        self.set_state(rank, IDLE, 0)

    @property
    def deaths(self) -> int:
        return int(self.hdr[25])

    def arena(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s registered memory: buffers here are read by peers in place (zero copy)."""
        return self.arenas[rank * self.A : (rank + 1) * self.A]

    def channel(self, src: int, dst: int) -> int:
        """The index of the directed channel ``src -> dst``."""
        return src * self.world + dst

    def slot(self, channel: int, k: int) -> np.ndarray:
        i = channel * self.K + k
        return self.data[i * self.S : (i + 1) * self.S]

    def leftovers(self):
        """Messages posted and never received, one per channel: ``[(src, dst, header words or None)]``
        (the header when the piece is long enough to hold one). Read by the launcher once every rank
        has returned; none when a rank's fabric failed (the failed calls' pieces stay behind)."""
        out = []
        if self.hdr[27] or self.hdr[0] or self.hdr[5]:
            return out
        for ch in np.flatnonzero(self.posted > self.consumed).tolist():
            src, dst = divmod(ch, self.world)
            out.append((src, dst, self.head(ch, int(self.consumed[ch] % self.K))))
        return out

    def head(self, channel: int, k: int):
        """The fingerprint words leading the piece in slot ``k`` of ``channel`` when it is long enough to
        carry them (a message's first piece: :data:`~netmorph.runtime.transport.fingerprint.HEADER_BYTES`),
        else None."""
        if abs(int(self.piece_bytes[channel * self.K + k])) < HEADER_BYTES:
            return None
        return self.slot(channel, k)[:HEADER_BYTES].view(np.int64).copy()

    def close(self) -> None:
        """Drop this process's mapping (the kernel frees it when the last holder is gone)."""
        self.hdr = self.posted = self.consumed = self.piece_bytes = self.not_before = self.data = None
        self._posted = self._consumed = self._piece_bytes = self._not_before = self._data = self.dead = None
        self.arenas = self.doorbell = self.sleeping = self.waits = None
        try:
            self.mem.close()
        except BufferError:  # a view is still referenced somewhere: the GC will unmap it
            pass

    def abort(self, rank: int, silent: bool = False) -> None:
        """Tell every rank that ``rank`` is gone (the launcher calls this when a process dies, or when
        it ends one its peers found silent: ``silent``)."""
        if not self.hdr[0]:
            self.hdr[1] = rank
            self.hdr[26] = int(silent)
            self.hdr[0] = 1
        for r in range(self.world):
            self.ring(r)

    def ring(self, rank: int) -> None:
        """Wake ``rank`` if it sleeps: something it may wait for has changed."""
        self.doorbell[rank] += 1
        if self.futex is not None and self.sleeping[rank]:
            self.futex.wake(address(self.doorbell[rank : rank + 1]))

    def report_mismatch(self, e) -> None:
        """Publish a :class:`~netmorph.runtime.transport.fingerprint.CollectiveMismatch` so every
        rank raises the same one (the first report wins), and wake them all."""
        if not self.hdr[5]:
            self.hdr[6:8] = (e.receiver, e.sender)
            self.hdr[8:16] = -1 if e.mine is None else e.mine  # -1: no call at that index
            self.hdr[16:24] = e.theirs
            self.hdr[24] = int(e.sent)
            self.hdr[5] = 1
        for r in range(self.world):
            self.ring(r)

    @property
    def mismatch(self):
        """The published mismatch as ``(receiver, sender, mine, theirs, sent)``, or None."""
        if not self.hdr[5]:
            return None
        mine = None if self.hdr[8] < 0 else self.hdr[8:16].copy()
        return int(self.hdr[6]), int(self.hdr[7]), mine, self.hdr[16:24].copy(), bool(self.hdr[24])

    def post_wait(self, rank: int, peer: int, what: int, fp) -> None:
        """Say what ``rank`` waits for, for a peer that times out: ``peer`` (-1: any), ``what`` (an index
        into :data:`netmorph.runtime.transport.blame.WHAT`) and its call's fingerprint (None: none)."""
        row = np.zeros(11, np.int64)
        row[0], row[1], row[2] = WAITING, peer, what
        if fp is not None:
            row[3:11] = fp
        else:
            row[3] = -1  # no fingerprint (op words are never negative)
        self.waits[rank, :11] = row

    def set_state(self, rank: int, state: int, pid: int | None = None) -> None:
        self.waits[rank, 0] = state
        if pid is not None:
            self.waits[rank, 11] = pid

    def wait_of(self, rank: int):
        """``(state, peer, what, fingerprint or None, pid)`` from ``rank``'s row of the wait board."""
        w = self.waits[rank].copy()
        fp = None if w[3] < 0 else w[3:11]
        return int(w[0]), int(w[1]), int(w[2]), fp, int(w[11])

    @property
    def aborted(self) -> int | None:
        return int(self.hdr[1]) if self.hdr[0] else None

    @property
    def aborted_silent(self) -> bool:
        """The aborted rank stopped answering (rather than exiting or raising)."""
        return bool(self.hdr[26])
