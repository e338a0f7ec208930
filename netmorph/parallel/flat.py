"""One flat buffer for a rank's parameters and one for its gradients, and Adam on flat slices.

Megatron's ``DistributedDataParallel`` (``param_and_grad_buffer``) and DeepSpeed's
ZeRO both lay every parameter of a rank out in one contiguous buffer: a bucket of
gradients is then a slice that one collective reduces in place (PyTorch DDP's
``gradient_as_bucket_view``), and a ZeRO shard is a slice too. The buffer is
padded to a multiple of the data-parallel degree so every rank's shard is the
same size.

Under mixed precision (Megatron's ``--bf16``) the parameters are 16-bit and the gradient buffer is float32, the
``main_grad`` Megatron's DDP accumulates into: autograd's 16-bit gradient of each microbatch is added to it and
dropped (:meth:`FlatParams.collect_grads`), so that only 2 + 4 bytes per parameter persist here; the float32
master copy lives with the optimizer.

Adam here is plain elementwise Adam (Kingma & Ba, bias-corrected) on a slice of
the flat buffer, so that the 1-rank run, DP and every ZeRO stage apply the very
same arithmetic to every element -- the reason a ZeRO shard's update equals the
unsharded one bit for bit.
"""

from __future__ import annotations

import math

import torch

from netmorph.mesh.placement import flat_offsets


class FlatParams:
    """``params`` re-homed into one flat parameter buffer and one flat gradient buffer; ``names`` (the
    placement table's, in the same order) label :meth:`index`."""

    def __init__(self, params, pad_to: int = 1, dtype=torch.float64, names=None, grad_dtype=None):
        self.params = list(params)
        self.names = list(names) if names is not None else [str(k) for k in range(len(self.params))]
        self.index = {id(p): k for k, p in enumerate(self.params)}
        self.offsets, self.padded = flat_offsets([p.numel() for p in self.params], pad_to)
        self.numel = sum(p.numel() for p in self.params)
        device = self.params[0].device if self.params else None  # where the model lives (cuda:N under NCCL)
        self.data = torch.zeros(self.padded, dtype=dtype, device=device)
        self.mixed = grad_dtype is not None and grad_dtype != dtype  # 16-bit parameters, float32 main grads
        self.grad = torch.zeros(self.padded, dtype=grad_dtype if self.mixed else dtype, device=device)
        for p, off in zip(self.params, self.offsets):
            self.data[off : off + p.numel()].copy_(p.data.reshape(-1))
            p.data = self.data[off : off + p.numel()].view_as(p)
            p.grad = None if self.mixed else self.grad[off : off + p.numel()].view_as(p)

    def entries(self) -> dict:
        """The buffer's real layout: {name: (offset, length)}, and the padding after the last one."""
        return {
            "params": {n: (off, p.numel()) for n, p, off in zip(self.names, self.params, self.offsets)},
            "padding": self.padded - self.numel,
        }

    def span(self, p) -> tuple[int, int]:
        i = self.index[id(p)]
        return self.offsets[i], self.offsets[i] + p.numel()

    def zero_grad(self) -> None:
        self.grad.zero_()
        for p, off in zip(self.params, self.offsets):  # autograd may have replaced a .grad
            if self.mixed:
                p.grad = None
                continue
            if p.grad is None or p.grad.data_ptr() != self.grad[off:].data_ptr():
                p.grad = self.grad[off : off + p.numel()].view_as(p)

    def collect_grads(self) -> None:
        """Make sure every gradient is in the flat buffer (a no-op when autograd accumulated in place); mixed:
        add each 16-bit gradient to the float32 main gradient and drop it (after every microbatch's backward)."""
        for p, off in zip(self.params, self.offsets):
            if self.mixed:
                if p.grad is not None:
                    self.grad[off : off + p.numel()].add_(p.grad.reshape(-1))
                    p.grad = None
                continue
            if p.grad is not None and p.grad.data_ptr() != self.grad[off:].data_ptr():
                self.grad[off : off + p.numel()].copy_(p.grad.reshape(-1))
                p.grad = self.grad[off : off + p.numel()].view_as(p)

    def bytes(self) -> dict:
        """Measured model-state bytes of this rank (unpadded)."""
        return {"params": self.numel * self.data.element_size(), "grads": self.numel * self.grad.element_size()}


class Adam:
    """Adam on a slice ``[lo, hi)`` of a flat buffer; its state is two buffers of that slice's size."""

    def __init__(
        self, lo: int, hi: int, lr: float = 3e-3, betas=(0.9, 0.95), eps: float = 1e-8, dtype=torch.float64, device=None
    ):
        self.lo, self.hi = lo, hi
        self.lr, (self.b1, self.b2), self.eps = lr, betas, eps
        self.m = torch.zeros(hi - lo, dtype=dtype, device=device)
        self.v = torch.zeros(hi - lo, dtype=dtype, device=device)
        self.t = 0

    def step(self, param: torch.Tensor, grad: torch.Tensor) -> None:
        """``param`` and ``grad`` are the slice (hi - lo elements), updated in place."""
        self.t += 1
        self.m.mul_(self.b1).add_(grad, alpha=1 - self.b1)
        self.v.mul_(self.b2).addcmul_(grad, grad, value=1 - self.b2)
        # torch.optim.Adam's single-tensor update: lr·m̂ / (√v̂ + eps) with the bias corrections folded into
        # scalars, so one temporary (the denominator) instead of five
        denom = self.v.sqrt().div_(math.sqrt(1 - self.b2**self.t)).add_(self.eps)
        param.addcdiv_(self.m, denom, value=-self.lr / (1 - self.b1**self.t))

    def bytes(self) -> int:
        return (self.m.numel() + self.v.numel()) * self.m.element_size()
