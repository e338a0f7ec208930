"""The twin held against the machine: every layout of a world trained for real, its step time predicted from a
profile of the same ranks measured in the same run, side by side.

A shared machine's speed drifts: on the 2-core VM this was built on, the same layout ran 1.4x slower three
minutes after the calibration, with nothing else running. So between every two training steps the ranks run a
speed probe (the first reference GPT's forward and backward on every rank, the microbenchmark the profile's
compute scales come from), and each prediction is the profile's scaled by the probe's median time over the
steps counted, over that reference's time in the profile: one number per run, the same microbenchmark for
every layout. The summary gives the errors with and without it.

Each layout runs ``netmorph train`` (its real compute: no emulated sleep) and is timed by the median step after
the first; the prediction is the planner's :func:`~netmorph.planner.timing.step_time` for the same
:class:`~netmorph.mesh.layout.Layout` -- the trainer's own, with the byte widths of its dtype -- on the profile's
:class:`~netmorph.planner.hardware.Hardware`. The profile is fitted on the calibration microbenchmarks alone
(:mod:`netmorph.calibrate.compute`, :mod:`netmorph.calibrate.links`), never on these runs, and no layout gets a
factor of its own: what the table shows is what the model knows.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from netmorph.calibrate.compute import DTYPES, ITEMSIZE, REFERENCE_MICROBATCH, REFERENCES, tiny_gpt
from netmorph.calibrate.run import calibrate
from netmorph.mesh.layout import CP_COMM, Layout
from netmorph.mesh.shape import ModelShape
from netmorph.parallel import limits
from netmorph.parallel.config import BUCKET_MB, TrainConfig
from netmorph.parallel.groups import overlaps_dp
from netmorph.parallel.hybrid import train_rank
from netmorph.parallel.phases import PHASES, step_parts
from netmorph.parallel.run import summarise
from netmorph.planner.hardware import hardware_from
from netmorph.planner.timing import step_time
from netmorph.runtime.launch import launch

MODELS = {
    "small": ModelShape(layers=4, hidden=64, heads=4, seq=32, vocab=128),
    "medium": ModelShape(layers=8, hidden=128, heads=8, seq=64, vocab=256),
    # the trainer's mixture of experts (Mixtral-style top-2 of 4 in every layer): its layouts add ep
    "moe": ModelShape(layers=4, hidden=64, heads=4, seq=32, vocab=128, experts=4, top_k=2),
}


WARMUP = 2  # steps not counted: the first builds the caches, the second still pays for some


@dataclass
class Row:
    model: str
    layout: Layout
    measured_s: float  # the median of its repeats
    predicted_s: float
    predicted_parts: dict
    repeats_s: tuple = ()  # each repeat's median step, in the order they ran
    # the machine's speed at each repeat: the probe's seconds then over its seconds when the profile was
    # measured (>1: slower than at calibration); the prediction is the profile's times the median of these
    drift: tuple = ()
    predicted_raw_s: float = 0.0  # the profile's prediction as measured, before the drift
    # the step split by what the busiest stage's rank did (netmorph.parallel.phases: compute, tp, ep, dp, optimizer,
    # rest -- the bubble, pipeline waits and sends, the host's own work), its mean over the last repeat's counted
    # steps, beside the model's split of its prediction into the same parts
    measured_split: dict = field(default_factory=dict)
    predicted_split: dict = field(default_factory=dict)

    @property
    def drift_factor(self) -> float:
        """The median of :attr:`drift`: what the profile's prediction was scaled by."""
        return statistics.median(self.drift) if self.drift else 1.0

    @property
    def spread(self) -> float:
        """The slowest repeat over the fastest, minus one: how far this machine moves the same run."""
        return max(self.repeats_s) / min(self.repeats_s) - 1 if len(self.repeats_s) > 1 else 0.0

    @property
    def error(self) -> float:
        """Predicted over measured, minus one: + when the model is pessimistic, - when it is optimistic."""
        return self.predicted_s / self.measured_s - 1

    @property
    def name(self) -> str:
        """The split, its pipeline schedule and sequence parallelism: ``tp2·pp2·dp1·1f1b·sp``."""
        lay = self.layout
        return (
            lay.tag()
            + (f"·{lay.pipeline_schedule}" if lay.pp > 1 and lay.interleave == 1 else "")
            + ("·sp" if lay.knobs.sequence_parallel else "")
        )

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "layout": self.name,
            "measured_s": self.measured_s,
            "predicted_s": self.predicted_s,
            "error": self.error,
            "predicted_raw_s": self.predicted_raw_s,
            "raw_error": self.predicted_raw_s / self.measured_s - 1,
            "drift": list(self.drift),
            "predicted_parts": self.predicted_parts,
            "repeats_s": list(self.repeats_s),
            "spread": self.spread,
            "measured_split": self.measured_split,
            "predicted_split": self.predicted_split,
        }


