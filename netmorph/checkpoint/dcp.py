"""torch.distributed.checkpoint's save and load, driven over netmorph's communicator.

``dcp.save`` is four steps around a process group (``_DistWrapper``): every rank's planner makes a local plan,
the coordinator gathers them and makes the global plan and the metadata, scatters each rank its part, every rank
writes its ``.distcp`` file, and the coordinator gathers the write results and writes ``.metadata``. The same
four steps run here with DCP's own classes -- a :class:`~torch.distributed.checkpoint.DefaultSavePlanner` whose
local plan is the rank's boxes (:mod:`netmorph.checkpoint.shards`) as ``SHARD`` write items, DCP's
``FileSystemWriter`` -- and netmorph's ``send``/``recv`` for the gathers (ledger phase ``checkpoint``), so that
a job on the local fabric writes the checkpoint a torch.distributed job writes:
``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` turns it into one state dict, and
``state["model"]`` loads into the 1-rank GPT with ``strict=True``.

A load needs no gathering: each rank reads the metadata, asks for the boxes it holds under the new layout
(``create_read_items_for_chunk_list``: DCP's resharding, the saved boxes that overlap each one) and reads them
into its flat buffers.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from pathlib import Path

import numpy as np
import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    ReadItem,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from netmorph.checkpoint.shards import NAMES, STEP, model_key
from netmorph.mesh.placement import parameters

TRAIN = ("step", "meta", "rng")  # train.*: the data position, the run's shape, the RNG


def tree(model) -> dict:
    """The checkpoint's nested state dict, its leaves ``None``: every name, for DCP's flattening map (the
    ``planner_data`` that lets ``dcp_to_torch_save`` nest the names again)."""
    keys = [model_key(p) for p in parameters(model)]
    return {
        "model": {k: None for k in keys},
        "optim": {"state": {k: {"exp_avg": None, "exp_avg_sq": None, "step": None} for k in keys}},
        "train": {k: None for k in TRAIN},
    }


class _Leaf:
    """A stand-in leaf (DCP flattens ``None`` away)."""


def _marked(t):
    return {k: _marked(v) for k, v in t.items()} if isinstance(t, dict) else _Leaf()


class BoxSavePlanner(DefaultSavePlanner):
    """DCP's default planner (its global plan, validation and metadata), with a local plan of this rank's boxes:
    ``tensors`` {(fqn, offsets): (the box's tensor, the whole shape)}; the coordinator also writes ``scalars``
    {fqn: 0-d tensor} and ``objects`` {fqn: picklable}."""

    def __init__(self, tensors: dict, scalars: dict, objects: dict):
        super().__init__(dedup_save_to_lowest_rank=False)
        self.tensors, self.scalars, self.objects = tensors, scalars, objects

    def create_local_plan(self) -> SavePlan:
        items = [
            WriteItem(
                index=MetadataIndex(fqn, torch.Size(off)),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    ChunkStorageMetadata(torch.Size(off), torch.Size(t.shape)),
                    TensorProperties.create_from_tensor(t),
                    torch.Size(shape),
                ),
            )
            for (fqn, off), (t, shape) in self.tensors.items()
        ]
        if self.is_coordinator:
            items += [
                WriteItem(
                    index=MetadataIndex(fqn, torch.Size([])),
                    type=WriteItemType.TENSOR,
                    tensor_data=TensorWriteData(
                        ChunkStorageMetadata(torch.Size([]), torch.Size([])),
                        TensorProperties.create_from_tensor(t),
                        torch.Size([]),
                    ),
                )
                for fqn, t in self.scalars.items()
            ]
            items += [WriteItem(index=MetadataIndex(fqn), type=WriteItemType.BYTE_IO) for fqn in self.objects]
        self.plan = SavePlan(items, planner_data=self.mappings)
        return self.plan

    def resolve_data(self, item: WriteItem):
        fqn = item.index.fqn
        if item.type == WriteItemType.BYTE_IO:
            out = io.BytesIO()
            torch.save(self.objects[fqn], out)
            return out
        if item.type == WriteItemType.TENSOR:
            return self.scalars[fqn]
        return self.tensors[(fqn, tuple(item.index.offset))][0]


def _send_object(comm, obj, dst: int) -> None:
    blob = np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy()
    comm.send(np.array([blob.size], dtype=np.int64), dst)
    comm.send(blob, dst)


def _recv_object(comm, src: int):
    n = np.zeros(1, dtype=np.int64)
    comm.recv(n, src)
    blob = np.empty(int(n[0]), dtype=np.uint8)
    comm.recv(blob, src)
    return pickle.loads(blob.tobytes())


def gather_object(comm, obj) -> list | None:
    """Every rank's ``obj`` on rank 0 (rank order), None elsewhere."""
    if comm.rank:
        _send_object(comm, obj, 0)
        return None
    return [obj] + [_recv_object(comm, r) for r in range(1, comm.world)]


def scatter_object(comm, objs: list | None):
    """Rank r gets ``objs[r]`` of rank 0's list."""
    if comm.rank:
        return _recv_object(comm, 0)
    for r in range(1, comm.world):
        _send_object(comm, objs[r], r)
    return objs[0]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def host_copy(boxes, flats: dict) -> dict:
    """{(fqn, offsets): (a contiguous host tensor of the box, the whole shape)} from the rank's flat buffers
    ``flats`` {(buffer, kind): numpy}: the copy a save writes from while training goes on (torchtitan's staging)."""
    return {(b.fqn, b.offsets): (torch.from_numpy(np.ascontiguousarray(b.view(flats[b.key]))), b.shape) for b in boxes}


class Planned:
    """A save after its plan exchange: this rank's writer, planner and final local plan (rank 0: the metadata)."""

    def __init__(self, writer, planner, plan, metadata):
        self.writer, self.planner, self.plan, self.metadata = writer, planner, plan, metadata


def plan_save(comm, path: Path, model, tensors: dict, t: int, train: dict) -> Planned:
    """The first two of DCP's save steps on every rank of ``comm``: the local plans (each rank its ``tensors``,
    :func:`host_copy`; rank 0 also Adam's step ``t`` and ``train`` {step, meta, rng}) gathered to rank 0, the
    global plan and the metadata made there and each rank's part scattered back."""
    writer = FileSystemWriter(str(path), sync_files=True, thread_count=1)
    coordinator = comm.rank == 0
    scalars = {STEP.format(model_key(p)): torch.tensor(float(t), dtype=torch.float64) for p in parameters(model)}
    objects = {f"train.{k}": v for k, v in train.items()}
    planner = BoxSavePlanner(tensors, scalars, objects)
    with comm.phase("checkpoint"):
        planner.set_up_planner(_marked(tree(model)), writer.storage_meta(), coordinator)
        writer.set_up_storage_writer(coordinator, rank=comm.rank, use_collectives=True)
        plans = gather_object(comm, writer.prepare_local_plan(planner.create_local_plan()))
        metadata = None
        if coordinator:
            plans, metadata = planner.create_global_plan(plans)
            plans = writer.prepare_global_plan(plans)
        mine = planner.finish_plan(scatter_object(comm, plans))
    return Planned(writer, planner, mine, metadata)


def write(planned: Planned, path: Path) -> tuple:
    """The third step, on one rank and no message: its file written and synced; (its write results, {file name:
    sha256})."""
    done = planned.writer.write_data(planned.plan, planned.planner)
    done.wait()
    results = done.value()
    files = sorted({r.storage_data.relative_path for r in results})
    return results, {f: sha256(path / f) for f in files}


def finish(planned: Planned, path: Path, everyone: list) -> dict:
    """The last step, on rank 0: ``.metadata`` from every rank's (write results, checksums); {file name: sha256}
    of every file of the checkpoint."""
    planned.writer.finish(planned.metadata, [r for r, _ in everyone])
    sums = {f: h for _, s in everyone for f, h in s.items()}
    sums[".metadata"] = sha256(path / ".metadata")
    return sums


class BoxLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner reading into this rank's boxes: ``dest`` {(fqn, offsets): writable tensor},
    the objects under ``train.*`` and one Adam step into ``found``."""

    def __init__(self, dest: dict, step_key: str):
        super().__init__()
        self.dest, self.step_key, self.found = dest, step_key, {}

    def create_local_plan(self) -> LoadPlan:
        md = self.metadata.state_dict_metadata
        chunks: dict = {}
        for (fqn, off), t in self.dest.items():
            chunks.setdefault(fqn, []).append(ChunkStorageMetadata(torch.Size(off), torch.Size(t.shape)))
        items = []
        for fqn, cs in chunks.items():
            items += create_read_items_for_chunk_list(fqn, md[fqn], cs)
        self.found[self.step_key] = torch.zeros((), dtype=torch.float64)
        items += create_read_items_for_chunk_list(
            self.step_key, md[self.step_key], [ChunkStorageMetadata(torch.Size([]), torch.Size([]))]
        )
        for k in TRAIN:
            fqn = f"train.{k}"
            if isinstance(md.get(fqn), BytesStorageMetadata):
                items.append(
                    ReadItem(
                        type=LoadItemType.BYTE_IO,
                        dest_index=MetadataIndex(fqn),
                        dest_offsets=torch.Size([0]),
                        storage_index=MetadataIndex(fqn),
                        storage_offsets=torch.Size([0]),
                        lengths=torch.Size([0]),
                    )
                )
        return LoadPlan(items)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        if index.fqn == self.step_key:
            return self.found[self.step_key]
        return self.dest[(index.fqn, tuple(index.offset))]

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        self.found[read_item.dest_index.fqn] = torch.load(value, weights_only=False)


def load(path: Path, model, dest: dict) -> dict:
    """Read the boxes ``dest`` {(fqn, offsets): writable tensor (a view into the rank's flat buffers)} from the
    checkpoint in ``path``; {"t": Adam's step, "step", "meta", "rng"} from it."""
    reader = FileSystemReader(str(path))
    metadata = reader.read_metadata()
    key = STEP.format(model_key(parameters(model)[0]))
    planner = BoxLoadPlanner(dest, key)
    planner.set_up_planner(_marked(tree(model)), metadata, False)
    reader.set_up_storage_reader(metadata, False)
    plan = reader.prepare_global_plan([reader.prepare_local_plan(planner.create_local_plan())])[0]
    reader.read_data(planner.finish_plan(plan), planner).wait()
    out = {k: planner.found.get(f"train.{k}") for k in TRAIN}
    out["t"] = int(planner.found[key].item())
    return out


def read_train(path: Path) -> dict:
    """The checkpoint's ``train.*`` objects (step, meta, rng), nothing else read."""
    reader = FileSystemReader(str(path))
    metadata = reader.read_metadata()
    planner = _TrainOnly()
    planner.set_up_planner({}, metadata, False)
    reader.set_up_storage_reader(metadata, False)
    plan = reader.prepare_global_plan([reader.prepare_local_plan(planner.create_local_plan())])[0]
    reader.read_data(planner.finish_plan(plan), planner).wait()
    return planner.found


class _TrainOnly(DefaultLoadPlanner):
    def create_local_plan(self) -> LoadPlan:
        self.found = {}
        md = self.metadata.state_dict_metadata
        return LoadPlan(
            [
                ReadItem(
                    type=LoadItemType.BYTE_IO,
                    dest_index=MetadataIndex(f"train.{k}"),
                    dest_offsets=torch.Size([0]),
                    storage_index=MetadataIndex(f"train.{k}"),
                    storage_offsets=torch.Size([0]),
                    lengths=torch.Size([0]),
                )
                for k in TRAIN
                if isinstance(md.get(f"train.{k}"), BytesStorageMetadata)
            ]
        )

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        self.found[read_item.dest_index.fqn[len("train.") :]] = torch.load(value, weights_only=False)


__all__ = [
    "NAMES",
    "finish",
    "gather_object",
    "host_copy",
    "load",
    "plan_save",
    "read_train",
    "scatter_object",
    "tree",
    "write",
]
