"""What every consistency mode shares: the run's configuration, emulated compute, snapshots.

Emulated compute: the problems here compute a gradient in microseconds, which would let
Python's own costs decide every comparison. Each worker step therefore takes at least
``compute_ms`` (times its straggler factor, plus optional exponential jitter) -- the knob
that stands for a real model's forward and backward pass.

Snapshots: a rank records ``(wall_s, updates, w)`` copies while it trains and the
launcher evaluates them afterwards, so measuring the loss never slows the run it measures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from netmorph.consistency.problems import MODELS
from netmorph.errors import UsageError
from netmorph.runtime.launch import TIMEOUT_RANGE

MODES = ("bsp", "async", "ssp", "hogwild", "local")
MAX_WORKERS = 32  # one process per worker on one machine


@dataclass
class Config:
    mode: str = "bsp"
    workers: int = 4
    servers: int = 1
    steps: int = 200  # updates per worker
    lr: float = 1.0  # the synchronous (BSP) learning rate; per-gradient steps use lr/p
    model: str = "convex"
    batch: int | None = None
    seed: int = 0
    staleness: int = 2  # SSP's bound s
    local_steps: int = 8  # local SGD's H
    outer_lr: float = 1.0  # DiLoCo-style outer step on the averaged delta (1.0 = plain averaging)
    outer_momentum: float = 0.0  # Nesterov momentum of the outer step (DiLoCo uses 0.9)
    n_push: int = 1  # Downpour: push accumulated gradients every n_push steps
    n_fetch: int = 1  # Downpour: fetch parameters every n_fetch steps
    compute_ms: float = 2.0
    straggler: tuple | None = None  # (worker, factor)
    jitter: float = 0.0  # mean extra delay, as a fraction of compute_ms (exponential)
    slow_link: tuple | None = None  # (src, dst, alpha_s, bytes_per_s), emulated on the fabric
    shared_budget: bool = True  # async/ssp/hogwild: workers draw from one pool of steps*workers updates
    snapshots: int = 40
    timeout: float = 60.0
    extra: dict = field(default_factory=dict)

    def check(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"{{mode}} must be one of {', '.join(MODES)}, got {self.mode!r}", "mode")
        if self.model not in MODELS:
            raise UsageError(f"{{model}} must be one of {', '.join(MODELS)}, got {self.model!r}", "model")
        if self.workers < 1:
            raise UsageError(f"{{workers}} must be >= 1, got {self.workers}", "workers")
        if self.workers > MAX_WORKERS:
            raise UsageError(
                f"{{workers}} {self.workers}: one process per worker; keep it <= {MAX_WORKERS} on one machine",
                "workers",
            )
        if self.servers < 1 or self.servers > 8:
            raise UsageError(f"{{servers}} must be in 1..8, got {self.servers}", "servers")
        if self.steps < 1:
            raise UsageError(f"{{steps}} must be >= 1, got {self.steps}", "steps")
        if self.staleness < 0:
            raise UsageError(f"{{staleness}} must be >= 0, got {self.staleness}", "staleness")
        if self.local_steps < 1:
            raise UsageError(f"{{local_steps}} must be >= 1, got {self.local_steps}", "local_steps")
        if self.n_push < 1 or self.n_fetch < 1:
            raise UsageError("{n_push} and {n_fetch} must be >= 1", "n_push")
        if not 0 < self.lr <= 100:
            raise UsageError(f"{{lr}} must be in (0, 100], got {self.lr:g}", "lr")
        if not (0 <= self.compute_ms <= 1e4 and 0 <= self.jitter <= 1e3):
            raise UsageError("{compute_ms} must be in [0, 10000] and {jitter} in [0, 1000]", "compute_ms")
        lo, hi = TIMEOUT_RANGE
        if not lo <= self.timeout <= hi:
            raise UsageError(f"{{timeout}} must be {lo:g}..{hi:g} seconds, got {self.timeout}", "timeout")
        if self.batch is not None and not 1 <= self.batch <= 1 << 16:
            raise UsageError(f"{{batch}} must be in 1..65536, got {self.batch}", "batch")
        if not 0 <= self.seed < 2**63:
            raise UsageError(f"{{seed}} must be a non-negative integer, got {self.seed}", "seed")
        if self.steps > 1_000_000:
            raise UsageError(f"{{steps}} must be at most 1,000,000, got {self.steps}", "steps")
        if not 0 < self.outer_lr <= 10:
            raise UsageError(f"{{outer_lr}} must be in (0, 10] (1: plain averaging), got {self.outer_lr}", "outer_lr")
        if not 0 <= self.outer_momentum < 1:
            raise UsageError(f"{{outer_momentum}} must be in [0, 1), got {self.outer_momentum}", "outer_momentum")
        if self.straggler is not None:
            r, f = self.straggler
            if not 0 <= r < self.workers or not 1 <= f <= 1000:
                raise UsageError(
                    f"{{straggler}} RANK:FACTOR needs 0 <= RANK < {self.workers} and 1 <= FACTOR <= 1000, got {r}:{f}",
                    "straggler",
                )
        if self.slow_link and not all(0 <= r < self.workers + self.servers for r in self.slow_link[:2]):
            raise UsageError(
                "{slow_link}: SRC and DST must be ranks of the run (workers first, then servers)", "slow_link"
            )


class Pacer:
    """Makes one worker step last compute_ms x factor (+ jitter), measured from ``start()``."""

    def __init__(self, cfg: Config, worker: int):
        self.base = cfg.compute_ms / 1000.0
        self.factor = cfg.straggler[1] if cfg.straggler and cfg.straggler[0] == worker else 1.0
        self.jitter = cfg.jitter
        self.rng = np.random.default_rng((cfg.seed, 7919, worker))
        self.t0 = 0.0

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def finish(self) -> None:
        target = self.base * self.factor
        if self.jitter:
            target += self.base * self.rng.exponential(self.jitter)
        left = target - (time.perf_counter() - self.t0)
        if left > 0:
            time.sleep(left)


class Snapshots:
    """(wall_s, updates, w) copies at about ``n`` evenly spaced points of a run."""

    def __init__(self, total_updates: int, n: int, t0: float):
        self.every = max(1, total_updates // max(1, n))
        self.t0 = t0
        self.items = []
        self.next = 0

    def maybe(self, updates: int, w: np.ndarray, force: bool = False) -> None:
        if force or updates >= self.next:
            self.items.append((time.perf_counter() - self.t0, int(updates), np.array(w, copy=True)))
            self.next = (updates // self.every + 1) * self.every
