"""Each link class's α and β, fitted from a ping-pong sweep over message sizes (nccl-tests' sendrecv_perf,
osu_latency's method): the time one message of n bytes takes one way is ``α + β·n``, where α is everything a
message pays whatever its size -- the transport's software on both ends as well as the wire's latency -- and β
the seconds per byte.

Rank 0 and one peer bounce a message ``reps`` times per size while every other rank bounces with its own
partner at the same distance (a collective's step has every rank sending at once); one way is half the median
round trip. The fit minimises the *relative* error over the sizes (every size counts alike, not only
the largest), and the residuals -- predicted over measured, minus one, per size -- go into the profile: where
they are large, one (α, β) does not describe the link (an eager/rendezvous protocol switch, a cache
boundary), and the planner's prediction inherits that error.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from netmorph.calibrate.device import buffer, device_of, rate, synchronizer
from netmorph.runtime.base import Group

SIZES = tuple(8 << (2 * i) for i in range(10))  # 8 B .. 2 MiB, x4
BUDGET = 0.15  # seconds of round trips per size at most (3 at least)


def partner(rank: int, distance: int, world: int) -> int | None:
    """Who ``rank`` bounces with at ``distance``: blocks of ``distance`` ranks pair with the next block (0-1,
    2-3, ... at 1; node 0's ranks with node 1's at a node's size), or None when its block has no partner."""
    other = rank + distance if (rank // distance) % 2 == 0 else rank - distance
    return other if 0 <= other < world else None


def pingpong_rank(comm, peers, sizes=SIZES, reps: int = 9) -> dict:
    """{peer: [one-way seconds per size]} on rank 0 (None elsewhere), for each of rank 0's ``peers`` in turn.
    Every other rank bounces with its own partner at the same distance at the same time (:func:`partner`):
    a collective's step has every rank sending at once, so the link is measured as loaded as it will be --
    on a machine whose ranks share cores, a message costs more while the others send theirs."""
    dev = device_of(comm)
    sync = synchronizer(dev)
    out = {}
    for peer in peers:
        comm.barrier()
        other = partner(comm.rank, peer, comm.world)
        times = []
        if other is not None:
            lead = comm.rank < other
            for n in sizes:
                buf = buffer(comm, n // 4, dev)
                rtts = []
                k, want = 0, reps + 2
                while k < want:  # two warm-ups, then the timed round trips
                    t0 = time.perf_counter()
                    if lead:
                        comm.send(buf, other)
                        comm.recv(buf, other)
                    else:
                        comm.recv(buf, other)
                        comm.send(buf, other)
                    sync()
                    rtt = time.perf_counter() - t0
                    if k >= 2:
                        rtts.append(rtt)
                    elif k == 1 and lead:
                        # a slow link's large messages: as many round trips as fit in BUDGET seconds, at least 3;
                        # the leader decides and tells its partner, so both bounce the same number
                        want = 2 + max(3, min(reps, int(BUDGET / max(rtt, 1e-9))))
                        comm.send(np.array([want], np.int64), other)
                    elif k == 1:
                        got = np.zeros(1, np.int64)
                        comm.recv(got, other)
                        want = int(got[0])
                    k += 1
                times.append(statistics.median(rtts) / 2)
                comm.free_all()
        out[peer] = times
    comm.barrier()
    return out if comm.rank == 0 else None


RING_SIZES = tuple(1 << e for e in range(10, 23, 2))  # 1 KiB .. 4 MiB


LOAD_S = 1e-3  # the compute between two loaded collectives, on one rank alone: about a small layer's


def ring_rank(comm, group_size: int, sizes=RING_SIZES, iters: int = 6, load_s: float = LOAD_S) -> list | None:
    """Seconds per ring all-reduce of each size on groups of ``group_size`` consecutive ranks (a node's), every
    group at once (nccl-tests' all_reduce_perf, the slowest rank's mean of ``iters``); on rank 0, else None.
    Every rank computes between two collectives (GEMMs lasting about ``load_s`` alone; 0: none), as a
    training step interleaves its layers with their TP and pipeline messages, and only the collective calls
    are timed -- what a step's trace shows as communication, waiting for the peers included. A step of a ring
    moves a message between two ranks that must both be running: where ranks share cores, it waits for a peer
    the scheduler gave its core to another rank's compute -- which a ping-pong, or a ring with idle
    neighbours, misses."""
    torch.set_num_threads(1)
    dev = device_of(comm)
    sync = synchronizer(dev)
    first = comm.rank - comm.rank % group_size
    group = Group(range(first, first + group_size))
    a = torch.randn(128, 128, device=dev)
    per = np.array([1 / rate(comm, lambda: torch.mm(a, a), 0.01, 1, device=dev)])
    comm.all_reduce(per, op="max")  # every rank the same number of GEMMs
    calls = int(load_s / per[0]) if load_s > 0 else 0

    def work():
        for _ in range(calls):
            torch.mm(a, a)

    out = []
    for n in sizes:
        buf = buffer(comm, n // 4, dev)
        comm.all_reduce(buf, group=group, algo="ring")  # warm-up
        sync()
        comm.barrier()
        inside = 0.0
        for _ in range(iters):
            work()
            sync()
            t0 = time.perf_counter()
            comm.all_reduce(buf, group=group, algo="ring")
            sync()
            inside += time.perf_counter() - t0
        t = np.array([inside / iters])
        comm.all_reduce(t, op="max")
        out.append(float(t[0]))
        comm.free_all()
    return out if comm.rank == 0 else None


def fit_ring(p, sizes, seconds) -> tuple[float, float, float, list]:
    """(base, α, β, residuals) of a ring all-reduce on p ranks: ``base + 2(p-1)·α + 2(p-1)/p·n·β`` -- a cost per
    call (NCCL's tuner: baseLat), its 2(p-1) steps each one message of n/p bytes -- minimising the relative error.
    ``p``, ``sizes`` and ``seconds`` may each be a list of several rings (one per group size): one fit to all of
    them, the residuals concatenated. With one group size the base and α cannot be told apart: base 0."""
    if isinstance(p, int):
        p, sizes, seconds = [p], [sizes], [seconds]
    rows, ts, ps, ns = [], [], [], []
    for g, n_, t_ in zip(p, sizes, seconds):
        n = np.asarray(n_, dtype=np.float64)
        t = np.asarray(t_, dtype=np.float64)
        rows.append(np.stack([1 / t, 2 * (g - 1) / t, 2 * (g - 1) / g * n / t], axis=1))
        ts.append(t)
        ps.append(np.full(len(n), g, dtype=np.float64))
        ns.append(n)
    a, t, g, n = np.concatenate(rows), np.concatenate(ts), np.concatenate(ps), np.concatenate(ns)
    base, alpha = 0.0, -1.0
    if len(set(p)) > 1:
        (base, alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if base <= 0 or alpha < 0:  # one size, or no cost per call in the data: the steps alone
        base = 0.0
        (alpha, beta), *_ = np.linalg.lstsq(a[:, 1:], np.ones_like(t), rcond=None)
    alpha, beta = max(float(alpha), 0.0), max(float(beta), 1e-15)
    return float(base), alpha, beta, [float(x) for x in (base + 2 * (g - 1) * (alpha + n / g * beta)) / t - 1]


def fit(sizes, seconds) -> tuple[float, float, list]:
    """(α, β, residuals): ``t = α + β·n`` minimising the relative error; residuals = fit / measured - 1."""
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    a = np.stack([1 / t, n / t], axis=1)  # (α + β n) / t ≈ 1 for every size
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    alpha, beta = max(float(alpha), 0.0), max(float(beta), 1e-15)
    return alpha, beta, [float(x) for x in (alpha + beta * n) / t - 1]
