"""morph across torchrun jobs: the control loop's ranks are a cluster's workers, one torchrun job per node.

What ``torchrun --nproc-per-node K -m netmorph morph --lighthouse HOST:P --node-index I --nodes 2 ...`` runs in
each worker (``netmorph launch --nodes 2 --nproc-per-node K -- morph ...`` starts them on one box). The workers
meet through the lighthouse (:func:`netmorph.elastic.cluster.join`) and form one communicator over a gloo group
of its store (:class:`~netmorph.runtime.transport.torchgroup.EpochGroup`), numbered node by node, so that the two
nodes of morph's scenarios are the two torchrun jobs. The links are emulated on the torch transport as the local
fabric emulates them (:mod:`netmorph.runtime.transport.sendclock`: a message leaves when the scenario's α and β
say it would have arrived), over whatever gloo adds beneath -- which the twin measures rather than assumes.

Every phase of ``netmorph morph`` runs on these same workers and none is started for it: the links measured
(calibrate's ping-pongs and rings on the cluster's communicator, fitted on rank 0 and shared through the store,
so that every worker builds the same twin and ranks the same layouts), the control loop
(:func:`~netmorph.morph.live.live_rank`: the twin decides, the reshard plan runs between live ranks over
torch.distributed), then each static split beside it, a fresh :class:`~netmorph.morph.live.LiveJob` on the same
communicator. Rank 0 prints for the job, as nccl-tests under mpirun: node 0's local rank 0, and where the
scenario loses node 0, from the loss on the survivors' new rank 0 (the standby that kept the same log), which
prints the result and removes the checkpoint folder.
"""

from __future__ import annotations

import json
import shutil
import tempfile

from netmorph.errors import UsageError
from netmorph.morph.scenario import Scenario

LINKS = "netmorph/morph/links"  # rank 0's fitted links, for every worker's twin
SCRATCH = "netmorph/morph/checkpoints"  # the folder the live loop's checkpoints go to
NODES = 2  # morph's scenarios happen on two nodes


def check_cluster(nodes: int, k: int, world, scenario: Scenario, max_restarts: int) -> int:
    """The cluster's world (``nodes`` x ``k``), or the one line that says which flag to change. Either node may be
    lost (or hang) and come back: its torchrun job restarts it (``max_restarts`` at least 1) and the restarted
    workers join at the scenario's ``node-joins``."""
    if nodes != NODES:
        raise UsageError(f"morph's scenarios happen on two nodes: --nodes 2, got {nodes}", "nodes")
    from netmorph.morph.controller import WORLDS

    if nodes * k not in WORLDS:
        raise UsageError(
            f"--nproc-per-node {k}: morph's two nodes hold {', '.join(str(w // 2) for w in WORLDS)} workers each",
            "nproc_per_node",
        )
    if world is not None and world != nodes * k:
        raise UsageError(
            f"--world {world} is the cluster's nodes x workers ({nodes} x {k} = {nodes * k}) under "
            f"torchrun; leave it out",
            "world",
        )
    if rejoins(scenario) and max_restarts < 1:
        raise UsageError(
            f"{{scenario}} {scenario.label()}: node {lost(scenario)} comes back as the workers its torchrun job "
            f"restarts: --max-restarts 1 or more, got {max_restarts}",
            "max_restarts",
        )
    return nodes * k


def lost(scenario: Scenario) -> int | None:
    """The node the scenario loses (or hangs), None if none."""
    return next((e.node for e in scenario.events if e.loss), None)


def rejoins(scenario: Scenario) -> bool:
    """Whether the node the scenario loses comes back (``node-joins`` after the loss)."""
    return any(e.kind == "node-joins" for e in scenario.events)


class Cluster:
    """This worker's place in the cluster: ``comm`` over every node's workers (rank = node x K + local rank).

    A worker torchrun restarted after the scenario lost its node (``restarted``) is a new slot: where the scenario
    brings the node back (``joins``) it is a joiner (``comm.joined``) that forms no group until the members admit
    it at the scenario's step (:meth:`netmorph.morph.members.Members.join`); otherwise it says so and leaves."""

    def __init__(
        self,
        lighthouse: str,
        node: int,
        nodes: int,
        timeout: float,
        joins: bool = False,
        checkpoint_dir: str | None = None,
    ):
        from netmorph.elastic.cluster import join

        self.comm = join(lighthouse, node, nodes, timeout)
        place = self.comm.placement
        self.restarted = place.incarnation > 0  # torchrun restarted this node after the scenario lost it
        self.joiner = self.restarted and joins
        self.world = place.launched
        if self.restarted and not joins:
            return
        # the emulated links place a slot by its position in the launch: a restarted worker where its node was
        self.comm.transport.clock.canon = lambda slot: slot % self.world
        self.comm.joined = self.joiner
        if not self.joiner:
            self.comm.reform(range(self.world), 0, renumber=True)
        # where every rank writes the live loop's checkpoints (a node lost may take state no survivor holds): a
        # folder rank 0 makes in --checkpoint-dir, else on this host (in launch's own temporary folder under
        # netmorph launch) -- on a real cluster it must be on a filesystem every node shares. Rank 0 at the end
        # removes it (the maker's node may be the one lost)
        if self.comm.rank == 0 and not self.joiner:
            self.comm.store.set(SCRATCH, tempfile.mkdtemp(prefix=".netmorph-ckpt-", dir=checkpoint_dir))
        self.comm.checkpoints = self.comm.store.get(SCRATCH).decode()

    @property
    def head(self) -> bool:
        """Whether this worker prints for the job now: rank 0 of the current view (node 0's local rank 0 until a
        loss of node 0 renumbers the survivors; a joiner never, its ranks come after the members')."""
        return self.comm.rank == 0 and not self.joiner

    @property
    def leaves(self) -> bool:
        """A worker torchrun restarted where the scenario does not bring its node back: it has nothing to do."""
        return self.restarted and not self.joiner

    def links(self, base) -> dict:
        """``measure_links`` on this cluster's workers, under ``base``'s emulated links: the same ping-pongs and
        ring all-reduces, fitted on rank 0, the same dict on every worker. A joiner reads what the launch's workers
        measured (they are training by then), so that its twin is theirs."""
        from netmorph.calibrate.run import links_in_job

        comm = self.comm
        comm.emulate(base)
        if self.joiner:
            return json.loads(comm.store.get(LINKS))
        links = links_in_job(comm, base.gpus_per_node)
        if comm.rank == 0:
            comm.store.set(LINKS, json.dumps(links))
        comm.barrier()
        return json.loads(comm.store.get(LINKS))

    def close(self) -> None:
        if self.leaves:
            self.comm.close()
            return
        self.comm.barrier()  # nobody leaves while a peer still talks to it, or reads a checkpoint
        head = self.head
        self.comm.close()
        if head:
            shutil.rmtree(self.comm.checkpoints, ignore_errors=True)
