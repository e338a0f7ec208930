"""Each link class's α and β, fitted from a ping-pong sweep over message sizes (nccl-tests' sendrecv_perf,
osu_latency's method): the time one message of n bytes takes one way is ``α + β·n``, where α is everything a
message pays whatever its size -- the transport's software on both ends as well as the wire's latency -- and β
the seconds per byte.

Rank 0 and one peer bounce a message ``reps`` times per size while every other rank waits; one way is half the
median round trip. The fit minimises the *relative* error over the sizes (every size counts alike, not only
the largest), and the residuals -- predicted over measured, minus one, per size -- go into the profile: where
they are large, one (α, β) does not describe the link (an eager/rendezvous protocol switch, a cache
boundary), and the planner's prediction inherits that error.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

SIZES = tuple(8 << (2 * i) for i in range(10))     # 8 B .. 2 MiB, x4


def pingpong_rank(comm, peers, sizes=SIZES, reps: int = 9) -> dict:
    """{peer: [one-way seconds per size]} on rank 0 (None elsewhere): rank 0 and each of ``peers`` in turn."""
    out = {}
    for peer in peers:
        comm.barrier()
        if comm.rank in (0, peer):
            other = peer if comm.rank == 0 else 0
            times = []
            for n in sizes:
                buf = comm.alloc(max(1, n // 4), np.float32)
                rtts = []
                for k in range(reps + 2):                       # two warm-ups
                    t0 = time.perf_counter()
                    if comm.rank == 0:
                        comm.send(buf, other)
                        comm.recv(buf, other)
                    else:
                        comm.recv(buf, other)
                        comm.send(buf, other)
                    if k >= 2:
                        rtts.append(time.perf_counter() - t0)
                times.append(statistics.median(rtts) / 2)
                comm.free_all()
            out[peer] = times
    comm.barrier()
    return out if comm.rank == 0 else None


def fit(sizes, seconds) -> tuple[float, float, list]:
    """(α, β, residuals): ``t = α + β·n`` minimising the relative error; residuals = fit / measured - 1."""
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    a = np.stack([1 / t, n / t], axis=1)                    # (α + β n) / t ≈ 1 for every size
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    alpha, beta = max(float(alpha), 0.0), max(float(beta), 1e-15)
    return alpha, beta, [float(x) for x in (alpha + beta * n) / t - 1]
