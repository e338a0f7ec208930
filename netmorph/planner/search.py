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

from dataclasses import dataclass
from functools import lru_cache

from netmorph.errors import UsageError
from netmorph.planner.config import RECOMPUTE, ParallelConfig
from netmorph.planner.hardware import Hardware
from netmorph.planner.memory import memory, memory_parts, memory_total
from netmorph.planner.model import ModelSpec
from netmorph.planner.timing import step_time


@dataclass(frozen=True)
class Rejection:
    """Why a configuration cannot run: a stable ``key``, the ``flag`` that changes it, and the sentence.

    ``soft``: a rule of thumb rather than a rule (``plan estimate`` still prices it, with a warning).
    """

    key: str
    flag: str
    text: str
    soft: bool = False

    def __str__(self) -> str:
        return self.text


@dataclass
class Rejected:
    """Every configuration the search rejected for one reason: how many, and one example."""

    key: str
    flag: str
    count: int
    example: str


@dataclass
class SearchResult:
    ranked: list                   # estimates that fit, fastest first (the first ``top``, or all)
    rejected: dict                 # key -> Rejected
    fits: int                      # how many configurations fit
    by_split: list                 # the fastest estimate of each (tp, pp) split that fits, fastest first

    @property
    def searched(self) -> int:
        return self.fits + sum(r.count for r in self.rejected.values())


def heads(model, tp):
    if model.heads % tp:
        return Rejection("heads", "--tp", f"tp {tp} does not divide the {model.heads} heads")
    return Rejection("heads", "--tp", f"tp {tp} does not divide the {model.kv} KV heads (query groups)")


def batch(c):
    return Rejection("batch", "--global-batch or --microbatch",
                     f"global batch {c.global_batch} does not split into dp {c.dp} x microbatch {c.microbatch}")


ZERO_PP = Rejection("zero-pp", "--zero or --pp", "ZeRO-2 with pipeline parallelism (gradients accumulate over "
                    "microbatches; ZeRO-1 and ZeRO-3/FSDP go with pp)")


def check(model: ModelSpec, c: ParallelConfig, hw: Hardware) -> Rejection | None:
    """Why ``c`` cannot run, or None."""
    if not model.bare and (model.heads % c.tp or model.kv % c.tp):
        return heads(model, c.tp)
    if c.tp > hw.gpus_per_node:
        return Rejection("inter-node-tp", "--tp", f"inter-node tensor parallelism (tp {c.tp} > {hw.gpus_per_node} "
                         f"devices per node)", soft=True)
    if c.precision == "fp8" and not hw.fp8_flops:
        return Rejection("fp8", "--precision or --hardware", f"{hw.name} has no FP8 tensor cores")
    if not model.bare:
        stages = c.stage_layers(model.layers)
        if sum(stages) != model.layers or min(stages) < 1:
            return Rejection("layers", "--pp or --first/last-stage-layers",
                             f"{model.layers} layers do not fill pp {c.pp} stages with at least one each "
                             f"(first {c.first_stage_layers or 'even'}, last {c.last_stage_layers or 'even'})")
        if c.interleave > 1 and min(stages) < c.interleave:
            return Rejection("layers", "--pp or --interleave",
                             f"interleave {c.interleave} needs at least {c.interleave} layers on every stage "
                             f"(the smallest of pp {c.pp} has {min(stages)})")
        if c.cp > 1 and model.attention != "flash":
            return Rejection("cp", "--cp or --attention", "context parallelism runs ring attention in a fused "
                             "(flash) kernel, as Megatron-Core's Transformer Engine path does; this model's "
                             "attention is standard")
        if model.seq % (2 * c.cp) and c.cp > 1:
            return Rejection("cp", "--cp", f"cp {c.cp}: the sequence {model.seq} does not split into 2 x cp chunks")
        if c.ep > 1 and (not model.experts or model.experts % c.ep or c.dp % c.ep):
            return Rejection("ep", "--ep", f"ep {c.ep} must divide the experts ({model.experts}) and dp ({c.dp})")
    if c.global_batch % (c.dp * c.microbatch):
        return batch(c)
    m = c.microbatches
    if c.interleave > 1 and (c.pp == 1 or m % c.pp):
        return Rejection("interleave", "--interleave",
                         f"interleaving needs pp > 1 and microbatches ({m}) a multiple of pp ({c.pp})")
    if c.zero == 2 and c.pp > 1:
        return ZERO_PP
    if c.sequence_parallel and c.tp == 1:
        return Rejection("sp-needs-tp", "--tp", "sequence parallelism needs tp > 1")
    return None


