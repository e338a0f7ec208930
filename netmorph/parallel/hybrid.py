"""3D parallelism (PTD-P): tensor x pipeline x data parallel, with ZeRO over the data-parallel group.

Megatron-LM's training loop on netmorph's mesh (tp innermost, order tp-cp-ep-dp-pp):
each rank builds its model chunks (layers of its pipeline stage, sharded over its
TP group), lays its parameters out in one flat buffer, and per step runs the
pipeline schedule over its microbatches, then synchronises gradients -- SP's
replicated parameters over TP, the tied word embedding between the first and last
stage (Megatron's embedding group), the rest over DP (all-reduce, or ZeRO's
reduce-scatter + all-gather) -- and steps Adam.

:func:`train_rank` is the SPMD function every rank runs (under ``launch`` or
``torchrun``); :func:`reference` is the 1-rank run every layout must equal.
"""

from __future__ import annotations

import bisect
import time

import torch

from netmorph.models.gpt import synthetic_batch
from netmorph.parallel.config import DTYPES, TrainConfig
from netmorph.parallel.groups import RankGroups, build_chunks, rank_groups, replicas, sync_replicated
from netmorph.parallel.phases import split_step
from netmorph.parallel.pipeline import Executor, schedule
from netmorph.parallel.replica import rank_state
from netmorph.parallel.results import RankReport, RankState
from netmorph.parallel.slots import Hooks, device_ms
from netmorph.parallel.state import named_pieces
from netmorph.parallel.traffic import counted_reductions, expert_traffic, predicted


def _routing(moe: list, lay: RankGroups, records, a2a_s: float, world: int) -> dict:
    """What this rank's MoE layers did in one step: per layer, the assignments routed to and kept by each
    expert and the rows sent to each global rank (summed over microbatches); the mean over microbatches of the
    load-balancing and z losses summed over the layers; the seconds in the all-to-alls; and the ledger's bytes
    per all-to-all phase and destination ({phase: {dst: bytes}})."""
    m = max(1, len(moe[0].stats))
    links = {}
    for rec in records:
        if rec.phase and rec.phase.startswith("moe.") and rec.phase not in ("moe.counts", "moe.cp"):
            to = links.setdefault(rec.phase, {})
            to[rec.dst] = to.get(rec.dst, 0) + rec.bytes
    send = []
    for b in moe:
        row = [0] * world
        for st in b.stats:
            for j, n in enumerate(st.send_rows):
                row[lay.ep_group.ranks[j]] += n
        send.append(row)
    return {
        "layers": [b.layer for b in moe],
        "routed": [sum(st.routed for st in b.stats).tolist() for b in moe],
        "kept": [sum(st.kept for st in b.stats).tolist() for b in moe],
        "send": send,
        "aux": sum(a for b in moe for a, _ in b.aux) / m,
        "z": sum(z for b in moe for _, z in b.aux) / m,
        "a2a_s": a2a_s,
        "links": links,
    }


