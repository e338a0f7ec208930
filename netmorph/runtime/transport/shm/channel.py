"""The single-producer single-consumer channels of the local fabric, and the streams that use them.

Stands in for NCCL's ``head``/``tail`` FIFO of ``NCCL_STEPS`` buffers per peer: a
message is cut into slot-sized pieces, so the sender's copy in and the
receiver's copy or reduction out overlap, and the receiver reduces straight
from the slot into its own buffer (one pass). A message whose every segment lies
in the sender's registered arena travels as one *descriptor* (offsets and
lengths, a negative ``piece_bytes``) and the receiver reads the sender's buffer in
place; its ``consumed`` bump is then the acknowledgement that the sender may
change that buffer again.

With fingerprints on, the first piece of every message (and every descriptor)
starts with the sender's 64-byte header (:mod:`..fingerprint`); the receiver
checks it against its own call before anything lands. ``piece_bytes`` counts the
header; the streams' ``total``/``sent``/``got`` count payload only.

Ordering assumption: a counter store becomes visible after the data stores that
precede it (x86-64 TSO; each wait also crosses a system call on other CPUs).
"""

from __future__ import annotations

import numpy as np

from netmorph.runtime.transport import fingerprint
from netmorph.runtime.transport.fingerprint import HEADER_BYTES as H
from netmorph.runtime.transport.shm.mapping import address


class OutStream:
    """A message being pushed into a channel, piece by piece, or as one descriptor
    (``ack_at`` is then the ``consumed`` count that says the receiver is done reading)."""

    __slots__ = ("peer", "segs", "seg", "pos", "done", "total", "sent", "start", "desc", "ack_at", "hdr", "fp")

    def __init__(self, peer, views, arena_range=None, fp=None):
        self.peer = peer
        self.segs = [v.reshape(-1).view(np.uint8) for v in views if v.size]
        self.seg = self.pos = self.sent = 0
        self.total = sum(len(s) for s in self.segs)
        self.done = self.total == 0
        self.start = None
        self.desc = None
        self.ack_at = None
        self.fp = self.hdr = fp  # the call's fingerprint; hdr: still to lead the first piece
        if arena_range is not None and self.segs:
            lo, hi = arena_range
            ptrs = [address(s) for s in self.segs]
            if all(lo <= q and q + len(s) <= hi for q, s in zip(ptrs, self.segs)):
                self.desc = np.array([[q - lo, len(s)] for q, s in zip(ptrs, self.segs)], dtype=np.int64)


class InStream:
    """A message being pulled out of a channel and copied or reduced into its destination views; a
    segment's flag is False (copy), True (reduce into it) or an accumulator array (reduce that with the
    incoming data into it: out of place)."""

    __slots__ = ("peer", "segs", "flags", "seg", "pos", "done", "total", "got", "fp")

    def __init__(self, peer, views, flags, fp=None):
        keep = [
            (v.reshape(-1), f.reshape(-1) if isinstance(f, np.ndarray) else bool(f))
            for v, f in zip(views, flags)
            if v.size
        ]
        self.peer = peer
        self.segs = [v for v, _ in keep]
        self.flags = [f for _, f in keep]
        self.seg = self.pos = self.got = 0  # pos in bytes within segment
        self.total = sum(v.nbytes for v in self.segs)
        self.done = self.total == 0
        self.fp = fp  # the call we are in (None: fingerprints off)


