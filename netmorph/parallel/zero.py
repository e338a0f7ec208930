"""ZeRO (Rajbhandari et al. 2020; DeepSpeed's stages) over the DP group, on the flat buffers.

- stage 1: optimizer states partitioned. Gradients are reduce-scattered (each rank
  gets the average of its 1/d shard), each rank runs Adam on its shard of the
  parameters, and the shards are all-gathered back: the same 2(d-1)/d·Ψ bytes as an
  all-reduce, in two halves.
- stage 2: gradients partitioned too: after the reduce-scatter only the shard is
  kept (the full gradient buffer is released between steps).
- stage 3: parameters partitioned too (``zero.Init``): only the shard persists.
  Before each microbatch's forward the parameters are all-gathered, released after
  it, and all-gathered again when backward needs them -- a ``saved_tensors_hooks``
  pair notices autograd unpacking a parameter, as FSDP's pre-backward hook does --
  so a step moves (2m + 1)(d-1)/d·Ψ: 1.5× data parallelism at one microbatch.

Under mixed precision the shard is the float32 master (Megatron's distributed optimizer): the float32 main
gradients are reduce-scattered (on the wire in bf16 unless ``--grad-reduce-dtype float32``), Adam runs on the
master shard, and the 16-bit parameters are all-gathered -- so a gather moves 2 bytes an element, a scatter the
wire's.

All of it in the ledger phase ``zero``.
"""

from __future__ import annotations

import torch

from netmorph.mesh.placement import shard_range
from netmorph.parallel.algos import CollectiveAlgos
from netmorph.parallel.flat import Adam


class ZeRO:
    def __init__(self, comm, group, flat, stage: int, lr: float, phase: str = "zero", algos=None, wire=None):
        self.comm, self.group, self.flat, self.stage, self.phase = comm, group, flat, stage, phase
        self.algos = algos or CollectiveAlgos()
        self.d = group.size()
        self.r = group.index[comm.rank]
        n = flat.padded // self.d
        self.lo, self.hi = shard_range(flat.padded, self.d, self.r)
        master = flat.grad.dtype  # float32 under mixed precision, else the params'
        self.wire = wire if wire is not None else master  # the gradients' dtype on the wire
        self.adam = Adam(self.lo, self.hi, lr=lr, dtype=master, device=flat.data.device)
        self.shard = flat.data[self.lo : self.hi].to(master, copy=True)  # this rank's parameters, always held
        # mixed ZeRO-3: the 16-bit shard the gathers send, held beside the master
        self.shard16 = self.shard.to(flat.data.dtype) if flat.mixed and stage >= 3 else None
        self.grad_shard = torch.zeros(n, dtype=master, device=flat.data.device)
        self.gathered = True
        self.full_bytes = flat.data.untyped_storage().nbytes()
        self.grad_bytes = flat.grad.untyped_storage().nbytes()
        if stage >= 3:
            self.release()

    def zero_grad(self) -> None:
        if self.flat.grad.untyped_storage().nbytes() == 0:  # stage 2+: the full buffer comes back for backward
            self.flat.grad.untyped_storage().resize_(self.grad_bytes)
        self.flat.zero_grad()

    # ------------------------------------------------------------ stage 3: parameters on demand
    def gather(self) -> None:
        if self.gathered:
            return
        self.flat.data.untyped_storage().resize_(self.full_bytes)
        with self.comm.phase(self.phase):
            self.comm.all_gather_into_tensor(
                self.flat.data,
                self.shard if self.shard16 is None else self.shard16,
                group=self.group,
                algo=self.algos.allgather,
            )
        self.gathered = True

    def release(self) -> None:
        self.flat.data.untyped_storage().resize_(0)
        self.gathered = False

    def forward(self, fn):
        """Run one microbatch's forward with the parameters gathered (stage 3), then release them;
        backward re-gathers them when autograd first unpacks one."""
        if self.stage < 3:
            return fn()
        self.gather()
        storage = self.flat.data.untyped_storage()

        def pack(t):
            if t.untyped_storage()._cdata == storage._cdata:
                return ("zero3-param", t)
            return t

        def unpack(x):
            if isinstance(x, tuple) and len(x) == 2 and x[0] == "zero3-param":
                self.gather()
                return x[1]
            return x

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = fn()
        self.release()
        return out

    def after_backward(self) -> None:
        if self.stage >= 3:
            self.release()

    # ------------------------------------------------------------ the step
    def step(self) -> None:
        """Reduce-scatter the gradients, Adam on the shard, all-gather the parameters (stages 1-2)."""
        self.flat.collect_grads()
        with self.comm.phase(self.phase):
            if self.d > 1:
                out = self.grad_shard if self.wire == self.grad_shard.dtype else self.grad_shard.to(self.wire)
                self.comm.reduce_scatter_tensor(
                    out, self.flat.grad.to(self.wire), group=self.group, algo=self.algos.reduce_scatter
                )
                self.grad_shard.copy_(out)
                self.grad_shard.div_(self.d)
            else:
                self.grad_shard.copy_(self.flat.grad)
            self.adam.step(self.shard, self.grad_shard)
            if self.shard16 is not None:
                self.shard16.copy_(self.shard)
            if self.stage < 3:
                if self.d > 1:
                    self.comm.all_gather_into_tensor(
                        self.flat.data, self.shard.to(self.flat.data.dtype), group=self.group, algo=self.algos.allgather
                    )
                else:
                    self.flat.data.copy_(self.shard)
        if self.stage >= 2:
            self.flat.grad.untyped_storage().resize_(0)  # only the shard persists

    def bytes(self) -> dict:
        """Model-state bytes this rank holds between steps."""
        isz, gsz = self.flat.data.element_size(), self.flat.grad.element_size()
        n, k = self.flat.numel, self.hi - self.lo
        master = k * gsz if self.flat.mixed else 0  # the float32 master shard, the optimizer's
        return {
            "params": k * isz if self.stage >= 3 else n * isz,
            "grads": k * gsz if self.stage >= 2 else n * gsz,
            "optimizer": self.adam.bytes() + master,
        }
