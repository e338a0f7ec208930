"""One rank's view of a schedule: what it sends, receives and copies in each round.

This is the per-rank program a transport runs -- MSCCL compiles its XML
schedule into exactly such per-GPU instruction lists. Rows between the same pair
of ranks in one round travel as one message (segments in row order), so sender
and receiver agree on the byte stream without any header. ``overlap`` marks a
round in which this rank receives into bytes it still has to send (recursive
doubling's whole-vector exchange): the transport then snapshots its sends first,
keeping the schedule's start-of-round read semantics. A receive that reduces
into a destination with an accumulator (out of place) names it per segment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from netmorph.schedule.core import Schedule


@dataclass
class Msg:
    peer: int
    offs: np.ndarray  # element offsets in this rank's workspace, in stream order
    lens: np.ndarray  # element counts
    reduce: np.ndarray  # per segment (receives only)
    acc: np.ndarray | None = None  # per segment: the accumulator's offset, -1 the destination (None: all -1)

    @property
    def elems(self) -> int:
        return int(self.lens.sum())


@dataclass
class RankRound:
    index: int
    sends: list = field(default_factory=list)  # [Msg]
    recvs: list = field(default_factory=list)  # [Msg]
    local: list = field(default_factory=list)  # [(src_off, dst_off, len)]
    overlap: bool = False


def _intervals_overlap(a_offs, a_lens, b_offs, b_lens) -> bool:
    if not len(a_offs) or not len(b_offs):
        return False
    a = sorted((int(o), int(o + l)) for o, l in zip(a_offs, a_lens) if l > 0)
    b = sorted((int(o), int(o + l)) for o, l in zip(b_offs, b_lens) if l > 0)
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i][0] < b[j][1] and b[j][0] < a[i][1]:
            return True
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return False


def _group(peers, offs, lens, red, acc=None):
    """Rows to one message per peer, keeping row order inside each message."""
    out = []
    if not len(peers):
        return out
    order = np.argsort(peers, kind="stable")
    peers, offs, lens, red = peers[order], offs[order], lens[order], red[order]
    acc = None if acc is None else acc[order]
    cuts = np.flatnonzero(np.diff(peers)) + 1
    for idx in np.split(np.arange(len(peers)), cuts):
        a = None if acc is None or not (acc[idx] >= 0).any() else acc[idx]
        out.append(Msg(int(peers[idx[0]]), offs[idx], lens[idx], red[idx], a))
    return out


def rank_program(s: Schedule, rank: int) -> list[RankRound]:
    prog = []
    for k, rd in enumerate(s.rounds):
        red = rd.reduce_rows()
        remote = rd.src != rd.dst
        mine_s = remote & (rd.src == rank)
        mine_r = remote & (rd.dst == rank)
        loc = (~remote) & (rd.src == rank)
        if not (mine_s.any() or mine_r.any() or loc.any()):
            continue
        rr = RankRound(k)
        rr.sends = _group(rd.dst[mine_s], rd.src_off[mine_s], rd.length[mine_s], red[mine_s])
        rr.recvs = _group(
            rd.src[mine_r],
            rd.dst_off[mine_r],
            rd.length[mine_r],
            red[mine_r],
            None if rd.acc_off is None else rd.acc_off[mine_r],
        )
        rr.local = list(zip(rd.src_off[loc].tolist(), rd.dst_off[loc].tolist(), rd.length[loc].tolist()))
        if rr.sends and rr.recvs:
            so = np.concatenate([m.offs for m in rr.sends])
            sl = np.concatenate([m.lens for m in rr.sends])
            ro = np.concatenate([m.offs for m in rr.recvs])
            rl = np.concatenate([m.lens for m in rr.recvs])
            rr.overlap = _intervals_overlap(so, sl, ro, rl)
        prog.append(rr)
    return prog