class Channels:
    """One rank's ends of every channel: push out-streams, pull in-streams."""

    def __init__(self, fabric, rank: int, clock):
        self.f, self.rank, self.clock = fabric, rank, clock
        self.ufunc = np.add  # the reduction of the round in flight

    # ------------------------------------------------------------ sender
    def push(self, st: OutStream) -> bool:
        """Fill free slots toward ``st.peer``; True if anything moved."""
        f = self.f
        ch = self.rank * f.world + st.peer
        if st.desc is not None:
            return self._push_desc(st, ch)
        moved = False
        while not st.done and f.posted[ch] - f.consumed[ch] < f.K:
            k = int(f.posted[ch] % f.K)
            slot = f.slot(ch, k)
            fill = head = 0
            if st.hdr is not None:  # the fingerprint leads the first piece
                fingerprint.write(st.hdr, st.total, slot[:H])
                st.hdr = None
                fill = head = H
            while fill < f.S and st.seg < len(st.segs):
                src = st.segs[st.seg]
                take = min(f.S - fill, len(src) - st.pos)
                slot[fill : fill + take] = src[st.pos : st.pos + take]
                fill += take
                st.pos += take
                if st.pos == len(src):
                    st.seg += 1
                    st.pos = 0
            st.sent += fill - head
            i = ch * f.K + k
            f.piece_bytes[i] = fill
            self.clock.stamp(f.not_before, i, st)
            f.posted[ch] += 1  # publish after the data
            moved = True
            st.done = st.sent == st.total
        if moved:
            f.ring(st.peer)
        return moved

    def _push_desc(self, st: OutStream, ch: int) -> bool:
        f = self.f
        if st.ack_at is None:
            if f.posted[ch] - f.consumed[ch] >= f.K:
                return False
            k = int(f.posted[ch] % f.K)
            i = ch * f.K + k
            raw = st.desc.reshape(-1).view(np.uint8)
            slot = f.slot(ch, k)
            head = 0
            if st.hdr is not None:
                fingerprint.write(st.hdr, st.total, slot[:H])
                head = H
            slot[head : head + len(raw)] = raw
            f.piece_bytes[i] = -(head + len(raw))  # negative: a descriptor, not data
            st.sent = st.total
            self.clock.stamp(f.not_before, i, st)
            f.posted[ch] += 1
            st.ack_at = int(f.posted[ch])
            f.ring(st.peer)
            return True
        if f.consumed[ch] >= st.ack_at:  # the receiver has read our buffer: it may change again
            st.done = True
            return True
        return False

    # ------------------------------------------------------------ receiver
    def pull(self, st: InStream) -> bool:
        """Land every visible piece from ``st.peer``; True if anything moved."""
        f = self.f
        ch = st.peer * f.world + self.rank
        moved = False
        while not st.done and f.posted[ch] > f.consumed[ch]:
            k = int(f.consumed[ch] % f.K)
            i = ch * f.K + k
            if self.clock.cost is not None and not self.clock.visible(f.not_before, i):
                break
            nb = int(f.piece_bytes[i])
            if nb < 0:
                self._pull_desc(st, ch, k, -nb, self.ufunc)
            else:
                land(st, self.open(st, f.slot(ch, k)[:nb]), self.ufunc)
            f.consumed[ch] += 1  # hand the slot back (for a descriptor: the ack)
            moved = True
            st.done = st.got == st.total
        if moved:
            f.ring(st.peer)
        return moved

    def _pull_desc(self, st: InStream, ch: int, k: int, nb: int, ufunc) -> None:
        """Read the sender's registered buffer in place: one pass, straight into our destination."""
        pairs = self.descriptor_pairs(st, ch, k, nb).copy()
        src_arena = self.f.arena(st.peer)
        for off, ln in pairs.tolist():
            land(st, src_arena[off : off + ln], ufunc)

    def open(self, st: InStream, piece: np.ndarray) -> np.ndarray:
        """The payload of a piece: on the first piece of a fingerprinted message, the header is
        checked (:class:`~..fingerprint.CollectiveMismatch` on disagreement, published to every
        rank) and cut off."""
        if st.fp is None or st.got:
            return piece
        try:
            fingerprint.check(st.fp, st.total, piece[:H], self.rank, st.peer)
        except fingerprint.CollectiveMismatch as e:
            self.f.report_mismatch(e)
            raise
        return piece[H:]

    def descriptor_pairs(self, st: InStream, ch: int, k: int, nb: int) -> np.ndarray:
        """The (offset, length) pairs of a descriptor piece, its header checked first."""
        return self.open(st, self.f.slot(ch, k)[:nb]).view(np.int64).reshape(-1, 2)

    def _next_visible(self, src: int):
        """(channel, slot, piece index) of the next piece from ``src`` when it is posted and visible
        (emulated links hold a piece back until its arrival time), else None."""
        f = self.f
        ch = f.channel(src, self.rank)
        if f.posted[ch] <= f.consumed[ch]:
            return None
        k = int(f.consumed[ch] % f.K)
        i = ch * f.K + k
        return (ch, k, i) if self.clock.visible(f.not_before, i) else None

    def head_descriptor(self, st: InStream):
        """(channel, slot, nbytes) when the next piece from ``st.peer`` is a visible descriptor;
        None when nothing is visible yet; () when it is plain data."""
        nxt = self._next_visible(st.peer)
        if nxt is None:
            return None
        ch, k, i = nxt
        nb = int(self.f.piece_bytes[i])
        return (ch, k, -nb) if nb < 0 else ()

    def peek_header(self, src: int):
        """The fingerprint words leading the next piece from ``src`` when one is visible (it starts a
        message when no receive from ``src`` is in progress), else None."""
        nxt = self._next_visible(src)
        return None if nxt is None else self.f.head(nxt[0], nxt[1])

    def has_message(self, src: int) -> bool:
        ch = self.f.channel(src, self.rank)
        return bool(self.f.posted[ch] > self.f.consumed[ch])


def land(st: InStream, data: np.ndarray, ufunc) -> None:
    """Copy or reduce the next ``len(data)`` bytes of the stream into its destination segments."""
    at, n = 0, len(data)
    while at < n:
        dst = st.segs[st.seg]
        take = min(n - at, dst.nbytes - st.pos)
        chunk = data[at : at + take]
        flag = st.flags[st.seg]
        if flag is not False:
            isz = dst.itemsize
            a, b = st.pos // isz, (st.pos + take) // isz
            acc = dst if flag is True else flag  # out of place: recvbuff = sendbuff + incoming
            ufunc(acc[a:b], chunk.view(dst.dtype), out=dst[a:b])
        else:
            dst.view(np.uint8)[st.pos : st.pos + take] = chunk
        at += take
        st.pos += take
        if st.pos == dst.nbytes:
            st.seg += 1
            st.pos = 0
    st.got += n
