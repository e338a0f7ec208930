"""The baselines a data-parallel run is measured against, on the same ranks, model and data.

- ``ddp``: PyTorch's ``torch.nn.parallel.DistributedDataParallel`` over gloo -- the
  reducer's buckets (25 MiB by default) all-reduced by gloo while backward runs.
- ``no_comm``: the same ranks stepping the same model with gradient synchronisation
  skipped -- the bound any data-parallel implementation approaches from below.

Both use ``torch.optim.Adam`` on a plain module; only their speed is compared
(the equivalence of netmorph's layouts is checked against its own 1-rank run).
"""

from __future__ import annotations

import time

import torch

from netmorph.models.gpt import GPTStage, synthetic_batch


def baseline_rank(comm, cfg, mode: str) -> list:
    """Step times of ``mode`` ("ddp" or "no_comm") on this rank, DP only (tp = pp = 1)."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
    model = GPTStage(cfg.model, dtype=dtype)
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95))
    times = []
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        base = (step * cfg.layout.dp + comm.rank) * cfg.layout.microbatches * cfg.layout.micro_batch_size
        for i in range(cfg.layout.microbatches):
            lo = base + i * cfg.layout.micro_batch_size
            x, y = synthetic_batch(cfg.model, range(lo, lo + cfg.layout.micro_batch_size))
            last = i == cfg.layout.microbatches - 1
            if mode == "ddp" and not last:
                with model.no_sync():
                    (model(x, y) / cfg.layout.microbatches).backward()
            else:
                (model(x, y) / cfg.layout.microbatches).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times
