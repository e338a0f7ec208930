"""The arrays a transport moves, whichever library holds them: numpy on the host, torch tensors on a device.

What ``torch.distributed``'s point-to-point calls need from netmorph's numpy buffers -- a tensor over the same
memory (``torch.from_numpy``; ml_dtypes' bfloat16 through its bits), a 64-byte header where the payload lives
(NCCL moves device memory), a reduction in place with numpy's ufunc or torch's op of the same name.
"""

from __future__ import annotations

import numpy as np

from netmorph.runtime.transport import fingerprint as fpr


def dist_module():
    import torch.distributed as dist

    return dist


def to_torch(a):
    """A torch tensor over ``a``'s memory (a tensor is returned as it is; ml_dtypes' bfloat16 becomes
    torch's, through its bits: torch.from_numpy does not know the type)."""
    if not isinstance(a, np.ndarray):
        return a
    import torch

    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def head_like(a):
    """A 64-byte header buffer where ``a`` lives (numpy, or ``a``'s device: NCCL moves device memory)."""
    if isinstance(a, np.ndarray):
        return np.empty(fpr.HEADER_BYTES, np.uint8)
    import torch

    return torch.empty(fpr.HEADER_BYTES, dtype=torch.uint8, device=a.device)


def header_like(fp, nbytes: int, a):
    h = to_torch(fpr.header(fp, nbytes))
    return h if isinstance(a, np.ndarray) else h.to(a.device)


def host(head) -> np.ndarray:
    return head if isinstance(head, np.ndarray) else head.cpu().numpy()


def reduce_into(v, part, ufunc, acc=None) -> None:
    """``v = ufunc(v, part)`` in place (``ufunc(acc, part)`` into ``v`` with an accumulator: out of place):
    numpy's ufunc, or torch's op of the same name on the device."""
    first = v if acc is None else acc
    if isinstance(v, np.ndarray):
        ufunc(first, part, out=v)
        return
    import torch

    op = {np.add: torch.add, np.multiply: torch.mul, np.maximum: torch.maximum, np.minimum: torch.minimum}[ufunc]
    op(first, part, out=v)


def concat(views):
    if isinstance(views[0], np.ndarray):
        return np.concatenate([v.reshape(-1) for v in views])
    import torch

    return torch.cat([v.reshape(-1) for v in views])


def contiguous(a):
    return np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a.contiguous()
