"""torch.distributed's own collectives on a cluster's membership epochs (``elastic --backend torch-native``).

A cluster has no default process group: each epoch's group is a ``ProcessGroupGloo`` c10d never registered
(:class:`~netmorph.runtime.transport.torchgroup.EpochGroup`), and the subgroups a trainer asks for are carved out
of it over the epoch's store. :class:`~netmorph.runtime.native.NativeComm` calls their own methods with
group-local roots; every collective must give what the schedule-driven communicator gives, in a world and in an
out-of-order subgroup, before and after a reform that renumbers the survivors.
"""

from __future__ import annotations

import numpy as np
import pytest
from clusters import spawn_ranks

from netmorph.cli import main


def _collectives(slot: int, world: int, path: str, q) -> None:
    import torch.distributed as dist

    from netmorph.runtime.native import NativeComm
    from netmorph.runtime.transport.torchdist import TorchTransport
    from netmorph.runtime.transport.torchgroup import StoreOnly

    store = dist.FileStore(path, world)
    comm = NativeComm(TorchTransport(slot, world, 30.0, group=StoreOnly(store)), slot, world)
    comm.reform(range(world), 0, renumber=True)
    out = {}
    x = np.full(4, slot + 1.0)
    comm.all_reduce(x)
    out["all_reduce"] = x.tolist()
    pair = comm.new_group([2, 0])  # out of order: group rank 0 is global rank 2
    b = np.full(3, 10.0 * slot)
    if slot in (0, 2):
        comm.broadcast(b, 2, pair)
    out["broadcast"] = b.tolist()
    r = np.full(2, slot + 1.0)
    comm.reduce(r, 1, op="max")
    out["reduce"] = r.tolist()
    g = np.zeros(world * 2)
    comm.all_gather_into_tensor(g, np.full(2, float(slot)))
    out["all_gather"] = g.tolist()
    s = np.zeros(1)
    comm.reduce_scatter_tensor(s, np.arange(world, dtype=np.float64) + slot)
    out["reduce_scatter"] = s.tolist()
    a = np.zeros(world)
    comm.all_to_all_single(a, np.arange(world, dtype=np.float64) + 10 * slot)
    out["all_to_all"] = a.tolist()
    comm.barrier()
    if slot != 1:  # epoch 1: slot 1 gone, the survivors renumbered in the view's order (slot 2 first)
        comm.reform((2, 0), 1, renumber=True)
        y = np.array([float(comm.rank), float(slot)])
        comm.all_reduce(y, op="avg")
        z = np.full(2, float(slot))
        comm.broadcast(z, 0)
        out["epoch 1"] = (comm.rank, comm.world, y.tolist(), z.tolist())
        comm.reform((2, 0), 2)  # not renumbered: ranks stay the launch's slots, the group is the view's order
        w = np.full(2, 10.0 * slot)
        comm.broadcast(w, 2)
        comm.all_reduce(w, op="max")
        out["epoch 2"] = (comm.rank, w.tolist())
    q.put((slot, out))
    comm.transport.close()


@pytest.mark.timeout(90)
def test_native_collectives_on_epoch_groups_and_their_subgroups_equal_the_closed_forms():
    """Three processes, no default group: world all-reduce, a broadcast in the subgroup [2, 0] (rooted at global
    rank 2, its group rank 0), reduce, all-gather, reduce-scatter, all-to-all, barrier; then epoch 1 among slots
    (2, 0), renumbered 0 and 1, with an average and a broadcast from its rank 0; then epoch 2 among the same
    two without renumbering (ranks stay 2 and 0), a broadcast from rank 2."""
    got = dict(spawn_ranks(_collectives, 3, 3))
    for slot, out in got.items():
        assert out["all_reduce"] == [6.0] * 4
        assert out["broadcast"] == ([20.0] * 3 if slot in (0, 2) else [10.0] * 3)
        assert out["reduce"] == ([3.0, 3.0] if slot == 1 else [slot + 1.0] * 2)  # only dst holds the result
        assert out["all_gather"] == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
        assert out["reduce_scatter"] == [3.0 * slot + 3.0]  # sum over ranks r of (slot + r)
        assert out["all_to_all"] == [slot + 0.0, slot + 10.0, slot + 20.0]
    assert got[2]["epoch 1"] == (0, 2, [0.5, 1.0], [2.0, 2.0])
    assert got[0]["epoch 1"] == (1, 2, [0.5, 1.0], [2.0, 2.0])
    assert got[2]["epoch 2"] == (2, [20.0, 20.0]) and got[0]["epoch 2"] == (0, [20.0, 20.0])
    assert "epoch 1" not in got[1]


def test_the_native_backend_on_one_box_names_launch(capsys):
    assert main(["elastic", "--backend", "torch-native"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--backend torch-native" in err and "netmorph launch" in err and len(err.splitlines()) == 1, err
