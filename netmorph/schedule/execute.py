"""Executors of one schedule: the in-process oracle and the counter.

``execute`` runs a :class:`~netmorph.schedule.core.Schedule` on p numpy
buffers in one process -- the oracle every transport is checked against, and
itself checked against numpy's reductions. ``count`` reports what a run would
put on the wire, the quantities nccl-tests and the MPICH cost papers reason in:
message rounds on the critical path, messages, bytes sent / received / reduced
per rank, bytes on the wire and the per-link traffic. Both walk the schedule a
round at a time over arrays, never a transfer at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from netmorph.schedule.core import Schedule
from netmorph.schedule.ranges import expand_ranges

REDOPS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def execute(s: Schedule, inputs, op: str = "sum") -> list[np.ndarray]:
    """Run ``s`` on ``inputs`` (one array per rank, ``in_len[r]`` elements each).

    Returns each rank's output span as a new array (empty for ranks with no
    output, e.g. non-roots of a reduce).
    """
    if op not in REDOPS:
        raise ValueError(f"unknown reduction {op!r}; choose one of {', '.join(REDOPS)}")
    ufunc = REDOPS[op]
    p = s.world
    if len(inputs) != p:
        raise ValueError(f"need {p} input arrays, got {len(inputs)}")
    dtype = np.result_type(*[np.asarray(x).dtype for x in inputs]) if p else np.float32
    L = int(max(1, s.buf_len.max()))
    buf = np.zeros((p, L), dtype=dtype)
    for r, x in enumerate(inputs):
        x = np.asarray(x).reshape(-1)
        if len(x) != s.in_len[r]:
            raise ValueError(f"rank {r}: input has {len(x)} elements, the schedule expects {s.in_len[r]}")
        buf[r, s.in_off[r] : s.in_off[r] + len(x)] = x
    flat = buf.reshape(-1)
    for rd in s.rounds:
        sidx = np.repeat(rd.src * L, rd.length) + expand_ranges(rd.src_off, rd.length)
        didx = np.repeat(rd.dst * L, rd.length) + expand_ranges(rd.dst_off, rd.length)
        data = flat[sidx]  # every read sees the start-of-round state
        if rd.acc_off is not None:  # out of place: those destinations start from the input
            arow = np.repeat(rd.acc_off >= 0, rd.length)
            aidx = np.repeat(rd.dst * L, rd.length) + expand_ranges(np.maximum(rd.acc_off, 0), rd.length)
            flat[didx[arow]] = flat[aidx[arow]]
        # several children may reduce into one parent's slot in one round: ufunc.at accumulates them
        if isinstance(rd.reduce, bool):
            if rd.reduce:
                ufunc.at(flat, didx, data)
            else:
                flat[didx] = data
        else:
            red = np.repeat(rd.reduce, rd.length)
            flat[didx[~red]] = data[~red]
            ufunc.at(flat, didx[red], data[red])
    return [buf[r, s.out_off[r] : s.out_off[r] + s.out_len[r]].copy() for r in range(p)]


@dataclass
class Counts:
    """What one run of a schedule puts on the wire (bytes; ranks are schedule ranks).

    ``rounds`` counts sequential steps on the critical path under the single-port
    model: per round, the most messages any one rank must send or receive (a root
    that receives from 7 peers in one round is 7 steps). ``logical_rounds`` is the
    number of rounds as written.
    """

    world: int
    rounds: int
    logical_rounds: int
    messages: int
    bytes_sent: np.ndarray  # per rank
    bytes_recv: np.ndarray  # per rank
    bytes_reduced: np.ndarray  # per rank: bytes it combines into its buffer
    bytes_on_wire: int
    local_bytes: int  # copies a rank makes inside its own workspace
    link_src: np.ndarray  # sparse per-link traffic: (src, dst) -> bytes
    link_dst: np.ndarray
    link_bytes: np.ndarray

    @property
    def max_bytes_sent(self) -> int:
        return int(self.bytes_sent.max()) if self.world else 0

    @property
    def links(self) -> int:
        """Distinct directed links that carry at least one message."""
        return int((self.link_bytes > 0).sum())

    def traffic_matrix(self) -> np.ndarray:
        """Dense ``(world, world)`` bytes matrix, ``[src, dst]`` (for small worlds)."""
        m = np.zeros((self.world, self.world), dtype=np.int64)
        m[self.link_src, self.link_dst] = self.link_bytes
        return m


class _Pattern:
    """Accumulators for all rounds that share one (src, dst) message pattern."""

    __slots__ = ("src", "dst", "elems", "reduced", "load")

    def __init__(self, src, dst, p):
        self.src, self.dst = src, dst
        self.elems = np.zeros(len(src), dtype=np.int64)
        self.reduced = np.zeros(len(src), dtype=np.int64)
        if len(src):
            self.load = int(max(np.bincount(src, minlength=p).max(), np.bincount(dst, minlength=p).max()))
        else:
            self.load = 0


def count(s: Schedule) -> Counts:
    """Count ``s``. Per round it only adds a vector; the per-rank sums happen once per pattern."""
    p, isz = s.world, s.itemsize
    patterns: dict[tuple[int, int], _Pattern] = {}
    rounds = logical = messages = local = 0
    for rd in s.rounds:
        src, dst, elems, red = rd.messages()
        if rd.msg is not None or len(rd.src) != len(src):
            local += int(rd.length[rd.src == rd.dst].sum())
        if not len(src):
            continue
        key = (id(src), id(dst))
        pat = patterns.get(key)
        if pat is None:
            pat = patterns[key] = _Pattern(src, dst, p)
        pat.elems += elems
        if isinstance(red, bool):
            if red:
                pat.reduced += elems
        else:
            pat.reduced += np.where(red, elems, 0)
        rounds += pat.load
        logical += 1
        messages += len(src)
    sent = np.zeros(p, dtype=np.int64)
    recv = np.zeros(p, dtype=np.int64)
    reduced = np.zeros(p, dtype=np.int64)
    keys, vals = [], []
    for pat in patterns.values():
        sent += np.bincount(pat.src, weights=pat.elems, minlength=p).astype(np.int64)
        recv += np.bincount(pat.dst, weights=pat.elems, minlength=p).astype(np.int64)
        reduced += np.bincount(pat.dst, weights=pat.reduced, minlength=p).astype(np.int64)
        keys.append(pat.src * p + pat.dst)
        vals.append(pat.elems)
    if keys:
        k = np.concatenate(keys)
        uniq, inv = np.unique(k, return_inverse=True)
        lb = np.bincount(inv, weights=np.concatenate(vals), minlength=len(uniq)).astype(np.int64)
    else:
        uniq, lb = np.zeros(0, np.int64), np.zeros(0, np.int64)
    return Counts(
        world=p,
        rounds=rounds,
        logical_rounds=logical,
        messages=messages,
        bytes_sent=sent * isz,
        bytes_recv=recv * isz,
        bytes_reduced=reduced * isz,
        bytes_on_wire=int(sent.sum()) * isz,
        local_bytes=local * isz,
        link_src=uniq // max(p, 1),
        link_dst=uniq % max(p, 1),
        link_bytes=lb * isz,
    )
