"""torch.distributed's own collectives behind netmorph's communicator API (``backend="torch-native"``).

``dist.all_reduce``, ``dist.broadcast``, ``dist.all_gather_into_tensor``,
``dist.all_to_all_single`` ... called directly: what the schedule-driven
:class:`~netmorph.runtime.comm.Comm` is measured against (gloo here, NCCL on GPUs).
Only the collectives differ; ranks, groups, phases and point-to-point are the
shared :class:`~netmorph.runtime.base.CommBase`. The ledger records one entry per
call (``dst`` -1: torch does not say who sent what). torch's collectives carry no
netmorph fingerprint (point-to-point does); torch's own cross-rank check of the
calls is ``TORCH_DISTRIBUTED_DEBUG=DETAIL``.

Two kinds of group run them. Under torchrun (or a local launch) they are ``torch.distributed``'s registered
groups: the default one and ``dist.new_group``'s, called through ``dist.all_reduce(..., group=...)`` with global
ranks. On a cluster whose membership changes (:mod:`netmorph.elastic.cluster`) there is no default group: each
membership epoch's own (:class:`~netmorph.runtime.transport.torchgroup.EpochGroup`, re-formed by ``comm.reform``)
and the subgroups it carves out are ``ProcessGroup`` objects c10d never registered, called through their own
methods with group-local roots -- what torchft's Manager does with the process group it re-configures per quorum.
"""

from __future__ import annotations

import time

from netmorph.runtime.base import CommBase, CompletedWork, canonical_redop
from netmorph.runtime.buffers import copy_of
from netmorph.runtime.transport import nbytes
from netmorph.runtime.transport.tensors import dist_module, to_torch

_NATIVE_OPS = {"sum": "SUM", "avg": "SUM", "prod": "PRODUCT", "max": "MAX", "min": "MIN"}  # gloo has no AVG


class _Registered:
    """``torch.distributed``'s functions on a group c10d knows (None: the default), roots as global ranks."""

    def __init__(self, pg):
        self.pg, self.dist = pg, dist_module()

    def _op(self, op):
        return getattr(self.dist.ReduceOp, _NATIVE_OPS[op])

    def all_reduce(self, t, op):
        self.dist.all_reduce(t, op=self._op(op), group=self.pg)

    def broadcast(self, t, src):
        self.dist.broadcast(t, src, group=self.pg)

    def reduce(self, t, dst, op):
        self.dist.reduce(t, dst, op=self._op(op), group=self.pg)

    def all_gather(self, out, inp):
        gather = getattr(self.dist, "all_gather_single", None) or self.dist.all_gather_into_tensor  # torch >= 2.13
        gather(out, inp, group=self.pg)

    def all_to_all(self, out, inp, out_splits, in_splits):
        self.dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.pg)

    def barrier(self):
        self.dist.barrier(group=self.pg)


class _Unregistered(_Registered):
    """A membership epoch's ``ProcessGroup`` (or a subgroup of it), which c10d never registered: its own methods,
    roots as ranks of the group (``index``: global rank -> group rank)."""

    def __init__(self, pg, index):
        super().__init__(pg)
        self.index = index

    def all_reduce(self, t, op):
        opts = self.dist.AllreduceOptions()
        opts.reduceOp = self._op(op)
        self.pg.allreduce([t], opts).wait()

    def broadcast(self, t, src):
        opts = self.dist.BroadcastOptions()
        opts.rootRank = self.index[src]
        self.pg.broadcast([t], opts).wait()

    def reduce(self, t, dst, op):
        opts = self.dist.ReduceOptions()
        opts.rootRank, opts.reduceOp = self.index[dst], self._op(op)
        self.pg.reduce([t], opts).wait()

    def all_gather(self, out, inp):
        self.pg._allgather_base(out, inp).wait()

    def all_to_all(self, out, inp, out_splits, in_splits):
        self.pg.alltoall_base(out, inp, out_splits or [], in_splits or [], self.dist.AllToAllOptions()).wait()

    def barrier(self):
        self.pg.barrier().wait()


