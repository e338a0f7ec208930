"""Run a training layout on real ranks and summarise it: losses, traffic against the closed forms,
the pipeline's in-flight microbatches and bubble, memory, and the 1-rank reference (a :class:`TrainSummary`).

What ``netmorph train`` prints and ``--json`` returns; the SPMD rank function is
:func:`netmorph.parallel.hybrid.train_rank` (run by ``launch`` here, or by every
process of a torchrun job).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, fields

from netmorph.models.gpt import GPTStage, synthetic_batch
from netmorph.parallel.baseline import abc_rank
from netmorph.parallel.baseline import summarise as compare_baselines
from netmorph.parallel.config import DTYPES, TrainConfig
from netmorph.parallel.flat import Adam, FlatParams
from netmorph.parallel.hybrid import train_rank
from netmorph.parallel.phases import step_parts
from netmorph.parallel.pipeline import theory
from netmorph.parallel.results import RankReport
from netmorph.parallel.state import assemble, named_pieces
from netmorph.runtime.launch import launch
from netmorph.runtime.progress import ProgressCounter


@dataclass
class TrainSummary:
    """A training job's result, from every rank's :class:`RankReport` (:func:`netmorph.parallel.run.summarise`).

    Per-phase figures are bytes each rank sent per step, the maximum over ranks, beside the closed form."""

    config: TrainConfig  # what ran: the model, the layout and the run's options
    backend: str
    losses: list  # per step
    step_times_s: list  # per step, the slowest rank's
    step_time_s: float  # the median after the first step
    tokens_per_s: float
    bytes_per_rank_by_phase: dict  # {phase: measured} (a routed phase: its last step)
    predicted_bytes_per_rank_by_phase: dict
    traffic_exact: dict  # {phase: every rank sent its closed form, every step}
    formulas: dict  # {phase: the closed form, as text}
    in_flight_peak: dict  # {pp rank: the most microbatches it held}
    bubble_fraction: dict  # {"theory": (p-1)/(v·m+p-1), "measured": the share of time waited}
    memory_bytes: dict  # params, grads, optimizer, activations_peak: the most loaded rank
    timeline: dict  # {rank: its last step's slots}, the ranks of tp 0 and dp 0
    pp_rank: dict  # {rank: its pipeline stage}
    step_bytes_by_phase: list  # per step {phase: bytes}
    # the busiest rank's step by what it did (compute, tp, ep, dp, optimizer, rest), the mean after the first step
    step_parts: dict
    experts_by_rank: dict | None = None  # with experts: {rank: (tp, pp, dp, the router's log)}
    bytes_by_rank: list | None = None  # with experts: every rank's bytes by step
    reference_losses: list | None = None  # with --check: the 1-rank run
    reference_kept: list | None = None  # with --check and experts: the 1-rank run's kept tokens by step
    max_rel_loss_diff: float | None = None
    max_abs_weight_diff: float | None = None
    trace: dict | None = None  # with --trace: the last step as Trace Event Format
    baseline: dict | None = None  # with --baseline ddp: PyTorch DDP and the no-communication bound
    checkpoints: list | None = None  # with --save: each checkpoint written (step, path, bytes, seconds)
    resumed_from: str | None = None  # with --load: the checkpoint the run started from

    def to_json(self) -> dict:
        """The ``--json`` object: the layout's fields first, then every result that was computed (no trace)."""
        cfg, lay = self.config, self.config.layout
        out = {
            "world": cfg.world,
            "tp": lay.tp,
            "cp": lay.cp,
            "cp_comm_type": lay.knobs.cp_comm_type,
            "pp": lay.pp,
            "dp": lay.dp,
            "zero": lay.zero,
            "schedule": lay.pipeline_schedule,
            "interleave": lay.interleave,
            "microbatches": lay.microbatches,
            "micro_batch_size": lay.batch.micro_batch_size,
            "global_batch": lay.batch.global_batch,
            "steps": cfg.steps,
            "backend": self.backend,
            "dtype": cfg.dtype,
            "sequence_parallel": lay.knobs.sequence_parallel,
            "dp_mode": cfg.dp_mode,
            "model": {**asdict(cfg.model), "params": cfg.model.params()},
        }
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in ("config", "backend", "trace") and value is not None:
                out[f.name] = value
        return out


