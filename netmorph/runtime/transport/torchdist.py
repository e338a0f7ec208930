"""The same schedules over ``torch.distributed`` point-to-point, and torch's own collectives.

``TorchTransport`` runs each round as plain ``dist.isend``/``dist.irecv`` plus
``wait`` (``batch_isend_irecv`` is known to hang on gloo), so every netmorph
algorithm runs across machines: gloo on CPU, NCCL when the tensors live on GPUs.
(torch.distributed's own collectives, for comparison, are
:class:`netmorph.runtime.native.NativeComm`.)

Fingerprints travel as a separate 64-byte message on their own tag, ahead of the
payload, and the payload's receive is posted only once its header checked out:
gloo aborts the receiving process (``gloo::EnforceNotMet``, SIGABRT) when a
message is longer than the posted buffer, so a count mismatch must be caught
before the payload is received. Headers and payloads each keep their posting
order per peer, as torch.distributed matches messages per (peer, tag) in order.

Errors are classified from what gloo reports (:mod:`~netmorph.runtime.transport.torchdiagnose`):
a timeout is :class:`PeerTimeout`, a closed connection :class:`PeerLost` -- unless a
peer published a :class:`CollectiveMismatch` in the job's store first, which every
rank then raises. The first failure is final: every later call raises it again.
"""

from __future__ import annotations

import re
from collections import deque

import numpy as np

from netmorph.runtime.transport import FabricError, nbytes, settle
from netmorph.runtime.transport import fingerprint as fpr
from netmorph.runtime.transport.sendclock import SendClock
from netmorph.runtime.transport.tensors import concat as _concat
from netmorph.runtime.transport.tensors import contiguous as _contiguous
from netmorph.runtime.transport.tensors import head_like as _head_like
from netmorph.runtime.transport.tensors import header_like as _header_like
from netmorph.runtime.transport.tensors import host as _host
from netmorph.runtime.transport.tensors import reduce_into as _reduce_into
from netmorph.runtime.transport.tensors import to_torch
from netmorph.runtime.transport.torchdiagnose import Diagnosis
from netmorph.runtime.transport.torchgroup import DefaultGroup, EpochGroup

HEADER_TAG, PAYLOAD_TAG = 1, 2
# what gloo and NCCL say when the transport under a call failed (a peer gone, a call timed out, ranks that
# disagree); any other RuntimeError is torch refusing the call itself, raised as it is
_TRANSPORT_ERROR = re.compile(
    r"[Cc]onnection|[Tt]imed out|[Rr]ead error|[Ww]rite error|[Bb]roken pipe|[Ss]ocket|"
    r"[Pp]eer|EOF|[Cc]losed|mismatch|NCCL|ncclRemoteError|ncclSystemError"
)


class _P2PRecv:
    """One point-to-point receive: its header is posted at once, its payload after the header checked."""

    __slots__ = ("src", "array", "fp", "head", "hwork", "pwork", "done")

    def __init__(self, src, array, fp):
        self.src, self.array, self.fp = src, array, fp
        self.head = _head_like(array)
        self.hwork = self.pwork = None
        self.done = False


class _TorchWork:
    """``torch.distributed.Work``-like handle: ``wait()``, ``is_completed()``; ``keep`` holds the tensor.
    On gloo a receive's ``is_completed()`` stays False until ``wait()`` (torch's own gloo Work does the
    same, data or not); NCCL's reports the stream's progress."""

    def __init__(self, transport, finish, peer, test=None):
        self._t, self._finish, self._peer, self._test = transport, finish, peer, test
        self.keep = None

    def is_completed(self) -> bool:
        return self._test() if self._test else False

    def wait(self, timeout=None) -> bool:
        self._t.guard(self._peer, self._finish)
        return True


