"""``netmorph elastic``'s job (``--job gpt``, the default): elastic data parallelism on ``netmorph train``'s GPT.

The same membership machinery as :mod:`netmorph.elastic.train` -- heartbeats, the store's views, the survivors'
agreement, φ-accrual fencing of a hung member, joiners admitted through the rendezvous -- around the trainer
every other part of netmorph runs (:func:`netmorph.parallel.hybrid.train_rank`: the GPT, DDP's bucketed gradient
all-reduce overlapped with the backward, the flat Adam), as torchelastic runs a DDP job. Every step the global
batch of ``global_batch`` sequences is split over the members (dp = the members, each holding a whole replica).

What the GPT trainer needs that the least-squares ring does not: a mesh of ``dp`` ranks numbered 0..dp-1. After a
loss the survivors -- whichever ranks they are, rank 0 included -- shrink the communicator to a new numbering
(``comm.reform(..., renumber=True)``: NCCL's ``ncclCommShrink``, ULFM's ``MPIX_Comm_shrink``), and a join grows
it (``ncclCommGrow``); the trainer then builds its groups on ``range(world)`` as at launch. The state a survivor
resumes from is its in-memory commit of the agreed step (the last two are kept: a survivor may be one step
ahead), re-padded for the new data-parallel degree (the flat buffer is padded to a multiple of it); a joiner
receives the parameters, Adam's moments and step from rank 0 by broadcast. A kill lands at the member's first
communication call of its step (its first gradient bucket: mid-backward); a hang SIGSTOPs it there.

``check``: the losses and the final parameters against the failure-free run on one process
(:func:`netmorph.parallel.run.reference`, the same global batches) -- to rounding, float64.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch

from netmorph.elastic.agent import FINISHED, HEARTBEAT, admit, admitted, agree, arm_faults, fence_hung, requested
from netmorph.elastic.cluster import confirm_lost, watch_members
from netmorph.elastic.heartbeat import Heartbeat, publish_pid
from netmorph.elastic.membership import Rendezvous
from netmorph.mesh.grid import Mesh
from netmorph.mesh.layout import Layout
from netmorph.mesh.placement import Shard, flat_offsets, rank_parameters, stage_elements
from netmorph.mesh.shape import ModelShape
from netmorph.parallel.config import TrainConfig
from netmorph.parallel.hybrid import train_rank
from netmorph.parallel.run import reference as one_rank
from netmorph.runtime.transport import PeerLost, PeerTimeout

PROGRESS = "netmorph/done-steps"  # a cluster's view rank 0 writes the steps done after each one
MODEL = ModelShape(layers=2, hidden=32, heads=2, seq=16, vocab=64)  # small: a step is tens of milliseconds


def train_config(cfg, world: int, steps: int, start: int) -> TrainConfig:
    """The trainer's config for ``steps`` steps from ``start`` on ``world`` members: ``cfg.tp``-way tensor parallel
    and ``cfg.pp`` pipeline stages inside each node (a replica is tp x pp of one node's workers:
    :func:`megatron_order` numbers them) and data parallel over the replicas, one sequence per microbatch, the
    global batch re-split over the replicas."""
    tp, pp = cfg_tp(cfg), cfg_pp(cfg)
    dp = world // (tp * pp)
    return TrainConfig.make(
        cfg.model or MODEL,
        tp=tp,
        pp=pp,
        dp=dp,
        microbatches=cfg.global_batch // dp,
        micro_batch_size=1,
        steps=steps,
        start_step=start,
        lr=cfg.lr,
        dtype="float64",
    )


def repad(state: dict, padded: int) -> dict:
    """A whole replica's state (every flat array as long as the buffer) for a buffer ``padded`` long: the padding
    after the last parameter is zeros in the parameters and in both moments, so cut or extend it."""

    def fit(a):
        a = np.asarray(a)
        return a[:padded] if len(a) >= padded else np.concatenate([a, np.zeros(padded - len(a), a.dtype)])

    return {"params": fit(state["params"]), "m": fit(state["m"]), "v": fit(state["v"]), "t": state["t"]}


class _Join(Exception):
    """Raised from a step's commit when the members agree that workers nobody scheduled asked to join."""

    def __init__(self, done: int, count: int):
        super().__init__(f"{count} worker(s) join after step {done}")
        self.done, self.count = done, count