class NativeComm(CommBase):
    """``torch.distributed``'s own collectives behind the same API (``backend="torch-native"``)."""

    def _native(self, name, nbytes, call, group):
        """``call()`` on ``group``: over the node's own group where it is node-mates (a cluster's), its failure
        held otherwise (:meth:`_held`); one ledger entry."""
        over = self._over((group or self.WORLD).ranks)

        def run():
            seq = self._begin(over)
            t0 = time.perf_counter()
            over.guard(-1, call)  # torch does not say which peer failed a collective
            self.ledger.add(
                self.rank, -1, nbytes, seq, 0, self.current_phase, name, "torch-native", t0, time.perf_counter()
            )

        self._held(over, run)

    def _epoch(self, over=None):
        """The group a transport (``over``, default the epoch's) talks over where it is a membership epoch's or a
        node's (a cluster's), or None (torch's default)."""
        group = getattr(self.transport if over is None else over, "group", None)
        return group if hasattr(group, "process_group") else None

    def new_group(self, ranks):
        """``dist.new_group``: collective over the whole world -- every rank creates every group, in the same
        order, members or not. In a membership epoch, nothing yet: its members build it at its first call."""
        g = super().new_group(ranks)
        if self._epoch() is None:
            g.pg = dist_module().new_group(list(g.ranks))
        return g

    def _on(self, group, tensor):
        """What runs a collective on ``group`` (None: the world) for ``tensor``."""
        g = group or self.WORLD
        epoch = self._epoch(self._over(g.ranks))
        if epoch is None:
            return _Registered(None if group is None else group.pg)
        ranks = tuple(epoch.route[self.wire(r)] for r in g.ranks)  # the group's numbering (the view's, the node's)
        return _Unregistered(epoch.process_group(ranks, cuda=tensor.device.type == "cuda"), g.index)

    @staticmethod
    def _alone(group) -> bool:
        """A 1-rank group (a mesh dimension of size 1) has no process group: its collectives are the identity."""
        return group is not None and group.size() == 1

    def all_reduce(self, tensor, op="sum", group=None, algo="auto", async_op=False):
        a = self._buf(tensor)
        op = canonical_redop(op)
        if self._alone(group):
            return CompletedWork() if async_op else tensor
        t = to_torch(a)
        self._native("allreduce", nbytes(a), lambda: self._on(group, t).all_reduce(t, op), group)
        if op == "avg":
            a /= self.get_world_size(group)
        return CompletedWork() if async_op else tensor

    def broadcast(self, tensor, src, group=None, algo="auto", async_op=False):
        a = self._buf(tensor)
        if self._alone(group):
            return CompletedWork() if async_op else tensor
        t = to_torch(a)
        self._native("broadcast", nbytes(a), lambda: self._on(group, t).broadcast(t, src), group)
        return CompletedWork() if async_op else tensor

    def reduce(self, tensor, dst, op="sum", group=None, algo="auto", async_op=False):
        """Only ``dst`` gets the result; the others' tensors stay as they were (gloo's reduce
        scribbles partial sums into them, so they hand torch a copy) -- the contract of the
        schedule-driven backends."""
        a = self._buf(tensor)
        op = canonical_redop(op)
        if self._alone(group):
            return CompletedWork() if async_op else tensor
        work = to_torch(a if self.rank == dst else copy_of(a))
        self._native("reduce", nbytes(a), lambda: self._on(group, work).reduce(work, dst, op), group)
        if op == "avg" and self.rank == dst:
            a /= self.get_world_size(group)
        return CompletedWork() if async_op else tensor

    def all_gather_into_tensor(self, output, input, group=None, algo="auto", async_op=False):
        out, inp = self._buf(output), self._buf(input)
        if self._alone(group):
            out[:] = inp
            return CompletedWork() if async_op else output
        o, i = to_torch(out), to_torch(inp)
        self._native("allgather", nbytes(out), lambda: self._on(group, o).all_gather(o, i), group)
        return CompletedWork() if async_op else output

    def reduce_scatter_tensor(self, output, input, op="sum", group=None, algo="auto", async_op=False):
        out, inp = self._buf(output), self._buf(input)
        if self._alone(group):
            out[:] = inp
            return CompletedWork() if async_op else output
        op = canonical_redop(op)
        # gloo has no reduce_scatter_tensor; all-reduce then keep our block (what torch users do on gloo)
        me = self.get_rank(group)

        def call():
            work = copy_of(inp)
            t = to_torch(work)
            self._on(group, t).all_reduce(t, op)
            out[:] = work[me * len(out) : (me + 1) * len(out)]
            if op == "avg":
                out[:] /= self.get_world_size(group)

        self._native("reduce_scatter", nbytes(inp), call, group)
        return CompletedWork() if async_op else output

    def all_to_all_single(
        self, output, input, output_split_sizes=None, input_split_sizes=None, group=None, algo="auto", async_op=False
    ):
        out, inp = self._buf(output), self._buf(input)
        if self._alone(group):
            out[:] = inp
            return CompletedWork() if async_op else output
        o, i = to_torch(out), to_torch(inp)
        self._native(
            "alltoall",
            nbytes(inp),
            lambda: self._on(group, o).all_to_all(o, i, output_split_sizes, input_split_sizes),
            group,
        )
        return CompletedWork() if async_op else output

    def barrier(self, group=None):
        if self._alone(group):
            return
        import torch

        self._native("barrier", 0, lambda: self._on(group, torch.empty(0)).barrier(), group)
