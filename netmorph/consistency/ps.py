"""Parameter-server SGD: asynchronous (Downpour) and stale synchronous parallel (SSP).

Ranks ``0 .. W-1`` are workers, ``W .. W+S-1`` servers; server j owns the j-th
contiguous shard of the parameters (Li et al. 2014, "Scaling Distributed Machine
Learning with the Parameter Server"). Messages are a 4-word header
``[kind, clock, version, elems]`` and, for pushes and replies, the shard.

- ``async``: DistBelief's Downpour SGD (Dean et al. 2012). The server applies each
  pushed gradient the moment it arrives; a worker fetches parameters every
  ``n_fetch`` steps and pushes its accumulated gradient every ``n_push`` steps,
  applying its own gradients to its local copy in between. Eventual consistency.
- ``ssp``: stale synchronous parallel (Ho et al. 2013; Petuum's SSPTable). Worker
  clocks advance one per step. The server keeps pushed gradients per clock and
  commits clock k (applies all of its gradients, in worker order) once every worker
  has pushed it. A worker at clock c may read only a state that includes every
  update of clocks <= c - s - 1; a cached read that old is used as is, otherwise it
  pulls, and the server holds the reply until the commit it needs has happened --
  so a worker more than s clocks ahead of the slowest blocks. Its reads also
  include its own uncommitted updates (read-my-writes). s = 0 is BSP; s = ∞ is async.

Staleness of a gradient = floor((server updates when it is applied - server
updates in the state it was computed on) / W), i.e. how many global steps old its
parameters were -- 0 under BSP, at most s under SSP (tested).
"""

from __future__ import annotations

import time

import numpy as np

from netmorph.collectives.base import bounds
from netmorph.consistency.common import Pacer, Snapshots
from netmorph.consistency.problems import make

PUSH, PULL, DONE = 1, 2, 3


class _Servers:
    """A worker's view of the sharded servers."""

    def __init__(self, comm, W, S, dim):
        self.comm, self.ranks = comm, list(range(W, W + S))
        self.b = bounds(dim, S)

    def push(self, clock, version, g):
        for j, srv in enumerate(self.ranks):
            shard = g[self.b[j] : self.b[j + 1]]
            self.comm.send(np.array([PUSH, clock, version, len(shard)], np.int64), srv)
            self.comm.send(np.ascontiguousarray(shard), srv)

    def pull(self, clock, w):
        """Fill ``w`` from every shard; returns (committed clock, server updates) of server 0's reply."""
        for srv in self.ranks:
            self.comm.send(np.array([PULL, clock, 0, 0], np.int64), srv)
        meta = None
        hdr = np.zeros(4, np.int64)
        for j, srv in enumerate(self.ranks):
            self.comm.recv(hdr, srv)
            self.comm.recv(w[self.b[j] : self.b[j + 1]], srv)
            if meta is None:
                meta = (int(hdr[1]), int(hdr[2]))
        return meta

    def done(self):
        for srv in self.ranks:
            self.comm.send(np.array([DONE, 0, 0, 0], np.int64), srv)


def worker(comm, cfg, progress):
    prob = make(cfg.model, cfg.batch, cfg.seed)
    W, S, rank = cfg.workers, cfg.servers, comm.rank
    srv = _Servers(comm, W, S, prob.dim)
    pace = Pacer(cfg, rank)
    w = prob.init(cfg.seed)
    ssp = cfg.mode == "ssp"
    pushed_sum = np.zeros(prob.dim)  # every gradient this worker pushed, for the no-lost-update check
    pushes = 0
    own = {}  # ssp: clock -> own update not yet committed (read-my-writes)
    acc = np.zeros(prob.dim)
    cached = None  # (committed clock, server updates, server params)
    comm.barrier()
    t0 = time.perf_counter()
    version = 0
    budget = cfg.steps * W  # a shared update budget: fast workers may take more of it
    c = -1
    while (progress.total() < budget) if cfg.shared_budget else (c + 1 < cfg.steps):
        c += 1
        if ssp:
            if cached is None or cached[0] < c - cfg.staleness - 1:
                base = np.empty(prob.dim)
                committed, version = srv.pull(c, base)
                cached = (committed, version, base)
            committed, version, base = cached
            for k in [k for k in own if k <= committed]:
                del own[k]
            w = base - sum((own[k] for k in sorted(own)), np.zeros(prob.dim))
        elif c % cfg.n_fetch == 0:
            _, version = srv.pull(c, w)
        pace.start()
        _, g = prob.grad(w, prob.batch(rank, c))
        pace.finish()
        if ssp:
            own[c] = cfg.lr / W * g
            srv.push(c, version, g)
            pushed_sum += g
            pushes += 1
        else:
            w -= cfg.lr / W * g  # Downpour: the replica applies its own update locally
            acc += g
            if (c + 1) % cfg.n_push == 0:
                srv.push(c, version, acc)
                pushed_sum += acc
                pushes += 1
                acc = np.zeros(prob.dim)
        progress.bump(rank)
    if not ssp and acc.any():
        srv.push(c, version, acc)
        pushed_sum += acc
        pushes += 1
    wall = time.perf_counter() - t0
    srv.done()
    return {"role": "worker", "wall": wall, "updates": c + 1, "pushes": pushes, "pushed_sum": pushed_sum}