def train_rank(comm, cfg: TrainConfig, progress=None, inits=None, commit=None) -> RankReport:
    """One rank's part of ``cfg.steps`` training steps; what it measured (``progress``: a
    :class:`~netmorph.runtime.progress.ProgressCounter` bumped once per step). ``inits[rank]``, when given,
    is the rank's state to start from -- {"params": its flat buffer, "m", "v": Adam's moments over its
    range, "t": Adam's step}, as ``flat_state`` returns it or :func:`netmorph.morph.reshard.run_rank`
    makes it for this layout. ``commit(steps done, state(), its loss or None)`` after each step, when given."""
    torch.manual_seed(0)
    torch.set_num_threads(1)  # torchrun's OMP_NUM_THREADS=1: one process per core, no spinning pools
    split = cfg.layout
    lay = rank_groups(comm, cfg)
    dtype = DTYPES[cfg.dtype]
    chunks, tp = build_chunks(comm, cfg, lay, dtype)
    device = torch.device(comm.device)  # cuda:LOCAL_RANK under torchrun with GPUs (NCCL), else the CPU
    for c in chunks:
        c.to(device)  # the same initial weights on every device: drawn on the CPU
    reps = replicas(comm, cfg, lay, chunks, device, dtype)
    dense = reps[0]
    isz, gsz = cfg.wire_sizes()[:2]
    ck = cfg.checkpoint
    if ck.load and inits is None:  # a resumed run: this rank's boxes, read under its layout
        from netmorph.checkpoint.training import Resume

        inits = Resume(cfg)
    if inits is not None:
        init = inits[comm.rank]
        dense.load(init)
        if len(reps) > 1:  # a mixture of experts' expert buffer (a checkpoint's)
            reps[1].load(init["experts"])
    saver = None
    if ck.save:
        from netmorph.checkpoint.training import Saver

        saver = Saver(comm, cfg)
    moe = [b for c in chunks for b in c.blocks if b.moe is not None]
    for b in moe:
        b.aux_scale = 1.0 / split.microbatches  # each microbatch's load-balancing loss, averaged
    slots = schedule(split.pipeline_schedule, split.pp, split.microbatches, split.interleave)[lay.pp_rank]
    T = cfg.model.seq // split.cp // (split.tp if tp.sequence_parallel else 1)
    # under cp this rank's positions of every sequence (a head and a tail chunk), its tokens and targets alike
    mine = tp.cp.positions(cfg.model.seq) if tp.cp is not None else None
    ex = Executor(
        comm,
        lay.pp_group,
        chunks,
        split.interleave,
        (T, split.batch.micro_batch_size, cfg.model.hidden),
        dtype,
        tp.weight_store,
        split.v_shaped,
    )
    last_backward = max(i for i, s in enumerate(slots) if s.kind == "B")
    is_last_stage = any(c.is_last for c in chunks)  # pp rank p - 1, or 0 in a V (the loss)
    reads_data = any(c.is_first or c.is_last for c in chunks)
    emulated = device_ms(cfg, sum(len(c.blocks) for c in chunks), any(c.is_last for c in chunks))
    losses, times, peaks, bounds, idle, busy, routed, experts_log, phases = [], [], [], [], [], [], [], [], []
    saved = 0
    try:
        for step in range(cfg.steps):
            t0 = time.perf_counter()
            for r in reps:
                r.zero_grad()
            for b in moe:
                b.stats.clear()
                b.aux.clear()
            at, a2a = len(comm.ledger.records), sum(b.moe.clock[0] for b in moe)
            base = (
                ((cfg.start_step + step) * split.dp + lay.dp_rank) * split.microbatches * split.batch.micro_batch_size
            )

            # the step's samples, drawn once (a data loader's batch) and only where a stage reads them: tokens
            # on the first virtual stage, targets on the last -- Megatron's get_batch gives a middle stage none
            # (drawing a microbatch's walk costs more than a middle stage's layer here)
            mbs = split.batch.micro_batch_size
            samples = range(base, base + mbs * split.microbatches)
            batch = (
                tuple((t if mine is None else t[mine]).to(device) for t in synthetic_batch(cfg.model, samples))
                if reads_data
                else None
            )

            def inputs(i, step=step, batch=batch):
                for b in moe:  # the global microbatch index: seeds the router's jitter
                    b.key = ((cfg.start_step + step) * split.dp + lay.dp_rank) * split.microbatches + i
                if batch is None:
                    return None, None
                return tuple(t[:, i * mbs : (i + 1) * mbs].contiguous() for t in batch)

            # the emulated compute is a stage's per microbatch: its interleaved chunks share it
            # what autograd saves is measured on the first step (a router's varies: on every step with experts);
            # its hook costs a Python call per saved tensor, which the later steps' times are spared
            hooks = Hooks(
                reps,
                last_backward,
                emulated / split.interleave,
                measure=step == 0 or bool(moe),
                split=tp.weight_store is not None,
            )
            t_pipe = time.perf_counter()
            mb_losses, peak = ex.run(slots, inputs, split.microbatches, hooks)
            t_pipe = time.perf_counter() - t_pipe
            idle.append(1 - hooks.busy / t_pipe if t_pipe > 0 else 0.0)
            busy.append(hooks.busy)
            for r in reps:
                r.finish()
            sync_replicated(comm, lay, tp, chunks, dense.flat)
            t_opt = time.perf_counter()
            for r in reps:
                r.step()
            t_opt = (t_opt, time.perf_counter())
            if moe:  # what the router sent this step: the all-to-alls' closed form
                routed.append(
                    {ph: v[0] for ph, v in expert_traffic(cfg, 0, 1, isz, moe, lay.ep_rank, gsz, lay.cp_rank).items()}
                )
                experts_log.append(
                    _routing(moe, lay, comm.ledger.records[at:], sum(b.moe.clock[0] for b in moe) - a2a, comm.world)
                )
            loss = torch.tensor([sum(mb_losses)], dtype=torch.float64, device=device)
            if is_last_stage and lay.tp_rank == 0:
                with comm.phase("metrics"):
                    comm.all_reduce(loss, group=lay.dp_group)
            losses.append(float(loss) / (split.dp * split.cp * split.microbatches))  # every token's mean
            if saver is not None:  # a checkpoint when one is due, in the step's time (async: its staging)
                saver.commit(cfg.start_step + step + 1, lambda: rank_state(reps))
            t1 = time.perf_counter()
            times.append(t1 - t0)
            bounds.append((t0, t1))
            phases.append(split_step(comm.ledger.records[at:], (t0, t1), [sp[3:] for sp in ex.spans], t_opt))
            peaks.append(peak)
            saved = max(saved, hooks.saved_per_microbatch)
            if progress is not None:
                progress.bump(comm.rank)
            if commit is not None:  # an in-memory commit (Horovod Elastic's): a loss redoes one step at most
                commit(
                    cfg.start_step + step + 1, dense.state, losses[-1] if is_last_stage and lay.tp_rank == 0 else None
                )
        if saver is not None:
            saver.wait()
        for r in reps:
            r.gather()
        state = named_pieces(chunks)
        flat_state = dense.state()
    finally:
        if saver is not None and saver.thread is not None:
            saver.thread.join()  # a background save ends before its buffers go
        for r in reps:
            r.close()
    mem = {k: sum(r.bytes()[k] for r in reps) for k in ("params", "grads", "optimizer")}
    # activations: what autograd saved for one microbatch's backward, times the most microbatches held
    mem["activations_peak"] = None if split.zero >= 3 else saved * max(peaks)
    # a zero-bubble schedule's weight-gradient stash: the most its store held at once (inputs, output gradients)
    mem["wgrad_stash_peak"] = tp.weight_store.peak_bytes if tp.weight_store is not None else 0
    flat = dense.flat
    pred = predicted(
        cfg,
        lay.pp_rank,
        flat.padded,
        isz,
        any(c.is_first for c in chunks),
        any(c.is_last for c in chunks),
        sum(len(c.blocks) for c in chunks),
        sum(p.numel() for p in tp.replicated()),
        moe_layers=len(moe),
        tp_rank=lay.tp_rank,
    )
    if moe:
        pred.update(
            expert_traffic(cfg, reps[1].flat.padded, lay.edp_group.size(), isz, moe, lay.ep_rank, gsz, lay.cp_rank)
        )
    pred.update(counted_reductions(cfg, reps, comm.rank, gsz))
    return RankReport(
        comm.rank,
        split.coords(comm.rank),
        losses=losses if is_last_stage and lay.tp_rank == 0 else None,
        step_times=times,
        step_bounds=bounds,
        idle_fraction=idle,
        in_flight_peak=max(peaks),
        memory_bytes=mem,
        timeline=ex.spans,
        bytes_by_step=_bytes_by_step(comm.ledger, bounds),
        predicted=pred,
        params=flat.numel,
        state=RankState(state, flat_state, dense.index()),
        busy_s=busy,
        phases_s=phases,
        ledger=comm.ledger.records if cfg.trace else None,
        predicted_by_step=routed or None,
        experts=experts_log or None,
        checkpoints=saver.log if saver is not None and saver.log else None,
    )


def _bytes_by_step(ledger, bounds) -> list:
    """{phase: bytes this rank sent} for each step, from the ledger's timestamps."""
    out = [{} for _ in bounds]
    starts = [b[0] for b in bounds]
    for rec in ledger.records:
        k = bisect.bisect_right(starts, rec.t0) - 1
        if 0 <= k < len(out) and rec.t0 <= bounds[k][1]:
            ph = rec.phase or "(untagged)"
            out[k][ph] = out[k].get(ph, 0) + rec.bytes
    return out
