"""A cluster's in-node groups on the node's own torchrun process group, kept across membership epochs.

Four processes stand for 2 nodes x 2 workers: each node's local rank 0 hosts the node's store (torchrun's agent
store) and both meet on it through ``env://`` (:class:`~netmorph.runtime.transport.torchgroup.NodeGroup`); the
epochs meet on a shared store (the lighthouse's). Node 1 leaves after epoch 0. A call across the nodes that then
fails is held, not raised: the in-node calls after it still run on the node's group, and the step's vote
(``should_commit``, torchft's) raises on both node-mates at the same call -- the failing worker's own loss, and
a node-mate's for the other. Epoch 1 goes on over the very same node group.
"""

from __future__ import annotations

import numpy as np
import pytest
from clusters import spawn_ranks


def _member(slot: int, world: int, path: str, q, native: bool = False) -> None:
    import os

    import torch.distributed as dist

    from netmorph.runtime.comm import Comm
    from netmorph.runtime.native import NativeComm
    from netmorph.runtime.transport import PeerLost
    from netmorph.runtime.transport.torchdist import TorchTransport
    from netmorph.runtime.transport.torchgroup import NodeGroup, StoreOnly

    epochs = dist.FileStore(path, world)
    node, local = divmod(slot, 2)
    if local == 0:  # the node's agent store, as torchrun's agent hosts it
        agent = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        epochs.set(f"port/{node}", str(agent.port))
    port = epochs.get(f"port/{node}").decode()
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(local), WORLD_SIZE="2", TORCHELASTIC_USE_AGENT_STORE="True"
    )
    kind = NativeComm if native else Comm
    comm = kind(TorchTransport(slot, world, 30.0, group=StoreOnly(epochs)), slot, world)
    comm.node_transport = TorchTransport(slot, world, 30.0, group=NodeGroup(slot, 2, 30.0))
    first = comm.node_transport.group.pg
    comm.reform(range(world), 0, renumber=True)
    out = {}
    x = np.full(2, slot + 1.0)
    comm.all_reduce(x)  # across the nodes: the epoch's group
    mates = comm.new_group([2 * node, 2 * node + 1])
    y = np.full(2, slot + 1.0)
    comm.all_reduce(y, group=mates)  # in the node: its own group
    pair = comm.new_group([0, 2])  # across the nodes (on torch-native a subgroup of the epoch's, built now)
    if slot in (0, 2):
        comm.all_reduce(np.ones(1), group=pair)
    out["epoch 0"] = (x.tolist(), y.tolist())
    comm.should_commit()
    if node == 1:  # node 1 leaves
        q.put((slot, out))
        comm.close()
        return
    if slot == 0:  # a call across the nodes to a worker that left: held
        lost = np.ones(2)
        comm.all_reduce(lost, group=pair)
        out["held"] = type(comm.deferred).__name__
    z = np.full(3, slot + 1.0)
    comm.all_reduce(z, group=mates)  # the node's group still works: no abort reached it
    out["in node after"] = z.tolist()
    try:
        comm.should_commit()
        out["vote"] = None
    except PeerLost as e:
        out["vote"] = (e.rank, str(e))
    comm.reform((0, 1), 1, renumber=True)
    w = np.full(2, 10.0 * (slot + 1))
    comm.all_reduce(w, group=comm.new_group([0, 1]))
    comm.should_commit()
    out["epoch 1"] = (w.tolist(), comm.node_transport.group.pg is first, comm.deferred)
    q.put((slot, out))
    comm.close()


def _native_member(slot, world, path, q):
    _member(slot, world, path, q, native=True)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("target", [_member, _native_member], ids=["schedules", "torch-native"])
def test_in_node_calls_run_on_the_nodes_own_group_and_a_failure_across_nodes_waits_for_the_vote(target):
    got = dict(spawn_ranks(target, 4, 4))
    for slot, out in got.items():
        mates = 3.0 if slot < 2 else 7.0  # 1 + 2, 3 + 4
        assert out["epoch 0"] == ([10.0, 10.0], [mates, mates])
    for slot in (0, 1):
        assert got[slot]["in node after"] == [3.0] * 3
        assert got[slot]["epoch 1"] == ([30.0, 30.0], True, None)
    assert got[0]["held"] == "PeerLost" and "held" not in got[1]
    rank, text = got[1]["vote"]  # the node-mate that held nothing raises its mate's loss, naming no peer
    assert rank == -1 and "node-mate" in text
    assert got[0]["vote"] is not None and "node-mate" not in got[0]["vote"][1]  # its own
