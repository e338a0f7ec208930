"""Out of place as a case of the schedule: read the send buffer, write the receive buffer.

NCCL's ``ncclAllReduce(sendbuff, recvbuff, count, ...)`` (and ``ncclReduce``,
``ncclBroadcast``) never copies ``sendbuff`` into ``recvbuff`` first: a ring's
first step sends its block straight from ``sendbuff``, the receiver reduces the
incoming block with its own ``sendbuff`` block into ``recvbuff`` (a
three-operand reduction), and every later step works in ``recvbuff``. nccl-tests'
first column, out of place, times exactly that.

:func:`out_of_place` turns any in-place schedule of an all-reduce, reduce or
broadcast into that form by first touch. The workspace keeps its in-place layout
(output and scratch) and gains the input as a region of its own, after it. An
element of the in-place input span that no round has written yet still holds the
input in the in-place run, so here a row that reads it reads the input region, a
reduction into it takes the input element as its accumulator
(:attr:`~netmorph.schedule.core.Round.acc_off`), and a copy into it simply writes
the output. Output elements no round ever writes (a broadcast root's, a rank of a
1-member group's) get one local copy at the end, as NCCL's broadcast root copies
``sendbuff`` to ``recvbuff``. So the wire carries exactly the in-place schedule's
messages, and no element of the payload is moved once more than the algorithm
needs: the copy in front of an in-place schedule is gone.
"""

from __future__ import annotations

import bisect

import numpy as np

from netmorph.schedule.core import Schedule

OPS = ("allreduce", "reduce", "broadcast")  # one buffer in place, a send and a receive buffer out of place


class _Written:
    """The element intervals of one rank's workspace some round has written (sorted, disjoint)."""

    __slots__ = ("lo", "hi")

    def __init__(self):
        self.lo: list[int] = []
        self.hi: list[int] = []

    def pieces(self, a: int, b: int):
        """``[a, b)`` cut into ``(lo, hi, written)`` pieces, in order."""
        out, at = [], a
        i = max(0, bisect.bisect_right(self.lo, a) - 1)
        while at < b and i < len(self.lo):
            lo, hi = self.lo[i], self.hi[i]
            if hi <= at:
                i += 1
                continue
            if lo >= b:
                break
            if lo > at:
                out.append((at, lo, False))
                at = lo
            end = min(hi, b)
            out.append((at, end, True))
            at = end
            i += 1
        if at < b:
            out.append((at, b, False))
        return out

    def add(self, a: int, b: int) -> None:
        if a >= b:
            return
        i = bisect.bisect_left(self.hi, a)  # first interval that ends at or after a
        j = bisect.bisect_right(self.lo, b)  # intervals [i, j) touch [a, b)
        if i < j:
            a, b = min(a, self.lo[i]), max(b, self.hi[j - 1])
        self.lo[i:j] = [a]
        self.hi[i:j] = [b]


def _cuts(*splits):
    """The common refinement of several piece lists over the same row (relative offsets)."""
    edges = sorted({e for pieces in splits for lo, hi, _ in pieces for e in (lo, hi)})
    return list(zip(edges[:-1], edges[1:]))


def _state(pieces, lo: int) -> bool:
    for a, b, w in pieces:
        if a <= lo < b:
            return w
    return True  # empty row: nothing to read