def gpt_rank(comm, cfg):
    """One worker: train, and through deaths, hangs and joins agree on the view, shrink or grow the communicator
    and go on from the agreed step. Returns its record (as :func:`netmorph.elastic.train.rank_fn`'s).

    On the one-box launch the joiners are the launch's spare ranks, each at its scheduled step. A worker of a
    cluster (``comm.placement``: a node's torchrun job, :mod:`netmorph.elastic.cluster`) finds out instead: a
    worker nobody scheduled -- a node torchrun restarted, a node started later -- asks to join
    (:meth:`Rendezvous.request`), and at every step's end the members agree how many asked (an all-reduce of the
    count each read), so they admit them after the same step."""
    me = comm.slot
    cluster = getattr(comm, "placement", None) is not None
    clock = getattr(comm, "clock", time.monotonic)
    publish_pid(comm.store, me)
    heart = Heartbeat(comm.store, me, HEARTBEAT).start()
    rdzv = Rendezvous(comm.store, cfg.min_workers)
    view = (rdzv.current() if cluster else None) or rdzv.start(cfg.initial_members())
    dies_at, hangs_at = dict(cfg.kills).get(me), dict(cfg.hangs).get(me)
    if cluster and comm.placement.incarnation:
        dies_at = hangs_at = None  # a restarted worker: the faults were its predecessor's
    spares = {} if cluster else cfg.spares()
    n_params = numel(cfg)
    local = comm.placement.local_world if cluster else 1

    def order(members):  # the communicator's numbering of a view: whole tp x pp replicas on each node
        return megatron_order(members, local, cfg)

    pieces = None  # this rank's pieces of the model by name, after the last segment (for the whole)
    losses, events, timeline = {}, [], []
    state, step = None, 0
    if me in spares or (cluster and me not in view.members):  # a joiner: admitted, then handed the state
        view = (
            admitted(comm, rdzv, cfg, spares[me], renumber=True)
            if not cluster
            else requested(comm, rdzv, cfg, view, order)
        )
        if view is None:  # the job finished before it was admitted
            heart.stop()
            return None
        state, step = _handed(comm, None, len(view.members), cfg), view.first_step
    else:
        comm.reform(order(view.members), view.epoch, renumber=True)
    epochs = [(view.epoch, list(view.members), view.first_step)]
    dog = watch_members(comm, view.members, HEARTBEAT) if cluster else None
    joining = sorted({s for s in spares.values() if s > step})
    commits = {}
    saved = {step: state}  # Horovod Elastic's state.commit() every commit_every steps (and at a join)

    arm = arm_faults(comm, dies_at, hangs_at)

    def quorum(done):
        """How many asked to join, agreed by every member (an all-reduce of the count each read); None after the
        last step or off a cluster."""
        if not cluster or done >= cfg.steps:
            return None
        asked = np.array([len(rdzv.requests(view.epoch))], dtype=np.int64)
        with comm.phase("elastic.quorum"):
            comm.all_reduce(asked, op="max")
        return int(asked[0])

    def commit(done, snapshot, loss):
        voted = comm.node_transport is not None  # a failed step is left here, by all node-mates together: none kept
        if voted:
            asked = quorum(done)
            comm.should_commit()
        commits[done] = snapshot()
        for k in [k for k in commits if k < done - 1]:
            del commits[k]
        if done % cfg.commit_every == 0 and cfg.commit_every > 1:
            saved[done] = commits[done]
            for k in sorted(saved)[:-2]:
                del saved[k]
        if loss is not None:
            losses[done - 1] = loss
        if events and "resumed_at" not in events[-1]:
            events[-1]["resumed_at"] = clock()
        timeline.append((clock(), done, len(view.members)))
        if cluster and comm.rank == 0:
            comm.store.set(PROGRESS, str(done))  # how far the job is (netmorph launch starts a late node by it)
        if not voted:
            asked = quorum(done)
        if asked is not None and whole_nodes(rdzv.requests(view.epoch, asked), comm.placement.local_world):
            raise _Join(done, asked)
        arm(done)

    def reformed(new_view):
        if dog is not None:  # watch the new members, forget the gone
            dog.forget([m for m in view.members if m not in new_view.members])
            dog.add([m for m in new_view.members if m not in view.members and m != me])
        return new_view

    def grow(new, state, step, t_start):
        """Admit ``new`` after ``step`` (ncclCommGrow's numbering), hand them ``state``; the view and the state."""
        new_view = reformed(admit(comm, rdzv, view, new, step, cfg, renumber=True, order=order))
        state = _handed(comm, state, len(new_view.members), cfg)
        saved.clear()
        saved[step] = state
        epochs.append((new_view.epoch, list(new_view.members), new_view.first_step))
        events.append(
            {
                "kind": "join",
                "ranks": new,
                "epoch": new_view.epoch,
                "detected_at": t_start,
                "agreed_at": clock(),
                "step": step,
                "steps_redone": 0,
            }
        )
        return new_view, state

    while step < cfg.steps:
        if joining and step == joining[0]:
            joining.pop(0)
            view, state = grow([r for r, s in spares.items() if s == step], state, step, clock())
            continue
        end = joining[0] if joining else cfg.steps
        tc = train_config(cfg, len(view.members), end - step, step)
        commits = {step: state}
        arm(step)
        try:
            padded = _padded(numel(cfg, stage(comm, cfg)), len(view.members) // cfg_mp(cfg))
            init = None if state is None else {comm.rank: repad(state, padded)}
            out = train_rank(comm, tc, None, init, commit=commit)
            state, step, pieces = out.state.flat, end, out.state.pieces
        except _Join as j:  # asked to join: admit them after the step all finished
            t_start = clock()
            step = j.done
            new = whole_nodes(rdzv.requests(view.epoch, j.count), comm.placement.local_world)
            view, state = grow(new, commits[j.done], step, t_start)
        except (PeerLost, PeerTimeout) as e:
            t_detect = clock()
            comm.faults.clear()
            hung_at = fence_hung(comm, view, cfg) if isinstance(e, PeerTimeout) else None
            confirm_lost(comm, e)  # a closed connection from a peer that stopped beating: gone, now
            before, done = set(view.members), max(commits)
            new_view, _ = agree(comm, rdzv, view, done, cfg)
            if me not in new_view.members:
                heart.stop()
                return None
            view = reformed(new_view)
            agreed = first = view.first_step
            state = commits[agreed]  # the agreed step's commit (the last two are kept)
            if cfg.commit_every > 1:  # Horovod: back to the last commit at or before it (all members
                first = max(k for k in saved if k <= agreed)  # hold the same: every K steps, at each join)
                state = saved[first]
            comm.reform(order(view.members), view.epoch, renumber=True)
            epochs.append((view.epoch, list(view.members), agreed))
            lost = sorted(before - set(view.members))
            events.append(
                {
                    "kind": _kind(comm, e, lost),
                    "epoch": view.epoch,
                    "lost": lost,
                    "failed_at": hung_at,
                    "detected_at": t_detect,
                    "agreed_at": clock(),
                    "step": agreed,
                    "steps_redone": agreed - first + 1,
                }
            )
            step = first
    if dog is not None:
        dog.stop()
    if cluster:
        comm.store.set(FINISHED, "1")
    heart.stop()
    w = (
        None
        if state is None
        else whole(comm, cfg, pieces)
        if cfg_mp(cfg) > 1
        else np.asarray(state["params"])[:n_params]
    )
    rec = {"w": w, "losses": losses, "events": events, "epochs": epochs, "timeline": timeline}
    if getattr(comm, "asked_at", None) is not None and timeline:  # a joiner: from asking to its first step
        rec["healed"] = {"asked_at": comm.asked_at, "first_step_at": timeline[0][0]}
    return rec


def whole_nodes(slots, local_world: int) -> list:
    """The slots among ``slots`` whose whole node asked (every local rank of one incarnation of a node: a node
    joins as the torchrun job it is), in slot order: each node's workers side by side, local rank 0 first, so that
    a tensor-parallel group of the grown view is one node's."""
    groups = {}
    for s in slots:
        groups.setdefault(s // local_world, []).append(s)
    return sorted(s for s in slots if len(groups[s // local_world]) == local_world)


def _kind(comm, e, lost) -> str:
    """kill or hang: a lost member that stamped its stop (``netmorph/hung/``) hung; on the fabric a PeerTimeout."""
    if isinstance(e, PeerTimeout):
        return "hang"
    if getattr(comm, "placement", None) is not None and any(comm.store.check([f"netmorph/hung/{r}"]) for r in lost):
        return "hang"
    return "kill"


def cfg_tp(cfg) -> int:
    return getattr(cfg, "tp", 1)


def cfg_pp(cfg) -> int:
    return getattr(cfg, "pp", 1)


def cfg_mp(cfg) -> int:
    """A replica's workers: tp x pp, all on one node."""
    return cfg_tp(cfg) * cfg_pp(cfg)


def megatron_order(members, local_world: int, cfg) -> tuple:
    """The members (slots) in the numbering the trainer's mesh wants when each node's workers hold whole
    replicas of tp x pp: Megatron orders ranks tp-dp-pp (pp outermost), so tensor rank t of stage p in replica d
    is rank ``t + tp·(d + D·p)`` of D replicas. A node's local rank l is ``t = l % tp``, ``p = l // tp % pp``,
    its replica ``l // (tp·pp)`` of the node's; the nodes in the view's order (the members before the joiners,
    as ``ncclCommGrow`` appends them), so the first replica of every shard is a survivor's. Without pipeline
    stages this is the view's own order (each node's workers side by side). tp and pp are ``cfg``'s."""
    members = tuple(members)
    if cfg_pp(cfg) == 1:
        return members
    mp = cfg_mp(cfg)
    replicas = []
    for node in dict.fromkeys(s // local_world for s in members):  # a node's incarnation: its slots' block
        mine = sorted(s for s in members if s // local_world == node)
        replicas += [mine[i : i + mp] for i in range(0, len(mine), mp)]
    out = [0] * len(members)
    # replica d's ranks in ascending order are its (p, t) in the order of a node's local ranks: p·tp + t
    for rep, ranks in zip(replicas, _mesh(len(members), cfg).groups_over(["tp", "pp"])):
        for slot, r in zip(rep, ranks):
            out[r] = slot
    return tuple(out)


def _mesh(world: int, cfg) -> Mesh:
    """The trainer's mesh of ``world`` ranks for ``cfg``'s tp and pp (dp: the replicas), Megatron's order."""
    return Mesh(world, tp=cfg_tp(cfg), pp=cfg_pp(cfg))


def stage(comm, cfg) -> int:
    """This rank's pipeline stage in :func:`megatron_order`'s numbering."""
    return _mesh(comm.world, cfg).coords(comm.rank)["pp"]


def numel(cfg, pp_rank: int = 0) -> int:
    """A rank's flat buffer's length before padding: the GPT's parameter count (a dense model: one replica), or
    with tensor parallelism and pipeline stages its stage's shard's (every tp rank of a stage holds the same
    count: split weights in equal parts, the replicated ones whole)."""
    model = cfg.model or MODEL
    if cfg_mp(cfg) == 1:
        return model.params()
    return stage_elements(model, train_config(cfg, cfg_mp(cfg), 1, 0).layout, pp_rank)[0]


def whole(comm, cfg, pieces: dict) -> np.ndarray:
    """The whole model's flat parameters from this rank's pieces: every rank's pieces all-gathered over its
    replica's tp x pp ranks (one call: each rank's pieces flattened side by side, padded to the longest stage's)
    and put back together -- the tp shards along their split dimension, the stages' parameters by name (the tied
    embedding, on the first and the last stage, from the first) -- in the 1-rank buffer's order: what
    ``--check`` compares."""
    tp, pp, mp = cfg_tp(cfg), cfg_pp(cfg), cfg_mp(cfg)
    model = cfg.model or MODEL
    layout = train_config(cfg, mp, 1, 0).layout
    longest = max(numel(cfg, p) for p in range(pp))
    mine = np.zeros(longest)
    flat = np.concatenate([p.numpy().reshape(-1) for p, _ in pieces.values()])
    mine[: len(flat)] = flat
    out = np.empty(mp * longest)
    with comm.phase("elastic.final"):  # the replica's ranks in ascending order: stage-major, tp rank within
        replica = next(g for g in _mesh(comm.world, cfg).groups_over(["tp", "pp"]) if comm.rank in g)
        comm.all_gather_into_tensor(out, mine, comm.new_group(replica))
    parts = out.reshape(pp, tp, longest)
    full = {}
    for p in range(pp):
        at = 0
        for row in rank_parameters(model, layout, p):
            shape = row.local_shape(tp)
            n = int(np.prod(shape))
            shards = [torch.from_numpy(parts[p, k, at : at + n].reshape(shape)) for k in range(tp)]
            dim = row.placement.dim if isinstance(row.placement, Shard) else None
            full.setdefault(row.name, shards[0] if dim is None else torch.cat(shards, dim=dim))
            at += n
    one = rank_parameters(model, Layout(), 0)
    return np.concatenate([full[row.name].reshape(-1).numpy() for row in one])


def _padded(numel: int, dp: int) -> int:
    return flat_offsets([numel], dp)[1]


def _handed(comm, state, world: int, cfg) -> dict:
    """Every member of a grown view: the first replica of each (tp, pp) shard (rank 0 without model parallelism;
    a survivor: the joiners are numbered after the members) broadcasts its parameters, Adam's moments and step to
    the others holding the same shard (the joiners hold nothing: what they would otherwise read from a
    checkpoint), re-padded for the ``world // (tp·pp)`` replicas."""
    mesh = _mesh(world, cfg)
    holders = mesh.group("dp", comm.rank)  # this (tp, pp) shard's replicas, the first a survivor's
    n, root = _padded(numel(cfg, mesh.coords(comm.rank)["pp"]), len(holders)), holders[0]
    buf = np.zeros(3 * n + 1)
    if state is not None and comm.rank == root:
        s = repad(state, n)
        buf[:] = np.concatenate([s["params"], s["m"], s["v"], [s["t"]]])
    with comm.phase("elastic.join"):
        comm.broadcast(buf, root, comm.new_group(holders) if cfg_mp(cfg) > 1 else None)
    comm.should_commit()  # a node's workers agree that every one of them was handed its shard
    if state is not None and comm.rank != root:
        return state
    return {"params": buf[:n], "m": buf[n : 2 * n], "v": buf[2 * n : 3 * n], "t": int(buf[-1])}


def reference(cfg) -> tuple[list, np.ndarray]:
    """The failure-free run on one process: per-step losses and the final flat parameters."""
    losses, weights, _ = one_rank(train_config(replace(cfg, tp=1, pp=1) if cfg_mp(cfg) > 1 else cfg, 1, cfg.steps, 0))
    return losses, np.concatenate([np.asarray(v).reshape(-1) for v in weights.values()])
