"""The same schedules over ``torch.distributed`` point-to-point, and torch's own collectives.

``TorchTransport`` runs each round as plain ``dist.isend``/``dist.irecv`` plus
``wait`` (``batch_isend_irecv`` is known to hang on gloo), so every netmorph
algorithm runs across machines: gloo on CPU, NCCL when the tensors live on GPUs.
``NativeComm`` calls ``dist.all_reduce`` and friends instead, for comparison --
what the schedule-driven path is measured against.
"""

from __future__ import annotations

import datetime
import time

import numpy as np

from netmorph.comm import Comm, as_array
from netmorph.fabric.transport import PeerLost, Work


def _dist():
    import torch.distributed as dist
    return dist


def _to_torch(a: np.ndarray):
    import torch
    return torch.from_numpy(a)


def _fail(peer, e):
    """gloo's error text, trimmed to what happened: '[.../pair.cc:553] Connection closed by peer ...'."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    text = text.split("] ", 1)[-1].split(". This is typically")[0]
    return PeerLost(peer, f"torch.distributed: {text}")


class _TorchWork(Work):
    def __init__(self, work, peer, after=None):
        self._w, self._peer, self._after = work, peer, after

    def is_completed(self) -> bool:
        return self._w.is_completed()

    def wait(self, timeout=None) -> bool:
        try:
            self._w.wait()
        except RuntimeError as e:
            raise _fail(self._peer, e) from None
        if self._after:
            self._after()
        return True


class TorchTransport:
    name = "torch"

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def run_round(self, sends, recvs, ufunc, snapshot: bool = False) -> None:
        dist = _dist()
        works, bufs = [], []
        try:
            for peer, views in sends:
                payload = views[0] if len(views) == 1 else np.concatenate([v.reshape(-1) for v in views])
                if payload.size:
                    works.append((peer, dist.isend(_to_torch(np.ascontiguousarray(payload)), peer)))
            for peer, views, flags in recvs:
                total = sum(v.size for v in views)
                if total:
                    buf = np.empty(total, dtype=views[0].dtype)
                    works.append((peer, dist.irecv(_to_torch(buf), peer)))
                    bufs.append((buf, views, flags))
        except RuntimeError as e:
            raise _fail(peer, e) from None
        for peer, w in works:
            try:
                w.wait()
            except RuntimeError as e:
                raise _fail(peer, e) from None
        for buf, views, flags in bufs:       # receives land after every send has left: start-of-round reads
            at = 0
            for v, red in zip(views, flags):
                part = buf[at:at + v.size]
                if red:
                    ufunc(v, part, out=v)
                else:
                    v[:] = part
                at += v.size

    def isend(self, array, dst):
        return _TorchWork(_dist().isend(_to_torch(array), dst), dst)

    def irecv(self, array, src):
        return _TorchWork(_dist().irecv(_to_torch(array), src), src)

    def recv_any(self, array, srcs) -> int:
        """``dist.recv`` with no source: gloo's recv-from-any (sources outside ``srcs`` are not expected)."""
        try:
            return int(_dist().recv(_to_torch(array)))
        except RuntimeError as e:
            raise _fail(-1, e) from None

    def close(self) -> None:
        dist = _dist()
        if dist.is_initialized():
            dist.destroy_process_group()


_NATIVE_OPS = {"sum": "SUM", "prod": "PRODUCT", "max": "MAX", "min": "MIN"}


class NativeComm(Comm):
    """``torch.distributed``'s own collectives behind the same API (``backend="torch-native"``)."""

    def _native(self, name, nbytes, call):
        seq = self._begin()
        t0 = time.perf_counter()
        try:
            call()
        except RuntimeError as e:
            raise _fail(-1, e) from None
        self.ledger.add(self.rank, -1, nbytes, seq, 0, self._phase, name, "torch-native", t0, time.perf_counter())

    def _pg(self, group):
        return None if group is None else _dist().new_group(list(group.ranks))

    def all_reduce(self, tensor, op="sum", group=None, algo="auto"):
        a = as_array(tensor)
        dist = _dist()
        self._native("allreduce", a.nbytes,
                     lambda: dist.all_reduce(_to_torch(a), op=getattr(dist.ReduceOp, _NATIVE_OPS[op]),
                                             group=self._pg(group)))
        return tensor

    def broadcast(self, tensor, src, group=None, algo="auto"):
        a = as_array(tensor)
        self._native("broadcast", a.nbytes, lambda: _dist().broadcast(_to_torch(a), src, group=self._pg(group)))
        return tensor

    def reduce(self, tensor, dst, op="sum", group=None, algo="auto"):
        a = as_array(tensor)
        dist = _dist()
        self._native("reduce", a.nbytes, lambda: dist.reduce(_to_torch(a), dst,
                                                             op=getattr(dist.ReduceOp, _NATIVE_OPS[op]),
                                                             group=self._pg(group)))
        return tensor

    def all_gather_into_tensor(self, output, input, group=None, algo="auto"):
        out, inp = as_array(output), as_array(input)
        self._native("allgather", out.nbytes,
                     lambda: _dist().all_gather_into_tensor(_to_torch(out), _to_torch(inp), group=self._pg(group)))
        return output

    def reduce_scatter_tensor(self, output, input, op="sum", group=None, algo="auto"):
        out, inp = as_array(output), as_array(input)
        dist = _dist()
        # gloo has no reduce_scatter_tensor; all-reduce then keep our block (what torch users do on gloo)
        me = self.get_rank(group)
        def call():
            work = inp.copy()
            dist.all_reduce(_to_torch(work), op=getattr(dist.ReduceOp, _NATIVE_OPS[op]), group=self._pg(group))
            out[:] = work[me * len(out):(me + 1) * len(out)]
        self._native("reduce_scatter", inp.nbytes, call)
        return output

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                          algo="auto"):
        out, inp = as_array(output), as_array(input)
        self._native("alltoall", inp.nbytes, lambda: _dist().all_to_all_single(
            _to_torch(out), _to_torch(inp), output_split_sizes, input_split_sizes, group=self._pg(group)))
        return output

    def barrier(self, group=None):
        self._native("barrier", 0, lambda: _dist().barrier(group=self._pg(group)))


def init_torch(rank: int, world: int, addr: str, port: int, timeout: float, native: bool = False, faults=()):
    """``init_process_group`` (gloo on CPU) and a Comm over it."""
    dist = _dist()
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))
    t = TorchTransport(rank, world)
    cls = NativeComm if native else Comm
    return cls(t, rank, world, faults, tuner_topology="flat")