def train(
    cfg: TrainConfig,
    backend: str = "local",
    timeout: float = 60.0,
    check: bool = False,
    on_progress=None,
    baseline: str | None = None,
) -> TrainSummary:
    """Train ``cfg`` on ``cfg.world`` processes; what the job did."""
    cfg.check()
    progress = ProgressCounter(cfg.world)
    with progress.watch(on_progress, ProgressCounter.slowest, cfg.steps):
        if baseline == "ddp":  # A/B/C: netmorph, DDP and no-communication steps alternate in one launch
            results, others, weights = zip(
                *launch(abc_rank, cfg.world, cfg, progress, backend=backend, timeout=timeout, torch_group=True)
            )
        else:
            results = launch(train_rank, cfg.world, cfg, progress, backend=backend, timeout=timeout)
    out = summarise(cfg, results, backend, reference(cfg) if check else None)
    if cfg.trace:
        out.trace = chrome_trace(results)
    if baseline == "ddp":
        slowest = {m: [max(o[m][k] for o in others) for k in range(cfg.steps)] for m in others[0]}
        out.baseline = compare_baselines(
            {"netmorph": out.step_times_s, **slowest}, cfg.layout.batch.global_batch * cfg.model.seq, weights
        )
    return out


def train_torchrun(
    cfg: TrainConfig, backend: str = "torch", timeout: float = 60.0, check: bool = False
) -> TrainSummary | None:
    """This process's part of a job ``torchrun`` started: train, then rank 0 gathers every rank's
    report (``all_gather_object``) and returns the summary; the other ranks return None."""
    from netmorph.runtime.torchrun import init_from_env
    from netmorph.runtime.transport.tensors import dist_module

    cfg.check()
    comm = init_from_env(backend, timeout)
    try:
        res = train_rank(comm, cfg)
        everyone = [None] * comm.world
        dist_module().all_gather_object(everyone, res)
    finally:
        comm.transport.close()
    if comm.rank != 0:
        return None
    return summarise(cfg, everyone, backend, reference(cfg) if check else None)


def summarise(cfg: TrainConfig, results: list, backend: str, ref=None) -> TrainSummary:
    losses = next(r.losses for r in results if r.losses is not None)
    times = [max(r.step_times[k] for r in results) for k in range(cfg.steps)]
    tokens = cfg.layout.batch.global_batch * cfg.model.seq
    phases = sorted(
        {ph for r in results for s in r.bytes_by_step for ph in s} | {ph for r in results for ph in r.predicted}
    )
    # a phase whose closed form changes step by step (the routing's all-to-alls) is shown for the last step
    routed = {ph for r in results for ph in (r.predicted_by_step or [{}])[-1]}
    measured = {
        ph: max(
            (r.bytes_by_step[-1].get(ph, 0) if ph in routed else max(s.get(ph, 0) for s in r.bytes_by_step))
            for r in results
        )
        for ph in phases
    }
    predicted = {ph: max((r.predicted.get(ph, (0, ""))[0] for r in results), default=0) for ph in phases}
    # torch-native: torch does not say what each rank sent; the ledger holds one buffer size per call
    exact = (
        {}
        if backend == "torch-native"
        else {
            ph: all(
                all(s.get(ph, 0) == _expected(r, ph, k) for k, s in enumerate(r.bytes_by_step))
                for r in results
                if ph in r.predicted
            )
            for ph in phases
            if predicted[ph]
        }
    )
    formulas = {}  # the closed form of the rank that sends the most
    for ph in phases:
        ranks = [r for r in results if ph in r.predicted]
        if ranks:
            formulas[ph] = max(ranks, key=lambda r: r.predicted[ph][0]).predicted[ph][1]
    med = statistics.median(times[1:] if len(times) > 1 else times)
    p, m, v = cfg.layout.pp, cfg.layout.microbatches, cfg.layout.interleave
    out = TrainSummary(
        config=cfg,
        backend=backend,
        losses=losses,
        step_times_s=times,
        step_time_s=med,
        tokens_per_s=tokens / med if med else 0.0,
        bytes_per_rank_by_phase=measured,
        predicted_bytes_per_rank_by_phase=predicted,
        traffic_exact=exact,
        formulas=formulas,
        in_flight_peak={r.pp: r.in_flight_peak for r in results},
        # measured: the share of the pipeline's time a rank waited, averaged over ranks and the steps after
        # the first (the first pays for warming up)
        # the zero-bubble ones: the W's fill the wait (pipeline.theory, at the paper's F = B = W)
        bubble_fraction={
            **dict(zip(("theory", "form"), theory(cfg.layout.pipeline_schedule, p, m, v))),
            "measured": statistics.mean(statistics.mean(r.idle_fraction[1:] or r.idle_fraction) for r in results),
        },
        memory_bytes={
            **{
                k: max(r.memory_bytes[k] for r in results) for k in ("params", "grads", "optimizer", "wgrad_stash_peak")
            },
            "activations_peak": None
            if any(r.memory_bytes["activations_peak"] is None for r in results)
            else max(r.memory_bytes["activations_peak"] for r in results),
        },
        timeline={r.rank: r.timeline for r in results if r.tp == 0 and r.dp == 0},
        step_parts=step_parts(results),
        pp_rank={r.rank: r.pp for r in results},
        step_bytes_by_phase=[
            {ph: max(r.bytes_by_step[k].get(ph, 0) for r in results) for ph in phases} for k in range(cfg.steps)
        ],
    )
    head = next(r for r in results if r.rank == 0)
    out.checkpoints = head.checkpoints
    out.resumed_from = cfg.checkpoint.load or None
    if any(r.experts for r in results):  # the router's own log, for netmorph moe's view
        out.experts_by_rank = {r.rank: (r.tp, r.pp, r.dp, r.experts) for r in results}
        out.bytes_by_rank = [r.bytes_by_step for r in sorted(results, key=lambda r: r.rank)]
    if ref is not None:
        ref_losses, ref_w, out.reference_kept = ref
        out.reference_losses = ref_losses
        out.max_rel_loss_diff = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
        full = assemble(results)
        out.max_abs_weight_diff = max(float((full[k] - ref_w[k]).abs().max()) for k in ref_w)
    return out