def layouts(model: ModelShape, world: int, microbatches: int = 4, micro_batch_size: int = 2) -> list:
    """Every layout of ``world`` ranks the trainer runs for ``model``: each tp x cp x pp x dp, ZeRO 0-3 on dp > 1,
    GPipe, 1F1B, interleaved and ZB-H1 pipelines, tensor parallelism with and without sequence parallelism, context
    parallelism's three exchanges, and for a mixture of experts each expert-parallel degree that divides dp and
    the experts."""
    out = []
    for cp in (c for c in range(1, world + 1) if world % c == 0):  # cp 1 first: the layouts before cp
        for tp in (t for t in range(1, world // cp + 1) if (world // cp) % t == 0):
            for pp in (p for p in range(1, world // (cp * tp) + 1) if (world // (cp * tp)) % p == 0):
                out += _variants(model, tp, cp, pp, world // (tp * cp * pp), microbatches, micro_batch_size)
    return out


def _variants(model: ModelShape, tp: int, cp: int, pp: int, dp: int, microbatches: int, mbs: int) -> list:
    variants = [{}] if cp == 1 else [{"cp": cp, "cp_comm_type": k} for k in CP_COMM]
    base = variants[0]
    if dp > 1:
        variants += [{**base, "zero": z} for z in (1, 2, 3)]
    if pp > 1:
        variants += [
            {**base, "schedule": "afab"},
            {**base, "schedule": "interleaved", "interleave": 2},
            {**base, "schedule": "zb-h1"},
        ]
    if tp > 1:
        variants += [{**base, "sequence_parallel": True}]
    if model.experts:
        variants += [{**base, "ep": e} for e in range(2, dp + 1) if dp % e == 0 and model.experts % e == 0]
    cfgs = (
        TrainConfig.make(model=model, tp=tp, pp=pp, dp=dp, microbatches=microbatches, micro_batch_size=mbs, **v)
        for v in variants
    )
    return [cfg.layout for cfg in cfgs if not limits.check(cfg.layout, model)]


def planner_layout(layout: Layout, dtype: str, model: ModelShape | None = None) -> Layout:
    """The trainer's layout as the planner prices it: every byte width its dtype's (no mixed precision), the
    gradient buckets of the trainer's size (the layout's, or the trainer's default), overlapped with the backward where the
    trainer overlaps them (:func:`~netmorph.parallel.groups.overlaps_dp`; never when ``layout`` says not to), and
    under sequence parallelism the gathered inputs kept for the backward (autograd saves them; no second gather)."""
    b = ITEMSIZE[dtype]
    overlap = overlaps_dp(layout, model or ModelShape())
    return layout.replace(
        param_bytes=b,
        grad_bytes=b,
        optimizer_bytes=2 * b,
        activation_bytes=b,
        dp_overlap=overlap,
        dp_bucket_mb=layout.knobs.dp_bucket_mb or BUCKET_MB,
        sp_regather=False,
    )


def _probed(comm, cfg: TrainConfig) -> tuple:
    """(the rank's training report, the speed probe's seconds after each step): after every training step the
    ranks meet (a barrier), run one forward and backward of the first reference GPT -- the microbenchmark the
    profile's compute scales were fitted on, timed the same way (every rank at once, the slowest rank's) -- and
    meet again before the next step, so the probe sees the machine as the steps around it did. A shared
    machine's speed drifts: on this 2-core VM the same dp8 run took 170 ms and, fifteen minutes later, 265 ms,
    nothing else running."""
    ref = REFERENCES[0]
    run = tiny_gpt(ref.layers, DTYPES[cfg.dtype], ref, REFERENCE_MICROBATCH)
    run()  # warm, as reference_seconds does
    seconds = []

    def after(done, state, loss):
        comm.barrier()
        t0 = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - t0)
        comm.barrier()  # the next step starts on every rank together, as the probe did

    return train_rank(comm, cfg, commit=after), seconds


def measure(model: ModelShape, layout: Layout, steps: int, dtype: str, timeout: float) -> tuple:
    """(the median step time of ``layout`` trained for real after :data:`WARMUP` steps, the busiest stage's rank's
    steps split by what it did (:func:`~netmorph.parallel.phases.split_step`, the mean over the same steps), the
    speed probe's median over them -- each step's slowest rank, as the step times)."""
    cfg = TrainConfig(model=model, layout=layout, steps=steps, dtype=dtype)
    cfg.check()
    out = launch(_probed, cfg.world, cfg, timeout=timeout)
    run = summarise(cfg, [r for r, _ in out], "local")
    split = step_parts([r for r, _ in out], WARMUP)
    probe = statistics.median(max(p[k] for _, p in out) for k in range(WARMUP, steps))
    return statistics.median(run.step_times_s[WARMUP:]), split, probe


def predicted_split(pred: dict) -> dict:
    """The planner's :func:`~netmorph.planner.timing.step_time` in the measured split's parts
    (:data:`~netmorph.parallel.phases.PHASES`): ``rest`` is its bubble, pipeline sends and the slowdown of what
    ran beside compute."""
    comm = pred.parts
    out = {
        "compute": pred.compute_s,
        "tp": comm.tensor_parallel,
        "cp": comm.context_parallel,
        "ep": comm.expert_parallel,
        "dp": comm.data_parallel + comm.zero3_gather,
        "optimizer": pred.optimizer_s,
    }
    out["rest"] = max(0.0, pred.step_time_s - sum(out.values()))  # 0 less rounding without a pipeline
    return out


def validate(
    world: int,
    models=("small", "medium"),
    steps: int = 8,
    dtype: str = "float32",
    timeout: float = 120.0,
    profile: dict | None = None,
    on_run=lambda done, total: None,
    only=None,
    repeats: int = 1,
) -> dict:
    """{"profile", "probe_s", "rows": [Row]} for every layout of every model (``only``: the first of them), each
    measured ``repeats`` times -- in rounds, every layout once per round, so a slow minute of the machine falls
    on different layouts, not on one layout's every repeat -- and its median kept; ``on_run(done, total)``
    after each training run. Each prediction is the profile's scaled by the machine's drift since the profile
    was measured: the speed probe around the run over the same reference GPT's time in the profile (a
    microbenchmark, the same for every layout; nothing is read from the training runs)."""
    prof = profile or calibrate(world, dtype=dtype, timeout=timeout)
    # the probe's time when the profile was measured: the same reference GPT the profile's scales were fitted on
    base = prof["compute"]["busy"]["reference_s"][0]
    hw = hardware_from(prof, "the profile measured first")
    todo = [(name, lay) for name in models for lay in layouts(MODELS[name], world)][:only]
    times, drift = {k: [] for k in range(len(todo))}, {k: [] for k in range(len(todo))}
    split = {}
    done = 0
    for _ in range(repeats):
        for k, (name, lay) in enumerate(todo):
            seconds, split[k], now = measure(MODELS[name], lay, steps, dtype, timeout)
            times[k].append(seconds)
            drift[k].append(now / base)
            done += 1
            on_run(done, len(todo) * repeats)
    rows = []
    for k, (name, lay) in enumerate(todo):
        pred = step_time(MODELS[name], planner_layout(lay, dtype, MODELS[name]), hw)
        d = statistics.median(drift[k])
        parts = {
            "compute": pred.compute_s,
            "bubble": pred.bubble_s,
            "optimizer": pred.optimizer_s,
            **{k: v for k, v in pred.comm_s.items() if v},
        }
        parts = {key: d * v for key, v in parts.items()}
        rows.append(
            Row(
                name,
                lay,
                statistics.median(times[k]),
                d * pred.step_time_s,
                parts,
                repeats_s=tuple(times[k]),
                drift=tuple(drift[k]),
                predicted_raw_s=pred.step_time_s,
                measured_split=split[k],
                predicted_split={key: d * v for key, v in predicted_split(pred).items()},
            )
        )
    return {"profile": prof, "probe_s": base, "rows": rows}


def summary(rows: list) -> dict:
    """Mean and worst |error|, Spearman's rank correlation, and whether the predicted best is within 5% of the
    measured best -- per model, since layouts are ranked against each other for one model."""
    out = {
        "mean_abs_error": float(np.mean([abs(r.error) for r in rows])),
        "worst_abs_error": max(abs(r.error) for r in rows),
        "layouts": len(rows),
        "by_model": {},
        # the machine's own noise: the same layout's repeats apart (0 with one repeat)
        "mean_spread": float(np.mean([r.spread for r in rows])),
        "worst_spread": max(r.spread for r in rows),
        # the same against the profile as measured, no drift: what the machine's drift alone moved
        "raw_mean_abs_error": float(np.mean([abs(r.predicted_raw_s / r.measured_s - 1) for r in rows])),
        "raw_worst_abs_error": max(abs(r.predicted_raw_s / r.measured_s - 1) for r in rows),
        "drift_range": (min(min(r.drift) for r in rows), max(max(r.drift) for r in rows)),
        # each part of the step summed over the layouts, measured and predicted: where the model is off
        "phases": {
            k: (sum(r.measured_split.get(k, 0.0) for r in rows), sum(r.predicted_split.get(k, 0.0) for r in rows))
            for k in PHASES
        },
    }
    for name in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == name]
        m = np.array([r.measured_s for r in mine])
        p = np.array([r.predicted_s for r in mine])
        best_pred = mine[int(np.argmin(p))]
        out["by_model"][name] = {
            "layouts": len(mine),
            "mean_abs_error": float(np.mean(np.abs(p / m - 1))),
            "spearman": _spearman(m, p),
            "predicted_best": best_pred.name,
            "measured_best": mine[int(np.argmin(m))].name,
            "predicted_best_within_5pct": bool(best_pred.measured_s <= 1.05 * m.min()),
        }
    return out


def _spearman(a, b) -> float:
    """Spearman's rank correlation (average ranks for ties): Pearson's of the ranks."""
    if len(a) < 2:
        return float("nan")
    return float(np.corrcoef(_ranks(np.asarray(a)), _ranks(np.asarray(b)))[0, 1])


def _ranks(x) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    for v in np.unique(x):  # ties share their mean rank
        ranks[x == v] = ranks[x == v].mean()
    return ranks