class TorchTransport(Diagnosis):
    """One rank's end of torch.distributed point-to-point. Buffers are numpy views of CPU memory, or
    torch tensors on their device (``devices``): a CUDA tensor goes over NCCL as it is, its header
    beside it on the device, its reduction done by torch on the device -- no host round trip."""

    name = "torch"
    devices = True

    def __init__(self, rank: int, world: int, timeout: float = 60.0, group=None):
        self.rank, self.world, self.timeout = rank, world, timeout
        self.group = group or DefaultGroup()  # the process group it talks over (a membership epoch's: reform)
        self.failed = None  # the first failure: raised again on every later call
        self.current = None  # the fingerprint of the call in flight (compared at a timeout)
        self.current_what = 0  # what it waits for (blame.WHAT): 0 data, 1 a send's receive
        self.pending: dict[int, deque] = {}  # src -> point-to-point receives whose payload is not posted yet
        self.clock = SendClock(rank)  # links emulated by Comm.emulate (none until then)

    # ------------------------------------------------------------ failures
    def guard(self, peer: int, call):
        """Run ``call()``; a torch.distributed error becomes the classified netmorph error, kept."""
        if self.failed is not None:
            raise self.failed
        try:
            return call()
        except fpr.CollectiveMismatch as e:
            self.failed = e
            self._publish(e)
            raise
        except RuntimeError as e:
            self._raise(peer, e)

    def _raise(self, peer: int, e: RuntimeError):
        """Raise a torch.distributed error from a call to ``peer``: the transport under it failing as the
        classified netmorph error, kept (:meth:`failure`); torch refusing the call itself (a type gloo
        lacks, ...) as it is."""
        if not _TRANSPORT_ERROR.search(str(e)):
            raise e
        raise self.failure(peer, e) from None

    # ------------------------------------------------------------ membership
    def reform(self, epoch: int, members=None, slot: int | None = None) -> None:
        """A new membership epoch: a fresh process group among ``members`` (slots, in the agreed view's order)
        over a prefix of the job's store, this process slot ``slot`` (:class:`~.torchgroup.EpochGroup`,
        ``ncclCommShrink``/``Grow``); the old group is aborted. Every member calls it for the same epoch."""
        if members is None:
            raise FabricError(
                "reform on torch.distributed needs the members: the new process group is built among them"
            )
        store = self.group.store()
        self.group.abort()
        self.group = EpochGroup(store, epoch, members, self.rank if slot is None else slot, self.timeout)
        self.failed, self.current, self.pending = None, None, {}

    # ------------------------------------------------------------ rounds of a schedule
    def run_round(self, sends, recvs, ufunc, snapshot: bool = False, fp=None) -> None:
        self.guard(-1, lambda: None)
        self.current = fp
        self.current_what = 0
        g = self.group
        works, bufs, heads = [], [], []
        peer = -1
        try:
            for peer, views in sends:
                payload = views[0] if len(views) == 1 else _concat(views)
                if nbytes(payload):
                    self.clock.hold(peer, nbytes(payload))
                    if fp is not None:
                        works.append((peer, g.isend(_header_like(fp, nbytes(payload), payload), peer, tag=HEADER_TAG)))
                    works.append(
                        (peer, g.isend(to_torch(_contiguous(payload)), peer, tag=PAYLOAD_TAG if fp is not None else 0))
                    )
            for peer, views, flags in recvs:
                total = sum(len(v) for v in views)
                if total:
                    self._flush(peer)
                    buf = (
                        np.empty(total, dtype=views[0].dtype)
                        if isinstance(views[0], np.ndarray)
                        else views[0].new_empty(total)
                    )
                    bufs.append((peer, buf, views, flags))
                    if fp is not None:
                        head = _head_like(buf)
                        heads.append((peer, head, buf, g.irecv(to_torch(head), peer, tag=HEADER_TAG)))
                    else:
                        works.append((peer, g.irecv(to_torch(buf), peer)))
        except RuntimeError as e:
            self._raise(peer, e)
        for peer, head, buf, w in heads:  # every header checked before any payload is received
            self.guard(peer, w.wait)
            self.guard(peer, lambda: fpr.check(fp, nbytes(buf), _host(head), self.rank, peer))
        for peer, head, buf, w in heads:
            works.append((peer, self.guard(peer, lambda: g.irecv(to_torch(buf), peer, tag=PAYLOAD_TAG))))
        for peer, w in works:
            self.guard(peer, w.wait)
        settled = settle([(views, flags) for _, _, views, flags in bufs])
        for (_, buf, views, _), flags in zip(bufs, settled):  # land after every send left: start-of-round reads
            at = 0
            for v, red in zip(views, flags):
                part = buf[at : at + len(v)]
                if red is False:
                    v[:] = part
                else:
                    _reduce_into(v, part, ufunc, None if red is True else red)
                at += len(v)

    # ------------------------------------------------------------ point to point
    def isend(self, array, dst, fp=None):
        g = self.group
        self.current = fp
        self.current_what = 1  # a send that waits for its receive

        def post():
            self.clock.hold(dst, nbytes(array))
            ws = []
            if fp is not None:
                ws.append(g.isend(_header_like(fp, nbytes(array), array), dst, tag=HEADER_TAG))
            ws.append(g.isend(to_torch(array), dst, tag=PAYLOAD_TAG if fp is not None else 0))
            return ws

        works = self.guard(dst, post)
        return _TorchWork(
            self, lambda: [w.wait() for w in works], dst, test=lambda: all(w.is_completed() for w in works)
        )

    def irecv(self, array, src, fp=None):
        g = self.group
        self.current = fp
        self.current_what = 0
        if fp is None:
            w = self.guard(src, lambda: g.irecv(to_torch(array), src))
            return _TorchWork(self, w.wait, src, test=w.is_completed)
        r = _P2PRecv(src, array, fp)
        r.hwork = self.guard(src, lambda: g.irecv(to_torch(r.head), src, tag=HEADER_TAG))
        self.pending.setdefault(src, deque()).append(r)

        def finish():
            self._flush(src, upto=r)
            r.pwork.wait()

        def test():
            if r.pwork is None:
                q = self.pending.get(src, ())
                ahead = list(q)[: list(q).index(r) + 1] if r in q else []
                if not all(x.hwork.is_completed() for x in ahead):
                    return False  # a header still in flight: posting its payload would block
                self.guard(src, lambda: self._flush(src, upto=r))
            return r.pwork.is_completed()

        return _TorchWork(self, finish, src, test=test)

    def _flush(self, src: int, upto: _P2PRecv | None = None) -> None:
        """Post the payload receives of earlier point-to-point receives from ``src`` (in order, each
        after its header checked), up to and including ``upto`` (None: all)."""
        q = self.pending.get(src)
        g = self.group
        while q:
            r = q.popleft()
            self.guard(src, r.hwork.wait)
            self.guard(src, lambda: fpr.check(r.fp, nbytes(r.array), _host(r.head), self.rank, src))
            r.pwork = self.guard(src, lambda: g.irecv(to_torch(r.array), src, tag=PAYLOAD_TAG))
            if r is upto:
                return

    def recv_any(self, array, srcs, fp_of=None) -> int:
        """``dist.recv`` with no source: gloo's recv-from-any (sources outside ``srcs`` are not expected);
        with fingerprints the header is received from any source, then the payload from that one."""
        g = self.group
        if fp_of is None:
            return int(self.guard(-1, lambda: g.recv_any(to_torch(array))))
        head = np.empty(fpr.HEADER_BYTES, np.uint8)
        src = int(self.guard(-1, lambda: g.recv_any(to_torch(head), tag=HEADER_TAG)))
        self.guard(src, lambda: fpr.check(fp_of(src), array.nbytes, head, self.rank, src))
        self.guard(src, lambda: g.irecv(to_torch(array), src, tag=PAYLOAD_TAG).wait())
        return src

    def close(self) -> None:
        self.group.close()
