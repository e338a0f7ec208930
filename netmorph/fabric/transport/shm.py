"""The local fabric: ranks as OS processes exchanging messages through shared memory.

Stands in for NCCL's intra-node SHM/P2P transports (``src/transport/shm.cc``,
``p2p.cc``): every directed pair of ranks owns a channel of ``K`` slots of ``S``
bytes in one shared mapping, a single-producer single-consumer ring with two
counters (``posted`` by the sender, ``consumed`` by the receiver) -- NCCL's
``head``/``tail`` FIFO of ``NCCL_STEPS`` buffers. A message is cut into
slot-sized pieces, so the sender's copy in and the receiver's copy or reduction
out overlap, and the receiver reduces straight from the slot into its own
buffer (one pass). One progress engine serves collectives and point-to-point
alike, per-peer FIFO, so ``isend``/``recv`` pairs never deadlock on full slots.

The mapping is anonymous (``mmap(-1, ...)``) and created before the ranks fork:
no name exists in ``/dev/shm``, so nothing can leak -- the kernel frees it when
the last process holding it exits, on every exit path, SIGKILL included.

Waiting spins briefly, then yields the CPU (``sched_yield``), then sleeps in
short steps, so more ranks than cores still make progress. Every wait checks
the abort word the launcher sets when a rank dies (-> :class:`PeerLost` naming
it) and a deadline (-> :class:`PeerTimeout` naming the silent peer).

Link emulation: given per-link α and β, a piece becomes visible to the receiver
only at ``start + α + bytes_so_far·β`` (CLOCK_MONOTONIC is shared by all
processes), with one send port per rank, so a two-level topology can be
emulated on one machine and measured against the cost model.

Ordering assumption: a counter store becomes visible after the data stores that
precede it (x86-64 TSO; each wait also crosses a system call on other CPUs).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import sys
import time
from collections import deque

import numpy as np

from netmorph.fabric.transport import PeerLost, PeerTimeout, Work

_HDR = 16          # int64 words: [0] abort flag, [1] abort rank, [2] world, [3] K, [4] S
_MAP_NORESERVE = 0x4000 if sys.platform.startswith("linux") else 0


class _Futex:
    """Linux futex on a word of the shared mapping: a waiting rank sleeps in the kernel instead of
    spinning, which is what lets 4 ranks share 2 cores without thrashing (NCCL's proxy threads
    block the same way). None where unavailable: waiters then poll with sched_yield and sleep."""

    _NR = {"x86_64": 202, "aarch64": 98, "arm64": 98}

    def __init__(self):
        self.nr = self._NR.get(platform.machine())
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long

    @classmethod
    def make(cls):
        if not sys.platform.startswith("linux") or platform.machine() not in cls._NR:
            return None
        try:
            return cls()
        except OSError:
            return None

    def wait(self, addr: int, expected: int, seconds: float) -> None:
        ts = (ctypes.c_long * 2)(int(seconds), int((seconds % 1) * 1e9))
        self.libc.syscall(self.nr, ctypes.c_void_p(addr), 0, ctypes.c_int(expected), ctypes.byref(ts), None, 0)

    def wake(self, addr: int) -> None:
        self.libc.syscall(self.nr, ctypes.c_void_p(addr), 1, ctypes.c_int(1 << 30), None, None, 0)


class ShmFabric:
    """The shared mapping for ``world`` ranks; created once in the launcher before the ranks start."""

    def __init__(self, world: int, slots: int = 4, slot_bytes: int | None = None, arena_bytes: int | None = None):
        if slot_bytes is None:
            slot_bytes = 1 << 20 if world <= 8 else max(64 << 10, (8 << 20) // world)
        slot_bytes -= slot_bytes % 64
        if arena_bytes is None:
            arena_bytes = min(1 << 30, (8 << 30) // world)
        arena_bytes -= arena_bytes % 4096
        self.world, self.K, self.S, self.A = world, slots, slot_bytes, arena_bytes
        p2 = world * world
        sizes = [_HDR * 8, p2 * 8, p2 * 8, p2 * slots * 8, p2 * slots * 8, 2 * world * 4 + 8]
        offs = np.cumsum([0] + sizes)
        data_off = int(-(-offs[-1] // 4096) * 4096)
        arena_off = data_off + p2 * slots * slot_bytes
        total = arena_off + world * arena_bytes
        flags = mmap.MAP_SHARED | _MAP_NORESERVE
        self.mem = mmap.mmap(-1, total, flags=flags)
        buf = self.mem
        self.hdr = np.frombuffer(buf, np.int64, _HDR, 0)
        self.posted = np.frombuffer(buf, np.int64, p2, int(offs[1]))
        self.consumed = np.frombuffer(buf, np.int64, p2, int(offs[2]))
        self.piece_bytes = np.frombuffer(buf, np.int64, p2 * slots, int(offs[3]))
        self.not_before = np.frombuffer(buf, np.float64, p2 * slots, int(offs[4]))
        # per rank: a doorbell word peers bump when they post to it or free its slots, and a sleeping flag
        self.doorbell = np.frombuffer(buf, np.int32, world, int(offs[5]))
        self.sleeping = np.frombuffer(buf, np.int32, world, int(offs[5]) + 4 * world)
        self.futex = _Futex.make()
        self.data = np.frombuffer(buf, np.uint8, p2 * slots * slot_bytes, data_off)
        self.arenas = np.frombuffer(buf, np.uint8, world * arena_bytes, arena_off)
        self.hdr[2:5] = (world, slots, slot_bytes)

    def arena(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s registered memory: buffers here are read by peers in place (zero copy)."""
        return self.arenas[rank * self.A:(rank + 1) * self.A]

    def close(self) -> None:
        """Drop this process's mapping (the kernel frees it when the last holder is gone)."""
        self.hdr = self.posted = self.consumed = self.piece_bytes = self.not_before = self.data = None
        self.arenas = self.doorbell = self.sleeping = None
        try:
            self.mem.close()
        except BufferError:       # a view is still referenced somewhere: the GC will unmap it
            pass

    def abort(self, rank: int) -> None:
        """Tell every rank that ``rank`` is gone (the launcher calls this when a process dies)."""
        if not self.hdr[0]:
            self.hdr[1] = rank
            self.hdr[0] = 1
        for r in range(self.world):
            self.ring(r)

    def ring(self, rank: int) -> None:
        """Wake ``rank`` if it sleeps: something it may wait for has changed."""
        self.doorbell[rank] += 1
        if self.futex is not None and self.sleeping[rank]:
            self.futex.wake(self.doorbell[rank:rank + 1].__array_interface__["data"][0])

    @property
    def aborted(self):
        return int(self.hdr[1]) if self.hdr[0] else None

    def slot(self, channel: int, k: int) -> np.ndarray:
        i = channel * self.K + k
        return self.data[i * self.S:(i + 1) * self.S]


