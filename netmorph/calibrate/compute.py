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
- **layer**: one layer of netmorph's GPT forward and backward at a shape too small for FLOPs to matter (3
  layers' time minus 1 layer's, over 4) -- eager PyTorch's dispatch, autograd and the operators' fixed costs,
  the CPU's kernel-launch latency, which a small model pays at every layer whatever its size; ``op_s`` is that
  over the layer's aten operators (:data:`netmorph.mesh.kernels.LAYER_KERNELS`). Beside it, for the record, one bare
  ``torch.add`` (``dispatch_s``) and a generic autograd chain per operator (``chain_op_s``).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from netmorph.calibrate.device import buffer, device_of, rate, synchronizer
from netmorph.mesh.kernels import LAYER_KERNELS
from netmorph.mesh.shape import ModelShape
from netmorph.models.gpt import GPTStage, synthetic_batch
from netmorph.parallel.flat import Adam

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2}
HIDDEN = (32, 64, 128, 256)
TOKENS = (64, 256, 1024)
ELEMENTWISE_BYTES = 48 << 20  # per array: out of every cache level
WINDOW = 0.03  # seconds each measurement runs, on every rank at once
DEEP = 5  # layers of the tiny GPT whose time over one layer's gives a layer's


def gemm_shapes(hidden=HIDDEN, tokens=TOKENS) -> list:
    """[(m, n, k)]: every linear layer of a transformer layer at every (tokens, h)."""
    return [(m, n, k) for h in hidden for m in tokens for k, n in ((h, 3 * h), (h, h), (h, 4 * h), (4 * h, h))]


def compute_rank(comm, shapes, dtype: str, window: float = WINDOW, group=None) -> dict:
    """One rank's measurements, every rank of ``group`` (default: all; a group of one: the rank alone) at the same
    shape at once: {"gemm": [(m, n, k, FLOP/s)], "elementwise_bytes_per_s", "dispatch_s", "chain_op_s",
    "layer_s", "head_s", "op_s", "optimizer_bytes_per_s", "reference_s"}, on the rank's device (its GPU under
    torchrun with GPUs). One intra-op thread per rank, as torchrun's OMP_NUM_THREADS=1."""
    torch.set_num_threads(1)
    dt, dev = DTYPES[dtype], device_of(comm)

    def per_s(fn, w=window):
        return rate(comm, fn, w, group=group, device=dev)

    g = torch.Generator(device=dev).manual_seed(comm.rank)
    out = {"gemm": []}
    for m, n, k in shapes:
        a = torch.randn(m, k, dtype=dt, generator=g, device=dev)
        b = torch.randn(k, n, dtype=dt, generator=g, device=dev)
        out["gemm"].append((m, n, k, 2 * m * n * k * per_s(lambda: torch.mm(a, b))))
    # a shorter window (a quick profile) takes a smaller array: in cache at the smallest, so rougher
    n = int(ELEMENTWISE_BYTES * min(1.0, window / WINDOW)) // torch.tensor([], dtype=dt).element_size()
    x, y, z = (torch.ones(n, dtype=dt, device=dev) for _ in range(3))
    out["elementwise_bytes_per_s"] = 3 * x.nbytes * per_s(lambda: torch.add(x, y, out=z), 3 * window)
    one = torch.ones(1, dtype=dt, device=dev)
    out["dispatch_s"] = 1 / per_s(lambda: torch.add(one, one))
    chain, ops = autograd_chain(dt, device=dev)
    out["chain_op_s"] = 1 / per_s(chain) / ops
    seconds = {}
    for layers in (1, DEEP):
        seconds[layers] = 1 / per_s(tiny_gpt(layers, dt, device=dev), 3 * window)
    out["layer_s"], out["op_s"] = layer_seconds(seconds[1], seconds[DEEP], out["dispatch_s"])
    out["head_s"] = seconds[1] - out["layer_s"]  # the embedding, LM head and loss
    out["optimizer_bytes_per_s"] = optimizer_rate(comm, dt, window, group=group)
    calls, repeats = (2, 1) if window < WINDOW else (6, 5)  # a rough profile: one short repeat
    out["reference_s"] = [reference_seconds(comm, dt, shape, calls, repeats, group) for shape in REFERENCES]
    comm.barrier(group)
    return out


