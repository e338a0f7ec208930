"""Symbolic execution of a :class:`~netmorph.schedule.core.Schedule` (duck-typed: this
module sits below ``core``, which calls it from ``Schedule.validate``).

Each element of each rank's workspace carries a *key* (which input element it
derives from, -1 for "nothing yet") and a *mask* of the ranks whose
contributions it already sums. A copy moves (key, mask); a reduce requires equal
keys and disjoint masks and takes the union. That is enough to prove, for every
element, that a schedule never sends what it does not hold, never double-counts,
and ends with what the op promises -- without picking numbers, so a schedule that
is right by luck on random data still fails here. Cost is O(world * buffer) per
round with Python-int masks: test-sized schedules only.
"""

from __future__ import annotations

import numpy as np

from netmorph.schedule.ranges import expand_ranges


class ScheduleError(ValueError):
    """A schedule breaks a rule; the message names the round and ranks."""


def _span(a: np.ndarray) -> str:
    a = np.unique(a)
    return f"[{a.min()}, {a.max() + 1})" if len(a) else "[]"


def expected_output(s, r: int) -> tuple[np.ndarray, np.ndarray]:
    """(key, mask) every output element of rank ``r`` must end with."""
    p = s.world
    lo, n = int(s.out_off[r]), int(s.out_len[r])
    if s.reduces:
        key = np.arange(lo, lo + n, dtype=np.int64)
        return key, np.full(n, (1 << p) - 1, dtype=object)
    if s.op == "alltoall":
        splits = s.meta["splits"]  # (p, p): splits[src, dst] elements
        send_off = np.cumsum(splits, axis=1) - splits  # where src keeps its block for dst
        key = np.concatenate(
            [np.arange(send_off[q, r], send_off[q, r] + splits[q, r]) for q in range(p)] + [np.zeros(0, np.int64)]
        ).astype(np.int64)
        owner = np.repeat(np.arange(p), splits[:, r])
        return key, np.array([1 << int(q) for q in owner], dtype=object)
    # copy ops with same-offset semantics (all-gather, broadcast): owner holds it as input
    key = np.arange(lo, lo + n, dtype=np.int64)
    mask = np.zeros(n, dtype=object)
    at = s.in_off if s.in_key is None else s.in_key  # where each input lies in the in-place layout
    for q in range(p):
        a, b = max(lo, int(at[q])), min(lo + n, int(at[q] + s.in_len[q]))
        if b > a:
            mask[a - lo : b - lo] = 1 << q
    return key, mask


def validate(s) -> None:
    p = s.world
    L = int(max(1, s.buf_len.max()))
    key = np.full((p, L), -1, dtype=np.int64)
    mask = np.zeros((p, L), dtype=object)
    for r in range(p):
        a, n = int(s.in_off[r]), int(s.in_len[r])
        if a < 0 or a + n > s.buf_len[r] or s.out_off[r] < 0 or s.out_off[r] + s.out_len[r] > s.buf_len[r]:
            raise ScheduleError(f"rank {r}: input or output span outside its {s.buf_len[r]}-element workspace")
        k0 = a if s.in_key is None else int(s.in_key[r])  # out of place: named by its in-place offset
        key[r, a : a + n] = np.arange(k0, k0 + n)
        mask[r, a : a + n] = 1 << r
    fkey, fmask = key.reshape(-1), mask.reshape(-1)

    for k, rd in enumerate(s.rounds):
        where = f"{s.algo} round {k}"
        if len(rd) and (rd.src.min() < 0 or rd.dst.min() < 0 or rd.src.max() >= p or rd.dst.max() >= p):
            raise ScheduleError(f"{where}: a transfer names a rank outside 0..{p - 1}")
        if (rd.length < 0).any() or (rd.src_off < 0).any() or (rd.dst_off < 0).any():
            raise ScheduleError(f"{where}: negative offset or length")
        if ((rd.src_off + rd.length) > s.buf_len[rd.src]).any() or ((rd.dst_off + rd.length) > s.buf_len[rd.dst]).any():
            raise ScheduleError(f"{where}: a segment runs past the end of a workspace")
        red = rd.reduce_rows()
        if rd.msg is not None:
            remote = rd.src != rd.dst
            for m in np.unique(rd.msg[remote]):
                rows = (rd.msg == m) & remote
                if (
                    len(np.unique(rd.src[rows])) > 1
                    or len(np.unique(rd.dst[rows])) > 1
                    or len(np.unique(red[rows])) > 1
                ):
                    raise ScheduleError(f"{where}: message {m} mixes peers or copy/reduce")
        sidx = np.repeat(rd.src * L, rd.length) + expand_ranges(rd.src_off, rd.length)
        didx = np.repeat(rd.dst * L, rd.length) + expand_ranges(rd.dst_off, rd.length)
        rrow = np.repeat(red, rd.length)
        c = ~rrow
        if len(np.unique(didx[c])) != int(c.sum()) or np.isin(didx[c], didx[rrow]).any():
            raise ScheduleError(f"{where}: two transfers write the same elements in one round")
        skey, smask = fkey[sidx].copy(), fmask[sidx].copy()
        acc = None
        if rd.acc_off is not None:
            if ((rd.acc_off >= 0) & ~red).any():
                raise ScheduleError(f"{where}: a copy names an accumulator")
            if ((rd.acc_off + rd.length) > s.buf_len[rd.dst]).any():
                raise ScheduleError(f"{where}: an accumulator runs past the end of a workspace")
            arow = np.repeat(rd.acc_off >= 0, rd.length)
            aidx = (np.repeat(rd.dst * L, rd.length) + expand_ranges(np.maximum(rd.acc_off, 0), rd.length))[arow]
            acc = (didx[arow], fkey[aidx].copy(), fmask[aidx].copy())  # read at the start of the round
            if (acc[1] < 0).any():
                raise ScheduleError(f"{where}: an accumulator holds no data yet")
        bad = skey < 0
        if bad.any():
            i = int(np.argmax(bad))
            s_rank = int(sidx[i] // L)
            raise ScheduleError(
                f"{where}: rank {s_rank} sends elements {_span(sidx[bad & (sidx // L == s_rank)] % L)} "
                f"it does not hold yet"
            )
        if acc is not None:  # the destination starts from its accumulator, once
            fkey[acc[0]] = acc[1]
            fmask[acc[0]] = acc[2]
        if rrow.any():
            d, k_in, m_in = didx[rrow], skey[rrow], smask[rrow]
            if (fkey[d] != k_in).any():
                raise ScheduleError(f"{where}: a reduction combines different elements (or into an empty slot)")
            # several children may reduce into one parent's slot in the same round: fold them in one by one
            for j in range(len(d)):
                if fmask[d[j]] & m_in[j]:
                    raise ScheduleError(
                        f"{where}: a reduction counts a rank's contribution twice (into rank {int(d[j] // L)})"
                    )
                fmask[d[j]] |= m_in[j]
        fkey[didx[c]] = skey[c]
        fmask[didx[c]] = smask[c]

    for r in range(p):
        want_key, want_mask = expected_output(s, r)
        lo, n = int(s.out_off[r]), int(s.out_len[r])
        got_key, got_mask = key[r, lo : lo + n], mask[r, lo : lo + n]
        wrong = (got_key != want_key) | np.array([a != b for a, b in zip(got_mask, want_mask)], dtype=bool)
        if wrong.any():
            idx = np.nonzero(wrong)[0] + lo
            raise ScheduleError(f"{s.algo}: rank {r} ends with wrong or partial data at elements {_span(idx)}")