class _Out:
    """A message being pushed into a channel, piece by piece -- or, when every segment lies in the
    sender's registered arena, as one descriptor the receiver reads through (``ack_at`` is then the
    ``consumed`` count that says the receiver is done reading)."""

    __slots__ = ("peer", "segs", "seg", "pos", "done", "total", "sent", "start", "desc", "ack_at")

    def __init__(self, peer, views, arena_range=None):
        self.peer = peer
        self.segs = [v.reshape(-1).view(np.uint8) for v in views if v.size]
        self.seg = self.pos = self.sent = 0
        self.total = sum(len(s) for s in self.segs)
        self.done = self.total == 0
        self.start = None
        self.desc = None
        self.ack_at = None
        if arena_range is not None and self.segs:
            lo, hi = arena_range
            ptrs = [s.__array_interface__["data"][0] for s in self.segs]
            if all(lo <= q and q + len(s) <= hi for q, s in zip(ptrs, self.segs)):
                self.desc = np.array([[q - lo, len(s)] for q, s in zip(ptrs, self.segs)], dtype=np.int64)


class _In:
    """A message being pulled out of a channel and copied or reduced into its destination views."""

    __slots__ = ("peer", "segs", "flags", "seg", "pos", "done", "total", "got")

    def __init__(self, peer, views, flags):
        keep = [(v.reshape(-1), bool(f)) for v, f in zip(views, flags) if v.size]
        self.peer = peer
        self.segs = [v for v, _ in keep]
        self.flags = [f for _, f in keep]
        self.seg = self.pos = self.got = 0           # pos in bytes within segment
        self.total = sum(v.nbytes for v in self.segs)
        self.done = self.total == 0


class _NotFusable(Exception):
    pass


