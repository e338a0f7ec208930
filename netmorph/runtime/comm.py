"""The process-group API model code calls: ``comm.all_reduce(t, group=...)``, run from netmorph schedules.

Stands in for ``torch.distributed`` (``ProcessGroup``, ``all_reduce``,
``all_gather_into_tensor``, ``reduce_scatter_tensor``, ``broadcast``, ``reduce``,
``all_to_all_single``, ``barrier``) with the same argument order, on numpy arrays
and CPU torch tensors (a torch tensor is viewed as numpy, no copy). Each
collective names its schedule (:class:`~netmorph.runtime.interpreter.Call`) and
the interpreter runs this rank's part of it on the transport, so what runs is
exactly what was counted and timed. ``algo="auto"`` asks the cost model's tuner
(:func:`netmorph.cost.tuner.auto_algo`), as NCCL's tuner picks ring or tree.

On the torch backend a tensor on a device (CUDA) is used where it lives: the
schedule's segments are views of it, NCCL moves them and torch reduces them on
the device (``comm.keep_tensors = True`` sends CPU tensors the same way, with
gloo, which is how that path is tested without a GPU).

Half precision: float16 and bfloat16 (ml_dtypes' numpy type on the local
fabric) travel in their own type and are reduced at every hop as NCCL does: the
two operands added in float32 and the sum rounded once to the type -- so a
ring's partial sums are rounded p-1 times, and where the order of additions
cannot matter (two ranks, or sums the type holds exactly) the result is gloo's
bit for bit. netmorph does not widen to float32 because the bytes on the wire are
the point of the exercise; widen the tensor yourself (or all-reduce float32
gradients, as mixed-precision trainers do) when the rounding matters.

Ranks, groups, phases, point-to-point and registered memory live in
:class:`~netmorph.runtime.base.CommBase`.
"""

from __future__ import annotations

import numpy as np

from netmorph.collectives import check_algo
from netmorph.cost.topology import PRESETS, Topology
from netmorph.cost.tuner import auto_algo
from netmorph.errors import UsageError
from netmorph.runtime.base import CommBase, CompletedWork, Group, ReduceOp, canonical_redop
from netmorph.runtime.buffers import as_array, copy_of, empty_like, is_float, same_memory
from netmorph.runtime.interpreter import Call, interpret, program
from netmorph.runtime.transport import fingerprint
from netmorph.schedule import REDOPS

__all__ = ["Comm", "Group", "ReduceOp", "as_array"]


