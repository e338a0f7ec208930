"""What one rank computes per second while every rank of the machine computes: GEMMs, elementwise, one operator.

The shapes are a transformer layer's (Megatron's order, tokens = micro-batch x sequence): the QKV projection
``(tokens, h) x (h, 3h)``, the output projection ``(h, h)``, the MLP's ``(h, 4h)`` and ``(4h, h)``, at several
token counts and hidden sizes -- the same (m, n, k) family ``benchmarks/gemm_efficiency.py`` sweeps on a GPU.
Every rank runs the same shape at the same time (a barrier before each), so the rate is what a rank gets when
all of them share the machine's cores: on 2 cores, 8 ranks get about a quarter of a core each, and the
profile records that as measured, beside the single-rank rate.

- **GEMM**: achieved FLOP/s of ``a @ b`` (2mnk FLOPs) over a window every rank runs at once;
- **elementwise**: bytes moved per second by ``torch.add(x, y, out=z)`` over arrays out of every cache (read
  two, write one): what the planner's ``hbm_bandwidth`` prices the non-GEMM passes with;
- **operator**: seconds per call of a one-element ``torch.add`` -- eager PyTorch's dispatch cost, the CPU's
  kernel-launch latency, which a small model pays once per operator whatever its size.
"""

from __future__ import annotations

import time

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64}
HIDDEN = (32, 64, 128, 256)
TOKENS = (64, 256, 1024)
ELEMENTWISE_BYTES = 48 << 20          # per array: out of every cache level
WINDOW = 0.03                         # seconds each measurement runs, on every rank at once


def gemm_shapes(hidden=HIDDEN, tokens=TOKENS) -> list:
    """[(m, n, k)]: every linear layer of a transformer layer at every (tokens, h)."""
    return [(m, n, k) for h in hidden for m in tokens for k, n in ((h, 3 * h), (h, h), (h, 4 * h), (4 * h, h))]


def _rate(comm, fn, window: float = WINDOW) -> float:
    """Calls of ``fn`` per second over ``window`` seconds that start on every rank together (a barrier): the
    rate a rank gets while the others run theirs -- not the best of a few repetitions, which would pick a
    moment when its neighbours happened to wait."""
    fn()                                                    # warm: allocation, the kernel's first call
    comm.barrier()
    calls, t0 = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= window:
            return calls / elapsed


def compute_rank(comm, shapes, dtype: str, window: float = WINDOW) -> dict:
    """One rank's measurements, every rank at the same shape at once: {"gemm": [(m, n, k, FLOP/s)],
    "elementwise_bytes_per_s", "op_s"}. One intra-op thread per rank, as torchrun's OMP_NUM_THREADS=1."""
    torch.set_num_threads(1)
    dt = DTYPES[dtype]
    g = torch.Generator().manual_seed(comm.rank)
    out = {"gemm": []}
    for m, n, k in shapes:
        a = torch.randn(m, k, dtype=dt, generator=g)
        b = torch.randn(k, n, dtype=dt, generator=g)
        out["gemm"].append((m, n, k, 2 * m * n * k * _rate(comm, lambda: torch.mm(a, b), window)))
    n = ELEMENTWISE_BYTES // torch.tensor([], dtype=dt).element_size()
    x, y, z = torch.ones(n, dtype=dt), torch.ones(n, dtype=dt), torch.empty(n, dtype=dt)
    out["elementwise_bytes_per_s"] = 3 * x.nbytes * _rate(comm, lambda: torch.add(x, y, out=z), 3 * window)
    one = torch.ones(1, dtype=dt)
    out["op_s"] = 1 / _rate(comm, lambda: torch.add(one, one), window)
    comm.barrier()
    return out
