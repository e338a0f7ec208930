"""Timing work on a rank's device: the CPU of a local rank, or the GPU torchrun gave it (``cuda:LOCAL_RANK``).

A CUDA kernel and an NCCL call return before they finish (the host queues them on a stream), so every clock
read that closes a measurement on a GPU comes after ``torch.cuda.synchronize`` -- the same rule nccl-tests'
timers and ``torch.utils.benchmark`` follow. On the CPU the call has finished when it returns and the wait is
nothing. Message buffers live where the collectives of that device run: the local fabric's registered memory
(``comm.alloc``), or a tensor on the GPU, which the torch transport hands to NCCL as it is.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch


def device_of(comm) -> torch.device:
    """The rank's device: ``cuda:LOCAL_RANK`` when a torchrun job with GPUs set it (``comm.device``), else the
    CPU."""
    return torch.device(getattr(comm, "device", "cpu") or "cpu")


def synchronizer(device: torch.device):
    """A function that returns once the device's queued work is done (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def buffer(comm, count: int, device: torch.device):
    """``count`` float32 zeros to send and reduce: registered memory on the local fabric (NCCL's ncclMemAlloc
    stand-in), a tensor on the GPU for NCCL."""
    if device.type == "cuda":
        return torch.zeros(max(1, count), dtype=torch.float32, device=device)
    return comm.alloc(max(1, count), np.float32)


def rate(comm, fn, window: float, windows: int = 3, group=None, device: torch.device | None = None) -> float:
    """Calls of ``fn`` per second over ``window`` seconds that start on every rank of ``group`` (default: all)
    together (a barrier): the rate a rank gets while the others run theirs -- not the best of a few repetitions,
    which would pick a moment when its neighbours happened to wait. The median of ``windows`` such windows. On
    a GPU each call is waited for before the clock is read."""
    sync = synchronizer(device or device_of(comm))
    fn()  # warm: allocation, the kernel's first call
    sync()
    rates = []
    for _ in range(windows):
        comm.barrier(group)
        calls, t0 = 0, time.perf_counter()
        while True:
            fn()
            sync()
            calls += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= window:
                break
        rates.append(calls / elapsed)
    return statistics.median(rates)
