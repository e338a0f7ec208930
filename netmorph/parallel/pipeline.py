"""Pipeline parallelism: a schedule as data (:mod:`netmorph.mesh.schedules`: GPipe, 1F1B, interleaved, ZB-H1,
ZB-V, DualPipeV), checked, then executed over the fabric's send/recv.

The executor sends activations forward and gradients backward with ``isend``
(queued, so a send never blocks) and receives with ``recv``; each payload is
preceded by a 4-int64 header (kind, virtual stage, microbatch, elements) in the
ledger phase ``pp.tag``, so messages that share a link in both directions
(interleaving wraps from the last rank to the first) are matched by key, not by
arrival order. Payload bytes are in phase ``pp``: one b·s·h activation and one
gradient per stage boundary per microbatch; in a V the bottom's hand-off (rank p-1's chunk 0 to its chunk 1) is
local and sends nothing.
"""

from __future__ import annotations

import time

import torch

from netmorph.mesh.schedules import (
    SCHEDULES,
    SPLIT_BACKWARD,
    V_SHAPED,
    Slot,
    bubble,
    check,
    draw,
    peaks,
    schedule,
    stage_of,
    theory,
)

__all__ = [
    "SCHEDULES",
    "SPLIT_BACKWARD",
    "V_SHAPED",
    "Executor",
    "Slot",
    "bubble",
    "check",
    "draw",
    "peaks",
    "schedule",
    "stage_of",
    "theory",
]


class Executor:
    """Runs one rank's slots for one step: ``chunks[c]`` is virtual stage ``c·pp + rank``.

    ``inputs(i)`` gives microbatch i's (tokens, targets) -- read by the first virtual stage and the last, (None,
    None) where a rank holds neither; the last virtual stage returns the loss,
    scaled by 1/m so the microbatches' gradients average. Returns the microbatches' losses
    (last stage) and the peak number in flight.
    """

    def __init__(self, comm, group, chunks, v: int, hidden_shape, dtype, store=None, v_shaped: bool = False):
        self.comm, self.group, self.chunks, self.v, self.v_shaped = comm, group, chunks, v, v_shaped
        self.store = store  # a zero-bubble schedule's WeightGradStore: B defers, W runs
        self.pp = group.size()
        self.rank = group.index[comm.rank]
        self.stages = self.pp * v
        self.hidden_shape, self.dtype = hidden_shape, dtype
        self.device = next(chunks[0].parameters()).device  # p2p buffers where the activations live
        self.mailbox: dict[int, dict] = {}
        self.pending = []  # (work, tensor) of sends still in flight
        self.spans = []

    def _owner(self, vs: int) -> int:
        """The global rank that runs virtual stage ``vs``."""
        r = 2 * self.pp - 1 - vs if self.v_shaped and vs >= self.pp else vs % self.pp
        return self.group.ranks[r]

    def _send(self, kind: int, vstage: int, mb: int, t: torch.Tensor, dst: int) -> None:
        if dst == self.comm.rank:  # a V's bottom: the next stage is this rank's other chunk, no wire
            self.mailbox.setdefault(dst, {})[(kind, vstage, mb)] = t.detach().clone()
            return
        t = t.detach().contiguous()
        hdr = torch.tensor([kind, vstage, mb, t.numel()], dtype=torch.int64, device=t.device)
        with self.comm.phase("pp.tag"):
            self.pending.append((self.comm.isend(hdr, dst), hdr))
        with self.comm.phase("pp"):
            self.pending.append((self.comm.isend(t, dst), t))

    def _take(self, kind: int, vstage: int, mb: int, src: int) -> torch.Tensor:
        box = self.mailbox.setdefault(src, {})
        while (kind, vstage, mb) not in box:
            hdr = torch.empty(4, dtype=torch.int64, device=self.device)
            self.comm.recv(hdr, src)
            k, s, i, n = (int(x) for x in hdr)
            buf = torch.empty(n, dtype=self.dtype, device=self.device)
            self.comm.recv(buf, src)
            box[(k, s, i)] = buf
        return box.pop((kind, vstage, mb))

    def run(self, slots, inputs, m: int, hooks=None):
        hooks = hooks or _NoHooks()
        self.spans = []  # (kind, microbatch, chunk, t0, t1): the step's timeline
        saved = {}  # (chunk, mb) -> (input needing grad or None, output)
        losses, in_flight, peak = {}, 0, 0
        for index, s in enumerate(slots):
            vs = stage_of(self.rank, s.chunk, self.pp, self.v_shaped)
            model = self.chunks[s.chunk]
            if s.kind == "F":
                tokens, targets = inputs(s.microbatch)
                if vs == 0:
                    x_in, x = None, tokens
                else:
                    x_in = self._take(0, vs, s.microbatch, self._owner(vs - 1)).view(self.hidden_shape)
                    x_in.requires_grad_(True)
                    x = x_in
                t0 = time.perf_counter()
                out = hooks.forward(lambda: model(x, targets if vs == self.stages - 1 else None))
                self.spans.append(("F", s.microbatch, s.chunk, t0, time.perf_counter()))
                if vs == self.stages - 1:
                    losses[s.microbatch] = float(out.detach())
                    out = out / m
                else:
                    self._send(0, vs + 1, s.microbatch, out, self._owner(vs + 1))
                saved[(s.chunk, s.microbatch)] = (x_in, out)
                in_flight += 1
                peak = max(peak, in_flight)
            elif s.kind == "W":
                t0 = time.perf_counter()
                hooks.weight(lambda key=(s.chunk, s.microbatch): self.store.run(key))
                self.spans.append(("W", s.microbatch, s.chunk, t0, time.perf_counter()))
            else:
                x_in, out = saved.pop((s.chunk, s.microbatch))
                if vs == self.stages - 1:
                    grad = None
                else:
                    grad = self._take(1, vs, s.microbatch, self._owner(vs + 1)).view(out.shape)
                t0 = time.perf_counter()
                hooks.backward(
                    index, lambda out=out, grad=grad, key=(s.chunk, s.microbatch): self._backward(out, grad, key)
                )
                self.spans.append(("B", s.microbatch, s.chunk, t0, time.perf_counter()))
                if vs > 0:
                    self._send(1, vs - 1, s.microbatch, x_in.grad, self._owner(vs - 1))
                in_flight -= 1
        self.flush()
        return [losses[i] for i in sorted(losses)], peak

    def _backward(self, out, grad, key) -> None:
        """B: the backward, its weight gradients queued for the W slot under a zero-bubble schedule."""
        if self.store is None:
            out.backward(grad)
            return
        with self.store.deferring(key):
            out.backward(grad)

    def flush(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()


class _NoHooks:
    def forward(self, fn):
        return fn()

    def backward(self, index, fn):
        fn()

    def weight(self, fn):
        fn()
