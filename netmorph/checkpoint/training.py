"""The trainer's checkpoints: ``train --save DIR [--save-every N] [--keep K] [--async-save]`` and ``--load DIR``.

:class:`Saver` is a training rank's part of every save (torchtitan's ``CheckpointManager``): at the step's end
it copies its boxes of the parameters and Adam's moments to host memory (the staging), exchanges the save plan
with rank 0 over the communicator, and writes its ``.distcp`` file -- in the step, or with ``--async-save`` in a
thread while the next steps run, at most one save in flight (the next waits for it). A rank whose file is
written and synced leaves ``.rank-R.done`` (its write results and checksums) in the partial folder; rank 0,
once every rank's is there, writes DCP's ``.metadata`` and publishes the folder (:mod:`netmorph.checkpoint.
folder`). The finish goes through the folder rather than the communicator so that a background save never
sends a message between the training's own (torchtitan gives its async save a process group of its own).

:func:`resume` is a rank's start from a checkpoint written on any layout: its boxes under its own layout read
by DCP's resharding into fresh flat buffers, Adam's step, the data position the launcher already set
(``start_step``).

``NETMORPH_CHECKPOINT_KILL=RANK@STEP`` makes rank RANK SIGKILL itself in the save of step STEP, after its shard is
written and before its ``.done``: the crash mid-save the suite recovers from.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from netmorph.checkpoint import dcp, folder
from netmorph.checkpoint.shards import NAMES, owners, rank_boxes

KILL = "NETMORPH_CHECKPOINT_KILL"


def meta(cfg, done: int) -> str:
    """What a checkpoint says about the run that wrote it."""
    lay = cfg.layout
    return json.dumps({"format": 1, "step": done, "consumed_samples": done * lay.global_batch,
                       "global_batch": lay.global_batch, "model": asdict(cfg.model), "layout": lay.tag(),
                       "world": lay.world, "dtype": cfg.dtype, "lr": cfg.lr})


def _full(m, state: dict, dtype) -> dict:
    """{kind: the rank's whole flat buffer of it} (Adam's moments placed at their range)."""
    lo, hi = m.optimizer
    out = {"params": np.asarray(state["params"])}
    for kind in ("m", "v"):
        out[kind] = np.zeros(m.flat.size, dtype=dtype)
        out[kind][lo:hi] = state[kind]
    return out


class Saver:
    """One rank's part of the run's saves (module docstring); ``log`` on rank 0: one row per checkpoint."""

    def __init__(self, comm, cfg):
        from netmorph.mesh.elements import element_map
        self.comm, self.cfg, self.ck = comm, cfg, cfg.checkpoint
        self.root = Path(self.ck.save)
        self.map = element_map(cfg.model, cfg.layout)[comm.rank]
        self.boxes = rank_boxes(cfg.model, cfg.layout, comm.rank, owned=True, who=owners(cfg.model, cfg.layout))
        self.end = cfg.start_step + cfg.steps
        self.log: list = []
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        kill = os.environ.get(KILL, "")
        self.kill = tuple(int(x) for x in kill.split("@")) if "@" in kill else None
        if comm.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            folder.sweep(self.root)
        comm.barrier()

    def commit(self, done: int, state) -> None:
        """After step ``done`` (``state()``: the rank's flat state): save when it is due."""
        if done == self.end or self.ck.every and done % self.ck.every == 0:
            self.save(done, state())

    def save(self, done: int, state: dict) -> None:
        t0 = time.perf_counter()
        self.wait()                                   # at most one save in flight
        blocked = time.perf_counter() - t0
        tensors = dcp.host_copy(self.boxes, _full(self.map, state, state["params"].dtype))
        train = {"step": done, "meta": meta(self.cfg, done), "rng": torch.get_rng_state()}
        path = folder.partial_dir(self.root, done)
        if self.comm.rank == 0:
            path.mkdir(parents=True, exist_ok=True)
        plan = dcp.plan_save(self.comm, path, self.cfg.model, tensors, state["t"], train)
        staged = time.perf_counter() - t0
        if self.ck.async_save:
            self.thread = threading.Thread(target=self._guarded, args=(plan, done, path, t0, staged, blocked),
                                           name="netmorph-checkpoint", daemon=True)
            self.thread.start()
        else:
            self._write(plan, done, path, t0, staged, blocked)

    def _guarded(self, *args) -> None:
        try:
            self._write(*args)
        except BaseException as e:                    # noqa: BLE001 - raised in the rank's thread by wait()
            self.error = e

    def _write(self, plan, done: int, path: Path, t0: float, staged: float, blocked: float) -> None:
        results, sums = dcp.write(plan, path)
        if self.kill == (self.comm.rank, done):
            os.kill(os.getpid(), signal.SIGKILL)
        mark = path / f".rank-{self.comm.rank}.done"
        with open(mark.with_suffix(".tmp"), "wb") as fh:
            pickle.dump((results, sums), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(mark.with_suffix(".tmp"), mark)
        if self.comm.rank:
            return
        marks = [path / f".rank-{r}.done" for r in range(self.comm.world)]
        deadline = time.monotonic() + self.comm.transport.timeout
        while not all(m.exists() for m in marks):
            if time.monotonic() > deadline:
                raise TimeoutError(f"checkpoint of step {done}: ranks {[r for r, m in enumerate(marks) if not m.exists()]}"
                                   f" did not finish their shards within {self.comm.transport.timeout:g} s")
            time.sleep(0.002)
        everyone = []
        for m in marks:
            with open(m, "rb") as fh:
                everyone.append(pickle.load(fh))
            m.unlink()
        sums = dcp.finish(plan, path, everyone)
        final = folder.publish(self.root, done, sums)
        removed = folder.prune(self.root, self.ck.keep)
        size = sum((final / f).stat().st_size for f in sums)
        self.log.append({"step": done, "path": str(final), "bytes": size, "staged_s": staged, "blocked_s": blocked,
                         "save_s": time.perf_counter() - t0, "removed": removed})

    def wait(self) -> None:
        """The save in flight done (its error raised here)."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            err, self.error = self.error, None
            raise err


def resume(cfg, rank: int) -> dict:
    """Rank ``rank``'s flat state under ``cfg.layout`` from the checkpoint ``cfg.checkpoint.load`` (any layout's)."""
    from netmorph.mesh.elements import element_map
    m = element_map(cfg.model, cfg.layout)[rank]
    dtype = np.dtype(cfg.dtype)
    flats = {k: np.zeros(m.flat.size, dtype=dtype) for k in NAMES}
    dest = {(b.fqn, b.offsets): torch.from_numpy(b.view(flats[b.kind]))
            for b in rank_boxes(cfg.model, cfg.layout, rank)}
    got = dcp.load(Path(cfg.checkpoint.load), cfg.model, dest)
    if got.get("rng") is not None:
        torch.set_rng_state(got["rng"])
    lo, hi = m.optimizer
    return {"params": flats["params"], "m": flats["m"][lo:hi].copy(), "v": flats["v"][lo:hi].copy(), "t": got["t"]}


class Resume:
    """``train_rank``'s ``inits``: rank r's state read from the checkpoint when the rank asks for it."""

    def __init__(self, cfg):
        self.cfg = cfg

    def __getitem__(self, rank: int) -> dict:
        return resume(self.cfg, rank)