def layer_seconds(shallow_s: float, deep_s: float, dispatch_s: float) -> tuple[float, float]:
    """(one layer's forward and backward, one operator's share of it) from the tiny GPT timed at 1 and
    :data:`DEEP` layers (FLOPs ~ 0, so the difference is the operators' fixed cost). The difference of two
    timings is noise where the layers cost little: on a busy machine the deeper model can time faster. An
    operator costs at least one bare dispatch (``dispatch_s``, measured beside it), so that is the floor --
    a measured bound, never a negative cost the planner would refuse."""
    kernels = sum(LAYER_KERNELS)
    layer = max((deep_s - shallow_s) / (DEEP - 1), kernels * dispatch_s)
    return layer, layer / kernels


# two GPTs no validate local trains: one where the operators' fixed costs weigh most, one where the FLOPs do
REFERENCES = (
    ModelShape(layers=2, hidden=96, heads=4, seq=48, vocab=64),
    ModelShape(layers=2, hidden=192, heads=4, seq=96, vocab=64),
)
REFERENCE_MICROBATCH = 2


def reference_seconds(comm, dt, shape: ModelShape, calls: int = 6, repeats: int = 5, group=None) -> float:
    """Seconds of one forward and backward of ``shape`` (micro-batch 2), every rank at once: the slowest rank's
    mean over ``calls`` run back to back, as a rank runs its microbatches, the median of ``repeats``. What the
    GEMM, elementwise and operator rates above miss when a real layer runs -- ranks sharing cores and caches,
    the scheduler's time slices -- is this over what they predict for it
    (:func:`netmorph.calibrate.profile.scales`). The ranks do not meet between calls: a barrier after each cost
    ~20 ms at 8 ranks on 2 cores, and the wait for the last rank is a collective's, which the links' α (rings
    with the ranks computing between them) prices."""
    dev = device_of(comm)
    run = tiny_gpt(shape.layers, dt, shape, REFERENCE_MICROBATCH, device=dev)
    run()
    return statistics.median(_slowest_mean(comm, run, calls, synchronizer(dev), group) for _ in range(repeats))


def _slowest_mean(comm, run, calls: int, sync, group=None, active: bool = True) -> float:
    """The ranks of ``group`` meet, each ``active`` one calls ``run`` ``calls`` times back to back, and all take
    the slowest rank's mean seconds per call (an idle rank counts 0: it waited in the meeting)."""
    comm.barrier(group)
    t = 0.0
    if active:
        t0 = time.perf_counter()
        for _ in range(calls):
            run()
        sync()
        t = (time.perf_counter() - t0) / calls
    x = np.array([t])
    comm.all_reduce(x, op="max", group=group)
    return float(x[0])


def sharing_rank(comm, dtype: str, calls: int = 6, repeats: int = 5) -> dict | None:
    """How much of a core a rank gets when every rank computes, measured side by side in one launch: the first
    reference GPT's forward and backward on rank 0 alone (the others asleep in a barrier) and on every rank at
    once, alternated ``repeats`` times (the slowest rank's mean of ``calls``, as :func:`reference_seconds`), the
    medians -- so a machine whose speed drifts between the calibration's alone and busy phases does not enter
    the ratio (on the 2-core VM: 3.2-3.7x side by side at 8 ranks, 5.8x from the phases). On rank 0, else
    None."""
    torch.set_num_threads(1)
    dev = device_of(comm)
    sync = synchronizer(dev)
    ref = REFERENCES[0]
    run = tiny_gpt(ref.layers, DTYPES[dtype], ref, REFERENCE_MICROBATCH, device=dev)
    run()
    alone, busy = [], []
    for _ in range(repeats):
        alone.append(_slowest_mean(comm, run, calls, sync, active=comm.rank == 0))
        busy.append(_slowest_mean(comm, run, calls, sync))
    return (
        {"alone_s": statistics.median(alone), "busy_s": statistics.median(busy), "repeats": repeats}
        if comm.rank == 0
        else None
    )


