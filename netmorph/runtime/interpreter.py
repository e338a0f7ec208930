"""Run this rank's part of a schedule on a transport: the schedule interpreter.

MSCCL compiles a collective's program into per-GPU instruction lists and its
runtime interprets them step by step; this is that runtime. For a collective
call it builds (and caches) the schedule and this rank's program
(:func:`netmorph.schedule.rank_program`), maps the program's workspace offsets
onto the caller's real arrays (used in place), and hands each round's sends and
receives to the transport, recording every message in the ledger. What runs is
exactly what was counted and timed.
"""

from __future__ import annotations

import bisect
import time
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from netmorph.collectives import build
from netmorph.schedule import out_of_place, rank_program


class Call(NamedTuple):
    """What identifies one collective's schedule: the key of the program cache (a tuple: cheap to
    build and hash once per collective call)."""

    op: str
    algo: str
    world: int
    count: int
    itemsize: int
    root: int = 0
    splits: tuple | None = None  # all-to-all: the flattened (world, world) element table
    options: tuple = ()
    in_place: bool = True  # False: the out-of-place case (a send buffer after the workspace)


@lru_cache(maxsize=256)
def program(call: Call, rank: int):
    """(schedule, this rank's program) for ``call``, built once per process."""
    kw = dict(call.options)
    if call.splits is not None:
        kw["splits"] = np.array(call.splits, dtype=np.int64).reshape(call.world, call.world)
    s = build(call.op, call.algo, call.world, call.count, call.itemsize, root=call.root, **kw)
    if not call.in_place:
        s = out_of_place(s)
    return s, rank_program(s, rank)


class Workspace:
    """The schedule's flat workspace as regions of real arrays (user buffers used in place)."""

    def __init__(self, regions):
        self.starts = [s for s, _ in regions]
        self.arrays = [a for _, a in regions]

    def view(self, off: int, n: int) -> np.ndarray:
        i = bisect.bisect_right(self.starts, off) - 1
        a = self.arrays[i]
        lo = off - self.starts[i]
        if lo + n > len(a):
            raise AssertionError("segment crosses a workspace region")
        return a[lo : lo + n]


def interpret(
    transport, ledger, call: Call, ranks, me: int, regions, ufunc, seq: int, phase: str, fp=None, peers=None
) -> None:
    """Run schedule rank ``me``'s program of ``call``; schedule rank i is global rank ``ranks[i]``, which the
    transport calls ``peers[ranks[i]]`` (a renumbered communicator: ``CommBase.reform``; None: the same).
    ``fp``: the call's fingerprint, carried by every message (None: no headers)."""
    _, prog = program(call, me)
    ws = Workspace(regions)
    me_global = ranks[me]
    isz = call.itemsize
    slot = ranks if peers is None else [peers[r] for r in ranks]
    for rr in prog:
        sends = [(slot[m.peer], [ws.view(o, n) for o, n in zip(m.offs.tolist(), m.lens.tolist())]) for m in rr.sends]
        recvs = [
            (
                slot[m.peer],
                [ws.view(o, n) for o, n in zip(m.offs.tolist(), m.lens.tolist())],
                m.reduce.tolist() if m.acc is None else _flags(ws, m),
            )
            for m in rr.recvs
        ]
        t0 = time.perf_counter()
        transport.run_round(sends, recvs, ufunc, rr.overlap, fp)
        t1 = time.perf_counter()
        for m in rr.sends:
            ledger.add(me_global, ranks[m.peer], m.elems * isz, seq, rr.index, phase, call.op, call.algo, t0, t1)
        for so, do, n in rr.local:
            ws.view(do, n)[:] = ws.view(so, n)


def _flags(ws: Workspace, m) -> list:
    """Per segment of a receive: False (copy), True (reduce into the destination) or the accumulator's
    view (reduce it with the incoming data into the destination: out of place)."""
    return [ws.view(a, n) if a >= 0 else bool(r) for a, n, r in zip(m.acc.tolist(), m.lens.tolist(), m.reduce.tolist())]
