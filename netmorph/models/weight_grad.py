"""The backward split in two: B, the input gradient (on the pipeline's critical path: the previous stage waits for
it), and W, the weight gradient (needed only by the optimizer: movable into the bubble) -- Qi et al. 2024's
zero-bubble pipelines, as Megatron-LM's and DeepSeek's ``WeightGradStore`` run them.

A linear layer given a :class:`WeightGradStore` computes, in its backward, the input gradient and the bias's at
once; while the store is deferring (one microbatch's B slot), the weight's GEMM ``dW = gᵀ·x`` is queued under
that microbatch and chunk instead of run, its two operands kept alive by the closure (the activation autograd
saved, the output gradient), and runs when the schedule's W slot for it comes. Outside a deferring store, or with
no store, the backward is the joint one. Either way the same products: the split equals the joint backward (in
float64, to rounding).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F


class WeightGradStore:
    """Queued weight-gradient GEMMs, by key (the pipeline's (chunk, microbatch))."""

    def __init__(self):
        self.key = None  # while a B slot runs: the key its weight gradients queue under
        self.queue: dict = {}
        self.held: dict = {}  # storage -> [bytes, references]: what the queued GEMMs keep alive
        self.held_bytes = 0  # their bytes, the distinct storages counted once
        self.peak_bytes = 0  # the most held at once: the W stash the memory model counts

    @contextmanager
    def deferring(self, key):
        """Queue the weight gradients of the backward run inside under ``key``."""
        self.key = key
        try:
            yield
        finally:
            self.key = None

    def push(self, fn, *operands: torch.Tensor) -> bool:
        """Queue ``fn`` under the current key, ``operands`` the tensors it keeps alive; False when nothing
        defers (run it now)."""
        if self.key is None:
            return False
        self.queue.setdefault(self.key, []).append((fn, operands))
        for t in operands:
            box = self.held.get(t.untyped_storage().data_ptr())
            if box is None:
                box = self.held[t.untyped_storage().data_ptr()] = [t.untyped_storage().nbytes(), 0]
                self.held_bytes += box[0]
            box[1] += 1
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)
        return True

    def run(self, key) -> int:
        """The W slot: every weight gradient queued under ``key``, in the order the backward met them."""
        fns = self.queue.pop(key, [])
        with torch.no_grad():  # outside autograd's backward: nothing here is differentiated
            for fn, operands in fns:
                fn()
                for t in operands:
                    ptr = t.untyped_storage().data_ptr()
                    self.held[ptr][1] -= 1
                    if not self.held[ptr][1]:
                        self.held_bytes -= self.held.pop(ptr)[0]
        return len(fns)

    def __len__(self) -> int:
        return sum(len(v) for v in self.queue.values())


def _accumulate(weight: torch.Tensor, dw: torch.Tensor) -> None:
    if weight.grad is None:
        weight.grad = dw
    else:
        weight.grad.add_(dw)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, store):
        ctx.save_for_backward(x, weight)  # through saved-tensor hooks (ZeRO-3 gathers the weight on unpack)
        # the Parameter itself, whose .grad W accumulates into: a hook's unpacked tensor may be another object
        ctx.param, ctx.store, ctx.has_bias = weight, store, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        gx = g @ weight
        gb = g.reshape(-1, g.shape[-1]).sum(0) if ctx.has_bias else None

        def w_grad(g=g, x=x, param=ctx.param):
            _accumulate(param, g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1]))

        if not ctx.store.push(w_grad, g, x):
            return gx, g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1]), gb, None
        return gx, None, gb, None


def linear(x, weight, bias=None, store: WeightGradStore | None = None):
    """``F.linear``, its weight gradient deferred to ``store``'s W slot when one is given and deferring."""
    if store is None:
        return F.linear(x, weight, bias)
    return _Linear.apply(x, weight, bias, store)