def server(comm, cfg, progress):
    prob = make(cfg.model, cfg.batch, cfg.seed)
    W, S = cfg.workers, cfg.servers
    j = comm.rank - W
    b = bounds(prob.dim, S)
    lo, hi = int(b[j]), int(b[j + 1])
    w = prob.init(cfg.seed)[lo:hi].copy()
    ssp = cfg.mode == "ssp"
    hdr = np.zeros(4, np.int64)
    buf = np.empty(hi - lo)
    applied = np.zeros(W, np.int64)  # pushes applied, per worker
    clocks = np.zeros(W, np.int64)  # ssp: clocks pushed, per worker
    pending: dict[int, dict[int, np.ndarray]] = {}
    read_version: dict[int, dict[int, int]] = {}
    committed = -1
    updates = 0  # gradients applied to this shard
    deferred = []  # ssp: (worker, clock) pulls waiting for a commit
    stale = {}
    done = 0
    comm.barrier()
    t0 = time.perf_counter()
    snaps = Snapshots(cfg.steps * W, cfg.snapshots, t0)
    snaps.maybe(0, w)
    BIG = np.iinfo(np.int64).max // 2
    gap = [0, 0]  # ssp: max (pushed clock - slowest live clock), pulls held back

    def reply(dst, committed, updates):
        comm.send(np.array([0, committed, updates, hi - lo], np.int64), dst)
        comm.send(w, dst)

    def commit(committed, updates):
        """Apply every clock all live workers have pushed, in clock order, then answer waiting pulls."""
        nonlocal deferred
        while clocks.min() > committed + 1 and (committed + 1) in pending:
            k = committed + 1
            grads, vers = pending.pop(k), read_version.pop(k)
            for wk in sorted(grads):  # worker order: deterministic sums
                record(vers[wk], updates)
                applied[wk] += 1
            w[:] -= cfg.lr / W * np.sum([grads[wk] for wk in sorted(grads)], axis=0)
            updates += len(grads)
            committed = k
            snaps.maybe(updates, w)
        if clocks.min() >= BIG:  # everyone finished: release any waiter
            committed = max(committed, max(pending, default=committed))
        still = []
        for wk, c in deferred:
            if committed >= c - cfg.staleness - 1:
                reply(wk, committed, updates)
            else:
                still.append((wk, c))
        deferred = still
        return committed, updates

    def record(version, updates):
        k = max(0, (updates - version) // W)
        stale[k] = stale.get(k, 0) + 1

    while done < W:
        src = comm.recv_any(hdr, range(W))
        kind, clock, version = int(hdr[0]), int(hdr[1]), int(hdr[2])
        if kind == PUSH:
            comm.recv(buf, src)
            if not ssp:
                record(version, updates)
                w -= cfg.lr / W * buf
                updates += 1
                applied[src] += 1
                snaps.maybe(updates, w)
            else:
                live = clocks[clocks < BIG]
                gap[0] = max(gap[0], clock - int(live.min()) if len(live) else 0)
                pending.setdefault(clock, {})[src] = buf.copy()
                read_version.setdefault(clock, {})[src] = version
                clocks[src] = clock + 1
                committed, updates = commit(committed, updates)
        elif kind == PULL:
            if ssp and committed < clock - cfg.staleness - 1:
                deferred.append((src, clock))  # the SSP gate: too far ahead of the slowest
                gap[1] += 1
            else:
                reply(src, committed, updates)
        elif kind == DONE:
            done += 1
            if ssp:  # a finished worker pushes no more clocks: commits stop waiting for it
                clocks[src] = BIG
                committed, updates = commit(committed, updates)
    snaps.maybe(updates, w, force=True)
    return {
        "role": "server",
        "shard": (lo, hi),
        "wall": time.perf_counter() - t0,
        "updates": updates,
        "applied": applied,
        "staleness": stale,
        "snapshots": snaps.items,
        "w": w,
        "max_clock_gap": gap[0],
        "held_pulls": gap[1],
    }


def ps_rank(comm, cfg, progress):
    return worker(comm, cfg, progress) if comm.rank < cfg.workers else server(comm, cfg, progress)
