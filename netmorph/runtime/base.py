"""What every communicator shares, whoever runs its collectives: ranks, groups, phases, faults, p2p.

Stands in for the parts of ``torch.distributed`` that are not collectives:
``get_rank``/``get_world_size``, ``new_group`` (a group is an object, never a
global), ``send/recv/isend/irecv``, and NCCL's registered memory
(``ncclMemAlloc``). :class:`~netmorph.runtime.comm.Comm` adds collectives run from
netmorph schedules; :class:`~netmorph.runtime.native.NativeComm` adds
torch.distributed's own. ``with comm.phase("dp.grad"):`` tags every message in
the ledger.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from enum import Enum

import numpy as np

from netmorph.errors import UsageError
from netmorph.runtime.buffers import as_array, empty_like, is_tensor, same_memory
from netmorph.runtime.held import NodeCalls
from netmorph.runtime.ledger import Ledger
from netmorph.runtime.transport import fingerprint, nbytes


class ReduceOp(str, Enum):
    """``torch.distributed.ReduceOp``'s names: every reduction argument also takes these, torch's own
    members (``dist.ReduceOp.SUM``) and the strings ``"sum"``, ``"avg"``, ``"prod"``, ``"min"``, ``"max"``."""

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "prod"
    MIN = "min"
    MAX = "max"


_REDOP_NAMES = {"sum": "sum", "avg": "avg", "prod": "prod", "product": "prod", "min": "min", "max": "max"}


def canonical_redop(op) -> str:
    """``"sum" | "avg" | "prod" | "min" | "max"`` for a string, a :class:`ReduceOp` or torch's ``ReduceOp``."""
    if isinstance(op, ReduceOp):
        return op.value
    name = getattr(op, "name", op)  # torch.distributed.ReduceOp.SUM has .name == "SUM"
    key = str(name).lower()
    if key not in _REDOP_NAMES:
        raise UsageError(
            f"{{op}} must be one of SUM, AVG, PRODUCT, MIN, MAX (or their lower-case names), got {op!r}", "op"
        )
    return _REDOP_NAMES[key]


class CompletedWork:
    """What ``async_op=True`` returns: the collective has already run (netmorph's collectives are
    blocking), so ``wait()`` returns at once -- the handle exists so torch-style code runs unchanged."""

    keep = None

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class Group:
    """An ordered set of global ranks; schedule rank i runs on ``ranks[i]``."""

    def __init__(self, ranks):
        self.ranks = tuple(int(r) for r in ranks)
        self.index = {r: i for i, r in enumerate(self.ranks)}
        self.pg = None  # torch.distributed's ProcessGroup, for the torch-native backend

    def size(self) -> int:
        return len(self.ranks)

    def __repr__(self):
        return f"Group({list(self.ranks)})"


