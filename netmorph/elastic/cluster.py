"""A node is a torchrun job: an elastic member that meets the others through the lighthouse.

Each node of the cluster runs its own ``torchrun --nproc-per-node K --max-restarts R -m netmorph elastic
--lighthouse HOST:P --node-index I --nodes N ...`` -- torchft's replica groups, each its own torchrun job. A worker's
identity is its *slot*: ``(incarnation · N + node) · K + local rank``, where the incarnation is torchrun's
``TORCHELASTIC_RESTART_COUNT``: at incarnation 0 the slot is the launch's global rank (what ``--kill RANK@STEP``
names), and a worker torchrun restarted after its node went down is a new slot -- a joiner that holds nothing,
healed from a live peer, as ``ncclCommGrow`` appends new ranks.

What the one-box launcher gives its ranks, the cluster gives them here:

- the *store*: the lighthouse's (:class:`~netmorph.elastic.lighthouse.LighthouseStore`), where views are agreed,
  heartbeats published and each epoch's process group meets;
- the *communicator* among the members: a fresh gloo group per membership epoch
  (:class:`~netmorph.runtime.transport.torchgroup.EpochGroup`, built by ``comm.reform``);
- the *dead flags*: :class:`Liveness`, fed by a :class:`~netmorph.elastic.heartbeat.Watchdog` over the members'
  heartbeats (φ accrual). A member it suspects is fenced (SIGKILLed where it runs on this host; elsewhere the
  view itself fences it) and the epoch's group is aborted, so every member blocked in a collective fails at once
  instead of waiting out gloo's timeout -- torchft's Manager aborting its process group when the quorum changes.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass

from netmorph.elastic.detector import PhiAccrual
from netmorph.elastic.heartbeat import Watchdog
from netmorph.elastic.lighthouse import LighthouseStore, parse_address
from netmorph.errors import UsageError

# heartbeat intervals without a beat after which a member whose connection closed is gone (Liveness.stopped)
STALE_BEATS = 5


@dataclass(frozen=True)
class Placement:
    """Where a worker runs: node ``node`` of ``nodes``, local rank ``local_rank`` of ``local_world`` (torchrun's
    --nproc-per-node), after ``incarnation`` restarts of its node."""

    node: int
    nodes: int
    local_rank: int
    local_world: int
    incarnation: int = 0

    @property
    def slot(self) -> int:
        return (self.incarnation * self.nodes + self.node) * self.local_world + self.local_rank

    @property
    def launched(self) -> int:
        """The launch's workers: N nodes x K."""
        return self.nodes * self.local_world

    @classmethod
    def from_env(cls, node: int, nodes: int) -> Placement:
        """From torchrun's environment (LOCAL_RANK, LOCAL_WORLD_SIZE, TORCHELASTIC_RESTART_COUNT)."""
        if not 1 <= nodes <= 1024:
            raise UsageError(f"{{nodes}} must be in 1..1024, got {nodes}", "nodes")
        if not 0 <= node < nodes:
            raise UsageError(f"{{node}} must be in 0..{nodes - 1} (--nodes {nodes}), got {node}", "node")
        missing = [k for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE") if k not in os.environ]
        if missing:
            raise UsageError(
                f"--lighthouse joins a cluster from a torchrun job: {', '.join(missing)} unset (run it "
                f"under torchrun, or use netmorph launch)",
                "lighthouse",
            )
        return cls(
            node,
            nodes,
            int(os.environ["LOCAL_RANK"]),
            int(os.environ["LOCAL_WORLD_SIZE"]),
            int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        )


def node_of(slot: int, nodes: int, local_world: int) -> int:
    return (slot // local_world) % nodes


class Liveness:
    """The members this worker knows to be gone (its watchdog suspected them, or they were fenced): the cluster's
    counterpart of the local fabric's dead flags, read by the agreement after a loss.

    φ accrual suspects a member from its silence alone, so it waits out the jitter of a loaded host before it
    fences a live one. A member whose connection closed *and* whose heartbeat counter has not moved for
    ``stale`` seconds is gone on the two signals together (:meth:`stopped`, :func:`confirm_lost`), sooner: gloo
    says which peer closed, the lighthouse says it stopped beating -- what works across hosts, where its pid
    means nothing."""

    def __init__(self):
        self._dead: set = set()
        self._lock = threading.Lock()
        self.silence = None  # slot -> seconds since its heartbeat counter last moved, or None (watch_members)
        self.stale = math.inf  # seconds of silence that, with a closed connection, mean gone

    def mark(self, slot: int) -> None:
        with self._lock:
            self._dead.add(slot)

    def dead(self, slot: int) -> bool:
        with self._lock:
            return slot in self._dead

    def stopped(self, slot: int) -> bool:
        """Its heartbeat counter has not moved for ``stale`` seconds (the watchdog's reading)."""
        silent = None if self.silence is None else self.silence(slot)
        return silent is not None and silent > self.stale


def confirm_lost(comm, err) -> bool:
    """After ``err`` on a cluster's worker: a :class:`PeerLost` whose root has stopped beating is gone -- marked
    dead now rather than when φ accrual suspects it, so the agreement after the loss need not wait for that. A
    root still beating is left to the agreement (it posts, or φ accrual decides). Whether it was marked."""
    from netmorph.runtime.transport import PeerLost

    live = getattr(comm, "liveness", None)
    if live is None or not isinstance(err, PeerLost) or err.rank < 0 or not live.stopped(err.rank):
        return False
    live.mark(err.rank)
    return True


def join(
    lighthouse: str,
    node: int,
    nodes: int,
    timeout: float,
    fingerprints: bool = True,
    native: bool = False,
    node_group: bool = False,
):
    """This torchrun worker's communicator in the cluster: connected to the lighthouse, no group until its first
    view (``comm.reform``). ``comm.placement``, ``comm.liveness`` and ``comm.store`` say where it is, whom it
    knows dead, and where the members meet. Its collectives are netmorph's schedules over the epoch group's
    point-to-point, or with ``native`` the group's own (gloo's, NCCL's: ``--backend torch-native``).

    ``node_group`` (tensor or pipeline parallelism inside each node): the calls among node-mates go over the
    torchrun job's own process group (``comm.node_transport``, a
    :class:`~netmorph.runtime.transport.torchgroup.NodeGroup` kept across the epochs), and a failure across the
    nodes is held until the step's vote (``comm.should_commit``)."""
    from netmorph.cost.topology import PRESETS
    from netmorph.runtime.comm import Comm
    from netmorph.runtime.heap import freeze_heap
    from netmorph.runtime.torchrun import gloo_on_loopback
    from netmorph.runtime.transport.torchdist import TorchTransport
    from netmorph.runtime.transport.torchgroup import StoreOnly

    host, port = parse_address(lighthouse)
    place = Placement.from_env(node, nodes)
    if host in ("127.0.0.1", "localhost", "::1"):
        gloo_on_loopback()  # an emulated cluster: nothing beyond this host
    store = LighthouseStore(host, port, timeout)
    world = max(place.launched, place.slot + 1)
    transport = TorchTransport(place.slot, world, timeout, group=StoreOnly(store))
    if native:
        from netmorph.runtime.native import NativeComm

        comm = NativeComm(transport, place.slot, world, fingerprints=fingerprints)
    else:
        comm = Comm(transport, place.slot, world, tuner_topology=PRESETS["flat"], fingerprints=fingerprints)
    comm.store, comm.placement, comm.liveness = store, place, Liveness()
    if node_group and place.local_world > 1:
        from netmorph.runtime.transport.torchgroup import NodeGroup

        comm.node_transport = TorchTransport(
            place.slot, world, timeout, group=NodeGroup(place.slot, place.local_world, timeout)
        )
    freeze_heap()
    return comm


def on_suspect(comm):
    """What a suspicion does beyond the fence on a cluster's worker: mark the member dead (``comm.liveness``) and
    abort the current epoch's group, so that every pending call fails now; None off a cluster (the local fabric's
    launcher marks a fenced rank dead itself)."""
    if getattr(comm, "liveness", None) is None:
        return None

    def suspected(slot):
        comm.liveness.mark(slot)
        comm.transport.group.abort()

    return suspected


def watch_members(comm, members, interval: float) -> Watchdog:
    """A watchdog over ``members``' heartbeats (all but this worker): a member φ accrual suspects is fenced, marked
    dead, and the current epoch's group aborted -- every pending collective fails now (``comm.watchdog``)."""

    def make():
        return PhiAccrual(
            first_heartbeat_estimate=interval, min_std_deviation=interval / 2, acceptable_heartbeat_pause=4 * interval
        )

    dog = Watchdog(
        comm.store, [m for m in members if m != comm.slot], make, interval=interval / 2, on_suspect=on_suspect(comm)
    )
    stopped_after(comm, dog, interval)
    return dog.start()


def stopped_after(comm, dog: Watchdog, interval: float) -> None:
    """Let ``comm`` tell a stopped member from ``dog``'s readings: its liveness (:meth:`Liveness.stopped`) and its
    transport's failure diagnosis (a closed connection's wait for the peer to say what it waited for ends when
    the peer has stopped beating: a dead peer never says). Stopped is :data:`STALE_BEATS` intervals of silence."""
    if getattr(comm, "liveness", None) is None:
        return
    comm.liveness.silence, comm.liveness.stale = dog.silent_for, STALE_BEATS * interval
    for t in (comm.transport, getattr(comm, "node_transport", None)):
        if t is not None:
            t.stopped = comm.liveness.stopped
