"""All-to-all with per-destination sizes: ``torch.distributed.all_to_all_single``
with ``input_split_sizes`` / ``output_split_sizes``, ``MPI_Alltoallv``; NCCL
builds it from grouped ``ncclSend``/``ncclRecv``. This is the MoE dispatch.

``splits[s, d]`` elements go from rank s to rank d. Rank r's workspace is
``send | recv | scratch``: its send buffer holds the blocks for d = 0..p-1 in
order, its receive buffer the blocks from s = 0..p-1 in order. ``--bytes`` is the
per-rank send buffer, split evenly (nccl-tests' convention).

- ``naive``: every rank posts all p-1 sends at once, in destination order
  0, 1, 2, ... -- so every rank hits rank 0 first and the receive ports queue
  (the hot spot MPICH's ``MPIR_Alltoall_intra_scattered`` avoids by rotating).
- ``pairwise``: round k, rank r sends to r+k and receives from r-k: one partner
  each way per round, no contention (MPICH ``MPIR_Alltoall_intra_pairwise``).
- ``bruck``: ceil(log2 p) rounds; in round k every block whose distance
  ``(d - s) mod p`` has bit k set hops 2^k ranks forward (Bruck et al. 1997;
  MPICH ``MPIR_Alltoall_intra_brucks``). Fewer rounds, each block travels up to
  log2 p hops: more bytes. Forwarded blocks wait in the holder's scratch area.
"""

from __future__ import annotations

import numpy as np

from netmorph.collectives import base
from netmorph.schedule import COPY, Schedule


def _add(s: Schedule, src, dst, so, do, ln, msg=None) -> None:
    """Add a round without its empty blocks: an MoE rank that routes nothing to an expert sends nothing."""
    ln = np.asarray(ln)
    keep = ln > 0
    cols = [np.asarray(c)[keep] for c in (src, dst, so, do, ln)]
    s.add(*cols, COPY, msg=None if msg is None else np.asarray(msg)[keep])


def even_splits(p: int, count: int) -> np.ndarray:
    """Rank s sends block d of ``bounds(count, p)`` to rank d."""
    b = base.bounds(count, p)
    return np.tile(np.diff(b), (p, 1))


def _offsets(splits):
    send_off = np.cumsum(splits, axis=1) - splits  # [s, d]
    recv_base = splits.sum(axis=1)  # recv region starts after send
    recv_off = recv_base[None, :] + np.cumsum(splits, axis=0) - splits  # [s, d]: where d keeps s's block
    return send_off, recv_off


def _setup(algo, p, count, itemsize, splits):
    splits = even_splits(p, count) if splits is None else np.asarray(splits, dtype=np.int64)
    if splits.shape != (p, p) or (splits < 0).any():
        raise ValueError(f"splits must be a ({p}, {p}) matrix of non-negative element counts")
    s = base.layout("alltoall", algo, p, count, itemsize, splits=splits)
    return s, splits


def _self_copies(splits, send_off, recv_off):
    r = np.arange(len(splits))
    return r, r, send_off[r, r], recv_off[r, r], splits[r, r]


def naive(p: int, count: int, itemsize: int = 4, splits=None) -> Schedule:
    s, splits = _setup("naive", p, count, itemsize, splits)
    send_off, recv_off = _offsets(splits)
    r = np.arange(p)
    cols = [list(x) for x in _self_copies(splits, send_off, recv_off)]
    for i in range(p - 1):  # i-th post of every rank: destinations in order 0,1,.. (skip self)
        d = np.where(i < r, i, i + 1)
        for c, v in zip(cols, (r, d, send_off[r, d], recv_off[r, d], splits[r, d])):
            c.extend(v)
    _add(s, *cols)
    return s


def pairwise(p: int, count: int, itemsize: int = 4, splits=None) -> Schedule:
    s, splits = _setup("pairwise", p, count, itemsize, splits)
    send_off, recv_off = _offsets(splits)
    r = np.arange(p, dtype=np.int64)
    for k in range(1, p):
        d = (r + k) % p
        src, dst, so, do, ln = r, d, send_off[r, d], recv_off[r, d], splits[r, d]
        if k == 1:  # the local self-copy rides along with the first round
            sr, sd, sso, sdo, sln = _self_copies(splits, send_off, recv_off)
            src, dst, so, do, ln = (np.concatenate(x) for x in ((src, sr), (dst, sd), (so, sso), (do, sdo), (ln, sln)))
        _add(s, src, dst, so, do, ln)
    if p == 1:
        _add(s, *_self_copies(splits, send_off, recv_off))
    return s


def bruck(p: int, count: int, itemsize: int = 4, splits=None) -> Schedule:
    s, splits = _setup("bruck", p, count, itemsize, splits)
    send_off, recv_off = _offsets(splits)
    if p == 1:
        _add(s, *_self_copies(splits, send_off, recv_off))
        return s
    src_r, dst_r = np.nonzero(~np.eye(p, dtype=bool))  # every block (s, d), s != d
    size = splits[src_r, dst_r]
    j = (dst_r - src_r) % p  # how far the block must travel
    where = send_off[src_r, dst_r].astype(np.int64)  # offset of the block at its holder
    scratch_used = s.buf_len.copy()  # scratch grows past send|recv
    first = True
    k = 0
    while (1 << k) < p:
        hop = 1 << k
        moving = ((j >> k) & 1) == 1
        holder = (src_r + (j & (hop - 1))) % p
        nxt = (holder + hop) % p
        final = (j >> (k + 1)) == 0
        m = np.nonzero(moving)[0]
        dst_off = np.empty(len(m), dtype=np.int64)
        fin = final[m]
        dst_off[fin] = recv_off[src_r[m[fin]], dst_r[m[fin]]]
        park = m[~fin]  # blocks that rest at nxt until a later hop
        if len(park):
            order = np.argsort(nxt[park], kind="stable")
            ps, pz = park[order], size[park[order]]
            holders = nxt[ps]
            csum = np.cumsum(pz) - pz
            group_start = np.searchsorted(holders, holders, side="left")
            within = csum - csum[group_start]
            offs = scratch_used[holders] + within
            np.add.at(scratch_used, holders, pz)
            tmp = np.empty(len(park), dtype=np.int64)
            tmp[order] = offs
            dst_off[~fin] = tmp
        src_off = where[m]
        rows = (holder[m], nxt[m], src_off, dst_off, size[m])
        if first:
            rows = tuple(np.concatenate([a, b]) for a, b in zip(rows, _self_copies(splits, send_off, recv_off)))
            first = False
        _add(s, *rows, msg=rows[0])
        where[m] = dst_off
        k += 1
    s.buf_len = scratch_used
    return s