class ShmTransport:
    """One rank's end of a :class:`ShmFabric`."""

    name = "local"

    def __init__(self, fabric: ShmFabric, rank: int, timeout: float = 10.0, link_cost=None):
        self.f, self.rank, self.world = fabric, rank, fabric.world
        self.timeout = timeout
        self.link_cost = link_cost            # None, or fn(src, dst) -> (alpha_s, beta_s_per_byte)
        self.port_free = 0.0
        self._next_visible = float("inf")    # emulated links: when the earliest withheld piece shows
        self.outq = {}                        # peer -> deque[_Out]
        self.inq = {}                         # peer -> deque[_In]
        self.ufunc = None
        self._ppid = os.getppid()
        # more ranks than cores: a waiting rank must hand its core over at once, not spin
        self.spins = 64 if fabric.world <= (os.cpu_count() or 1) else 2
        self._bell = fabric.doorbell[rank:rank + 1].__array_interface__["data"][0]
        arena = fabric.arena(rank)
        base = arena.__array_interface__["data"][0]
        self.arena_range = (base, base + len(arena))
        self.arena_top = 0

    def alloc(self, nbytes: int) -> np.ndarray:
        """Bytes in this rank's registered arena (``ncclMemAlloc``-like): peers read them in place."""
        start = -(-self.arena_top // 64) * 64
        if start + nbytes > self.f.A:
            raise MemoryError(f"registered arena of rank {self.rank} is full ({self.f.A:,} B); "
                              f"pass arena_bytes= to launch")
        self.arena_top = start + nbytes
        return self.f.arena(self.rank)[start:start + nbytes]

    def free_all(self) -> None:
        """Release every registered buffer at once (the arena is a bump allocator)."""
        self.arena_top = 0

    def shared(self, nbytes: int) -> np.ndarray:
        """Bytes at the same place for every rank: carved from the top of rank 0's arena, downwards,
        in call order (every rank calls in the same order, so they agree without talking)."""
        self.shared_top = getattr(self, "shared_top", self.f.A)
        start = (self.shared_top - nbytes) // 64 * 64
        if start < (self.arena_top if self.rank == 0 else 0):
            raise MemoryError("shared region exhausted; pass arena_bytes= to launch")
        self.shared_top = start
        return self.f.arena(0)[start:start + nbytes]

    # ------------------------------------------------------------ engine
    def _push(self, st: _Out) -> bool:
        f = self.f
        ch = self.rank * f.world + st.peer
        moved = False
        if st.desc is not None:
            return self._push_desc(st, ch)
        while not st.done and f.posted[ch] - f.consumed[ch] < f.K:
            k = int(f.posted[ch] % f.K)
            slot = f.slot(ch, k)
            fill = 0
            while fill < f.S and st.seg < len(st.segs):
                src = st.segs[st.seg]
                take = min(f.S - fill, len(src) - st.pos)
                slot[fill:fill + take] = src[st.pos:st.pos + take]
                fill += take
                st.pos += take
                if st.pos == len(src):
                    st.seg += 1
                    st.pos = 0
            st.sent += fill
            i = ch * f.K + k
            f.piece_bytes[i] = fill
            self._stamp(st, i)
            f.posted[ch] += 1                    # publish after the data
            moved = True
            st.done = st.sent == st.total
        if moved:
            f.ring(st.peer)
        return moved

    def _stamp(self, st: _Out, i: int) -> None:
        """Emulated link: the piece is visible at start + α + bytes_so_far·β (one send port per rank)."""
        if self.link_cost is None:
            self.f.not_before[i] = 0.0
            return
        a, b = self.link_cost(self.rank, st.peer)
        if st.start is None:
            st.start = max(time.perf_counter(), self.port_free)
        self.f.not_before[i] = st.start + a + st.sent * b
        if st.sent == st.total:
            self.port_free = self.f.not_before[i]

    def _push_desc(self, st: _Out, ch: int) -> bool:
        f = self.f
        if st.ack_at is None:
            if f.posted[ch] - f.consumed[ch] >= f.K:
                return False
            k = int(f.posted[ch] % f.K)
            i = ch * f.K + k
            raw = st.desc.reshape(-1).view(np.uint8)
            f.slot(ch, k)[:len(raw)] = raw
            f.piece_bytes[i] = -len(raw)            # negative: a descriptor, not data
            st.sent = st.total
            self._stamp(st, i)
            f.posted[ch] += 1
            st.ack_at = int(f.posted[ch])
            f.ring(st.peer)
            return True
        if f.consumed[ch] >= st.ack_at:             # the receiver has read our buffer: it may change again
            st.done = True
            return True
        return False

    def _pull_desc(self, st: _In, ch: int, k: int, nb: int) -> None:
        """Read the sender's registered buffer in place: one pass, straight into our destination."""
        f = self.f
        pairs = f.slot(ch, k)[:nb].view(np.int64).reshape(-1, 2).copy()
        src_arena = f.arena(st.peer)
        for off, ln in pairs.tolist():
            self._land(st, src_arena[off:off + ln])

    def _land(self, st: _In, data: np.ndarray) -> None:
        """Copy or reduce the next ``len(data)`` bytes of the stream into its destination segments."""
        at, n = 0, len(data)
        while at < n:
            dst = st.segs[st.seg]
            take = min(n - at, dst.nbytes - st.pos)
            chunk = data[at:at + take]
            if st.flags[st.seg]:
                isz = dst.itemsize
                a, b = st.pos // isz, (st.pos + take) // isz
                self.ufunc(dst[a:b], chunk.view(dst.dtype), out=dst[a:b])
            else:
                dst.view(np.uint8)[st.pos:st.pos + take] = chunk
            at += take
            st.pos += take
            if st.pos == dst.nbytes:
                st.seg += 1
                st.pos = 0
        st.got += n

    def _pull(self, st: _In) -> bool:
        f = self.f
        ch = st.peer * f.world + self.rank
        moved = False
        while not st.done and f.posted[ch] > f.consumed[ch]:
            k = int(f.consumed[ch] % f.K)
            i = ch * f.K + k
            if self.link_cost is not None and f.not_before[i] > time.perf_counter():
                self._next_visible = min(self._next_visible, float(f.not_before[i]))
                break
            nb = int(f.piece_bytes[i])
            if nb < 0:
                self._pull_desc(st, ch, k, -nb)
                f.consumed[ch] += 1                  # the ack: the sender may reuse its buffer
                moved = True
                st.done = st.got == st.total
                continue
            self._land(st, f.slot(ch, k)[:nb])
            f.consumed[ch] += 1                  # hand the slot back after reading it
            moved = True
            st.done = st.got == st.total
        if moved:
            f.ring(st.peer)
        return moved

    def progress(self, pull: bool = True) -> bool:
        moved = self._drain(self.outq, self._push)
        if pull:
            moved |= self._drain(self.inq, self._pull)
        return moved

    @staticmethod
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

    def _check(self) -> None:
        lost = self.f.aborted
        if lost is not None:
            raise PeerLost(lost, "it exited or raised")
        if os.getppid() != self._ppid:
            raise PeerLost(-1, "the launcher exited")

    def _blame(self, streams):
        for s in streams:
            if not s.done:
                return s.peer, ("no data arrived" if isinstance(s, _In) else "its receive slots stayed full")
        return -1, "?"

    def wait_for(self, streams, ready=None, pull: bool = True) -> None:
        """Progress until every stream is done (or ``ready()`` holds), or fail naming the peer."""
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
            now = time.perf_counter()
            idle = now - last
            if idle > self.timeout:
                peer, what = self._blame(streams)
                raise PeerTimeout(peer, self.timeout, what)
            self._sleep(idle, pull)

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
            if self.progress(pull) or f.hdr[0]:
                return
            # emulated links: the next piece becomes visible by the clock, not by a ring
            nap = 0.05
            if self._next_visible < float("inf"):
                nap = min(nap, max(self._next_visible - time.perf_counter(), 0.0))
                self._next_visible = float("inf")
            if nap > 0:
                f.futex.wait(self._bell, seen, nap)
        finally:
            f.sleeping[me] = 0

    # ------------------------------------------------------------ interface
    def _enqueue(self, sends, recvs):
        outs, ins = [], []
        for peer, views in sends:
            st = _Out(peer, views, self.arena_range)
            if not st.done:
                self.outq.setdefault(peer, deque()).append(st)
                outs.append(st)
        for peer, views, flags in recvs:
            st = _In(peer, views, flags)
            if not st.done:
                self.inq.setdefault(peer, deque()).append(st)
                ins.append(st)
        return outs + ins

    def run_round(self, sends, recvs, ufunc, snapshot: bool = False) -> None:
        """Send ``[(peer, [views])]`` and receive ``[(peer, [views], [reduce?])]`` as one step."""
        if snapshot:
            sends = [(peer, [np.concatenate([v.reshape(-1) for v in views])]) for peer, views in sends]
        self.ufunc = ufunc
        streams = self._enqueue(sends, recvs)
        ins = [st for st in streams if isinstance(st, _In)]
        if len(ins) > 1 and self._fusable(ins):
            self._fused_reduce(ins, streams)
        self.wait_for(streams)

    # -------------------------------------------------------- fused multi-peer reduction
    FUSE_CHUNK = 256 << 10

    @staticmethod
    def _fusable(ins) -> bool:
        """Several peers reduce into one and the same segment (a direct reduce-scatter step)."""
        first = ins[0]
        if len(first.segs) != 1 or not first.flags[0]:
            return False
        d = first.segs[0]
        key = (d.__array_interface__["data"][0], d.nbytes)
        return all(len(st.segs) == 1 and st.flags[0] and
                   (st.segs[0].__array_interface__["data"][0], st.segs[0].nbytes) == key for st in ins)

    def _head_descriptor(self, st: _In):
        """(channel, slot, nbytes) when ``st``'s next piece is a visible descriptor, else None."""
        f = self.f
        q = self.inq.get(st.peer)
        if not q or q[0] is not st:
            return None
        ch = st.peer * f.world + self.rank
        if f.posted[ch] <= f.consumed[ch]:
            return None
        k = int(f.consumed[ch] % f.K)
        i = ch * f.K + k
        if self.link_cost is not None and f.not_before[i] > time.perf_counter():
            self._next_visible = min(self._next_visible, float(f.not_before[i]))
            return None
        nb = int(f.piece_bytes[i])
        return (ch, k, -nb) if nb < 0 else ()

    def _fused_reduce(self, ins, streams) -> None:
        """Wait for every peer's descriptor, then reduce all sources into the destination chunk by
        chunk, so the destination stays in cache: one pass over it instead of one per peer
        (what vLLM's 2-stage kernel does with all peers' pointers at once)."""
        heads = {}

        def ready():
            for st in ins:
                if st not in heads:
                    h = self._head_descriptor(st)
                    if h == ():
                        raise _NotFusable
                    if h is not None:
                        heads[st] = h
            return len(heads) == len(ins)

        try:
            self.wait_for(streams, ready=ready, pull=False)
        except _NotFusable:
            return
        f = self.f
        dst = ins[0].segs[0]
        srcs = []
        for st in ins:
            ch, k, nb = heads[st]
            pairs = f.slot(ch, k)[:nb].view(np.int64).reshape(-1, 2)
            if len(pairs) != 1 or int(pairs[0, 1]) != dst.nbytes:
                return self.wait_for(streams)
            off = int(pairs[0, 0])
            srcs.append(f.arena(st.peer)[off:off + dst.nbytes].view(dst.dtype))
        step = max(1, self.FUSE_CHUNK // dst.itemsize)
        for a in range(0, len(dst), step):
            d = dst[a:a + step]
            for src in srcs:
                self.ufunc(d, src[a:a + step], out=d)
        for st in ins:
            ch = heads[st][0]
            st.got, st.done = st.total, True
            self.inq[st.peer].popleft()
            f.consumed[ch] += 1
            f.ring(st.peer)

    def isend(self, array: np.ndarray, dst: int) -> Work:
        streams = self._enqueue([(dst, [array])], [])
        self.progress()
        return Work(self, streams)

    def irecv(self, array: np.ndarray, src: int) -> Work:
        streams = self._enqueue([], [(src, [array], [False])])
        self.progress()
        return Work(self, streams)

    def recv_any(self, array: np.ndarray, srcs) -> int:
        """Receive the next message from whichever of ``srcs`` has one (MPI_ANY_SOURCE); returns it.

        Sources are polled round-robin from where the last call stopped, so a busy
        peer cannot starve the others (a parameter server serving many workers).
        """
        srcs = list(srcs)
        f = self.f
        start = self._any_next = getattr(self, "_any_next", 0)
        box = {}

        def ready():
            for j in range(len(srcs)):
                q = srcs[(start + j) % len(srcs)]
                if not self.inq.get(q) and f.posted[q * f.world + self.rank] > f.consumed[q * f.world + self.rank]:
                    box["src"] = q
                    self._any_next = (start + j + 1) % len(srcs)
                    return True
            return False

        self.wait_for([], ready=ready, pull=False)
        self.irecv(array, box["src"]).wait()
        return box["src"]

    def close(self) -> None:
        pass
