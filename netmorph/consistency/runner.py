"""Run one consistency mode on real processes, or all of them, and summarise what happened.

Each mode runs under :func:`netmorph.runtime.launch.launch` with the ledger on, so
bytes on the wire are counted, not estimated. The snapshots the ranks took are
evaluated here, after the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from netmorph.consistency.common import MODES, Config
from netmorph.consistency.problems import make
from netmorph.runtime.progress import ProgressCounter

SYSTEMS = {
    "bsp": "PyTorch DDP / Horovod: all-reduce every step",
    "async": "DistBelief Downpour SGD: parameter server, no waiting",
    "ssp": "Petuum SSPTable: stale synchronous parallel, bound s",
    "hogwild": "Hogwild!: lock-free writes to shared memory",
    "local": "local SGD / DiLoCo: average every H steps",
}


@dataclass
class RunResult:
    """One mode's run: the JSON-ready summary (what ``netmorph sgd --json`` prints), what every rank
    returned, and the trained parameters."""

    summary: dict
    ranks: list
    final: np.ndarray


def _entry(mode):
    from netmorph.consistency import hogwild, ps, sync

    return {
        "bsp": sync.bsp,
        "local": sync.local_sgd,
        "async": ps.ps_rank,
        "ssp": ps.ps_rank,
        "hogwild": hogwild.hogwild,
    }[mode]


def _rank_fn(comm, cfg, progress):
    return _entry(cfg.mode)(comm, cfg, progress)


def run(cfg: Config, on_progress=None, backend: str = "local") -> RunResult | None:
    """Train with ``cfg.mode`` on ``cfg.workers`` processes (+ servers). ``backend="job"``: this process is one
    rank of a torchrun job of that many ranks (torch.distributed point-to-point); rank 0 gets the result, the
    others None."""
    from netmorph.runtime.launch import launch

    cfg.check()
    make(cfg.model, cfg.batch, cfg.seed)  # build before the fork: the ranks inherit it
    ps_mode = cfg.mode in ("async", "ssp")
    world = cfg.workers + (cfg.servers if ps_mode else 0)
    progress = ProgressCounter(world)
    slow = None
    if cfg.slow_link is not None:
        s, d, a, bw = cfg.slow_link
        slow = {(s, d): (a, bw), (d, s): (a, bw)}
    t0 = time.perf_counter()
    with progress.watch(on_progress, ProgressCounter.total, cfg.steps * cfg.workers):
        got = launch(_rank_fn, world, cfg, progress, ledger=True, timeout=cfg.timeout, slow_links=slow, backend=backend)
    elapsed = time.perf_counter() - t0
    if got is None:  # a torchrun rank other than 0
        return None
    return summarise(cfg, list(got), got.ledger, elapsed)


def _combine_shards(results, dim):
    """Server snapshots, one per shard at matching update counts, into whole-vector snapshots."""
    servers = [r for r in results if r.get("role") == "server"]
    by_updates = {}
    for srv in servers:
        lo, hi = srv["shard"]
        for wall, upd, w in srv["snapshots"]:
            slot = by_updates.setdefault(upd, [0.0, np.full(dim, np.nan)])
            slot[0] = max(slot[0], wall)
            slot[1][lo:hi] = w
    snaps = [(wall, upd, w) for upd, (wall, w) in sorted(by_updates.items()) if not np.isnan(w).any()]
    final = np.full(dim, np.nan)
    for srv in servers:
        lo, hi = srv["shard"]
        final[lo:hi] = srv["w"]
    return snaps, final


def summarise(cfg: Config, results, ledger, elapsed) -> RunResult:
    prob = make(cfg.model, cfg.batch, cfg.seed)
    if cfg.mode in ("async", "ssp"):
        snaps, final = _combine_shards(results, prob.dim)
        workers = [r for r in results if r.get("role") == "worker"]
        stale = {}
        for r in results:
            if r.get("role") == "server":
                for k, v in r["staleness"].items():  # each gradient is recorded once per shard
                    stale[k] = stale.get(k, 0) + v
        stale = {k: v // cfg.servers for k, v in stale.items()}
        wall = max(r["wall"] for r in workers)
        updates = sum(r["updates"] for r in workers)
    else:
        snaps, final = results[0]["snapshots"], results[0]["w"]
        stale = {}
        for r in results:
            for k, v in r["staleness"].items():
                stale[k] = stale.get(k, 0) + v
        wall = max(r["wall"] for r in results)
        updates = sum(r["updates"] for r in results)
    curve = [[round(t, 6), int(u), prob.loss(w)] for t, u, w in snaps]
    out = {
        "mode": cfg.mode,
        "system": SYSTEMS[cfg.mode],
        "model": cfg.model,
        "workers": cfg.workers,
        "servers": cfg.servers if cfg.mode in ("async", "ssp") else 0,
        "updates": updates,
        "wall_s": wall,
        "updates_per_s": updates / wall if wall > 0 else 0.0,
        "launch_s": elapsed,
        "initial_loss": curve[0][2] if curve else None,
        "final_loss": prob.loss(final),
        "loss_curve": curve,
        "max_staleness": max(stale) if stale else 0,
        "staleness_histogram": {int(k): int(v) for k, v in sorted(stale.items())},
        "bytes_on_wire": ledger.bytes,
        "messages": len(ledger),
        "staleness_bound": cfg.staleness if cfg.mode == "ssp" else None,
        "local_steps": cfg.local_steps if cfg.mode == "local" else None,
        "straggler": list(cfg.straggler) if cfg.straggler else None,
    }
    out.update(prob.metrics(final))
    if cfg.mode == "ssp":
        srv = [r for r in results if r.get("role") == "server"]
        out["max_clock_gap"] = max(r["max_clock_gap"] for r in srv)
        out["held_pulls"] = sum(r["held_pulls"] for r in srv)
    if cfg.mode == "hogwild":
        out["shared_bytes_written"] = sum(r.get("shared_bytes_written", 0) for r in results)
        out["conflict_rate"] = sum(r["conflicts"] for r in results) / max(1, updates)
    return RunResult(out, results, final)


def time_to(curve, target):
    """Wall seconds until the loss first reaches ``target`` (None if never)."""
    for t, _, loss in curve:
        if loss <= target:
            return t
    return None


def compare(base: Config, modes=MODES, on_mode=None, on_progress=None) -> list[RunResult]:
    """Every mode with the same model, data, workers and update count."""
    out = []
    for m in modes:
        cfg = Config(**{**base.__dict__, "mode": m})
        if on_mode:
            on_mode(m)
        out.append(run(cfg, on_progress))
    init = max(r.summary["initial_loss"] for r in out)
    best = min(r.summary["final_loss"] for r in out)
    target = best + 0.1 * (init - best)  # 90% of the best reduction any mode achieved
    for r in out:
        r.summary["target_loss"] = target
        r.summary["time_to_target_s"] = time_to(r.summary["loss_curve"], target)
    return out