def _expected(r: RankReport, ph: str, step: int) -> int:
    """The closed form of phase ``ph`` in step ``step`` of rank report ``r``: the routing's own for the
    all-to-alls of a mixture of experts (it changes step by step), else the layout's."""
    by_step = r.predicted_by_step
    if by_step and ph in by_step[step]:
        return by_step[step][ph]
    return r.predicted[ph][0]


def reference(cfg: TrainConfig) -> tuple[list, dict, list | None]:
    """The 1-rank run on the same global batches: (losses per step, final weights, and with experts each step's
    (MoE layers, E) assignments kept, summed over the microbatches). A run that starts at ``cfg.start_step`` (one
    resumed from a checkpoint of this run) is held against the 1-rank run from step 0: its last ``cfg.steps``
    losses."""
    dtype = DTYPES["float32" if cfg.mixed else cfg.dtype]  # bf16 mixed precision is held against float32
    model = GPTStage(cfg.model, dtype=dtype, router=cfg.router)
    flat = FlatParams(list(model.parameters()), dtype=dtype)
    adam = Adam(0, flat.padded, lr=cfg.lr, dtype=dtype)
    G, b = cfg.layout.batch.global_batch, cfg.layout.batch.micro_batch_size
    losses, kept = [], []
    moe = [blk for blk in model.blocks if blk.moe is not None]
    # dense: the global batch at once; with experts microbatch by microbatch, as the ranks route them (capacity
    # and the load-balancing loss are per microbatch)
    n = G // b if cfg.model.experts else 1
    for blk in moe:
        blk.aux_scale = 1.0 / n
    for step in range(cfg.start_step + cfg.steps):
        flat.zero_grad()
        total = 0.0
        for i in range(n):
            for blk in moe:
                blk.key = step * n + i  # the global microbatch index: seeds the router's jitter
            lo = step * G + i * G // n
            x, y = synthetic_batch(cfg.model, range(lo, lo + G // n))
            loss = model(x, y)
            (loss / n if n > 1 else loss).backward()
            total += float(loss.detach())
        flat.collect_grads()
        adam.step(flat.data, flat.grad)
        losses.append(total / n)
        kept.append([sum(st.kept for st in blk.stats).tolist() for blk in moe])
        for blk in moe:
            blk.stats.clear()
    skip = cfg.start_step
    return losses[skip:], {k: v for k, (v, _) in named_pieces([model]).items()}, kept[skip:] if moe else None


def chrome_trace(results: list) -> dict:
    """The last step on every rank as a Trace Event Format object (Perfetto, chrome://tracing): one
    track per rank, its forward and backward slots as compute spans and every message it sent."""
    events = []
    t_min = min(r.step_bounds[-1][0] for r in results)
    for r in results:
        lo, hi = r.step_bounds[-1]
        for kind, mb, chunk, t0, t1 in r.timeline:
            events.append(
                {
                    "name": f"{kind}{mb}" + (f".{chunk}" if chunk else ""),
                    "cat": "compute",
                    "ph": "X",
                    "pid": 0,
                    "tid": r.rank,
                    "ts": (t0 - t_min) * 1e6,
                    "dur": (t1 - t0) * 1e6,
                    "args": {"microbatch": mb, "chunk": chunk},
                }
            )
        for src, dst, nb, seq, rnd, phase, op, algo, t0, t1 in r.ledger or ():
            if lo <= t0 <= hi:
                events.append(
                    {
                        "name": f"{phase or op} -> {dst}",
                        "cat": phase or op,
                        "ph": "X",
                        "pid": 0,
                        "tid": src,
                        "ts": (t0 - t_min) * 1e6,
                        "dur": max((t1 - t0) * 1e6, 0.01),
                        "args": {"bytes": nb, "op": op, "algo": algo, "round": rnd},
                    }
                )
        events.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": 0,
                "tid": r.rank,
                "args": {"name": f"rank {r.rank} (tp{r.tp} pp{r.pp} dp{r.dp})"},
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}
