"""The buffers a communicator takes: numpy arrays and torch tensors, viewed without copies.

``torch.distributed`` takes tensors; netmorph's collectives run on numpy views of them (a CPU tensor's memory
seen through its address, no copy), or keep them as tensors where the transport moves them on their device
(NCCL). These are the helpers every communicator shares for that: a copy, an empty buffer where the other lives,
whether two buffers are one, and the flat numpy view.
"""

from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from netmorph.errors import UsageError
from netmorph.units import numpy_dtype


@cache
def _numpy_dtype(torch_dtype):
    """numpy's dtype for a torch dtype (bfloat16: ml_dtypes'), or None where there is none."""
    import torch

    if torch_dtype == torch.bfloat16:
        return numpy_dtype("bfloat16")
    try:
        return torch.empty(0, dtype=torch_dtype).numpy().dtype
    except (TypeError, RuntimeError):
        return None


def is_tensor(t) -> bool:
    return hasattr(t, "is_contiguous") and hasattr(t, "device")


def copy_of(a):
    """A copy of a buffer, numpy array or torch tensor (on its device)."""
    return a.copy() if isinstance(a, np.ndarray) else a.clone()


def empty_like(a, n: int):
    """``n`` uninitialised elements of ``a``'s dtype, where ``a`` lives (numpy, or its device)."""
    return np.empty(n, a.dtype) if isinstance(a, np.ndarray) else a.new_empty(n)


def same_memory(a, b) -> bool:
    """Two flat buffers over the same first element (an out-of-place call given one buffer twice: in place)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return False
    return a.data_ptr() == b.data_ptr()


def is_float(a) -> bool:
    if isinstance(a, np.ndarray):
        return a.dtype.kind == "f" or a.dtype.name == "bfloat16"  # ml_dtypes' bfloat16 is kind V
    return a.is_floating_point()


def as_array(t) -> np.ndarray:
    """A flat numpy view of a numpy array or CPU torch tensor (no copy)."""
    if isinstance(t, np.ndarray):
        arr = t
    elif hasattr(t, "numpy") and hasattr(t, "is_contiguous"):
        if t.device.type != "cpu":
            raise UsageError(
                "the local fabric works on CPU tensors; use backend='torch' (NCCL) for GPU tensors", "tensor"
            )
        if not t.is_contiguous():
            raise UsageError("tensor must be contiguous (call .contiguous() first)", "tensor")
        arr = _view(t)
    else:
        raise UsageError(f"expected a numpy array or torch tensor, got {type(t).__name__}", "tensor")
    if not arr.flags.c_contiguous:
        raise UsageError("array must be C-contiguous (use np.ascontiguousarray)", "tensor")
    return arr.reshape(-1)


def _view(t) -> np.ndarray:
    """The tensor's memory as numpy, through its address: unlike ``Tensor.numpy()`` this leaves the
    storage resizable, which ZeRO-3 and FSDP release and re-grow. The caller keeps ``t`` alive for
    as long as the view is in use (a collective's duration; an ``isend`` until its ``wait``)."""
    dtype = _numpy_dtype(t.dtype)
    if dtype is None:
        raise UsageError(
            f"{t.dtype} has no numpy type to reduce with on the local fabric; use backend='torch' "
            f"(torch reduces it) or a float16/bfloat16/float32 tensor",
            "tensor",
        )
    n = t.numel() * dtype.itemsize
    if n == 0:
        return np.empty(0, dtype)
    return np.ctypeslib.as_array((ctypes.c_char * n).from_address(t.data_ptr())).view(dtype)
