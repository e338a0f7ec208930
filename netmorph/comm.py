"""The process-group API model code calls: ``comm.all_reduce(t, group=...)``.

Stands in for ``torch.distributed`` (``ProcessGroup``, ``new_group``,
``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``,
``broadcast``, ``reduce``, ``all_to_all_single``, ``send/recv/isend/irecv``,
``barrier``) with the same argument order, on numpy arrays and CPU torch tensors
(a torch tensor is viewed as numpy, no copy). Each collective builds (and
caches) the netmorph schedule of the chosen algorithm and runs this rank's part
of it on the transport, so what runs is exactly what was counted and timed.

A ``Comm`` is an object passed to the rank's function; groups are objects too
(no globals). ``with comm.phase("dp.grad"):`` tags every message in the ledger.
"""

from __future__ import annotations

import bisect
import os
import signal
import time
from contextlib import contextmanager
from functools import lru_cache

import numpy as np

from netmorph.collectives import ALGORITHMS
from netmorph.errors import UsageError
from netmorph.fabric.execute import REDOPS
from netmorph.fabric.ledger import Ledger
from netmorph.fabric.program import cached_program


class Group:
    """An ordered set of global ranks; schedule rank i runs on ``ranks[i]``."""

    def __init__(self, ranks):
        self.ranks = tuple(int(r) for r in ranks)
        self.index = {r: i for i, r in enumerate(self.ranks)}

    def size(self) -> int:
        return len(self.ranks)

    def __repr__(self):
        return f"Group({list(self.ranks)})"


def as_array(t) -> np.ndarray:
    """A numpy view of a numpy array or CPU torch tensor (no copy)."""
    if isinstance(t, np.ndarray):
        arr = t
    elif hasattr(t, "numpy") and hasattr(t, "is_contiguous"):
        if t.device.type != "cpu":
            raise UsageError("the local fabric works on CPU tensors; use backend='torch' (NCCL) for GPU tensors")
        if not t.is_contiguous():
            raise UsageError("tensor must be contiguous (call .contiguous() first)")
        arr = t.detach().numpy()
    else:
        raise UsageError(f"expected a numpy array or torch tensor, got {type(t).__name__}")
    if not arr.flags.c_contiguous:
        raise UsageError("array must be C-contiguous (use np.ascontiguousarray)")
    return arr.reshape(-1)


class _Workspace:
    """The schedule's flat workspace as regions of real arrays (user buffers used in place)."""

    def __init__(self, regions):
        self.starts = [s for s, _ in regions]
        self.arrays = [a for _, a in regions]

    def view(self, off: int, n: int) -> np.ndarray:
        i = bisect.bisect_right(self.starts, off) - 1
        a = self.arrays[i]
        lo = off - self.starts[i]
        if lo + n > len(a):
            raise AssertionError("segment crosses a workspace region")
        return a[lo:lo + n]


@lru_cache(maxsize=512)
def _auto(op: str, p: int, nbytes: int, itemsize: int, topo_name: str) -> str:
    from netmorph.cost.topology import PRESETS
    from netmorph.cost.tuner import choose
    return choose(op, p, nbytes, PRESETS[topo_name], itemsize).best.algo


