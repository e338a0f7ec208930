"""One flat buffer of parameters kept in step over one data-parallel group: its gradient reduction and its
optimizer.

Megatron-core's ``_ParamAndGradBuffer`` with its ``DistributedDataParallel`` (or its distributed optimizer,
ZeRO here): a dense model has one, over the data-parallel group. A mixture of experts has two, as Megatron
keeps them -- the dense parameters over the data-parallel group, and the experts over the *expert*
data-parallel group (the dp / ep ranks that hold the same experts; ``expert_data_parallel_group``). An
expert's gradient on its rank already sums the contributions of the whole expert-parallel group's tokens (the
all-to-all's backward brought them), so its mean divides by the whole data-parallel size, not by the replica
group's: ``scale`` = (replica group size) / dp.

Mixed precision (Megatron's ``--bf16`` with its default fp32 gradient accumulation): ``dtype`` bf16 parameters,
``master`` float32 main gradients, master weights and Adam moments -- 2 + 4 + 4 + 4 + 4 bytes a parameter --
and the reduction on the wire in ``wire`` (bf16 unless ``--grad-reduce-dtype float32``).
"""

from __future__ import annotations

import torch

from netmorph.parallel.algos import CollectiveAlgos
from netmorph.parallel.data_parallel import DataParallelBucket, DataParallelNaive
from netmorph.parallel.flat import Adam, FlatParams
from netmorph.parallel.zero import ZeRO


class Replica:
    """``params`` (named ``names``) replicated over ``group``: reduced by DDP's buckets (or naively, or by
    ZeRO stage ``zero``), stepped by Adam; ``phase`` tags its traffic in the ledger."""

    def __init__(
        self,
        comm,
        group,
        params,
        names,
        *,
        zero: int,
        lr: float,
        dtype,
        device,
        dp_mode: str = "bucket",
        bucket_mb: float = 1.0,
        overlap: bool = False,
        phase: str = "dp",
        scale: float = 1.0,
        algos=None,
        master=None,
        wire=None,
    ):
        algos = algos or CollectiveAlgos()
        self.flat = FlatParams(params, pad_to=group.size(), dtype=dtype, names=names, grad_dtype=master)
        self.scale, self.phase = scale, phase
        self.zero = (
            ZeRO(
                comm,
                group,
                self.flat,
                zero,
                lr,
                phase="zero" if phase == "dp" else f"zero.{phase}",
                algos=algos,
                wire=wire,
            )
            if zero
            else None
        )
        opt_dtype = self.flat.grad.dtype
        self.adam = None if self.zero else Adam(0, self.flat.padded, lr=lr, dtype=opt_dtype, device=device)
        # mixed precision without ZeRO: the float32 master weights the optimizer steps (ZeRO keeps its shard's)
        self.master = self.flat.data.to(opt_dtype, copy=True) if self.flat.mixed and not self.zero else None
        self.dp = None
        if not self.zero:
            self.dp = (
                DataParallelNaive(comm, group, self.flat, phase, algos.dp, wire)
                if dp_mode == "naive"
                else DataParallelBucket(
                    comm, group, self.flat, bucket_mb, overlap and not self.flat.mixed, phase, algos.dp, wire
                )
            )

    @property
    def optimizer(self) -> Adam:
        return self.zero.adam if self.zero else self.adam

    def zero_grad(self) -> None:
        (self.zero or self.flat).zero_grad()

    def arm(self) -> None:
        if self.dp is not None:
            self.dp.arm()

    def after_backward(self) -> None:
        if self.flat.mixed:  # each microbatch's bf16 gradient into the float32 main gradient
            self.flat.collect_grads()
        if self.zero:
            self.zero.after_backward()

    def finish(self) -> None:
        """After the step's last backward: reduce (DDP), rescale an expert replica's mean."""
        if self.dp is not None:
            self.dp.finish()
        if self.scale != 1.0:
            self.flat.collect_grads()
            self.flat.grad.mul_(self.scale)

    def step(self) -> None:
        if self.zero:
            self.zero.step()
        elif self.master is not None:
            self.adam.step(self.master, self.flat.grad)
            self.flat.data.copy_(self.master)
        else:
            self.adam.step(self.flat.data, self.flat.grad)

    def gather(self) -> None:
        if self.zero:
            self.zero.gather()

    def close(self) -> None:
        if self.dp is not None:
            self.dp.close()

    def state(self) -> dict:
        """{"params": the flat buffer, "m", "v": Adam's moments over its range, "t": its step}, on the host."""
        opt = self.optimizer
        params = self.flat.data if self.master is None else self.master  # mixed: the float32 master
        if self.flat.mixed and self.zero:  # the 16-bit parameters, this rank's shard its float32 master
            params = self.flat.data.to(self.flat.grad.dtype)
            params[self.zero.lo : self.zero.hi] = self.zero.shard
        return {
            "params": params.cpu().numpy().copy(),
            "m": opt.m.cpu().numpy().copy(),
            "v": opt.v.cpu().numpy().copy(),
            "t": opt.t,
        }

    def load(self, init: dict) -> None:
        """Start from a given state: the flat parameters (under ZeRO the shard too; under ZeRO-3 only the shard
        persists), Adam's moments over this rank's range and its step count."""
        flat, zero = self.flat, self.zero
        params = torch.as_tensor(init["params"], dtype=flat.grad.dtype, device=flat.data.device)
        if zero:
            zero.shard.copy_(params[zero.lo : zero.hi])
            if zero.shard16 is not None:
                zero.shard16.copy_(zero.shard)
            if zero.gathered:
                flat.data.copy_(params)
        else:
            flat.data.copy_(params)
            if self.master is not None:
                self.master.copy_(params)
        opt = self.optimizer
        opt.m.copy_(torch.as_tensor(init["m"]))
        opt.v.copy_(torch.as_tensor(init["v"]))
        opt.t = int(init["t"])

    def bytes(self) -> dict:
        if self.zero:
            return self.zero.bytes()
        master = 0 if self.master is None else self.master.numel() * self.master.element_size()
        return {**self.flat.bytes(), "optimizer": self.adam.bytes() + master}

    def index(self) -> dict:
        """The buffer's real layout (:meth:`FlatParams.entries`) and the range the optimizer covers."""
        z = self.zero
        return {**self.flat.entries(), "optimizer_range": (z.lo, z.hi) if z else (0, self.flat.padded)}


def rank_state(reps) -> dict:
    """The rank's flat state a checkpoint saves: the dense replica's, a mixture of experts' experts under
    ``"experts"`` (:func:`netmorph.checkpoint.training.load_state`'s shape)."""
    state = reps[0].state()
    return {**state, "experts": reps[1].state()} if len(reps) > 1 else state
