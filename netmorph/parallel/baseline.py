"""The baselines a data-parallel run is measured against, on the same ranks, model and data, step by step.

- ``ddp``: PyTorch's ``torch.nn.parallel.DistributedDataParallel`` over gloo -- the reducer's buckets
  (25 MiB by default) all-reduced by gloo while backward runs, ``no_sync()`` on every microbatch but the last;
- ``no_comm``: the same ranks stepping the same model with gradient synchronisation skipped -- the bound any
  data-parallel implementation approaches from below.

Both use ``torch.optim.Adam`` on a plain module; only their speed is compared (the equivalence of netmorph's
layouts is checked against its own 1-rank run). A machine shared with anything else drifts by tens of percent
between runs a minute apart, so the three are not timed in separate launches: :func:`abc_rank` runs one
launch in which every rank alternates a step of netmorph's trainer (A), one of DDP (B) and one with no
communication (C) -- A/B/C, A/B/C, ... on the same batches -- so that a slow spell of the machine falls on all
three alike, and :func:`compare` calls a ratio only where the interquartile ranges of the steps do not overlap.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from netmorph.models.gpt import GPTStage, synthetic_batch
from netmorph.parallel.config import DTYPES
from netmorph.parallel.hybrid import train_rank

MODES = ("netmorph", "ddp", "no_comm")
MIN_STEPS = 4  # counted steps below which no ratio is called: a quartile of fewer is one step


class Baseline:
    """One rank's replica of a DP baseline: ``step(k)`` runs step ``k`` on the batches netmorph's trainer
    gives this rank at step ``k`` and returns its seconds."""

    def __init__(self, cfg, mode: str, dp_rank: int):
        torch.manual_seed(0)
        self.cfg, self.mode, self.dp_rank = cfg, mode, dp_rank
        model = GPTStage(cfg.model, dtype=DTYPES[cfg.dtype])
        if mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model)
        self.model = model
        self.opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95))

    def step(self, step: int) -> float:
        lay, model = self.cfg.layout, self.model
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=False)
        base = (step * lay.dp + self.dp_rank) * lay.microbatches * lay.batch.micro_batch_size
        for i in range(lay.microbatches):
            lo = base + i * lay.batch.micro_batch_size
            x, y = synthetic_batch(self.cfg.model, range(lo, lo + lay.batch.micro_batch_size))
            if self.mode == "ddp" and i < lay.microbatches - 1:
                with model.no_sync():
                    (model(x, y) / lay.microbatches).backward()
            else:
                (model(x, y) / lay.microbatches).backward()
        self.opt.step()
        return time.perf_counter() - t0


def abc_rank(comm, cfg, progress=None) -> tuple:
    """(netmorph's :class:`~netmorph.parallel.results.RankReport`, {"ddp": [s], "no_comm": [s]}, {"ddp",
    "no_comm": the sum of the replica's weights at the end}): netmorph's
    trainer steps as ``netmorph train`` runs them, and after each one a DDP step and a no-communication step on
    the same batches, every rank starting each of them together (a barrier, not timed). DP only (tp = pp = 1);
    torch.distributed's default group (gloo) is there for DDP (``launch(..., torch_group=True)``)."""
    torch.set_num_threads(1)
    others = {mode: Baseline(cfg, mode, comm.rank) for mode in MODES[1:]}
    times = {mode: [] for mode in others}

    def after(done, state, loss):
        for mode, b in others.items():
            comm.barrier()
            times[mode].append(b.step(cfg.start_step + done - 1))
        comm.barrier()  # netmorph's next step starts on every rank together too

    comm.barrier()
    report = train_rank(comm, cfg, progress, commit=after)
    # what each replica ends with, summed: DDP's agree across ranks (its all-reduces ran), no_comm's do not
    with torch.no_grad():
        weights = {mode: float(sum(p.double().sum() for p in b.model.parameters())) for mode, b in others.items()}
    return report, times, weights


def quartiles(seconds) -> dict:
    """{"median_s", "q1_s", "q3_s"} of ``seconds``."""
    q1, med, q3 = np.percentile(np.asarray(seconds, dtype=float), (25, 50, 75))
    return {"median_s": float(med), "q1_s": float(q1), "q3_s": float(q3)}


def compare(a: dict, b: dict) -> str:
    """ "faster" / "slower" when ``a``'s steps' interquartile range lies wholly below / above ``b``'s, "within
    noise" when the two overlap: a ratio of medians is called only when the spread of the steps cannot make it."""
    if a["q3_s"] < b["q1_s"]:
        return "faster"
    if a["q1_s"] > b["q3_s"]:
        return "slower"
    return "within noise"


def summarise(step_times: dict, tokens: int, weights: list, warmup: int = 1) -> dict:
    """The ``baseline`` result from each mode's per-step seconds (the slowest rank's): per mode its quartiles
    and tokens/s at the median, the steps after ``warmup``; netmorph against DDP and against the bound (with
    fewer than :data:`MIN_STEPS` counted steps, "too few steps");
    ``replicas_agree``: whether each baseline's ranks ended with the same weights (``weights``: every rank's
    {mode: sum of its weights}) -- DDP's must, the unsynchronised bound's must not."""
    out = {
        "steps": len(step_times["netmorph"]) - warmup,
        "order": "A/B/C per step: " + ", ".join(MODES),
        "replicas_agree": {mode: len({w[mode] for w in weights}) == 1 for mode in MODES[1:]},
    }
    for mode in MODES:
        q = quartiles(step_times[mode][warmup:] or step_times[mode])
        out[mode] = {**q, "tokens_per_s": tokens / q["median_s"]}
    me, ddp, bound = (out[m] for m in MODES)
    out["tokens_per_s"], out["no_comm_tokens_per_s"] = ddp["tokens_per_s"], bound["tokens_per_s"]
    out["of_bound"] = bound["median_s"] / me["median_s"]
    out["ddp_of_bound"] = bound["median_s"] / ddp["median_s"]
    if out["steps"] < MIN_STEPS:
        out["vs_ddp"] = out["vs_bound"] = "too few steps"
    else:
        out["vs_ddp"], out["vs_bound"] = compare(me, ddp), compare(me, bound)
    return out
