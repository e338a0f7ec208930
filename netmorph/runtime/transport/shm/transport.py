"""One rank's end of the local fabric: the transport interface over channels and the engine.

Stands in for NCCL's intra-node transports as a whole (``src/transport/shm.cc``,
``p2p.cc``); the rooms it is built from are the mapping (:mod:`.mapping`), the
channels (:mod:`.channel`), the progress engine (:mod:`.engine`), the fused
reduction (:mod:`.fused`) and the link clock (:mod:`.linkclock`). It offers what
every transport offers -- ``run_round(sends, recvs, ufunc, snapshot)`` and
``isend/irecv`` -- plus registered memory (``alloc``) and one array all ranks
share (``shared``, for Hogwild!).
"""

from __future__ import annotations

import numpy as np

from netmorph.errors import UsageError
from netmorph.runtime.transport import Work, settle
from netmorph.runtime.transport.shm.channel import Channels, InStream
from netmorph.runtime.transport.shm.engine import ProgressEngine
from netmorph.runtime.transport.shm.fused import fusable, fused_reduce
from netmorph.runtime.transport.shm.linkclock import LinkClock
from netmorph.runtime.transport.shm.mapping import ShmFabric, address


class ShmTransport:
    name = "local"

    def __init__(self, fabric: ShmFabric, rank: int, timeout: float = 10.0, link_cost=None):
        self.f, self.rank, self.world = fabric, rank, fabric.world
        self.timeout = timeout
        arena = fabric.arena(rank)
        self.arena_range = (address(arena), address(arena) + len(arena))
        self.arena_top = 0  # bump allocator over our registered arena
        self.shared_top = fabric.A  # the shared region grows down from the top of rank 0's arena
        self.any_next = 0  # recv_any's round-robin position
        self.clock = LinkClock(rank, link_cost)
        self.channels = Channels(fabric, rank, self.clock)
        self.engine = ProgressEngine(fabric, rank, timeout, self.channels, self.clock, self.arena_range)

    # ------------------------------------------------------------ memory
    def alloc(self, nbytes: int) -> np.ndarray:
        """Bytes in this rank's registered arena (``ncclMemAlloc``-like): peers read them in place."""
        if nbytes < 0:
            raise UsageError(f"alloc: {{nbytes}} must be >= 0, got {nbytes}", "nbytes")
        start = -(-self.arena_top // 64) * 64
        limit = self.shared_top if self.rank == 0 else self.f.A  # rank 0's top holds shared() arrays
        if start + nbytes > limit:
            raise MemoryError(
                f"registered arena of rank {self.rank} is full ({limit - start:,} of {self.f.A:,} B "
                f"free, {nbytes:,} asked); pass a larger arena_bytes= to launch"
            )
        self.arena_top = start + nbytes
        return self.f.arena(self.rank)[start : start + nbytes]

    def free_all(self) -> None:
        """Release every registered buffer at once (the arena is a bump allocator)."""
        self.arena_top = 0

    def shared(self, nbytes: int) -> np.ndarray:
        """Bytes at the same place for every rank: carved from the top of rank 0's arena, downwards,
        in call order (every rank calls in the same order, so they agree without talking)."""
        start = (self.shared_top - nbytes) // 64 * 64
        if start < (self.arena_top if self.rank == 0 else 0):
            raise MemoryError("shared region exhausted; pass arena_bytes= to launch")
        self.shared_top = start
        return self.f.arena(0)[start : start + nbytes]

    # ------------------------------------------------------------ the transport interface
    @property
    def failed(self):
        """The fabric error this rank already hit (every later call raises it again), or None."""
        return self.engine.failed

    def progress(self) -> bool:
        return self.engine.progress()

    def wait_for(self, streams) -> None:
        self.engine.wait_for(streams)

    def run_round(self, sends, recvs, ufunc, snapshot: bool = False, fp=None) -> None:
        """Send ``[(peer, [views])]`` and receive ``[(peer, [views], [reduce?])]`` as one step, every
        message under the fingerprint ``fp`` (:mod:`netmorph.runtime.transport.fingerprint`)."""
        if snapshot:
            sends = [(peer, [np.concatenate([v.reshape(-1) for v in views])]) for peer, views in sends]
        self.channels.ufunc = ufunc
        streams = self.engine.enqueue(sends, recvs, fp)
        ins = [st for st in streams if isinstance(st, InStream)]
        if fusable(ins):
            fused_reduce(self.engine, ins, streams)
        live = [st for st in ins if not st.done]
        for st, flags in zip(live, settle([(st.segs, st.flags) for st in live])):
            st.flags = flags
        self.engine.wait_for(streams)

    def isend(self, array: np.ndarray, dst: int, fp=None) -> Work:
        streams = self.engine.enqueue([(dst, [array])], [], fp)
        self.engine.progress()
        return Work(self, streams)

    def irecv(self, array: np.ndarray, src: int, fp=None) -> Work:
        streams = self.engine.enqueue([], [(src, [array], [False])], fp)
        self.engine.progress()
        return Work(self, streams)

    def recv_any(self, array: np.ndarray, srcs, fp_of=None) -> int:
        """Receive the next message from whichever of ``srcs`` has one (MPI_ANY_SOURCE); returns it.
        ``fp_of(src)``: the fingerprint to expect from the source that turns out to send.

        Sources are polled round-robin from where the last call stopped, so a busy
        peer cannot starve the others (a parameter server serving many workers).
        """
        srcs = list(srcs)
        start = self.any_next
        box = {}

        def ready():
            for j in range(len(srcs)):
                q = srcs[(start + j) % len(srcs)]
                if not self.engine.inq.get(q) and self.channels.has_message(q):
                    box["src"] = q
                    self.any_next = (start + j + 1) % len(srcs)
                    return True
            return False

        who = ", ".join(map(str, srcs))
        self.engine.wait_for([], ready=ready, pull=False, blame=(-1, f"no message from any of ranks {who}"))
        src = box["src"]
        self.irecv(array, src, None if fp_of is None else fp_of(src)).wait()
        return src

    def reform(self, epoch: int, members=None, slot=None) -> None:
        """Elastic re-forming: fresh channels for membership epoch ``epoch`` (see the engine); every slot keeps its
        channels' place, so the members need not be named."""
        self.engine.reform(epoch)

    def finish(self) -> None:
        """The rank's function returned: say so on the wait board."""
        self.engine.finish()

    @property
    def trail(self) -> dict:
        """The last calls this rank made on each group (the launcher names them beside a message that
        was never received)."""
        return self.engine.trail

    def close(self) -> None:
        pass