CONFIG_KEYS = ("tp", "cp", "pp", "dp", "ep", "microbatch", "global_batch", "interleave", "zero", "recompute",
               "sequence_parallel", "precision", "first_stage_layers", "last_stage_layers", "tp_overlap",
               "pp_overlap")


def estimate(model: ModelSpec, c: ParallelConfig, hw: Hardware, times: dict | None = None) -> dict:
    """Memory and time of one configuration, as the JSON the CLI prints."""
    mem = memory(model, c)
    out = {**{k: getattr(c, k) for k in CONFIG_KEYS},
           "gpus": c.gpus, "hardware": hw.name, "model": model.name,
           **({} if model.bare else {"kv_heads": model.kv, "ffn_type": model.ffn_type, "ffn": model.f,
                                     "position": model.position, "tied": model.tied, "attention": model.attention,
                                     "dropout": model.dropout, "experts": model.experts,
                                     "top_k": model.top_k if model.experts else 0}),
           "memory_bytes": mem, "device_memory_bytes": hw.memory_bytes, "fits": mem["total"] <= hw.memory_bytes,
           "params_count": model.params()}
    if model.experts:
        out["active_params_count"] = model.active_params()
    if model.bare:
        return out
    out["stage_layers"] = c.stage_layers(model.layers)
    t = times or step_time(model, c, hw)
    out.update(t)
    out.update({
        "flops_per_iteration": model.flops_per_iteration(c.global_batch, c.recompute),
        # what the causal model needs, and Megatron's convention (the full s x s product; MFU divides it)
        "model_flops_per_iteration": model.causal_model_flops(c.global_batch),
        "megatron_flops_per_iteration": model.model_flops(c.global_batch),
        **rates(model, c, hw, t["step_time_s"]),
    })
    return out


def rates(model: ModelSpec, c: ParallelConfig, hw: Hardware, step: float) -> dict:
    """Throughput of a step of ``step`` seconds: executed TFLOP/s per GPU (eq. 3), MFU (Megatron's model
    FLOPs over the 16-bit peak), tokens/s."""
    executed, useful = _flops(model, c.global_batch, c.recompute)
    return {"tflops_per_gpu": executed / step / c.gpus / 1e12,
            "mfu": useful / step / c.gpus / hw.peak_flops,
            "tokens_per_s": c.global_batch * model.seq / step,
            "tokens_per_s_per_gpu": c.global_batch * model.seq / step / c.gpus}


@lru_cache(maxsize=1024)
def _flops(model: ModelSpec, batch: int, recompute: str) -> tuple[float, float]:
    return model.flops_per_iteration(batch, recompute), model.model_flops(batch)


def _divisors(n: int, cap: int | None = None):
    return [k for k in range(1, (cap or n) + 1) if n % k == 0]


