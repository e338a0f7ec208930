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
communicator. Rank 0 -- node 0's local rank 0 -- prints for the job, as nccl-tests under mpirun.
"""

from __future__ import annotations

import json

from netmorph.errors import UsageError
from netmorph.morph.scenario import Scenario

LINKS = "netmorph/morph/links"            # rank 0's fitted links, for every worker's twin
NODES = 2                                  # morph's scenarios happen on two nodes


def check_cluster(nodes: int, k: int, world, scenario: Scenario) -> int:
    """The cluster's world (``nodes`` x ``k``), or the one line that says which flag to change."""
    from netmorph.morph.members import membership_changes
    if nodes != NODES:
        raise UsageError(f"morph's scenarios happen on two nodes: --nodes 2, got {nodes}", "nodes")
    from netmorph.morph.controller import WORLDS
    if nodes * k not in WORLDS:
        raise UsageError(f"--nproc-per-node {k}: morph's two nodes hold "
                         f"{', '.join(str(w // 2) for w in WORLDS)} workers each", "nproc_per_node")
    if world is not None and world != nodes * k:
        raise UsageError(f"--world {world} is the cluster's nodes x workers ({nodes} x {k} = {nodes * k}) under "
                         f"torchrun; leave it out", "world")
    if membership_changes(scenario):
        raise UsageError(f"{{scenario}} {scenario.label()}: a node lost, hung or joining runs on one box (netmorph "
                         f"morph without launch); across torchrun jobs morph runs link-degrades, link-recovers, "
                         f"seq-grows and memory-shrinks, and netmorph elastic the membership changes", "scenario")
    return nodes * k


class Cluster:
    """This worker's place in the cluster: ``comm`` over every node's workers (rank = node x K + local rank)."""

    def __init__(self, lighthouse: str, node: int, nodes: int, timeout: float):
        from netmorph.elastic.cluster import join
        self.comm = join(lighthouse, node, nodes, timeout)
        place = self.comm.placement
        if place.incarnation:
            raise UsageError("morph's workers are not restarted under torchrun (its scenarios here lose no node): "
                             "--max-restarts 0", "max_restarts")
        self.world = place.launched
        self.comm.reform(range(self.world), 0, renumber=True)
        self.comm.transport.clock.canon = lambda slot: slot % self.world

    @property
    def head(self) -> bool:
        """Whether this worker prints for the job (rank 0: node 0's local rank 0)."""
        return self.comm.rank == 0

    def links(self, base) -> dict:
        """``measure_links`` on this cluster's workers, under ``base``'s emulated links: the same ping-pongs and
        ring all-reduces, fitted on rank 0, the same dict on every worker."""
        from netmorph.calibrate.run import links_in_job
        comm = self.comm
        comm.emulate(base)
        links = links_in_job(comm, base.gpus_per_node)
        if comm.rank == 0:
            comm.store.set(LINKS, json.dumps(links))
        comm.barrier()
        return json.loads(comm.store.get(LINKS))

    def close(self) -> None:
        self.comm.barrier()                   # nobody leaves while a peer still talks to it
        self.comm.close()
