"""Data parallelism: gradients averaged over the DP group, naive beside bucketed with overlap.

- :class:`DataParallelNaive` -- one all-reduce per parameter after backward (picotron's
  ``DataParallelNaive``): many small messages, nothing overlapped.
- :class:`DataParallelBucket` -- PyTorch DDP's ``Reducer`` / Horovod's tensor fusion
  (picotron's ``DataParallelBucket``): gradients are grouped, in the reverse order
  backward produces them, into buckets of about ``bucket_mb`` of the flat gradient
  buffer; a ``post_accumulate_grad`` hook marks a parameter ready, and a bucket whose
  parameters are all ready is all-reduced at once. With ``overlap`` the all-reduce
  runs on a communication thread while backward goes on (DDP's, on NCCL's stream);
  without it (under tensor or pipeline parallelism, whose own collectives share the
  communicator) the buckets go after backward. Gradient accumulation over
  microbatches communicates only on the last one (DDP's ``no_sync``).

Every bucket is a multiple of the DP degree, so a ring all-reduce of it sends
exactly 2(d-1)/d of it per rank (phase ``dp``). ``algo`` names the all-reduce (ring by default:
:class:`netmorph.parallel.algos.CollectiveAlgos`).
"""

from __future__ import annotations

import queue
import threading

from netmorph.errors import UsageError
from netmorph.parallel.algos import CollectiveAlgos


def mean_over(comm, g, group, algo: str, d: int, wire=None) -> None:
    """``g`` averaged over ``group`` in place, on the wire in ``wire`` (a float32 main gradient reduced in bf16:
    Megatron's ``--grad-reduce-in-bf16``, torch FSDP's ``reduce_dtype``) or in its own dtype."""
    buf = g if wire is None or wire == g.dtype else g.to(wire)
    comm.all_reduce(buf, group=group, algo=algo)
    if buf is not g:
        g.copy_(buf)
    g.div_(d)


class DataParallelNaive:
    def __init__(self, comm, group, flat, phase: str = "dp", algo: str = CollectiveAlgos.dp, wire=None):
        self.comm, self.group, self.flat, self.phase, self.algo, self.wire = comm, group, flat, phase, algo, wire
        self.d = group.size()

    def arm(self) -> None:
        """The next backward is the last of the step (nothing to do: the naive one waits for the end)."""

    def finish(self) -> None:
        """After the step's last backward: average every gradient over the DP group."""
        if self.d == 1:
            return
        self.flat.collect_grads()
        with self.comm.phase(self.phase):
            for p in reversed(self.flat.params):
                lo, hi = self.flat.span(p)
                mean_over(self.comm, self.flat.grad[lo:hi], self.group, self.algo, self.d, self.wire)

    def close(self) -> None:
        pass


class DataParallelBucket:
    def __init__(
        self,
        comm,
        group,
        flat,
        bucket_mb: float = 1.0,
        overlap: bool = True,
        phase: str = "dp",
        algo: str = CollectiveAlgos.dp,
        wire=None,
    ):
        if bucket_mb <= 0:
            raise UsageError(f"{{bucket_mb}} must be > 0, got {bucket_mb}", "bucket_mb")
        self.comm, self.group, self.flat, self.phase, self.algo, self.wire = comm, group, flat, phase, algo, wire
        self.d = group.size()
        self.overlap = overlap and self.d > 1
        isz = flat.grad.element_size()
        cap = max(self.d, int(bucket_mb * 2**20 / isz) // self.d * self.d)
        # buckets over the flat buffer from its end (backward produces the last layers' grads first);
        # a cut rounds down to a multiple of d, so a bucket may hold the tail of the parameter before
        # it: every parameter a bucket overlaps is a member, and the bucket waits for all of them
        ranges, hi = [], flat.padded
        for p in reversed(flat.params):
            lo_p, _ = flat.span(p)
            if hi - lo_p >= cap:
                lo = lo_p - lo_p % self.d
                ranges.append((lo, hi))
                hi = lo
        if hi > 0 or not ranges:
            ranges.append((0, hi))
        self.buckets = [(lo, hi, [p for p in flat.params if _overlaps(flat.span(p), lo, hi)]) for lo, hi in ranges]
        self.bucket_of = {}  # id(param) -> the buckets it has elements in
        for b, (_, _, ps) in enumerate(self.buckets):
            for p in ps:
                self.bucket_of.setdefault(id(p), []).append(b)
        self.pending = [0] * len(self.buckets)
        self.armed = False
        self.errors = []
        self.handles = []
        self.q: queue.Queue | None = None
        self.thread = None
        if self.overlap:
            self.q = queue.Queue()
            self.thread = threading.Thread(target=self._worker, name="netmorph-dp-comm", daemon=True)
            self.thread.start()
            for p in flat.params:
                self.handles.append(p.register_post_accumulate_grad_hook(self._ready))

    def _reduce(self, b: int) -> None:
        lo, hi, _ = self.buckets[b]
        if hi <= lo:
            return
        with self.comm.phase(self.phase):
            mean_over(self.comm, self.flat.grad[lo:hi], self.group, self.algo, self.d, self.wire)

    def _worker(self) -> None:
        while True:
            b = self.q.get()
            try:
                if b is None:
                    return
                if not self.errors:
                    self._reduce(b)
            except BaseException as e:  # noqa: BLE001 - handed to the main thread in finish()
                self.errors.append(e)
            finally:
                self.q.task_done()

    def _ready(self, p) -> None:
        if not self.armed:
            return
        for b in self.bucket_of[id(p)]:
            self.pending[b] -= 1
            if self.pending[b] == 0:
                self.q.put(b)

    def arm(self) -> None:
        """The next backward is the step's last: launch each bucket as soon as its gradients are in."""
        self.armed = self.overlap
        self.pending = [len(ps) for _, _, ps in self.buckets]

    def finish(self) -> None:
        if self.d == 1:
            return
        if self.overlap:
            for b, n in enumerate(self.pending):
                if n != 0:  # a parameter got no gradient this step: reduce its bucket now
                    self.q.put(b)
            self.q.join()
            self.armed = False
            if self.errors:
                raise self.errors[0]
            return
        self.flat.collect_grads()
        for b in range(len(self.buckets)):
            self._reduce(b)

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        if self.thread is not None:
            self.q.put(None)
            self.thread.join(5.0)


def _overlaps(span, lo: int, hi: int) -> bool:
    return span[0] < hi and lo < span[1]
