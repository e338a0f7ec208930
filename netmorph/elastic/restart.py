"""torchrun's recovery, the baseline in-place recovery is measured against: on any death every worker is torn
down and restarted (the dead one replaced) from the last checkpoint on disk, every step since redone.

The same job as :mod:`netmorph.elastic.train` (its problem, batches and update) or, ``job="gpt"``, as
:mod:`netmorph.elastic.gpt` (the GPT trainer, checkpointed as the trainer checkpoints: every rank's shards of
the parameters and Adam's state in DCP's format, :func:`netmorph.checkpoint.training.save_state`); for the toy
problem ``torch.save`` every ``commit_every`` steps is an atomic ``np.save``, and each attempt is one
:func:`~netmorph.runtime.launch`, as ``torchrun --max-restarts`` starts one worker group per attempt.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time

import numpy as np

from netmorph.elastic import gpt
from netmorph.elastic.agent import arm_faults
from netmorph.elastic.train import ElasticConfig, _grad_loss, global_batch, problem
from netmorph.files import write_text
from netmorph.parallel.hybrid import train_rank
from netmorph.runtime import LaunchError, launch


def _restart_rank(comm, cfg: ElasticConfig, start: int, w0, ckpt_dir: str, attempt: int):
    """One attempt of the torchrun-style job: every worker from the last checkpoint on disk."""
    x, y = problem(cfg)
    w, step = w0.copy(), start
    p, me = comm.world, comm.rank
    dies_at = {r: s for r, s in cfg.kills if s >= start}.get(me)
    while step < cfg.steps:
        mine = np.array_split(global_batch(cfg, step), p)[me]
        buf = _grad_loss(x, y, w, mine)
        if step == dies_at and attempt == _attempt_of(cfg, me):
            os.kill(os.getpid(), signal.SIGKILL)
        comm.all_reduce(buf, algo="ring")
        w = w - cfg.lr * buf[:-1] / cfg.global_batch
        step += 1
        if me == 0:
            _stamp(ckpt_dir, step, start, attempt)
            if step % cfg.commit_every == 0:  # torch.save(state) every K steps, atomically
                np.save(os.path.join(ckpt_dir, "w.tmp.npy"), w)
                os.replace(os.path.join(ckpt_dir, "w.tmp.npy"), os.path.join(ckpt_dir, "w.npy"))
                write_text(os.path.join(ckpt_dir, "step"), str(step))
    return w


def _restart_gpt_rank(comm, cfg: ElasticConfig, start: int, saved, ckpt_dir: str, attempt: int):
    """One attempt on the GPT trainer: every worker from the last checkpoint on disk (the trainer's, DCP's
    format: ``saved`` its folder; None: step 0's weights)."""
    from netmorph.checkpoint.training import load_state, save_state

    me = comm.rank
    tc = gpt.train_config(cfg, comm.world, cfg.steps - start, start)
    dies_at = {r: s for r, s in cfg.kills if s >= start}.get(me)
    dies_at = dies_at if dies_at is not None and attempt == _attempt_of(cfg, me) else None

    arm = arm_faults(comm, dies_at)

    def commit(done, snapshot, loss):
        if me == 0:
            _stamp(ckpt_dir, done, start, attempt)
        if done % cfg.commit_every == 0:  # every rank its shards, published whole (torch.save's place)
            save_state(comm, os.path.join(ckpt_dir, "dcp"), done, tc.model, tc.layout, snapshot(), keep=1)
            if me == 0:
                write_text(os.path.join(ckpt_dir, "step"), str(done))
        arm(done)

    arm(start)
    init = None if saved is None else {me: load_state(saved, tc.model, tc.layout, me)}
    out = train_rank(comm, tc, None, init, commit=commit)
    return np.asarray(out.state.flat["params"])[: gpt.numel(cfg)]


def _stamp(ckpt_dir: str, step: int, start: int, attempt: int) -> None:
    """Rank 0, after each step: the timeline (it survives the teardown, for the figure), and when the attempt's
    first step ended."""
    with open(os.path.join(ckpt_dir, "timeline"), "a") as f:
        f.write(f"{time.monotonic()!r} {step}\n")
    if step == start + 1:
        write_text(os.path.join(ckpt_dir, f"first_step_{attempt}"), repr(time.monotonic()))


def _attempt_of(cfg, rank) -> int:
    """The attempt in which ``rank``'s kill fires: one per kill, in step order."""
    order = sorted(cfg.kills, key=lambda k: k[1])
    return [r for r, _ in order].index(rank)


def restart_all(cfg: ElasticConfig) -> dict:
    """torchrun's recovery on the same job: on any death, every worker is torn down and restarted (the
    dead one replaced) from the last checkpoint written to disk every ``commit_every`` steps."""

    ckpt = tempfile.mkdtemp(prefix="netmorph-ckpt-")
    t0 = time.monotonic()
    events, attempt = [], 0
    try:
        while True:
            step = int(open(os.path.join(ckpt, "step")).read()) if os.path.exists(os.path.join(ckpt, "step")) else 0
            if cfg.job == "gpt":
                fn, w = _restart_gpt_rank, (os.path.join(ckpt, "dcp", f"step-{step}") if step else None)
            else:
                fn, w = _restart_rank, (np.load(os.path.join(ckpt, "w.npy")) if step else np.zeros(cfg.dim))
            if events:
                events[-1]["restart_step"] = step
            try:
                final = launch(fn, cfg.workers, cfg, step, w, ckpt, attempt, timeout=cfg.timeout)[0]
                break
            except LaunchError as e:
                events.append({"rank": e.root.rank, "dead_at": e.root.when, "attempt": attempt + 1})
                attempt += 1
                if attempt > len(cfg.kills):
                    raise
        for e in events:
            first = float(open(os.path.join(ckpt, f"first_step_{e['attempt']}")).read())
            kill_step = dict(cfg.kills)[e["rank"]]
            e.update(
                recovery_s=first - e["dead_at"],
                steps_redone=kill_step - e["restart_step"] + 1,
                at_s=e["dead_at"] - t0,
                step=kill_step,
            )
        with open(os.path.join(ckpt, "timeline")) as f:
            timeline = [(float(t) - t0, int(step), cfg.workers) for t, step in (line.split() for line in f)]
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    for e in events:  # nobody trains from the death to the restart
        timeline.append((e["at_s"], e["step"], 0))
    return {
        "wall_s": time.monotonic() - t0,
        "w": final,
        "timeline": sorted(timeline),
        "events": [{k: e[k] for k in ("rank", "step", "at_s", "recovery_s", "steps_redone")} for e in events],
    }
