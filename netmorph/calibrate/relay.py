"""A pipeline's hop, measured where it happens: GEMMs relayed along chains of ranks as a GPipe step relays
microbatches (every chain at once), beside the same GEMMs with no messages.

The link's α (a ping-pong, or rings with the ranks computing between them) is what a message costs while its
receiver is already there. A pipeline's receiver is not: it waited for its input a whole slot and is asleep
(the local fabric's futex, a GPU stream's event), and where ranks share cores the woken rank then waits for
one -- the scheduler's latency, milliseconds with several ranks per core, against microseconds for a message.
So the profile measures the hop the way the trainer's executor pays it (:mod:`netmorph.parallel.pipeline`:
a header and the activation by ``isend``, a blocking ``recv``): chains of ``p`` consecutive ranks run ``m``
microbatches forward and back, each slot ``work`` GEMMs (twice that backward), and the same ranks run the same
GEMMs with no messages. :func:`hop_seconds` gives the planner's ``pipeline_hop_s``: what each send must cost
beyond the link's α and β for the planner's own pipeline formula to give the relay's measured step.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from netmorph.calibrate.device import buffer, device_of, rate, synchronizer
from netmorph.planner.timing import shared_slots

SLOT_S = 0.004  # a forward slot's GEMMs, every rank busy: about a validated GPT's forward slot here
MICROBATCHES = 4
NBYTES = 1 << 14  # one activation of the validated GPTs: micro-batch 2 x 32 tokens x h 64, fp32


def relay_rank(
    comm, p: int, m: int = MICROBATCHES, slot_s: float = SLOT_S, nbytes: int = NBYTES, repeats: int = 5
) -> dict | None:
    """{"p", "m", "nbytes", "step_s", "compute_s"} on rank 0 (the slowest rank's median step, with the relay's
    messages and without, the two alternated), else None; ranks past the last whole chain compute without
    messages."""
    torch.set_num_threads(1)
    first = comm.rank - comm.rank % p
    stage = comm.rank - first
    chained = first + p <= comm.world
    dev = device_of(comm)
    sync = synchronizer(dev)
    a = torch.randn(128, 128, device=dev)
    per = np.array([1 / rate(comm, lambda: torch.mm(a, a), 0.02, 3, device=dev)])
    comm.all_reduce(per)  # every rank the same number of GEMMs: the mean rank's
    calls = max(1, int(slot_s * comm.world / per[0]))
    # the executor's header and activation, where its activations live (the GPU's: NCCL's point-to-point)
    hdr = np.zeros(4, np.int64) if dev.type == "cpu" else torch.zeros(4, dtype=torch.int64, device=dev)
    buf = buffer(comm, nbytes // 4, dev)

    def work(k):
        for _ in range(k * calls):
            torch.mm(a, a)

    def hop(dst, pending):
        pending += [comm.isend(hdr, dst), comm.isend(buf, dst)]

    def take(src):
        comm.recv(hdr, src)
        comm.recv(buf, src)

    def step(relay: bool):
        pending = []
        for _ in range(m):  # GPipe: every forward, then every backward
            if relay and stage > 0:
                take(first + stage - 1)
            work(1)
            if relay and stage < p - 1:
                hop(first + stage + 1, pending)
        for _ in range(m):
            if relay and stage < p - 1:
                take(first + stage + 1)
            work(2)
            if relay and stage > 0:
                hop(first + stage - 1, pending)
        for req in pending:
            req.wait()
        sync()

    step(False)  # warm
    step(chained)
    times = {"compute_s": [], "step_s": []}
    for _ in range(repeats):  # alternated, so a slow moment falls on both
        for name, relay in (("compute_s", False), ("step_s", chained)):
            comm.barrier()
            t0 = time.perf_counter()
            step(relay)
            t = np.array([time.perf_counter() - t0])
            comm.all_reduce(t, op="max")
            times[name].append(float(t[0]))
    out = {name: statistics.median(v) for name, v in times.items()}
    comm.free_all()
    return {"p": p, "m": m, "nbytes": nbytes, **out} if comm.rank == 0 else None


def hop_seconds(relays: list, link_s: float, core_sharing: float) -> float:
    """The planner's ``pipeline_hop_s`` from the relays: per relay, the step the planner's GPipe formula gives
    (:func:`netmorph.planner.timing.step_time`: :func:`~netmorph.planner.timing.shared_slots` of a microbatch's
    compute and its two sends, the bubble lent to the ranks not in it) equals the measured step when each send
    costs ``link_s`` (the link's α + n·β) plus the hop; a slot's compute is the no-message run's, every rank
    busy. The median over the relays, at least 0."""
    hops = []
    for r in relays:
        m, p = r["m"], r["p"]
        per_mb = r["step_s"] / shared_slots(m, p, 1, core_sharing)
        hops.append((per_mb - r["compute_s"] / m) / 2 - link_s)
    return max(0.0, statistics.median(hops)) if hops else 0.0