def out_of_place(s: Schedule) -> Schedule:
    """``s`` (an in-place all-reduce, reduce or broadcast) reading a separate send buffer: the input region
    lies after the in-place workspace (``in_off = buf_len``), the output where it was."""
    if s.op not in OPS:
        raise ValueError(f"out_of_place: {s.op} is not an in-place op ({', '.join(OPS)})")
    p = s.world
    base = s.buf_len.astype(np.int64)
    in_lo, in_hi = s.in_off.astype(np.int64), (s.in_off + s.in_len).astype(np.int64)
    t = Schedule(
        s.op,
        s.algo,
        p,
        s.count,
        s.itemsize,
        base + s.in_len,
        base.copy(),
        s.in_len.copy(),
        s.out_off.copy(),
        s.out_len.copy(),
        s.reduces,
        root=s.root,
        meta=dict(s.meta),
        in_key=s.in_off.copy(),
    )
    written = [_Written() for _ in range(p)]
    pending = np.ones(p, dtype=bool)  # ranks with input elements no round has written yet
    for r in range(p):
        pending[r] = in_hi[r] > in_lo[r]

    def source(r: int, off: int, was_written: bool) -> int:
        """Where rank r's element ``off`` (in-place coordinates) is now: the output, or the input region."""
        if was_written or not (in_lo[r] <= off < in_hi[r]):
            return off
        return int(base[r] + off - in_lo[r])

    for rd in s.rounds:
        if not (pending[rd.src].any() or pending[rd.dst].any()):
            t.rounds.append(rd)  # every element it touches is in the output already
            continue
        red = rd.reduce_rows()
        rows = {k: [] for k in ("src", "dst", "src_off", "dst_off", "length", "reduce", "msg", "acc")}
        msg = rd.msg if rd.msg is not None else np.arange(len(rd), dtype=np.int64)
        split = False
        for i in range(len(rd)):
            sr, dr, so, do, n = (
                int(rd.src[i]),
                int(rd.dst[i]),
                int(rd.src_off[i]),
                int(rd.dst_off[i]),
                int(rd.length[i]),
            )
            rp = [(a - so, b - so, w) for a, b, w in written[sr].pieces(so, so + n)] if pending[sr] else [(0, n, True)]
            wp = [(a - do, b - do, w) for a, b, w in written[dr].pieces(do, do + n)] if pending[dr] else [(0, n, True)]
            cuts = _cuts(rp, wp) if n else [(0, 0)]
            split |= len(cuts) > 1
            for a, b in cuts:
                acc = -1
                if red[i] and not _state(wp, a):
                    acc = source(dr, do + a, False)
                    acc = -1 if acc == do + a else acc
                for k, v in (
                    ("src", sr),
                    ("dst", dr),
                    ("src_off", source(sr, so + a, _state(rp, a))),
                    ("dst_off", do + a),
                    ("length", b - a),
                    ("reduce", bool(red[i])),
                    ("msg", int(msg[i])),
                    ("acc", acc),
                ):
                    rows[k].append(v)
        acc = np.array(rows["acc"], dtype=np.int64)
        if not split:  # same rows, same messages: keep the round's own arrays
            t.add(
                rd.src,
                rd.dst,
                rows["src_off"],
                rd.dst_off,
                rd.length,
                rd.reduce,
                rd.msg,
                acc if (acc >= 0).any() else None,
            )
        else:
            t.add(
                rows["src"],
                rows["dst"],
                rows["src_off"],
                rows["dst_off"],
                rows["length"],
                np.array(rows["reduce"], dtype=bool),
                rows["msg"],
                acc if (acc >= 0).any() else None,
            )
        for dr, do, n in zip(rd.dst.tolist(), rd.dst_off.tolist(), rd.length.tolist()):  # writes land last
            if pending[dr]:
                written[dr].add(do, do + n)
        for r in np.unique(rd.dst[pending[rd.dst]]).tolist():
            pending[r] = any(not w for _, _, w in written[r].pieces(int(in_lo[r]), int(in_hi[r])))
    _copy_untouched(t, s, written, pending, source)
    return t


def _copy_untouched(t: Schedule, s: Schedule, written, pending, source) -> None:
    """One local round: every output element no round wrote gets the input (a broadcast root's data)."""
    src, off, to, ln = [], [], [], []
    for r in np.flatnonzero(pending).tolist():
        lo, hi = (
            max(int(s.out_off[r]), int(s.in_off[r])),
            min(int(s.out_off[r] + s.out_len[r]), int(s.in_off[r] + s.in_len[r])),
        )
        for a, b, w in written[r].pieces(lo, hi) if hi > lo else []:
            if not w:
                src.append(r)
                off.append(source(r, a, False))
                to.append(a)
                ln.append(b - a)
    if src:
        t.add(src, src, off, to, ln)