class Comm:
    """One rank's communicator over a transport (local shared memory or torch.distributed)."""

    def __init__(self, transport, rank: int, world: int, faults=(), tuner_topology: str = "local-shm"):
        self.transport = transport
        self.rank, self.world = rank, world
        self.WORLD = Group(range(world))
        self.ledger = Ledger(rank)
        self._phase = ""
        self._ops = 0
        self._faults = [f for f in faults if f.rank == rank]
        self.tuner_topology = tuner_topology

    # torch.distributed spellings
    def get_rank(self, group: Group | None = None) -> int:
        return self.rank if group is None else group.index[self.rank]

    def get_world_size(self, group: Group | None = None) -> int:
        return self.world if group is None else group.size()

    def new_group(self, ranks) -> Group:
        ranks = list(ranks)
        bad = [r for r in ranks if not 0 <= r < self.world]
        if bad or len(set(ranks)) != len(ranks):
            raise UsageError(f"new_group: ranks must be distinct members of 0..{self.world - 1}, got {ranks}")
        return Group(ranks)

    def alloc(self, shape, dtype=np.float32) -> np.ndarray:
        """A zeroed array in registered memory (NCCL's ``ncclMemAlloc`` + ``ncclCommRegister``).

        On the local fabric peers read such buffers in place, so a collective on them
        moves each byte once instead of through the channel slots. Elsewhere it is
        plain memory. Wrap with ``torch.from_numpy`` for a tensor. Released together by
        :meth:`free_all` (the arena is a bump allocator: allocate long-lived buffers).
        """
        dtype = np.dtype(dtype)
        n = int(np.prod(shape)) if np.ndim(shape) else int(shape)
        if not hasattr(self.transport, "alloc"):
            return np.zeros(shape, dtype)
        raw = self.transport.alloc(n * dtype.itemsize)
        raw[:] = 0
        return raw.view(dtype).reshape(shape)

    def free_all(self) -> None:
        if hasattr(self.transport, "free_all"):
            self.transport.free_all()

    @contextmanager
    def phase(self, tag: str):
        """Tag every message sent inside the block (e.g. ``"dp.grad"``, ``"tp.fwd"``)."""
        old, self._phase = self._phase, tag
        try:
            yield
        finally:
            self._phase = old

    # ------------------------------------------------------------ internals
    def _begin(self) -> int:
        self._ops += 1
        for f in self._faults:
            f.trigger(self._ops)
        return self._ops

    def _group(self, group):
        g = group or self.WORLD
        if self.rank not in g.index:
            raise UsageError(f"rank {self.rank} is not a member of {g}")
        return g

    def _algo(self, op, algo, p, nbytes, itemsize):
        if algo in (None, "auto"):
            return _auto(op, p, nbytes, itemsize, self.tuner_topology)
        name = algo.lower().replace("-", "_")
        if name not in ALGORITHMS[op]:
            raise UsageError(f"algo: {op} has no algorithm {algo!r}; choose one of {', '.join(ALGORITHMS[op])}")
        return name

    def _run(self, op, algo, g: Group, count, arr_dtype, regions, redop="sum", root=0, splits=None, options=()):
        seq = self._begin()
        p = g.size()
        itemsize = np.dtype(arr_dtype).itemsize
        if redop not in REDOPS:
            raise UsageError(f"op must be one of {', '.join(REDOPS)}, got {redop!r}")
        algo = self._algo(op, algo, p, count * itemsize, itemsize)
        key = (op, algo, p, count, itemsize, root, splits, tuple(options))
        _, prog = cached_program(key, g.index[self.rank])
        ws = _Workspace(regions)
        ufunc = REDOPS[redop]
        led = self.ledger
        for rr in prog:
            sends = [(g.ranks[m.peer], [ws.view(o, n) for o, n in zip(m.offs.tolist(), m.lens.tolist())])
                     for m in rr.sends]
            recvs = [(g.ranks[m.peer], [ws.view(o, n) for o, n in zip(m.offs.tolist(), m.lens.tolist())],
                      m.reduce.tolist()) for m in rr.recvs]
            t0 = time.perf_counter()
            self.transport.run_round(sends, recvs, ufunc, rr.overlap)
            t1 = time.perf_counter()
            for m in rr.sends:
                led.add(self.rank, g.ranks[m.peer], m.elems * itemsize, seq, rr.index, self._phase, op, algo, t0, t1)
            for so, do, n in rr.local:
                ws.view(do, n)[:] = ws.view(so, n)
        return algo

    # ------------------------------------------------------------ collectives
    def all_reduce(self, tensor, op: str = "sum", group: Group | None = None, algo: str = "auto"):
        """In place, like ``torch.distributed.all_reduce``. Returns the tensor."""
        a = as_array(tensor)
        g = self._group(group)
        if g.size() > 1:
            self._run("allreduce", algo, g, len(a), a.dtype, [(0, a)], op)
        return tensor

    def reduce(self, tensor, dst: int, op: str = "sum", group: Group | None = None, algo: str = "auto"):
        """Only ``dst`` (a global rank) gets the result; other ranks' tensors are left unchanged."""
        a = as_array(tensor)
        g = self._group(group)
        if g.size() > 1:
            root = g.index[dst]
            work = a if self.rank == dst else a.copy()
            self._run("reduce", algo, g, len(a), a.dtype, [(0, work)], op, root=root)
        return tensor

    def broadcast(self, tensor, src: int, group: Group | None = None, algo: str = "auto"):
        a = as_array(tensor)
        g = self._group(group)
        if g.size() > 1:
            self._run("broadcast", algo, g, len(a), a.dtype, [(0, a)], root=g.index[src])
        return tensor

    def all_gather_into_tensor(self, output, input, group: Group | None = None, algo: str = "auto"):
        """``output`` (p·n elements) gets every rank's ``input`` (n elements) in rank order."""
        out, inp = as_array(output), as_array(input)
        g = self._group(group)
        p, me = g.size(), g.index[self.rank]
        if len(out) != p * len(inp):
            raise UsageError(f"all_gather: output has {len(out)} elements, need world*input = {p * len(inp)}")
        n = len(inp)
        out[me * n:(me + 1) * n] = inp
        if p > 1:
            self._run("allgather", algo, g, len(out), out.dtype, [(0, out)])
        return output

    def all_gather(self, tensor_list, tensor, group: Group | None = None, algo: str = "auto"):
        """List form: ``tensor_list[i]`` gets rank i's ``tensor``."""
        inp = as_array(tensor)
        flat = np.empty(len(tensor_list) * len(inp), dtype=inp.dtype)
        self.all_gather_into_tensor(flat, inp, group, algo)
        for i, t in enumerate(tensor_list):
            as_array(t)[:] = flat[i * len(inp):(i + 1) * len(inp)]
        return tensor_list

    def reduce_scatter_tensor(self, output, input, op: str = "sum", group: Group | None = None,
                              algo: str = "auto"):
        """``output`` (n elements) gets block ``rank`` of the reduction of every ``input`` (p·n)."""
        out, inp = as_array(output), as_array(input)
        g = self._group(group)
        p, me = g.size(), g.index[self.rank]
        if len(inp) != p * len(out):
            raise UsageError(f"reduce_scatter: input has {len(inp)} elements, need world*output = {p * len(out)}")
        if p == 1:
            out[:] = inp
            return output
        work = inp.copy()          # the schedule reduces in place; the caller's input stays intact
        self._run("reduce_scatter", algo, g, len(work), work.dtype, [(0, work)], op)
        n = len(out)
        out[:] = work[me * n:(me + 1) * n]
        return output

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                          group: Group | None = None, algo: str = "auto"):
        """``torch.distributed.all_to_all_single``: block i of ``input`` goes to rank i.

        Split sizes are element counts along the flat tensor; every rank must pass
        consistent ones (rank s's input split for d equals rank d's output split for s).
        """
        out, inp = as_array(output), as_array(input)
        g = self._group(group)
        p, me = g.size(), g.index[self.rank]
        ins = self._splits(input_split_sizes, len(inp), p, "input_split_sizes")
        outs = self._splits(output_split_sizes, len(out), p, "output_split_sizes")
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
                raise UsageError(f"all_to_all_single: rank {self.rank} expects {outs.tolist()} elements from "
                                 f"each rank but they send {table[:, me].tolist()}")
        elif not uneven:
            table[:] = ins[0]
        send_total = int(table[me].sum())
        splits = tuple(table.reshape(-1).tolist())
        regions = [(0, inp), (send_total, out)]
        if algo == "bruck":     # forwarded blocks rest in a scratch region sized by the schedule
            s, _ = cached_program(("alltoall", "bruck", p, len(inp), out.itemsize, 0, splits, ()), me)
            regions.append((send_total + len(out), np.empty(int(s.buf_len[me]) - send_total - len(out), out.dtype)))
        self._run("alltoall", algo, g, len(inp), out.dtype, regions, splits=splits)
        return output

    @staticmethod
    def _splits(sizes, n, p, name):
        if sizes is None:
            if n % p:
                raise UsageError(f"all_to_all_single: {n} elements do not split evenly over {p} ranks; pass {name}")
            return np.full(p, n // p, dtype=np.int64)
        sizes = np.asarray(list(sizes), dtype=np.int64)
        if len(sizes) != p or (sizes < 0).any() or sizes.sum() != n:
            raise UsageError(f"all_to_all_single: {name} must be {p} non-negative counts summing to {n}")
        return sizes

    def barrier(self, group: Group | None = None) -> None:
        """Dissemination-free barrier: a 1-element recursive-doubling all-reduce (log2 p rounds)."""
        self.all_reduce(np.zeros(1, dtype=np.int32), group=group, algo="recursive_doubling")

    # ------------------------------------------------------------ point to point
    def send(self, tensor, dst: int) -> None:
        self.isend(tensor, dst).wait()

    def recv(self, tensor, src: int) -> None:
        self.irecv(tensor, src).wait()

    def isend(self, tensor, dst: int):
        seq = self._begin()
        a = as_array(tensor)
        self._peer(dst)
        t = time.perf_counter()
        self.ledger.add(self.rank, dst, a.nbytes, seq, 0, self._phase, "send", "p2p", t, t)
        return self.transport.isend(a, dst)

    def irecv(self, tensor, src: int):
        self._begin()
        a = as_array(tensor)
        self._peer(src)
        return self.transport.irecv(a, src)

    def recv_any(self, tensor, srcs=None) -> int:
        """Receive from any of ``srcs`` (default: every other rank); returns the sender (MPI_ANY_SOURCE)."""
        self._begin()
        a = as_array(tensor)
        srcs = [r for r in (range(self.world) if srcs is None else srcs) if r != self.rank]
        return self.transport.recv_any(a, srcs)

    def shared(self, shape, dtype=np.float64) -> np.ndarray:
        """One array every rank maps (call on all ranks, same order): Hogwild's parameter vector.

        Only the local fabric has memory all ranks share; elsewhere this raises.
        """
        if not hasattr(self.transport, "shared"):
            raise UsageError("shared memory arrays need the local fabric (backend='local')")
        dtype = np.dtype(dtype)
        n = int(np.prod(shape))
        return self.transport.shared(n * dtype.itemsize).view(dtype).reshape(shape)

    def _peer(self, r):
        if not 0 <= r < self.world or r == self.rank:
            raise UsageError(f"peer must be another rank in 0..{self.world - 1}, got {r}")


class Fault:
    """Fault injection: ``Fault("kill", rank=1, at_op=3)`` SIGKILLs rank 1 as it starts its 3rd
    communication call; ``Fault("hang", ...)`` makes it stop answering (sleeps forever);
    ``Fault("raise", ...)`` raises an exception there; ``Fault("delay", ..., seconds=0.5)`` stalls
    it once (a straggler)."""

    KINDS = ("kill", "hang", "raise", "delay")

    def __init__(self, kind: str, rank: int, at_op: int = 1, seconds: float = 0.0):
        if kind not in self.KINDS:
            raise UsageError(f"fault kind must be one of {', '.join(self.KINDS)}, got {kind!r}")
        self.kind, self.rank, self.at_op, self.seconds = kind, rank, at_op, seconds

    def trigger(self, op_number: int) -> None:
        if op_number != self.at_op:
            return
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.kind == "hang":
            while True:
                time.sleep(3600)
        elif self.kind == "raise":
            raise RuntimeError(f"injected fault on rank {self.rank} at op {op_number}")
        elif self.kind == "delay":
            time.sleep(self.seconds)

    def __repr__(self):
        return f"Fault({self.kind!r}, rank={self.rank}, at_op={self.at_op})"


