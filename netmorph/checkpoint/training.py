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
written and before its ``.done``: the crash mid-save the suite recovers from (under torchrun, in the job's first
attempt only: the attempt ``--max-restarts`` starts goes on).
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
from netmorph.checkpoint.shards import NAMES, flats, owners, rank_boxes, rank_maps

KILL = "NETMORPH_CHECKPOINT_KILL"


def meta(model, layout, done: int, dtype: str = "float64", lr: float = 0.0) -> str:
    """What a checkpoint says about the run that wrote it."""
    return json.dumps(
        {
            "format": 1,
            "step": done,
            "consumed_samples": done * layout.batch.global_batch,
            "global_batch": layout.batch.global_batch,
            "model": asdict(model),
            "layout": layout.tag(),
            "world": layout.world,
            "dtype": dtype,
            "lr": lr,
        }
    )


class Saver:
    """One rank's part of the run's saves (module docstring); ``log`` on rank 0: one row per checkpoint."""

    def __init__(self, comm, cfg):
        self.comm, self.cfg, self.ck = comm, cfg, cfg.checkpoint
        self.root = Path(self.ck.save)
        self.maps = rank_maps(cfg.model, cfg.layout, comm.rank)
        self.boxes = rank_boxes(
            cfg.model, cfg.layout, comm.rank, owned=True, who=owners(cfg.model, cfg.layout, master=cfg.mixed)
        )
        self.end = cfg.start_step + cfg.steps
        self.log: list = []
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        kill = os.environ.get(KILL, "")
        first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"  # a job torchrun restarts dies once
        self.kill = tuple(int(x) for x in kill.split("@")) if "@" in kill and first else None
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
        self.wait()  # at most one save in flight
        blocked = time.perf_counter() - t0
        cfg = self.cfg
        staged = stage(
            self.comm,
            self.root,
            done,
            cfg.model,
            self.boxes,
            self.maps,
            state,
            meta(cfg.model, cfg.layout, done, cfg.dtype, cfg.lr),
        )
        took = time.perf_counter() - t0
        if self.ck.async_save:
            self.thread = threading.Thread(
                target=self._guarded, args=(staged, t0, took, blocked), name="netmorph-checkpoint", daemon=True
            )
            self.thread.start()
        else:
            self._write(staged, t0, took, blocked)

    def _guarded(self, *args) -> None:
        try:
            self._write(*args)
        except BaseException as e:  # noqa: BLE001 - raised in the rank's thread by wait()
            self.error = e

    def _write(self, staged, t0: float, took: float, blocked: float) -> None:
        final, sums, removed = complete(self.comm, staged, self.root, self.ck.keep, self.kill)
        if final is not None:
            self.log.append(
                {
                    "step": staged.step,
                    "path": str(final),
                    "bytes": sum((final / f).stat().st_size for f in sums),
                    "staged_s": took,
                    "blocked_s": blocked,
                    "save_s": time.perf_counter() - t0,
                    "removed": removed,
                }
            )

    def wait(self) -> None:
        """The save in flight done (its error raised here)."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            err, self.error = self.error, None
            raise err


class Staged:
    """A save after its plan exchange, its shards in host memory: what is left is writing them."""

    def __init__(self, step: int, path: Path, planned):
        self.step, self.path, self.planned = step, path, planned


def stage(comm, root: Path, done: int, model, boxes: list, maps: dict, state: dict, about: str) -> Staged:
    """The part of a save in the step, on every rank: its ``boxes`` copied from ``state`` (its flat state under
    its element maps ``maps``, :func:`~netmorph.checkpoint.shards.rank_maps`) to host memory, the plan exchanged
    with rank 0 (the only messages of a save)."""
    tensors = dcp.host_copy(boxes, flats(state, maps))
    train = {"step": done, "meta": about, "rng": torch.get_rng_state()}
    path = folder.partial_dir(root, done)
    if comm.rank == 0:
        path.mkdir(parents=True, exist_ok=True)
    return Staged(done, path, dcp.plan_save(comm, path, model, tensors, state["t"], train))


def complete(comm, staged: Staged, root: Path, keep: int = 0, kill=None) -> tuple:
    """The rest, with no message (it may run in a thread beside training): this rank's file written and
    synced, its ``.done`` left in the folder; rank 0 waits for every rank's, writes ``.metadata``, publishes and
    prunes. (the checkpoint's folder, {file: sha256}, the steps removed) on rank 0, (None, None, None) elsewhere."""
    path = staged.path
    results, sums = dcp.write(staged.planned, path)
    if kill == (comm.rank, staged.step):
        os.kill(os.getpid(), signal.SIGKILL)
    mark = path / f".rank-{comm.rank}.done"
    with open(mark.with_suffix(".tmp"), "wb") as fh:
        pickle.dump((results, sums), fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(mark.with_suffix(".tmp"), mark)
    if comm.rank:
        return None, None, None
    marks = [path / f".rank-{r}.done" for r in range(comm.world)]
    deadline = time.monotonic() + comm.transport.timeout
    while not all(mk.exists() for mk in marks):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"checkpoint of step {staged.step}: ranks {[r for r, mk in enumerate(marks) if not mk.exists()]}"
                f" did not finish their shards within {comm.transport.timeout:g} s"
            )
        time.sleep(0.002)
    everyone = []
    for mk in marks:
        with open(mk, "rb") as fh:
            everyone.append(pickle.load(fh))
        mk.unlink()
    sums = dcp.finish(staged.planned, path, everyone)
    final = folder.publish(root, staged.step, sums)
    return final, sums, folder.prune(root, keep)


def save_state(comm, root, done: int, model, layout, state: dict, keep: int = 0) -> None:
    """One checkpoint of every rank's flat ``state`` under ``layout``, written in the step (morph's and elastic's
    checkpoints: the trainer's code)."""
    root = Path(root)
    boxes = rank_boxes(model, layout, comm.rank, owned=True)
    maps = rank_maps(model, layout, comm.rank)
    complete(comm, stage(comm, root, done, model, boxes, maps, state, meta(model, layout, done)), root, keep)
    comm.barrier()  # the checkpoint is published before anyone goes on


def load_state(path, model, layout, rank: int, dtype: str = "float64") -> dict:
    """Rank ``rank``'s flat state under ``layout`` from the checkpoint in ``path`` (written on any layout): the
    dense buffer's ``{"params", "m", "v", "t"}``, a mixture of experts' expert buffer under ``"experts"``."""
    maps = rank_maps(model, layout, rank)
    full = {(b, k): np.zeros(m.flat.size, dtype=np.dtype(dtype)) for b, m in maps.items() for k in NAMES}
    dest, twins = {}, []
    for b in rank_boxes(model, layout, rank):
        view = torch.from_numpy(b.view(full[b.key]))
        if (b.fqn, b.offsets) in dest:  # a V's rank 0 holds the tied embedding twice: read once, copied
            twins.append((dest[b.fqn, b.offsets], view))
        else:
            dest[b.fqn, b.offsets] = view
    got = dcp.load(Path(path), model, dest)
    for src, dst in twins:
        dst.copy_(src)
    if got.get("rng") is not None:
        torch.set_rng_state(got["rng"])
    out = {}
    for b, m in maps.items():
        lo, hi = m.optimizer
        out[b] = {
            "params": full[b, "params"],
            "m": full[b, "m"][lo:hi].copy(),
            "v": full[b, "v"][lo:hi].copy(),
            "t": got["t"],
        }
    state = out.pop("dense")
    return {**state, **out}


def resume(cfg, rank: int) -> dict:
    """Rank ``rank``'s flat state under ``cfg.layout`` from the checkpoint ``cfg.checkpoint.load``."""
    # a bf16 run's state on the host is its float32 master
    return load_state(cfg.checkpoint.load, cfg.model, cfg.layout, rank, "float32" if cfg.mixed else cfg.dtype)


class Resume:
    """``train_rank``'s ``inits``: rank r's state read from the checkpoint when the rank asks for it."""

    def __init__(self, cfg):
        self.cfg = cfg

    def __getitem__(self, rank: int) -> dict:
        return resume(self.cfg, rank)