class CommBase(NodeCalls):
    """One rank's communicator over a transport, less the collectives."""

    def __init__(self, transport, rank: int, world: int, faults=(), fingerprints: bool = True):
        self.transport = transport
        self.rank, self.world = rank, world
        self.slot, self.launched = rank, world  # what the launch, the store and the fabric call this process
        self.peers: tuple | None = None  # rank -> slot once a reform renumbered (None: the same)
        self.WORLD = Group(range(world))
        self.fingerprints = fingerprints  # a checked header on every message (fingerprint.py)
        # the transport moves torch tensors where they live (CUDA over NCCL): no numpy round trip
        self.devices = bool(getattr(transport, "devices", False))
        self.keep_tensors = False  # CPU torch tensors take that path too (to test it on CPU)
        self.local_rank = 0  # torchrun's LOCAL_RANK: which GPU of the node is this rank's
        self.device = "cpu"  # where this rank's tensors live (init_from_env sets cuda:N)
        self.store = None  # elastic launches: the job's store (membership views)
        self.ledger = Ledger(rank, header_bytes=fingerprint.HEADER_BYTES if fingerprints else 0)
        self.current_phase = ""
        self.ops = 0  # communication calls started so far
        self.calls: dict[tuple, int] = {}  # group ranks -> collectives on it so far
        self.sent: dict[int, int] = {}  # peer -> point-to-point messages sent to it
        self.received: dict[int, int] = {}  # peer -> point-to-point messages received from it
        self.faults = [f for f in faults if f.rank == rank]
        # a cluster's worker under tensor or pipeline parallelism: its node's own process group, kept across epochs
        # (a transport over a NodeGroup) beside ``transport``, the epoch's; a call whose ranks are all node-mates
        # goes over it, and a call across the nodes that fails is held until the step's vote (should_commit)
        self.node_transport = None
        self.deferred = None  # the PeerLost or PeerTimeout held for the vote (runtime/held.py)

    def reform(self, members, epoch: int, renumber: bool = False) -> None:
        """Elastic: go on with ``members`` (launch slots: an agreed view) on the fresh channels of membership epoch
        ``epoch``; call counting starts over. Without ``renumber`` every rank keeps its launch number and the
        default group becomes the members' (a world with holes, as netmorph elastic's ring runs). With it member
        i of ``members`` (in the given order: a view's) becomes rank i, as NCCL's ``ncclCommShrink`` (2.27: "ranks
        will be re-ordered to fill the gap of removed ones") and ULFM's ``MPIX_Comm_shrink`` number the survivors
        in order, and ``ncclCommGrow`` appends the joiners: ``rank`` and ``world`` are then the new communicator's,
        so that a mesh of ``world`` ranks can be built on any survivors, while ``slot`` stays what the launch, the
        store and the fabric call this process; every peer is addressed by its new number."""
        members = tuple(members)
        self.transport.reform(epoch, members, self.slot)  # torch: a fresh group among them; fabric: its channels
        if renumber:
            if self.slot not in members:
                raise UsageError(f"reform: slot {self.slot} is not among the members {list(members)}", "members")
            self.peers, self.rank, self.world = members, members.index(self.slot), len(members)
            self.WORLD = Group(range(self.world))
        else:
            self.peers, self.rank, self.world = None, self.slot, self.launched
            self.WORLD = Group(sorted(members))
        self.calls.clear()
        self.sent.clear()
        self.received.clear()
        self.deferred = None

    def wire(self, rank: int) -> int:
        """The slot (what the transport addresses) of ``rank`` in the current numbering."""
        return rank if self.peers is None else self.peers[rank]

    def emulate(self, topology) -> None:
        """Price this rank's outgoing links by ``topology`` from here on, as a launch's ``topology=`` does from the
        start (the local fabric's link clock): a link that degrades or recovers mid-run. A real network (the torch
        backend) is what it is: nothing changes there."""
        from netmorph.runtime.links import link_cost

        clock = getattr(self.transport, "clock", None)
        if clock is not None:
            clock.cost = link_cost(topology)

    # torch.distributed spellings
    def close(self) -> None:
        """``destroy_process_group`` for this communicator: release the transport (idempotent)."""
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        if self.node_transport is not None:
            self.node_transport.close()
            self.node_transport = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def get_rank(self, group: Group | None = None) -> int:
        return self.rank if group is None else group.index[self.rank]

    def get_world_size(self, group: Group | None = None) -> int:
        return self.world if group is None else group.size()

    def new_group(self, ranks) -> Group:
        ranks = list(ranks)
        bad = [r for r in ranks if not 0 <= r < self.world]
        if bad or len(set(ranks)) != len(ranks):
            raise UsageError(
                f"new_group: {{ranks}} must be distinct members of 0..{self.world - 1}, got {ranks}", "ranks"
            )
        return Group(ranks)

    @contextmanager
    def phase(self, tag: str):
        """Tag every message sent inside the block (e.g. ``"dp.grad"``, ``"tp.fwd"``)."""
        old, self.current_phase = self.current_phase, tag
        try:
            yield
        finally:
            self.current_phase = old

    # ------------------------------------------------------------ memory
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

    def shared(self, shape, dtype=np.float64) -> np.ndarray:
        """One array every rank maps (call on all ranks, same order): Hogwild's parameter vector.

        Only the local fabric has memory all ranks share; elsewhere this raises.
        """
        if not hasattr(self.transport, "shared"):
            raise UsageError("shared memory arrays need the local fabric (backend='local')", "backend")
        dtype = np.dtype(dtype)
        n = int(np.prod(shape))
        return self.transport.shared(n * dtype.itemsize).view(dtype).reshape(shape)

    # ------------------------------------------------------------ out of place (NCCL's send and receive buffers)
    # torch.distributed's all_reduce, reduce and broadcast work in one tensor; NCCL's take a send and a receive
    # buffer, and nccl-tests' first column times that form. Here a torch user's way: copy, then in place.
    # Comm runs each as its schedule's out-of-place case instead (no copy in front).
    def all_reduce_into_tensor(
        self, output, input, op="sum", group: Group | None = None, algo: str = "auto", async_op: bool = False
    ):
        """``ncclAllReduce(sendbuff=input, recvbuff=output, ...)``: ``output`` gets the reduction of every
        rank's ``input``, which is only read."""
        out, _ = self._pair(output, input, "all_reduce_into_tensor")
        self._fill(out, input)
        return self.all_reduce(output, op, group, algo, async_op)

    def reduce_into_tensor(
        self, output, input, dst: int, op="sum", group: Group | None = None, algo: str = "auto", async_op: bool = False
    ):
        """``ncclReduce(sendbuff=input, recvbuff=output, ..., root=dst)``: ``dst``'s ``output`` gets the
        reduction; every other rank's ``output`` is left as it was (NCCL uses recvbuff only on the root)."""
        out, inp = self._pair(output, input, "reduce_into_tensor")
        work = out if self.rank == dst else empty_like(out, len(out))
        work[:] = inp
        self.reduce(work, dst, op, group, algo)
        return CompletedWork() if async_op else output

    def broadcast_into_tensor(
        self, output, input, src: int, group: Group | None = None, algo: str = "auto", async_op: bool = False
    ):
        """``ncclBroadcast(sendbuff=input, recvbuff=output, ..., root=src)``: every ``output`` gets ``src``'s
        ``input`` (only the root's is read; the others may pass None)."""
        out, _ = self._pair(output, input, "broadcast_into_tensor", optional=self.rank != src)
        if self.rank == src:
            self._fill(out, input)
        return self.broadcast(output, src, group, algo, async_op)

    def _pair(self, output, input, name: str, optional: bool = False):
        """(output, input) as flat buffers of one length; input None where ``optional``."""
        out = self._buf(output)
        if input is None and optional:
            return out, None
        inp = self._buf(input)
        if len(inp) != len(out) or inp.dtype != out.dtype:
            raise UsageError(
                f"{name}: {{input}} must match the output's {len(out)} elements of {out.dtype}, got "
                f"{len(inp)} of {inp.dtype}",
                "input",
            )
        return out, inp

    def _fill(self, out, input) -> None:
        inp = self._buf(input)
        if not same_memory(out, inp):
            out[:] = inp

    # ------------------------------------------------------------ point to point
    def send(self, tensor, dst: int) -> None:
        self.isend(tensor, dst).wait()

    def recv(self, tensor, src: int) -> None:
        self.irecv(tensor, src).wait()

    def isend(self, tensor, dst: int):
        """A send in flight. On torch.distributed (gloo) it completes only once the peer has posted the payload's
        receive, which the peer's receive ``wait()`` does: an exchange waits its receives before its sends."""
        over = self._over((dst,))
        seq = self._begin(over)
        a = self._buf(tensor)
        self._peer(dst)
        t = time.perf_counter()
        self.ledger.add(self.rank, dst, nbytes(a), seq, 0, self.current_phase, "send", "p2p", t, t)
        work = over.isend(a, self.wire(dst), self._p2p_fp(self.sent, dst, a, (self.rank, dst)))
        work.keep = tensor  # the memory stays alive until the send completes
        return work

    def irecv(self, tensor, src: int):
        over = self._over((src,))
        self._begin(over)
        a = self._buf(tensor)
        self._peer(src)
        work = over.irecv(a, self.wire(src), self._p2p_fp(self.received, src, a, (src, self.rank)))
        work.keep = tensor
        return work

    def recv_any(self, tensor, srcs=None) -> int:
        """Receive from any of ``srcs`` (default: every other rank); returns the sender (MPI_ANY_SOURCE)."""
        self._begin()
        a = as_array(tensor)
        srcs = [r for r in (range(self.world) if srcs is None else srcs) if r != self.rank]
        if self.peers is None:
            return self.transport.recv_any(a, srcs, lambda src: self._p2p_fp(self.received, src, a, (src, self.rank)))
        rank = {self.wire(r): r for r in srcs}
        got = self.transport.recv_any(
            a, list(rank), lambda s: self._p2p_fp(self.received, rank[s], a, (rank[s], self.rank))
        )
        return rank[got]

    # ------------------------------------------------------------ internals
    def _buf(self, t):
        """The buffer a collective works on: a flat torch view for a tensor the transport moves on its
        device (any non-CPU tensor; CPU ones too with ``keep_tensors``), else a flat numpy view."""
        if self.devices and is_tensor(t) and (t.device.type != "cpu" or self.keep_tensors):
            if not t.is_contiguous():
                raise UsageError("tensor must be contiguous (call .contiguous() first)", "tensor")
            return t.detach().view(-1)
        return as_array(t)

    def _p2p_fp(self, counts: dict, peer: int, a: np.ndarray, pair):
        """The fingerprint of the next message on the ordered pair (src, dst): its number and size."""
        counts[peer] = n = counts.get(peer, 0) + 1
        if not self.fingerprints:
            return None
        return fingerprint.stamp("p2p", "p2p", n, a.numel() if is_tensor(a) else a.size, a.dtype, 0, "none", pair)

    def _collective_fp(self, op, algo, g: Group, count, dtype, root, redop):
        """The fingerprint of the next collective on ``g``: the calls on the group are counted per
        group, as torch counts per process group."""
        self.calls[g.ranks] = n = self.calls.get(g.ranks, 0) + 1
        if not self.fingerprints:
            return None
        return fingerprint.stamp(op, algo, n, count, dtype, root, redop, g.ranks)

    def _begin(self, over=None) -> int:
        """Count one communication call (and fire any fault set for it); its sequence number.
        After a fabric failure every call over that transport (``over``, default the epoch's) raises it again."""
        failed = getattr(self.transport if over is None else over, "failed", None)
        if failed is not None:
            raise failed
        self.ops += 1
        for f in self.faults:
            f.trigger(self.ops)
        return self.ops

    def _group(self, group) -> Group:
        g = group or self.WORLD
        if self.rank not in g.index:
            raise UsageError(f"rank {self.rank} is not a member of {g}", "group")
        return g

    def _peer(self, r) -> None:
        if not 0 <= r < self.world or r == self.rank:
            raise UsageError(f"peer must be another rank in 0..{self.world - 1}, got {r}", "peer")
