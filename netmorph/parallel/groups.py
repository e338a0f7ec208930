"""One rank's part of a training layout: its place in the mesh and its process groups, its model chunks, and the
flat replicas its gradients reduce over -- what Megatron's ``initialize_model_parallel``, ``get_model`` and
``DistributedDataParallel`` set up before the first step, and the gradient synchronisations outside the data-
parallel reduction (sequence parallelism's replicated parameters over tp, the tied embedding over its group).

Context parallelism (Megatron's ``--context-parallel-size``) is one more mesh dimension, cp, beside tp: each cp
rank of a group holds seq/cp positions of every sequence, its model chunks are the same weights, and its
gradients reduce with the data-parallel ones over the dp x cp ranks (Megatron's
``data_parallel_group_with_cp``), which the dense replica and ZeRO's shards span.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from netmorph.mesh import DeviceMesh
from netmorph.mesh.layout import Layout
from netmorph.mesh.placement import rank_parameters
from netmorph.mesh.settings import SPLIT_BACKWARD
from netmorph.mesh.shape import ModelShape
from netmorph.models.gpt import GPTStage
from netmorph.models.weight_grad import WeightGradStore
from netmorph.parallel.context_parallel import ContextParallel
from netmorph.parallel.replica import Replica
from netmorph.parallel.tensor_parallel import TensorParallel


@dataclass
class RankGroups:
    """This rank's place in the mesh and its groups (objects, no globals). ``dp_group`` holds every replica of
    the dense parameters (the dp x cp ranks of one tp and pp coordinate); with experts, ``ep_group`` exchanges
    tokens and ``edp_group`` holds the replicas of this rank's experts (Megatron's expert_data_parallel_group,
    cp x dp / ep ranks); ``cp_group`` splits each sequence."""

    tp_group: object
    pp_group: object
    dp_group: object
    emb_group: object | None
    tp_rank: int
    pp_rank: int
    dp_rank: int
    ep_group: object = None
    edp_group: object = None
    ep_rank: int = 0
    cp_group: object = None
    cp_rank: int = 0


def rank_groups(comm, cfg) -> RankGroups:
    lay = cfg.layout
    dm = DeviceMesh(comm, tp=lay.tp, pp=lay.pp, dp=lay.dp // lay.ep, ep=lay.ep, cp=lay.cp)
    me = comm.rank
    emb = None
    if lay.pp > 1 and not lay.v_shaped:  # the tied embedding's group: each pipeline's first and last stage
        for ranks in dm.mesh.groups("pp"):
            g = comm.new_group([ranks[0], ranks[-1]])
            if me in (ranks[0], ranks[-1]):
                emb = g
    dp = _replica_group(comm, dm, ("cp", "ep", "dp"))  # the dense parameters': dp x cp x ep of one (tp, pp)
    edp = _replica_group(comm, dm, ("cp", "dp"))  # an expert's: cp x dp/ep of one (tp, ep, pp)
    c = lay.coords(me)
    return RankGroups(dm["tp"], dm["pp"], dp, emb, c["tp"], c["pp"], c["dp"], dm["ep"], edp, c["ep"], dm["cp"], c["cp"])


def _replica_group(comm, dm, dims) -> object:
    """The group of this rank's replicas over ``dims``: the mesh's dp group where only dp is wider than 1, else
    one group spanning every dimension of ``dims`` wider than 1 (Megatron's ``data_parallel_group_with_cp``), made
    on every rank for every coordinate, as torch.distributed's ``new_group`` wants."""
    spans = [d for d in dims if dm.mesh.size(d) > 1]
    if spans in ([], ["dp"]):
        return dm["dp"]
    mine = None
    for ranks in dm.mesh.groups_over(spans):
        g = comm.new_group(ranks)
        if comm.rank in ranks:
            mine = g
    return mine


def build_chunks(comm, cfg, lay: RankGroups, dtype):
    """This rank's model chunks: chunk c is virtual stage c·pp + pp_rank (in a V chunk 1 is 2·pp - 1 - pp_rank)."""
    k = cfg.layout.knobs
    cp = ContextParallel(comm, lay.cp_group, k.cp_comm_type, algos=cfg.algos) if cfg.layout.cp > 1 else None
    store = WeightGradStore() if cfg.layout.pipeline_schedule in SPLIT_BACKWARD else None  # B and W apart
    tp = TensorParallel(
        comm, lay.tp_group, k.sequence_parallel, ep_group=lay.ep_group, algos=cfg.algos, cp=cp, weight_store=store
    )
    chunks = [
        GPTStage(cfg.model, *cfg.layout.chunk_layers(cfg.model.layers, lay.pp_rank, c), tp, dtype, cfg.router)
        for c in range(cfg.layout.interleave)
    ]
    return chunks, tp


def overlaps_dp(layout: Layout, model: ModelShape) -> bool:
    """The trainer overlaps its gradient buckets with the backward (DDP's hooks) only where nothing else runs
    on the rank's communicator meanwhile: no tp, no cp, no pp, no experts; elsewhere the buckets go after it."""
    return layout.knobs.dp_overlap and layout.tp == 1 and layout.cp == 1 and layout.pp == 1 and not model.experts


def replicas(comm, cfg, lay: RankGroups, chunks, device, dtype) -> list:
    """The dense parameters' :class:`Replica` over dp x cp, and with experts the experts' over the expert
    data-parallel group, each in the placement table's order."""
    split = cfg.layout
    rows = rank_parameters(cfg.model, split, lay.pp_rank)
    params = [p for c in chunks for p in c.parameters()]
    dense = [(r.name, p) for r, p in zip(rows, params) if not r.is_expert]
    experts = [(r.name, p) for r, p in zip(rows, params) if r.is_expert]
    overlap = overlaps_dp(split, cfg.model)
    kw = dict(
        zero=split.zero,
        lr=cfg.lr,
        dtype=dtype,
        device=device,
        dp_mode=cfg.dp_mode,
        bucket_mb=cfg.bucket_mb,
        algos=cfg.algos,
    )
    if cfg.mixed:  # float32 main gradients and master state; the reduction's wire dtype
        kw.update(master=torch.float32, wire=torch.float32 if cfg.grad_reduce_dtype == "float32" else torch.bfloat16)
    out = [Replica(comm, lay.dp_group, [p for _, p in dense], [n for n, _ in dense], overlap=overlap, **kw)]
    if experts:
        out.append(
            Replica(
                comm,
                lay.edp_group,
                [p for _, p in experts],
                [n for n, _ in experts],
                phase="edp",
                scale=lay.edp_group.size() / (split.dp * split.cp),
                **kw,
            )
        )
    return out


def sync_replicated(comm, lay: RankGroups, tp, chunks, flat) -> None:
    """SP's replicated parameters over TP; the tied word embedding between first and last stage (on one rank in a
    V: its two copies summed)."""
    rep = tp.replicated()
    if rep:
        # coalesced into one all-reduce, as Megatron's _allreduce_layernorm_grads flattens them: one message
        # round instead of one per LayerNorm weight and bias
        spans = [flat.span(p) for p in rep]
        both = torch.cat([flat.grad[lo:hi] for lo, hi in spans])
        with comm.phase("tp.sp-grads"):
            comm.all_reduce(both, group=lay.tp_group, algo=tp.algos.tp)
        at = 0
        for lo, hi in spans:
            flat.grad[lo:hi].copy_(both[at : at + hi - lo])
            at += hi - lo
    tied = [c for c in chunks if hasattr(c, "wte") and (c.is_first or c.is_last)]
    if len(tied) == 2:  # a V: the first stage and the last are this rank's two chunks, summed here
        (a, b), (c, d) = flat.span(tied[0].wte), flat.span(tied[1].wte)
        flat.grad[a:b].add_(flat.grad[c:d])
        flat.grad[c:d].copy_(flat.grad[a:b])
    elif lay.emb_group is not None:
        for c in tied:
            lo, hi = flat.span(c.wte)
            with comm.phase("pp.emb"):
                comm.all_reduce(flat.grad[lo:hi], group=lay.emb_group, algo=tp.algos.pair)
