"""The process group a torch transport talks over: torch's default one, or a fresh one per membership epoch.

A torchrun job starts with one process group (``init_process_group``) and keeps it. A job whose membership
changes -- a node lost, a node back -- needs a new communicator among the members of each epoch, as torchft's
Manager re-configures its process group per quorum and NCCL 2.27 shrinks and grows one (``ncclCommShrink``,
``ncclCommGrow``). :class:`EpochGroup` builds it: a ``ProcessGroupGloo`` (with a ``ProcessGroupNCCL`` beside it
where there are GPUs) over a prefix of the job's store (``netmorph/pg/<epoch>/``), member i of the agreed view
its rank i; the transport addresses a peer by its slot and the group routes it to that rank.

:meth:`EpochGroup.abort` is ``ncclCommAbort``: gloo has no abort that reaches its peers (``ProcessGroup.abort``
and ``shutdown`` leave their connections open, and a peer blocked on us waits out its whole timeout), so the
group shuts down the TCP connections it made -- never the listening socket gloo's accept thread needs -- and every
peer's pending operation on them fails at once ("Connection closed by peer"); each of those peers aborts its own
in turn, and the failure has crossed the whole group in milliseconds.

:class:`NodeGroup` is the other kind a cluster's worker holds: its torchrun job's own process group among the
node's workers, kept across every epoch. A node is one failure domain -- torchrun tears it down whole when one of
its workers dies, and a hung one is fenced -- so a group inside it never loses a member while its members live,
and nothing needs to abort it.
"""

from __future__ import annotations

import datetime
import os
import socket

from netmorph.runtime.transport.tensors import dist_module


def socket_fds() -> set:
    """This process's open socket file descriptors."""
    out = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for fd in names:
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                out.add(int(fd))
        except OSError:
            continue
    return out


def _on_each(fds, call) -> list:
    """``call(sock)`` on a duplicate of each descriptor in ``fds`` (the original stays its owner's); the
    descriptors on which it did not raise OSError."""
    out = []
    for fd in fds:
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            call(s)
            out.append(fd)
        except OSError:
            pass
        finally:
            s.close()
    return out


def connected(fds) -> list:
    """The descriptors among ``fds`` that are connected sockets (a listener has no peer)."""
    return _on_each(fds, lambda s: s.getpeername())


def shut(fds) -> None:
    """Shut down both directions of each connected socket (its owner's pending reads and the peer's fail)."""
    _on_each(fds, lambda s: s.shutdown(socket.SHUT_RDWR))


class DefaultGroup:
    """torch's default process group (torchrun's, or a local launch's): peers are its ranks."""

    epoch = -1

    def __init__(self):
        self.dist = dist_module()

    def size(self) -> int:
        return self.dist.get_world_size()

    def store(self):
        try:
            from torch.distributed import distributed_c10d

            return distributed_c10d._get_default_store()
        except (ImportError, AttributeError, RuntimeError, ValueError):
            return None

    def isend(self, tensor, peer: int, tag: int = 0):
        return self.dist.isend(tensor, peer, tag=tag)

    def irecv(self, tensor, peer: int, tag: int = 0):
        return self.dist.irecv(tensor, peer, tag=tag)

    def recv_any(self, tensor, tag: int = 0) -> int:
        return int(self.dist.recv(tensor, tag=tag))

    def abort(self) -> None:
        pass

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


class StoreOnly:
    """Before a member's first view: the job's store and no group yet (the first ``reform`` builds one)."""

    epoch = -1

    def __init__(self, store):
        self._store = store

    def size(self) -> int:
        return 0

    def store(self):
        return self._store

    def _none(self, *args, **kwargs):
        raise RuntimeError("no process group yet: a member communicates after its first reform (its view)")

    isend = irecv = recv_any = _none

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass


class EpochGroup:
    """A process group among ``members`` (slots, in the view's order) for membership epoch ``epoch``, over
    ``store`` (every member constructs it; the constructor meets the others there)."""

    def __init__(self, store, epoch: int, members, slot: int, timeout: float):
        import torch

        dist = dist_module()
        self.epoch, self.members, self.slot = epoch, tuple(members), slot
        self.route = {s: i for i, s in enumerate(self.members)}
        self._store = store
        self._wait = datetime.timedelta(seconds=timeout)
        self._cuda = torch.cuda.is_available() and dist.is_nccl_available()
        self.fds: list = []  # the connections this group and its subgroups made (gloo's full mesh)
        self.aborted = False
        self.prefix = f"netmorph/pg/{epoch}/"
        self.pg, self.nccl = self._build(self.prefix, self.route[slot], len(self.members))
        self._subgroups = {tuple(range(len(self.members))): (self.pg, self.nccl)}

    def _build(self, prefix: str, rank: int, size: int):
        """A gloo group (and an NCCL one beside it where there are GPUs) of ``size`` over ``prefix`` of the store;
        its connections join :attr:`fds`, for :meth:`abort`."""
        dist = dist_module()
        # a LighthouseStore's TCPStore as it is now: a subgroup built after a lighthouse restart meets on the new one
        store = dist.PrefixStore(prefix, getattr(self._store, "raw", self._store))
        before = socket_fds()
        gloo = dist.ProcessGroupGloo(store, rank, size, self._wait)
        nccl = dist.ProcessGroupNCCL(dist.PrefixStore("nccl/", store), rank, size) if self._cuda else None
        self.fds += connected(socket_fds() - before)
        return gloo, nccl

    def process_group(self, ranks, cuda: bool = False):
        """The process group among ``ranks`` (this epoch's numbering: member i is rank i), in their order -- the
        whole epoch's, or a subgroup built the first time it is asked for, over its own prefix of the epoch's
        store (only its members build it, together: the constructor meets them there), as
        ``ncclCommSplit`` carves a tensor-parallel group out of the world's communicator; NCCL's for ``cuda``."""
        ranks = tuple(ranks)
        if ranks not in self._subgroups:
            me = self.route[self.slot]
            name = "-".join(map(str, ranks))
            self._subgroups[ranks] = self._build(f"{self.prefix}sub/{name}/", ranks.index(me), len(ranks))
        gloo, nccl = self._subgroups[ranks]
        return nccl if cuda and nccl is not None else gloo

    def size(self) -> int:
        return len(self.members)

    def store(self):
        return self._store

    def _pg(self, tensor):
        return self.nccl if self.nccl is not None and tensor.device.type == "cuda" else self.pg

    def isend(self, tensor, peer: int, tag: int = 0):
        return self._pg(tensor).send([tensor], self.route[peer], tag)

    def irecv(self, tensor, peer: int, tag: int = 0):
        return self._pg(tensor).recv([tensor], self.route[peer], tag)

    def recv_any(self, tensor, tag: int = 0) -> int:
        work = self.pg.recv_anysource([tensor], tag)
        work.wait()
        return self.members[work._source_rank()]

    def abort(self) -> None:
        """``ncclCommAbort``: close this group's connections, so every peer blocked on us fails now."""
        if not self.aborted:
            self.aborted = True
            shut(self.fds)
            for _, nccl in self._subgroups.values():
                if nccl is not None:
                    nccl.abort()

    def close(self) -> None:
        self.abort()


class NodeGroup(EpochGroup):
    """This node's torchrun job's own process group: ``init_process_group`` over torchrun's store (its
    ``MASTER_ADDR``/``MASTER_PORT``, ``RANK`` = the local rank), the node's ``local_world`` workers in local-rank
    order, each addressed by its slot (its node's incarnation's slots are consecutive: local rank = slot - first).
    Its subgroups (two tensor-parallel groups of a 4-worker node) are carved over its own prefix of torchrun's
    store, as an epoch's are over the lighthouse's (``ncclCommSplit`` of the job's communicator).

    Kept across membership epochs, never aborted: a node goes and comes back whole (its torchrun job), so its
    group outlives every epoch its node is in and dies with the node. On GPUs the default group is
    ``cpu:gloo,cuda:nccl``: NCCL over NVLink for a node's CUDA tensors, as a Megatron job's tensor-parallel
    group."""

    epoch = "node"

    def __init__(self, slot: int, local_world: int, timeout: float):
        import torch
        from torch.distributed import distributed_c10d

        dist = dist_module()
        self._wait = datetime.timedelta(seconds=timeout)
        self._cuda = torch.cuda.is_available() and dist.is_nccl_available()
        first = slot - slot % local_world
        if not dist.is_initialized():
            # torchrun's store outlives a restart of the node's workers: the group meets under a prefix of this
            # incarnation's (its first slot), or a restarted worker could read its predecessor's gloo address
            store, rank, size = next(dist.rendezvous("env://", timeout=self._wait))
            store = dist.PrefixStore(f"netmorph/node/{first}/", store)
            backend = "cpu:gloo,cuda:nccl" if self._cuda else "gloo"
            dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=self._wait)
        self.slot, self.members = slot, tuple(range(first, first + local_world))
        self.route = {s: i for i, s in enumerate(self.members)}
        self._store = distributed_c10d._get_default_store()
        self.fds, self.aborted, self.prefix = [], False, "netmorph/pg/node/"
        # the default group's own backends, called directly: its ProcessGroup front dispatches every call through
        # torch's operator dispatcher first (tens of microseconds a message, measured: a ping-pong 20-35% slower)
        default = distributed_c10d._get_default_group()
        self.pg = default._get_backend(torch.device("cpu"))
        self.nccl = default._get_backend(torch.device("cuda")) if self._cuda else None
        self._subgroups = {tuple(range(local_world)): (self.pg, self.nccl)}

    def holds(self, slots) -> bool:
        """Every one of ``slots`` is a worker of this node."""
        return all(s in self.route for s in slots)

    def abort(self) -> None:
        """Nothing: the node's group dies with the node (an epoch's abort never reaches it)."""

    def close(self) -> None:
        dist = dist_module()
        if dist.is_initialized():
            dist.destroy_process_group()