def search(model: ModelSpec, gpus: int, hw: Hardware, global_batch: int, base: ParallelConfig | None = None,
           max_microbatch: int = 16, max_interleave: int = 16, top: int = 5, fixed: dict | None = None,
           max_cp: int = 32) -> SearchResult:
    """Every configuration (those matching ``fixed``, {field: value}): the ``top`` that fit (0: all), ranked
    by step time, the best of each (tp, pp) split, and the rest counted by the reason they were rejected."""
    if gpus < 1:
        raise UsageError(f"{{gpus}} must be >= 1, got {gpus}", "gpus")
    if global_batch < 1:
        raise UsageError(f"{{global_batch}} must be >= 1, got {global_batch}", "global_batch")
    if model.bare:
        raise UsageError("a bare parameter count has no layers to split; use `netmorph plan estimate` for its "
                         "memory", "params")
    base = base or ParallelConfig()
    fixed = dict(fixed or {})
    fits, rejected = [], {}

    def allowed(key, values):
        return [x for x in values if key not in fixed or fixed[key] == x]

    mbs = allowed("microbatch", [k for k in (1, 2, 4, 8, 16) if k <= max_microbatch])
    vs = allowed("interleave", list(range(1, max_interleave + 1)))
    zeros = allowed("zero", [0, 1, 2, 3])
    rcs = allowed("recompute", list(RECOMPUTE))
    precisions = allowed("precision", ["bf16", "fp8"] if hw.fp8_flops else ["bf16"])
    inner = len(zeros) * len(rcs) * 2 * len(precisions)

    def reject(why: Rejection, c, n=1):
        r = rejected.get(why.key)
        if r is None:
            c = c() if callable(c) else c
            r = rejected[why.key] = Rejected(why.key, why.flag, 0, f"{c.label()}: {why.text}")
        r.count += n

    def make(tp, cp, pp, dp, ep=1, mb=1, v=1, zero=0, rc="none", sp=False, prec="bf16"):
        return ParallelConfig(tp, pp, dp, mb, global_batch, v, zero, rc, sp, base.dp_overlap, base.param_bytes,
                              base.grad_bytes, base.optimizer_bytes, cp, ep, prec, base.first_stage_layers,
                              base.last_stage_layers, base.tp_overlap, base.pp_overlap)

    for tp in allowed("tp", _divisors(gpus, min(gpus, 64))):
        rest = gpus // tp
        c0 = make(tp, 1, 1, rest)
        why = check(model, c0, hw)
        if why and why.key in ("heads", "inter-node-tp"):
            reject(why, c0, len(_divisors(rest)) * len(mbs) * len(vs) * inner)
            continue
        cps = allowed("cp", [k for k in _divisors(rest, min(rest, max_cp))
                             if k == 1 or model.seq % (2 * k) == 0 and model.attention == "flash"])
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
                            reject(batch(cb), cb, len(vs) * inner)
                            continue
                        why = check(model, make(tp, cp, pp, dp, ep, mb), hw)
                        if why:
                            reject(why, make(tp, cp, pp, dp, ep, mb), len(vs) * inner)
                            continue
                        m = global_batch // (dp * mb)
                        for v in vs:
                            if v > 1 and (pp == 1 or m % pp or smallest < v):
                                reject(check(model, make(tp, cp, pp, dp, ep, mb, v), hw),
                                       lambda: make(tp, cp, pp, dp, ep, mb, v), inner)
                                continue
                            for prec in precisions:
                                for rc in rcs:
                                    for sp in allowed("sequence_parallel", (False, True) if tp > 1 else (False,)):
                                        cz = make(tp, cp, pp, dp, ep, mb, v, 0, rc, sp, prec)
                                        parts = memory_parts(model, cz)
                                        for zero in zeros:
                                            if zero == 2 and pp > 1:
                                                reject(ZERO_PP, lambda: make(tp, cp, pp, dp, ep, mb, v, 2, rc, sp,
                                                                             prec))
                                                continue
                                            total = memory_total(cz, parts, zero)
                                            if total > hw.memory_bytes:
                                                reject(Rejection("memory", "--gpus, --hardware or --recompute",
                                                                 f"out of memory ({total / 1e9:.1f} GB > "
                                                                 f"{hw.memory_bytes / 1e9:.1f} GB)"),
                                                       lambda: make(tp, cp, pp, dp, ep, mb, v, zero, rc, sp, prec))
                                                continue
                                            fits.append(make(tp, cp, pp, dp, ep, mb, v, zero, rc, sp, prec))
    timed = sorted(((step_time(model, c, hw)["step_time_s"], i) for i, c in enumerate(fits)))
    n = len(timed) if not top else min(top, len(timed))
    ranked = [estimate(model, fits[i], hw) for _, i in timed[:n]]
    seen, by_split = set(), []
    for _, i in timed:
        key = (fits[i].tp, fits[i].pp)
        if key not in seen:
            seen.add(key)
            by_split.append(estimate(model, fits[i], hw))
    return SearchResult(ranked, rejected, len(fits), by_split)
