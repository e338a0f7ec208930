"""Estimate one configuration, or search them all and rank by throughput.

Stands in for what users otherwise take from DeepSpeed's memory estimators,
Megatron's theoretical-memory code, Calculon or llm-analysis. The search enumerates
every (tp, pp, dp, microbatch, v, zero, recompute, sequence parallel) that divides
the devices and the model, rejects what breaks a rule -- with the reason -- and
ranks what fits by predicted throughput.

The space: tp, cp, pp, dp, microbatch, v (up to 16), ZeRO 0-3, recompute, sequence
parallelism and, on hardware with FP8 tensor cores, the precision; for a mixture of experts
also ep. A layer count pp does not divide is split unevenly (the largest stage sets time
and memory), as Megatron-Core and DeepSpeed run it.

Rules, each a reason a configuration is rejected: t must divide the heads and the KV heads
(Megatron splits query groups over TP) and fit in one node (tensor parallelism across
nodes puts an all-reduce per layer on the network); every stage needs a layer, and v of
them when interleaving; the global batch must split into whole microbatches per
data-parallel rank; interleaving needs at least p microbatches and a multiple of p
(Megatron's condition); context parallelism needs a fused (flash) attention kernel and a sequence
that splits into 2·cp chunks (Megatron's load-balanced causal split); ep must divide the experts and the data-parallel ranks; ZeRO-2 does not go
with pipeline parallelism (gradients accumulate over microbatches: ZeRO-1 -- Megatron's
distributed optimizer -- and ZeRO-3 -- FSDP, as torchtitan runs it -- do); FP8 needs FP8
tensor cores; and the most loaded device must fit in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cache

from netmorph.errors import UsageError
from netmorph.mesh.layout import RECOMPUTE, SPLIT_BACKWARD, V_SHAPED, Layout, Rejection
from netmorph.mesh.shape import ModelShape
from netmorph.planner.hardware import Hardware
from netmorph.planner.memory import memory, memory_parts, memory_total
from netmorph.planner.results import Estimate, Flops, Rates
from netmorph.planner.timing import step_time


@dataclass
class Rejected:
    """Every configuration the search rejected for one reason: how many, and one example."""

    key: str
    flag: str
    count: int
    example: str


@dataclass
class SearchResult:
    ranked: list  # Estimates that fit, fastest first (the first ``top``, or all)
    rejected: dict  # key -> Rejected
    fits: int  # how many configurations fit
    by_split: list  # the fastest Estimate of each (tp, pp) split that fits, fastest first

    @property
    def searched(self) -> int:
        return self.fits + sum(r.count for r in self.rejected.values())


ZERO_PP = "zero-pp"


def check(model: ModelShape, c: Layout, hw: Hardware) -> Rejection | None:
    """Why ``c`` cannot run on ``hw``, or None: the layout's own rules (:meth:`Layout.check`) with this
    hardware's beside them (tensor parallelism inside a node, FP8 tensor cores)."""
    rules = c.check(model)
    if rules and rules[0].key in ("heads", "range"):
        return rules[0]
    if c.tp > hw.gpus_per_node:
        return Rejection(
            "inter-node-tp",
            "tp",
            c.tp,
            f"inter-node tensor parallelism (tp {c.tp} > {hw.gpus_per_node} devices per node)",
            "{tp}",
            soft=True,
        )
    if c.precision.name == "fp8" and not hw.fp8_flops:
        return Rejection(
            "fp8", "precision", c.precision.name, f"{hw.name} has no FP8 tensor cores", "{precision} or {hardware}"
        )
    return rules[0] if rules else None


def estimate(model: ModelShape, c: Layout, hw: Hardware) -> Estimate:
    """Memory and time of one configuration (``as_dict()``: the JSON the CLI prints)."""
    mem = memory(model, c)
    if model.bare:
        return Estimate(c, model, hw, mem)
    t = step_time(model, c, hw)
    flops = Flops(
        model.flops_per_iteration(c.batch.global_batch, c.knobs.recompute),
        model.causal_model_flops(c.batch.global_batch),
        model.model_flops(c.batch.global_batch),
    )
    return Estimate(c, model, hw, mem, t, flops, rates(model, c, hw, flops, t.step_time_s))


