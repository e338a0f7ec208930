"""torch.distributed's own collectives behind netmorph's communicator API (``backend="torch-native"``).

``dist.all_reduce``, ``dist.broadcast``, ``dist.all_gather_into_tensor``,
``dist.all_to_all_single`` ... called directly: what the schedule-driven
:class:`~netmorph.runtime.comm.Comm` is measured against (gloo here, NCCL on GPUs).
Only the collectives differ; ranks, groups, phases and point-to-point are the
shared :class:`~netmorph.runtime.base.CommBase`. The ledger records one entry per
call (``dst`` -1: torch does not say who sent what). torch's collectives carry no
netmorph fingerprint (point-to-point does); torch's own cross-rank check of the
calls is ``TORCH_DISTRIBUTED_DEBUG=DETAIL``.
"""

from __future__ import annotations

import time

from netmorph.runtime.base import CommBase, CompletedWork, canonical_redop
from netmorph.runtime.buffers import copy_of
from netmorph.runtime.transport import nbytes
from netmorph.runtime.transport.tensors import dist_module, to_torch

_NATIVE_OPS = {"sum": "SUM", "avg": "SUM", "prod": "PRODUCT", "max": "MAX", "min": "MIN"}  # gloo has no AVG


class NativeComm(CommBase):
    """``torch.distributed``'s own collectives behind the same API (``backend="torch-native"``)."""

    def _native(self, name, nbytes, call):
        seq = self._begin()
        t0 = time.perf_counter()
        self.transport.guard(-1, call)  # torch does not say which peer failed a collective
        self.ledger.add(
            self.rank, -1, nbytes, seq, 0, self.current_phase, name, "torch-native", t0, time.perf_counter()
        )

    def new_group(self, ranks):
        """``dist.new_group``: collective over the whole world -- every rank creates every group, in
        the same order, members or not."""
        g = super().new_group(ranks)
        g.pg = dist_module().new_group(list(g.ranks))
        return g

    def _pg(self, group):
        return None if group is None else group.pg

    @staticmethod
    def _alone(group) -> bool:
        """A 1-rank group (a mesh dimension of size 1) has no process group: its collectives are the identity."""
        return group is not None and group.size() == 1

    def all_reduce(self, tensor, op="sum", group=None, algo="auto", async_op=False):
        a = self._buf(tensor)
        op = canonical_redop(op)
        if self._alone(group):
            return CompletedWork() if async_op else tensor
        dist = dist_module()
        self._native(
            "allreduce",
            nbytes(a),
            lambda: dist.all_reduce(to_torch(a), op=getattr(dist.ReduceOp, _NATIVE_OPS[op]), group=self._pg(group)),
        )
        if op == "avg":
            a /= self.get_world_size(group)
        return CompletedWork() if async_op else tensor

    def broadcast(self, tensor, src, group=None, algo="auto", async_op=False):
        a = self._buf(tensor)
        if self._alone(group):
            return CompletedWork() if async_op else tensor
        self._native("broadcast", nbytes(a), lambda: dist_module().broadcast(to_torch(a), src, group=self._pg(group)))
        return CompletedWork() if async_op else tensor

    def reduce(self, tensor, dst, op="sum", group=None, algo="auto", async_op=False):
        """Only ``dst`` gets the result; the others' tensors stay as they were (gloo's reduce
        scribbles partial sums into them, so they hand torch a copy) -- the contract of the
        schedule-driven backends."""
        a = self._buf(tensor)
        op = canonical_redop(op)
        if self._alone(group):
            return CompletedWork() if async_op else tensor
        work = a if self.rank == dst else copy_of(a)
        dist = dist_module()
        self._native(
            "reduce",
            nbytes(a),
            lambda: dist.reduce(to_torch(work), dst, op=getattr(dist.ReduceOp, _NATIVE_OPS[op]), group=self._pg(group)),
        )
        if op == "avg" and self.rank == dst:
            a /= self.get_world_size(group)
        return CompletedWork() if async_op else tensor

    def all_gather_into_tensor(self, output, input, group=None, algo="auto", async_op=False):
        out, inp = self._buf(output), self._buf(input)
        if self._alone(group):
            out[:] = inp
            return CompletedWork() if async_op else output
        dist = dist_module()
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch >= 2.13's name
        self._native("allgather", nbytes(out), lambda: gather(to_torch(out), to_torch(inp), group=self._pg(group)))
        return CompletedWork() if async_op else output

    def reduce_scatter_tensor(self, output, input, op="sum", group=None, algo="auto", async_op=False):
        out, inp = self._buf(output), self._buf(input)
        if self._alone(group):
            out[:] = inp
            return CompletedWork() if async_op else output
        op = canonical_redop(op)
        dist = dist_module()
        # gloo has no reduce_scatter_tensor; all-reduce then keep our block (what torch users do on gloo)
        me = self.get_rank(group)

        def call():
            work = copy_of(inp)
            dist.all_reduce(to_torch(work), op=getattr(dist.ReduceOp, _NATIVE_OPS[op]), group=self._pg(group))
            out[:] = work[me * len(out) : (me + 1) * len(out)]
            if op == "avg":
                out[:] /= self.get_world_size(group)

        self._native("reduce_scatter", nbytes(inp), call)
        return CompletedWork() if async_op else output

    def all_to_all_single(
        self, output, input, output_split_sizes=None, input_split_sizes=None, group=None, algo="auto", async_op=False
    ):
        out, inp = self._buf(output), self._buf(input)
        if self._alone(group):
            out[:] = inp
            return CompletedWork() if async_op else output
        self._native(
            "alltoall",
            nbytes(inp),
            lambda: dist_module().all_to_all_single(
                to_torch(out), to_torch(inp), output_split_sizes, input_split_sizes, group=self._pg(group)
            ),
        )
        return CompletedWork() if async_op else output

    def barrier(self, group=None):
        if self._alone(group):
            return
        self._native("barrier", 0, lambda: dist_module().barrier(group=self._pg(group)))
