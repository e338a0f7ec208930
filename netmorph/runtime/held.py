"""A cluster's worker's calls among node-mates on its node's own process group, and the failures held for the vote.

Under tensor or pipeline parallelism inside each node a cluster's worker holds two transports: the membership
epoch's (``comm.transport``, re-formed at every epoch, aborted at a loss) and its node's (``comm.node_transport``,
over its torchrun job's own process group, :class:`~netmorph.runtime.transport.torchgroup.NodeGroup`, kept). A call
whose ranks are all node-mates goes over the node's; any other over the epoch's. A failure across the nodes is not
raised where it happens but held until the step's vote (:meth:`NodeCalls.should_commit`), as torchft's Manager
holds a collective's error (``report_error``) until ``should_commit``: the node's group cannot be aborted, so a
worker must never leave a step while its node-mates may still call it there.
"""

from __future__ import annotations

import time

from netmorph.runtime.transport import PeerLost, PeerTimeout


class NodeCalls:
    """The routing and the vote, mixed into :class:`~netmorph.runtime.base.CommBase` (``node_transport`` None:
    everything goes over ``transport``, nothing is held, the vote is a no-op)."""

    def _over(self, ranks):
        """The transport a call among ``ranks`` (this communicator's numbering) goes over: the node's own group's
        where every one of them is a node-mate (and this rank with them), the epoch's otherwise."""
        node = self.node_transport
        if node is not None and node.group.holds([self.wire(r) for r in ranks]):
            return node
        return self.transport

    def _held(self, over, run):
        """``run()`` -- a collective over ``over`` -- with a failure across the nodes held back while the node's
        own group is in use, as torchft's Manager holds a collective's error (``report_error``) until
        ``should_commit``: a worker that left the step at once would leave its node-mates blocked in their next
        call on the node's group, which nothing can abort. Held, it fails the epoch's group at once (every
        peer's pending call on it fails: :meth:`~.transport.torchdiagnose.Diagnosis.failure`), skips the
        step's later calls across the nodes and keeps making its in-node calls with its node-mates up to the
        vote. What ``run`` returns, or None for a call held or skipped."""
        if over is not self.transport or self.node_transport is None:
            return run()
        if self.deferred is not None:
            return None
        try:
            return run()
        except (PeerLost, PeerTimeout) as e:
            self.deferred = e
            return None

    def should_commit(self) -> None:
        """torchft's ``Manager.should_commit``, over this node's workers: every node-mate says whether a call of
        its step across the nodes failed (an all-reduce of the flags, max, on the node's own group, which every
        one of them reaches after the same in-node calls), and if one did every node-mate raises -- its own
        failure, or a node-mate's as :class:`PeerLost` (or :class:`PeerTimeout`) naming no peer -- so that they
        all leave the step together and redo it together. A no-op off a cluster's node group.

        The vote is the node group's own all-reduce (gloo's, NCCL's) whichever backend runs the step's
        collectives: one more all-reduce of netmorph's schedules a step (Python rounds, every message
        fingerprinted) cost this machine's 2 x 2 tensor-parallel job about as much as one of its tensor-parallel
        all-reduces. One ledger entry, 8 bytes."""
        node = self.node_transport
        if node is None:
            return
        import torch
        import torch.distributed as dist

        mine = self.deferred
        flag = torch.tensor([0 if mine is None else 2 if isinstance(mine, PeerTimeout) else 1], dtype=torch.int64)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        seq = self._begin(node)
        t0 = time.perf_counter()
        node.guard(-1, lambda: node.group.pg.allreduce([flag], opts).wait())
        self.ledger.add(self.rank, -1, 8, seq, 0, "elastic.vote", "allreduce", "torch-native", t0, time.perf_counter())
        if int(flag[0]) == 0:
            return
        self.deferred = None
        if mine is not None:
            raise mine
        if int(flag[0]) == 2:
            raise PeerTimeout(-1, 0.0, "a node-mate's call across the nodes timed out")
        raise PeerLost(-1, "a node-mate's call across the nodes failed")