def rates(model: ModelShape, c: Layout, hw: Hardware, flops: Flops, step: float) -> Rates:
    """Throughput of a step of ``step`` seconds: executed TFLOP/s per GPU (eq. 3), MFU (Megatron's model
    FLOPs over the 16-bit peak), tokens/s."""
    return Rates(
        flops.executed / step / c.gpus / 1e12,
        flops.megatron / step / c.gpus / hw.peak_flops,
        c.batch.global_batch * model.seq / step,
        c.batch.global_batch * model.seq / step / c.gpus,
    )


def _divisors(n: int, cap: int | None = None):
    return [k for k in range(1, (cap or n) + 1) if n % k == 0]


def search(
    model: ModelShape,
    gpus: int,
    hw: Hardware,
    global_batch: int,
    base: Layout | None = None,
    max_microbatch: int = 16,
    max_interleave: int = 16,
    top: int = 5,
    fixed: dict | None = None,
    max_cp: int = 32,
    schedules: tuple = (),
) -> SearchResult:
    """Every configuration (those matching ``fixed``, {field: value}): the ``top`` that fit (0: all), ranked
    by step time, the best of each (tp, pp) split, and the rest counted by the reason they were rejected.
    ``schedules``: the pipeline schedules to try on every pipeline (default ``base``'s alone: Megatron's 1F1B,
    interleaved with v > 1); a zero-bubble one is tried with one chunk a stage (a V's two are its own)."""
    if gpus < 1:
        raise UsageError(f"{{gpus}} must be >= 1, got {gpus}", "gpus")
    if global_batch < 1:
        raise UsageError(f"{{global_batch}} must be >= 1, got {global_batch}", "global_batch")
    if model.bare:
        raise UsageError(
            "a bare parameter count has no layers to split; use `netmorph plan estimate` for its memory", "params"
        )
    base = base or Layout()
    fixed = dict(fixed or {})
    fits, rejected = [], {}

    def allowed(key, values):
        return [x for x in values if key not in fixed or fixed[key] == x]

    mbs = allowed("microbatch", [k for k in (1, 2, 4, 8, 16) if k <= max_microbatch])
    vs = allowed("interleave", list(range(1, max_interleave + 1)))
    zeros = allowed("zero", [0, 1, 2, 3])
    rcs = allowed("recompute", list(RECOMPUTE))
    precisions = allowed("precision", ["bf16", "fp8"] if hw.fp8_flops else ["bf16"])
    scheds = tuple(schedules) or (base.batch.schedule,)
    inner = len(zeros) * len(rcs) * 2 * len(precisions) * len(scheds)

    def reject(why: Rejection, c, n=1):
        r = rejected.get(why.key)
        if r is None:
            c = c() if callable(c) else c
            r = rejected[why.key] = Rejected(why.key, why.flag, 0, f"{c.label()}: {why.text}")
        r.count += n

    fixed_fields = {f.name: getattr(base, f.name) for f in fields(base)}  # (faster than replace() per layout)
    batch = cache(
        lambda mb, sched=base.batch.schedule: replace(
            base.batch, global_batch=global_batch, micro_batch_size=mb, schedule=sched
        )
    )
    knobs = cache(lambda rc, sp: replace(base.knobs, recompute=rc, sequence_parallel=sp))
    precision = cache(lambda name: replace(base.precision, name=name))

    def make(tp, cp, pp, dp, ep=1, mb=1, v=1, zero=0, rc="none", sp=False, prec="bf16", sched=base.batch.schedule):
        return Layout(
            **{
                **fixed_fields,
                "tp": tp,
                "cp": cp,
                "ep": ep,
                "dp": dp,
                "pp": pp,
                "zero": zero,
                "interleave": v,
                "batch": batch(mb, sched),
                "knobs": knobs(rc, sp),
                "precision": precision(prec),
            }
        )

    for tp in allowed("tp", _divisors(gpus, min(gpus, 64))):
        rest = gpus // tp
        c0 = make(tp, 1, 1, rest)
        why = check(model, c0, hw)
        if why and why.key in ("heads", "inter-node-tp"):
            reject(why, c0, len(_divisors(rest)) * len(mbs) * len(vs) * inner)
            continue
        cps = allowed(
            "cp",
            [
                k
                for k in _divisors(rest, min(rest, max_cp))
                if k == 1 or model.seq % (2 * k) == 0 and model.attention == "flash"
            ],
        )
        for cp in cps:
            for pp in allowed("pp", _divisors(rest // cp)):
                dp = rest // (cp * pp)
                if "dp" in fixed and fixed["dp"] != dp:
                    continue
                c = make(tp, cp, pp, dp)
                if pp > model.layers or pp > 1 and min(c.stage_layers(model.layers)) < 1:
                    reject(check(model, c, hw), c, len(mbs) * len(vs) * inner)
                    continue
                smallest = min(c.stage_layers(model.layers))
                eps = [1] if not model.experts else [k for k in _divisors(dp) if model.experts % k == 0]
                for ep in allowed("ep", eps):
                    for mb in mbs:
                        if global_batch % (dp * mb):
                            cb = make(tp, cp, pp, dp, ep, mb)
                            reject(check(model, cb, hw), cb, len(vs) * inner)
                            continue
                        why = check(model, make(tp, cp, pp, dp, ep, mb), hw)
                        if why:
                            reject(why, make(tp, cp, pp, dp, ep, mb), len(vs) * inner)
                            continue
                        m = global_batch // (dp * mb)
                        for v in vs:
                            if v > 1 and (pp == 1 or m % pp or smallest < v):
                                reject(
                                    check(model, make(tp, cp, pp, dp, ep, mb, v), hw),
                                    lambda: make(tp, cp, pp, dp, ep, mb, v),
                                    inner,
                                )
                                continue
                            for prec, sched in ((a, b) for a in precisions for b in scheds):
                                if len(scheds) > 1 and sched in SPLIT_BACKWARD and (pp == 1 or v > 1):
                                    continue  # not a layout of its own: no pipeline, or interleaved
                                if sched in V_SHAPED and (smallest < 2 or m < (2 * pp if sched == "dualpipev" else 1)):
                                    reject(
                                        check(model, make(tp, cp, pp, dp, ep, mb, v, sched=sched), hw)
                                        or Rejection(
                                            "v-shape",
                                            "layers",
                                            smallest,
                                            f"{sched}: a V splits each stage's {smallest} layers in two",
                                            "{pp}",
                                        ),
                                        lambda: make(tp, cp, pp, dp, ep, mb, v, sched=sched),
                                        inner // len(scheds) // len(precisions),
                                    )
                                    continue
                                for rc in rcs:
                                    for sp in allowed("sequence_parallel", (False, True) if tp > 1 else (False,)):
                                        cz = make(tp, cp, pp, dp, ep, mb, v, 0, rc, sp, prec, sched)
                                        parts = memory_parts(model, cz)
                                        for zero in zeros:
                                            if zero == 3 and pp > 1 and 1 in zeros:
                                                # FSDP2 with a pipeline is ZeRO-1's memory and traffic
                                                # (Layout.sharding): the same plan, searched once as ZeRO-1
                                                reject(
                                                    Rejection(
                                                        ZERO_PP,
                                                        "zero",
                                                        zero,
                                                        "ZeRO-3 with a pipeline "
                                                        "runs as FSDP2 with reshard_after_forward=False: "
                                                        "ZeRO-1's memory and traffic, searched as ZeRO-1",
                                                        "{zero} or {pp}",
                                                    ),
                                                    lambda: make(tp, cp, pp, dp, ep, mb, v, zero, rc, sp, prec, sched),
                                                )
                                                continue
                                            total = memory_total(cz, parts, zero)
                                            if total > hw.memory_bytes:
                                                reject(
                                                    Rejection(
                                                        "memory",
                                                        "memory",
                                                        total,
                                                        f"out of memory ({total / 1e9:.1f} GB > "
                                                        f"{hw.memory_bytes / 1e9:.1f} GB)",
                                                        "{gpus}, {hardware} or {recompute}",
                                                    ),
                                                    lambda: make(tp, cp, pp, dp, ep, mb, v, zero, rc, sp, prec, sched),
                                                )
                                                continue
                                            fits.append(make(tp, cp, pp, dp, ep, mb, v, zero, rc, sp, prec, sched))
    timed = sorted(((step_time(model, c, hw).step_time_s, i) for i, c in enumerate(fits)))
    n = len(timed) if not top else min(top, len(timed))
    priced = {}  # fits' index -> its Estimate: a plan both ranked and the best of its split is priced once

    def priced_at(i: int) -> Estimate:
        if i not in priced:
            priced[i] = estimate(model, fits[i], hw)
        return priced[i]

    ranked = [priced_at(i) for _, i in timed[:n]]
    seen, by_split = set(), []
    for _, i in timed:
        key = (fits[i].tp, fits[i].pp)
        if key not in seen:
            seen.add(key)
            by_split.append(priced_at(i))
    return SearchResult(ranked, rejected, len(fits), by_split)