class Comm(CommBase):
    """One rank's communicator over a transport (local shared memory or torch.distributed point-to-point).

    ``tuner_topology``: the :class:`~netmorph.cost.topology.Topology` ``algo="auto"`` tunes for.
    """

    def __init__(
        self,
        transport,
        rank: int,
        world: int,
        faults=(),
        tuner_topology: Topology | None = None,
        fingerprints: bool = True,
    ):
        super().__init__(transport, rank, world, faults, fingerprints)
        self.tuner_topology = tuner_topology or PRESETS["local-shm"]

    def _algo(self, op, algo, p, nbytes, itemsize) -> str:
        if algo in (None, "auto"):
            return auto_algo(op, p, nbytes, itemsize, self.tuner_topology)
        return check_algo(op, algo, also=("auto",))

    def _run(
        self, op, algo, g: Group, count, like, regions, redop="sum", root=0, splits=None, uneven=False, in_place=True
    ):
        """Run collective ``op`` on ``regions`` (arrays or tensors like ``like``: its dtype and itemsize);
        ``in_place=False``: the schedule's out-of-place case, its send buffer the region after the workspace.
        Over the node's own group where ``g`` is node-mates (a cluster's), its failure held otherwise
        (:meth:`_held`)."""
        over = self._over(g.ranks)
        return self._held(
            over, lambda: self._schedule(over, op, algo, g, count, like, regions, redop, root, splits, uneven, in_place)
        )

    def _schedule(self, over, op, algo, g: Group, count, like, regions, redop, root, splits, uneven, in_place):
        seq = self._begin(over)
        itemsize, arr_dtype = like.itemsize, like.dtype
        call = Call(
            op,
            self._algo(op, algo, g.size(), count * itemsize, itemsize),
            g.size(),
            count,
            itemsize,
            root,
            splits,
            in_place=in_place,
        )
        # the fingerprint says avg (a rank dividing by p must not meet one that does not); the wire sums
        fp = self._collective_fp(op, call.algo, g, fingerprint.UNEVEN if uneven else count, arr_dtype, root, redop)
        ufunc = REDOPS["sum" if redop == "avg" else redop]
        interpret(
            over,
            self.ledger,
            call,
            g.ranks,
            g.index[self.rank],
            regions,
            ufunc,
            seq,
            self.current_phase,
            fp,
            self.peers,
        )
        return call.algo

    # ------------------------------------------------------------ collectives
    def all_reduce(self, tensor, op="sum", group: Group | None = None, algo: str = "auto", async_op: bool = False):
        """In place, like ``torch.distributed.all_reduce``. Returns the tensor, or with ``async_op``
        a completed work handle."""
        a = self._buf(tensor)
        g = self._group(group)
        op = _redop(op, a)
        if g.size() > 1:
            self._run("allreduce", algo, g, len(a), a, [(0, a)], op)
            if op == "avg":
                a /= g.size()
        return CompletedWork() if async_op else tensor

    def reduce(
        self, tensor, dst: int, op="sum", group: Group | None = None, algo: str = "auto", async_op: bool = False
    ):
        """Only ``dst`` (a global rank) gets the result; other ranks' tensors are left unchanged."""
        a = self._buf(tensor)
        g = self._group(group)
        op = _redop(op, a)
        if g.size() > 1:
            root = g.index[dst]
            work = a if self.rank == dst else copy_of(a)
            self._run("reduce", algo, g, len(a), a, [(0, work)], op, root=root)
            if op == "avg" and self.rank == dst:
                a /= g.size()
        return CompletedWork() if async_op else tensor

    def broadcast(self, tensor, src: int, group: Group | None = None, algo: str = "auto", async_op: bool = False):
        a = self._buf(tensor)
        g = self._group(group)
        if g.size() > 1:
            self._run("broadcast", algo, g, len(a), a, [(0, a)], root=g.index[src])
        return CompletedWork() if async_op else tensor

    # ------------------------------------------------------------ out of place: the schedule's own case
    def all_reduce_into_tensor(
        self, output, input, op="sum", group: Group | None = None, algo: str = "auto", async_op: bool = False
    ):
        """Out of place, as ``ncclAllReduce(sendbuff=input, recvbuff=output, ...)``: the schedule's first
        round reads ``input`` and writes ``output`` (:func:`netmorph.schedule.out_of_place`), so no copy
        runs in front of it; ``input`` is only read. (torch's ``all_reduce`` is in place, and so is ours.)"""
        out, inp = self._pair(output, input, "all_reduce_into_tensor")
        g = self._group(group)
        op = _redop(op, out)
        if g.size() == 1 or same_memory(out, inp) or not len(out):
            self._fill(out, inp)
            return self.all_reduce(output, op, group, algo, async_op)
        self._run("allreduce", algo, g, len(out), out, [(0, out), (len(out), inp)], op, in_place=False)
        if op == "avg":
            out /= g.size()
        return CompletedWork() if async_op else output

    def reduce_into_tensor(
        self, output, input, dst: int, op="sum", group: Group | None = None, algo: str = "auto", async_op: bool = False
    ):
        """Out of place, as ``ncclReduce(sendbuff=input, recvbuff=output, ..., root=dst)``: ``dst``'s output
        gets the reduction, the others' outputs stay as they were (NCCL uses recvbuff on the root only)."""
        out, inp = self._pair(output, input, "reduce_into_tensor")
        g = self._group(group)
        op = _redop(op, out)
        if g.size() == 1 or same_memory(out, inp) or not len(out):
            return super().reduce_into_tensor(output, input, dst, op, group, algo, async_op)
        work = out if self.rank == dst else empty_like(out, len(out))  # a non-root's partial sums
        self._run("reduce", algo, g, len(out), out, [(0, work), (len(out), inp)], op, root=g.index[dst], in_place=False)
        if op == "avg" and self.rank == dst:
            out /= g.size()
        return CompletedWork() if async_op else output

    def broadcast_into_tensor(
        self, output, input, src: int, group: Group | None = None, algo: str = "auto", async_op: bool = False
    ):
        """Out of place, as ``ncclBroadcast(sendbuff=input, recvbuff=output, ..., root=src)``: the root
        sends from ``input`` (and copies it into its own output, as NCCL's root does); the others may pass
        None for ``input``."""
        root = self.rank == src
        out, inp = self._pair(output, input, "broadcast_into_tensor", optional=not root)
        g = self._group(group)
        if g.size() == 1 or (root and same_memory(out, inp)) or not len(out):
            return super().broadcast_into_tensor(output, input, src, group, algo, async_op)
        self._run(
            "broadcast",
            algo,
            g,
            len(out),
            out,
            [(0, out)] + ([(len(out), inp)] if root else []),
            root=g.index[src],
            in_place=False,
        )
        return CompletedWork() if async_op else output

    def all_gather_into_tensor(
        self, output, input, group: Group | None = None, algo: str = "auto", async_op: bool = False
    ):
        """``output`` (p·n elements) gets every rank's ``input`` (n elements) in rank order."""
        out, inp = self._buf(output), self._buf(input)
        g = self._group(group)
        p, me = g.size(), g.index[self.rank]
        if len(out) != p * len(inp):
            raise UsageError(
                f"all_gather: {{output}} has {len(out)} elements, need world*input = {p * len(inp)}", "output"
            )
        n = len(inp)
        out[me * n : (me + 1) * n] = inp
        if p > 1:
            self._run("allgather", algo, g, len(out), out, [(0, out)])
        return CompletedWork() if async_op else output

    def all_gather(self, tensor_list, tensor, group: Group | None = None, algo: str = "auto"):
        """List form: ``tensor_list[i]`` gets rank i's ``tensor``."""
        inp = self._buf(tensor)
        flat = empty_like(inp, len(tensor_list) * len(inp))
        self.all_gather_into_tensor(flat, inp, group, algo)
        for i, t in enumerate(tensor_list):
            self._buf(t)[:] = flat[i * len(inp) : (i + 1) * len(inp)]
        return tensor_list

    def reduce_scatter_tensor(
        self, output, input, op="sum", group: Group | None = None, algo: str = "auto", async_op: bool = False
    ):
        """``output`` (n elements) gets block ``rank`` of the reduction of every ``input`` (p·n)."""
        out, inp = self._buf(output), self._buf(input)
        g = self._group(group)
        op = _redop(op, out)
        p, me = g.size(), g.index[self.rank]
        if len(inp) != p * len(out):
            raise UsageError(
                f"reduce_scatter: {{input}} has {len(inp)} elements, need world*output = {p * len(out)}", "input"
            )
        if p == 1:
            out[:] = inp
            return CompletedWork() if async_op else output
        work = copy_of(inp)  # the schedule reduces in place; the caller's input stays intact
        self._run("reduce_scatter", algo, g, len(work), work, [(0, work)], op)
        n = len(out)
        out[:] = work[me * n : (me + 1) * n]
        if op == "avg":
            out /= p
        return CompletedWork() if async_op else output

    def all_to_all_single(
        self,
        output,
        input,
        output_split_sizes=None,
        input_split_sizes=None,
        group: Group | None = None,
        algo: str = "auto",
        async_op: bool = False,
    ):
        """``torch.distributed.all_to_all_single``: block i of ``input`` goes to rank i.

        Split sizes are element counts along the flat tensor; every rank must pass
        consistent ones (rank s's input split for d equals rank d's output split for s).
        """
        out, inp = self._buf(output), self._buf(input)
        g = self._group(group)
        p, me = g.size(), g.index[self.rank]
        ins = _splits(input_split_sizes, len(inp), p, "input_split_sizes")
        outs = _splits(output_split_sizes, len(out), p, "output_split_sizes")
        algo = self._algo("alltoall", algo, p, len(inp) * out.itemsize, out.itemsize)
        table = np.zeros((p, p), dtype=np.int64)
        table[me], table[:, me] = ins, outs
        uneven = input_split_sizes is not None or output_split_sizes is not None
        if algo == "bruck" and uneven:
            # Bruck forwards other ranks' blocks, so every rank needs the whole matrix: the split
            # vectors travel first (Megatron's MoEAlltoAllTokenDispatcher likewise exchanges token
            # counts before the tokens). Direct algorithms need only this rank's row and column.
            self.all_gather_into_tensor(table.reshape(-1), ins.copy(), group=g, algo="bruck")
            if not np.array_equal(table[:, me], outs):
                raise UsageError(
                    f"all_to_all_single: rank {self.rank} expects {outs.tolist()} elements from "
                    f"each rank but they send {table[:, me].tolist()}",
                    "output_split_sizes",
                )
        elif not uneven:
            table[:] = ins[0]
        send_total = int(table[me].sum())
        splits = tuple(table.reshape(-1).tolist())
        regions = [(0, inp), (send_total, out)]
        if algo == "bruck":  # forwarded blocks rest in a scratch region sized by the schedule
            s, _ = program(Call("alltoall", "bruck", p, len(inp), out.itemsize, 0, splits), me)
            regions.append((send_total + len(out), empty_like(out, int(s.buf_len[me]) - send_total - len(out))))
        self._run("alltoall", algo, g, len(inp), out, regions, splits=splits, uneven=uneven)
        return CompletedWork() if async_op else output

    def barrier(self, group: Group | None = None) -> None:
        """A 1-element recursive-doubling all-reduce (log2 p rounds)."""
        self.all_reduce(np.zeros(1, dtype=np.int32), group=group, algo="recursive_doubling")


def _redop(op, a: np.ndarray) -> str:
    op = canonical_redop(op)
    if op == "avg" and not is_float(a):
        raise UsageError(f"{{op}} AVG needs a floating-point tensor, got {a.dtype}", "op")
    return op


def _splits(sizes, n, p, name):
    if sizes is None:
        if n % p:
            raise UsageError(
                f"all_to_all_single: {n} elements do not split evenly over {p} ranks; pass {{{name}}}", name
            )
        return np.full(p, n // p, dtype=np.int64)
    sizes = np.asarray(list(sizes), dtype=np.int64)
    if len(sizes) != p or (sizes < 0).any() or sizes.sum() != n:
        raise UsageError(f"all_to_all_single: {{{name}}} must be {p} non-negative counts summing to {n}", name)
    return sizes
