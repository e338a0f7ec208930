"""Pipeline parallelism: schedules as data, checked, then executed over the fabric's send/recv.

A schedule is, per pipeline rank, the ordered list of :class:`Slot` ``(F|B,
microbatch, chunk)`` it runs -- the same object is printed, drawn, checked for
deadlock, and executed. Three schedules:

- ``afab`` -- GPipe (Huang et al. 2019): all forwards, then all backwards;
  m microbatches in flight on every stage; bubble (p-1)/(m+p-1).
- ``1f1b`` -- PipeDream-flush, Megatron's ``forward_backward_pipelining_without_
  interleaving``: p-r-1 warm-up forwards, then one forward one backward, then the
  cool-down; at most p microbatches in flight; the same bubble, less memory.
- ``interleaved`` -- Megatron's ``forward_backward_pipelining_with_interleaving``
  (Narayanan et al. 2021): each rank holds V model chunks (virtual stage
  ``c·p + r``); bubble (p-1)/(V·m+p-1); needs m a multiple of p.

The executor sends activations forward and gradients backward with ``isend``
(queued, so a send never blocks) and receives with ``recv``; each payload is
preceded by a 4-int64 header (kind, virtual stage, microbatch, elements) in the
ledger phase ``pp.tag``, so messages that share a link in both directions
(interleaving wraps from the last rank to the first) are matched by key, not by
arrival order. Payload bytes are in phase ``pp``: one b·s·h activation and one
gradient per stage boundary per microbatch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from netmorph.errors import UsageError
from netmorph.parallel.zero_bubble import zb_h1

SCHEDULES = ("afab", "1f1b", "interleaved", "zb-h1")
SPLIT_BACKWARD = ("zb-h1",)      # schedules whose backward runs as B (input gradient) and a later W (weights)


@dataclass(frozen=True)
class Slot:
    kind: str            # "F", "B" (with W: the input gradient alone) or "W" (the weight gradient)
    microbatch: int
    chunk: int = 0       # model chunk on this rank (interleaved: virtual stage chunk·p + rank)

    def __str__(self):
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


def schedule(name: str, pp: int, m: int, v: int = 1) -> list[list[Slot]]:
    """Every pipeline rank's slots, in order."""
    if name not in SCHEDULES:
        raise UsageError(f"{{schedule}} must be one of {', '.join(SCHEDULES)}, got {name!r}", "schedule")
    if name != "interleaved" and v != 1:
        raise UsageError(f"{{interleave}} {v} needs {{schedule}} interleaved", "interleave")
    if name == "zb-h1":
        return [[Slot(s.kind, s.microbatch) for s in row] for row in zb_h1(pp, m)]
    if name == "afab":
        return [[Slot("F", i) for i in range(m)] + [Slot("B", i) for i in range(m)] for _ in range(pp)]
    if name == "1f1b":
        out = []
        for r in range(pp):
            warm = min(pp - r - 1, m)
            slots = [Slot("F", i) for i in range(warm)]
            f, b = warm, 0
            while f < m:
                slots += [Slot("F", f), Slot("B", b)]
                f, b = f + 1, b + 1
            slots += [Slot("B", i) for i in range(b, m)]
            out.append(slots)
        return out
    if pp < 2 or m % pp:
        raise UsageError(f"the interleaved schedule needs pp > 1 and {{microbatches}} ({m}) a multiple of pp ({pp})",
                         "microbatches")
    total = m * v

    def virtual(k, forward):
        """Megatron's ``get_model_chunk_id`` and microbatch of the k-th forward (or backward)."""
        group = k % (pp * v)
        chunk = group // pp
        if not forward:
            chunk = v - 1 - chunk
        return chunk, (k // (pp * v)) * pp + group % pp

    out = []
    for r in range(pp):
        warm = min((pp - r - 1) * 2 + (v - 1) * pp, total)
        slots = []
        for k in range(warm):
            c, i = virtual(k, True)
            slots.append(Slot("F", i, c))
        f, b = warm, 0
        while f < total:
            c, i = virtual(f, True)
            slots.append(Slot("F", i, c))
            c, i = virtual(b, False)
            slots.append(Slot("B", i, c))
            f, b = f + 1, b + 1
        while b < total:
            c, i = virtual(b, False)
            slots.append(Slot("B", i, c))
            b += 1
        out.append(slots)
    return out


def check(slots: list[list[Slot]], v: int = 1) -> int:
    """Play the schedule with unbounded send queues: raise if it deadlocks; return the most
    microbatches any rank holds in flight (forwarded, not yet backwarded)."""
    pp = len(slots)
    stages = pp * v
    done = set()                          # (kind, virtual stage, microbatch)
    pos = [0] * pp
    in_flight = [0] * pp
    peak = 0
    while any(pos[r] < len(slots[r]) for r in range(pp)):
        moved = False
        for r in range(pp):
            while pos[r] < len(slots[r]):
                s = slots[r][pos[r]]
                vs = s.chunk * pp + r
                if s.kind == "F":
                    ready = vs == 0 or ("F", vs - 1, s.microbatch) in done
                elif s.kind == "W":
                    ready = ("B", vs, s.microbatch) in done
                else:
                    ready = ("F", vs, s.microbatch) in done and (vs == stages - 1 or
                                                                  ("B", vs + 1, s.microbatch) in done)
                if not ready:
                    break
                done.add((s.kind, vs, s.microbatch))
                in_flight[r] += {"F": 1, "B": -1, "W": 0}[s.kind]
                peak = max(peak, in_flight[r])
                pos[r] += 1
                moved = True
        if not moved:
            stuck = {r: str(slots[r][pos[r]]) for r in range(pp) if pos[r] < len(slots[r])}
            raise RuntimeError(f"pipeline schedule deadlocks: ranks wait at {stuck}")
    return peak


def draw(slots: list[list[Slot]]) -> str:
    """One line per rank, one cell per slot: ``F0 F1 B0 ...``."""
    return "\n".join(f"rank {r}: " + " ".join(str(s) for s in row) for r, row in enumerate(slots))


class Executor:
    """Runs one rank's slots for one step: ``chunks[c]`` is virtual stage ``c·pp + rank``.

    ``inputs(i)`` gives microbatch i's (tokens, targets) -- read by the first virtual stage and the last, (None,
    None) where a rank holds neither; the last virtual stage returns the loss,
    scaled by 1/m so the microbatches' gradients average. Returns the microbatches' losses
    (last stage) and the peak number in flight.
    """

    def __init__(self, comm, group, chunks, v: int, hidden_shape, dtype, store=None):
        self.comm, self.group, self.chunks, self.v = comm, group, chunks, v
        self.store = store                # a zero-bubble schedule's WeightGradStore: B defers, W runs
        self.pp = group.size()
        self.rank = group.index[comm.rank]
        self.stages = self.pp * v
        self.hidden_shape, self.dtype = hidden_shape, dtype
        self.device = next(chunks[0].parameters()).device         # p2p buffers where the activations live
        self.mailbox: dict[int, dict] = {}
        self.pending = []                 # (work, tensor) of sends still in flight
        self.spans = []

    def _peer(self, d):
        return self.group.ranks[(self.rank + d) % self.pp]

    def _send(self, kind: int, vstage: int, mb: int, t: torch.Tensor, dst: int) -> None:
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
        self.spans = []                   # (kind, microbatch, chunk, t0, t1): the step's timeline
        saved = {}                        # (chunk, mb) -> (input needing grad or None, output)
        losses, in_flight, peak = {}, 0, 0
        for index, s in enumerate(slots):
            vs = s.chunk * self.pp + self.rank
            model = self.chunks[s.chunk]
            if s.kind == "F":
                tokens, targets = inputs(s.microbatch)
                if vs == 0:
                    x_in, x = None, tokens
                else:
                    x_in = self._take(0, vs, s.microbatch, self._peer(-1)).view(self.hidden_shape)
                    x_in.requires_grad_(True)
                    x = x_in
                t0 = time.perf_counter()
                out = hooks.forward(lambda: model(x, targets if vs == self.stages - 1 else None))
                self.spans.append(("F", s.microbatch, s.chunk, t0, time.perf_counter()))
                if vs == self.stages - 1:
                    losses[s.microbatch] = float(out.detach())
                    out = out / m
                else:
                    self._send(0, vs + 1, s.microbatch, out, self._peer(1))
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
                    grad = self._take(1, vs, s.microbatch, self._peer(1)).view(out.shape)
                t0 = time.perf_counter()
                hooks.backward(index, lambda out=out, grad=grad, key=(s.chunk, s.microbatch): self._backward(
                    out, grad, key))
                self.spans.append(("B", s.microbatch, s.chunk, t0, time.perf_counter()))
                if vs > 0:
                    self._send(1, vs - 1, s.microbatch, x_in.grad, self._peer(-1))
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
