"""The same schedules over ``torch.distributed`` point-to-point, and torch's own collectives.

``TorchTransport`` runs each round as plain ``dist.isend``/``dist.irecv`` plus
``wait`` (``batch_isend_irecv`` is known to hang on gloo), so every netmorph
algorithm runs across machines: gloo on CPU, NCCL when the tensors live on GPUs.
(torch.distributed's own collectives, for comparison, are
:class:`netmorph.runtime.native.NativeComm`.)
"""

from __future__ import annotations

import numpy as np

from netmorph.runtime.transport import PeerLost, Work


def dist_module():
    import torch.distributed as dist
    return dist


def to_torch(a: np.ndarray):
    import torch
    return torch.from_numpy(a)


def lost_peer(peer, e):
    """gloo's error text, trimmed to what happened: '[.../pair.cc:553] Connection closed by peer ...'."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    text = text.split("] ", 1)[-1].split(". This is typically")[0]
    return PeerLost(peer, f"torch.distributed: {text}")


class _TorchWork(Work):
    def __init__(self, work, peer, after=None):
        self._w, self._peer, self._after = work, peer, after
        self.keep = None

    def is_completed(self) -> bool:
        return self._w.is_completed()

    def wait(self, timeout=None) -> bool:
        try:
            self._w.wait()
        except RuntimeError as e:
            raise lost_peer(self._peer, e) from None
        if self._after:
            self._after()
        return True


class TorchTransport:
    name = "torch"

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def run_round(self, sends, recvs, ufunc, snapshot: bool = False) -> None:
        dist = dist_module()
        works, bufs = [], []
        try:
            for peer, views in sends:
                payload = views[0] if len(views) == 1 else np.concatenate([v.reshape(-1) for v in views])
                if payload.size:
                    works.append((peer, dist.isend(to_torch(np.ascontiguousarray(payload)), peer)))
            for peer, views, flags in recvs:
                total = sum(v.size for v in views)
                if total:
                    buf = np.empty(total, dtype=views[0].dtype)
                    works.append((peer, dist.irecv(to_torch(buf), peer)))
                    bufs.append((buf, views, flags))
        except RuntimeError as e:
            raise lost_peer(peer, e) from None
        for peer, w in works:
            try:
                w.wait()
            except RuntimeError as e:
                raise lost_peer(peer, e) from None
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
        return _TorchWork(dist_module().isend(to_torch(array), dst), dst)

    def irecv(self, array, src):
        return _TorchWork(dist_module().irecv(to_torch(array), src), src)

    def recv_any(self, array, srcs) -> int:
        """``dist.recv`` with no source: gloo's recv-from-any (sources outside ``srcs`` are not expected)."""
        try:
            return int(dist_module().recv(to_torch(array)))
        except RuntimeError as e:
            raise lost_peer(-1, e) from None

    def close(self) -> None:
        dist = dist_module()
        if dist.is_initialized():
            dist.destroy_process_group()
