"""Estimate one configuration, or search them all and rank by throughput.

Stands in for what users otherwise take from DeepSpeed's memory estimators,
Megatron's theoretical-memory code, Calculon or llm-analysis. The search enumerates
every (tp, pp, dp, microbatch, v, zero, recompute, sequence parallel) that divides
the devices and the model, rejects what breaks a rule -- with the reason -- and
ranks what fits by predicted throughput.

Rules, each a reason a configuration is rejected: t must divide the heads and fit in
one node (tensor parallelism across nodes puts an all-reduce per layer on the
network); p must divide the layers (and p·v must, when interleaving); the global batch
must split into whole microbatches per data-parallel rank; interleaving needs at least
p microbatches and a multiple of p (Megatron's condition); DeepSpeed runs ZeRO-2/3 only
without pipeline parallelism; and the most loaded device must fit in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from netmorph.errors import UsageError
from netmorph.planner.config import RECOMPUTE, ParallelConfig
from netmorph.planner.hardware import Hardware
from netmorph.planner.memory import memory
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

    @property
    def searched(self) -> int:
        return self.fits + sum(r.count for r in self.rejected.values())


def heads(model, tp):
    return Rejection("heads", "--tp", f"tp {tp} does not divide the {model.heads} heads")


def layers(model, pp):
    return Rejection("layers", "--pp or --interleave", f"pp {pp} does not divide the {model.layers} layers")


def batch(c):
    return Rejection("batch", "--global-batch or --microbatch",
                     f"global batch {c.global_batch} does not split into dp {c.dp} x microbatch {c.microbatch}")


ZERO_PP = Rejection("zero-pp", "--zero or --pp", "ZeRO-2/3 with pipeline parallelism (DeepSpeed supports stage 1 only)")


def check(model: ModelSpec, c: ParallelConfig, hw: Hardware) -> Rejection | None:
    """Why ``c`` cannot run, or None."""
    if not model.bare and model.heads % c.tp:
        return heads(model, c.tp)
    if c.tp > hw.gpus_per_node:
        return Rejection("inter-node-tp", "--tp", f"inter-node tensor parallelism (tp {c.tp} > {hw.gpus_per_node} "
                         f"devices per node)", soft=True)
    if not model.bare and model.layers % (c.pp * c.interleave):
        return Rejection("layers", "--pp or --interleave",
                         f"pp x v = {c.pp * c.interleave} does not divide the {model.layers} layers")
    if c.global_batch % (c.dp * c.microbatch):
        return batch(c)
    m = c.microbatches
    if c.interleave > 1 and (c.pp == 1 or m % c.pp):
        return Rejection("interleave", "--interleave",
                         f"interleaving needs pp > 1 and microbatches ({m}) a multiple of pp ({c.pp})")
    if c.zero >= 2 and c.pp > 1:
        return ZERO_PP
    if c.sequence_parallel and c.tp == 1:
        return Rejection("sp-needs-tp", "--tp", "sequence parallelism needs tp > 1")
    return None


def estimate(model: ModelSpec, c: ParallelConfig, hw: Hardware) -> dict:
    """Memory and time of one configuration, as the JSON the CLI prints."""
    mem = memory(model, c)
    out = {**{k: getattr(c, k) for k in ("tp", "pp", "dp", "microbatch", "global_batch", "interleave", "zero",
                                          "recompute", "sequence_parallel")},
           "gpus": c.gpus, "hardware": hw.name, "model": model.name,
           "memory_bytes": mem, "device_memory_bytes": hw.memory_bytes, "fits": mem["total"] <= hw.memory_bytes,
           "params_count": model.params()}
    if model.bare:
        return out
    t = step_time(model, c, hw)
    flops = model.flops_per_iteration(c.global_batch, c.recompute)
    step = t["step_time_s"]
    out.update(t)
    out.update({
        "flops_per_iteration": flops,
        "model_flops_per_iteration": model.model_flops(c.global_batch),
        "tflops_per_gpu": flops / step / c.gpus / 1e12,
        "mfu": model.model_flops(c.global_batch) / step / c.gpus / hw.peak_flops,
        "tokens_per_s": c.global_batch * model.seq / step,
    })
    return out


def _divisors(n: int, cap: int | None = None):
    return [k for k in range(1, (cap or n) + 1) if n % k == 0]


def search(model: ModelSpec, gpus: int, hw: Hardware, global_batch: int, base: ParallelConfig | None = None,
           max_microbatch: int = 8, max_interleave: int = 8, top: int = 5) -> SearchResult:
    """Every configuration: the ``top`` that fit (0: all), ranked; the rest counted by reason."""
    if gpus < 1:
        raise UsageError(f"{{gpus}} must be >= 1, got {gpus}", "gpus")
    if global_batch < 1:
        raise UsageError(f"{{global_batch}} must be >= 1, got {global_batch}", "global_batch")
    if model.bare:
        raise UsageError("a bare parameter count has no layers to split; use `netmorph plan estimate` for its "
                         "memory", "params")
    base = base or ParallelConfig()
    fits, rejected = [], {}
    mbs = [k for k in (1, 2, 4, 8, 16) if k <= max_microbatch]
    vs = list(range(1, max_interleave + 1))

    def reject(why: Rejection, c, n=1):
        r = rejected.get(why.key)
        if r is None:
            r = rejected[why.key] = Rejected(why.key, why.flag, 0, f"{c.label()}: {why.text}")
        r.count += n

    def make(tp, pp, dp, mb=1, v=1, zero=0, rc="none", sp=False):
        return ParallelConfig(tp, pp, dp, mb, global_batch, v, zero, rc, sp, base.dp_overlap,
                              base.param_bytes, base.grad_bytes, base.optimizer_bytes)

    per_pp = len(mbs) * len(vs) * 4 * 3 * 2
    for tp in _divisors(gpus, min(gpus, 64)):
        pps = _divisors(gpus // tp)
        c0 = make(tp, 1, gpus // tp)
        why = check(model, c0, hw)
        if why and why.key in ("heads", "inter-node-tp"):
            reject(why, c0, len(pps) * per_pp)
            continue
        for pp in pps:
            dp = gpus // (tp * pp)
            if model.layers % pp:
                reject(layers(model, pp), make(tp, pp, dp), per_pp)
                continue
            for mb in mbs:
                if global_batch % (dp * mb):
                    c = make(tp, pp, dp, mb)
                    reject(batch(c), c, per_pp // len(mbs))
                    continue
                for v in vs:
                    cv = make(tp, pp, dp, mb, v)
                    why = check(model, cv, hw)
                    if why:
                        reject(why, cv, 4 * 3 * 2)
                        continue
                    for zero in (0, 1, 2, 3):
                        if zero >= 2 and pp > 1:
                            reject(ZERO_PP, make(tp, pp, dp, mb, v, zero), 3 * 2)
                            continue
                        for rc in RECOMPUTE:
                            for sp in ((False, True) if tp > 1 else (False,)):
                                c = make(tp, pp, dp, mb, v, zero, rc, sp)
                                total = memory(model, c)["total"]
                                if total > hw.memory_bytes:
                                    reject(Rejection("memory", "--gpus, --hardware or --recompute",
                                                     f"out of memory ({total / 1e9:.1f} GB > "
                                                     f"{hw.memory_bytes / 1e9:.1f} GB)"), c)
                                    continue
                                fits.append(c)
    ests = sorted((estimate(model, c, hw) for c in fits), key=lambda e: e["step_time_s"])
    return SearchResult(ests[:top] if top else ests, rejected, len(ests))