def optimizer_rate(comm, dt, window: float = WINDOW, n: int = 1 << 20, group=None) -> float:
    """Bytes per second the trainer's own Adam (:class:`netmorph.parallel.flat.Adam`) streams on a buffer of
    ``n`` elements, every rank at once: the planner's bytes per element of an optimizer step (the parameter
    and both moments read and written, the gradient read: 7 of the dtype's width) over the measured time."""
    dev = device_of(comm)
    param, grad = torch.zeros(n, dtype=dt, device=dev), torch.full((n,), 1e-3, dtype=dt, device=dev)
    adam = Adam(0, n, dtype=dt, device=dev)
    return (
        7 * param.element_size() * n * rate(comm, lambda: adam.step(param, grad), 3 * window, group=group, device=dev)
    )


def tiny_gpt(layers: int, dt, shape: ModelShape | None = None, batch: int = 1, device=None):
    """A forward and backward of netmorph's own GPT, by default at a shape too small for FLOPs to matter (h 8,
    4 tokens): its time is the software each layer pays -- eager dispatch, autograd, the operators' fixed
    costs -- profiled operator by operator as vTrain and Echo profile a model's kernels, not a training run."""
    cfg = replace(shape, layers=layers) if shape else ModelShape(layers=layers, hidden=8, heads=2, seq=4, vocab=8)
    model = GPTStage(cfg, dtype=dt)
    x, y = synthetic_batch(cfg, range(batch))
    if device is not None:
        model, x, y = model.to(device), x.to(device), y.to(device)

    def run():
        model.zero_grad(set_to_none=True)
        model(x, y).backward()

    return run


class _Count(TorchDispatchMode):
    """Counts the aten operators dispatched under it."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def autograd_chain(dt, depth: int = 8, device=None):
    """(run, aten operators per run): forward and backward of ``depth`` tiny transformer-like steps (linear,
    GeLU, residual add, LayerNorm) -- sizes too small for FLOPs to matter, so its time per operator is what
    eager autograd costs per operator: the software a small model pays at every layer."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, dtype=dt, generator=g).to(device or "cpu").requires_grad_()
    w = torch.randn(16, 16, dtype=dt, generator=g).to(device or "cpu").requires_grad_()

    def run():
        y = x
        for _ in range(depth):
            y = F.layer_norm(F.gelu(F.linear(y, w)) + y, (16,))
        y.sum().backward()

    with _Count() as c:
        run()
    return run, c.n


def overlap_rank(comm, nbytes: int = 1 << 20, reps: int = 5) -> dict:
    """How much of a gradient all-reduce hides behind compute, measured the way the trainer overlaps it (a
    communication thread runs the ring all-reduce while the main thread computes, DDP's reducer): the times of
    the all-reduce alone, of GEMMs lasting about as long alone, and of both at once, every rank together.
    ``overlap`` = (alone + alone - together) / the shorter alone: 1 when one hides the other, 0 when they add up
    (no core free for it, or the interpreter's lock held by one of them)."""
    torch.set_num_threads(1)
    dev = device_of(comm)
    sync = synchronizer(dev)
    buf = buffer(comm, nbytes // 4, dev)

    def reduce():
        comm.all_reduce(buf, algo="ring")

    def timed(fn):
        out = []
        for _ in range(reps):
            comm.barrier()
            t0 = time.perf_counter()
            fn()
            sync()
            out.append(time.perf_counter() - t0)
        return statistics.median(out)

    reduce()
    t_comm = timed(reduce)
    a = torch.randn(256, 256, device=dev)
    one = rate(comm, lambda: torch.mm(a, a), 0.02, 1, device=dev)
    calls = max(1, int(t_comm * one))

    def compute():
        for _ in range(calls):
            torch.mm(a, a)

    t_comp = timed(compute)

    def both():
        th = threading.Thread(target=reduce)
        th.start()
        compute()
        th.join()

    t_both = timed(both)
    comm.free_all()
    return {
        "bytes": nbytes,
        "comm_s": t_comm,
        "compute_s": t_comp,
        "both_s": t_both,
        "overlap": min(1.0, max(0.0, (t_comm + t_comp - t_both) / min(t_comm, t_comp))),
    }
