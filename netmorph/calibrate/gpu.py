"""A GPU's GEMM-shape and attention efficiency: the ``gemm_table``, ``fp8_gemm_table`` and
``attention_efficiency`` a hardware preset takes, measured on the shapes the planner's models run.

The planner prices every transformer GEMM at one ``gemm_efficiency`` unless the hardware carries a
``gemm_table`` -- efficiency binned by GFLOP per GEMM, Calculon's approach -- and the fused attention core at
``attention_efficiency``. The shapes are each published model's layer (QKV, output projection, MLP up and down,
for Llama-3 8B/70B/405B, MPT 7B-70B and GPT-3 175B at tp 1-8 and 2k-16k tokens per microbatch), in bf16 and,
where ``torch._scaled_mm`` runs, FP8; attention is ``scaled_dot_product_attention`` (causal) forward and
backward. Efficiency is achieved FLOP/s over the datasheet peak given. ``netmorph calibrate`` measures these on
every GPU of a torchrun job; ``benchmarks/gemm_efficiency.py`` prints them for one.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from netmorph.calibrate.device import synchronizer
from netmorph.mesh.presets import PRESETS

MODELS = ("llama-3-8b", "llama-3-70b", "llama-3-405b", "mpt-7b", "mpt-30b", "mpt-70b", "gpt3-175b")
TOKENS, TPS = (2048, 4096, 8192, 16384), (1, 2, 4, 8)
EDGES = tuple(2**k for k in range(-4, 14))  # GFLOP per GEMM: 1/16 .. 8192


def shapes(tokens_list=TOKENS, tps=TPS) -> list:
    """[(m, k, n)]: the dense GEMMs of each model's layer, as (tokens, in, out) per tensor-parallel rank."""
    out = set()
    for name in MODELS:
        m = PRESETS[name]
        h, f, kv = m.hidden, m.f, m.h_kv
        for tokens in tokens_list:
            for t in tps:
                if m.heads % t or m.kv % t:
                    continue
                out |= {
                    (tokens, h, (h + 2 * kv) // t),
                    (tokens, h // t, h),
                    (tokens, h, (m.mlp_mats - 1) * f // t),
                    (tokens, f // t, h),
                }
    return sorted(out)


def timed(fn, device: torch.device, repeats: int) -> float:
    """The best of ``repeats`` timed calls of ``fn`` after one warm-up, each waited for on the device."""
    sync = synchronizer(device)
    fn()
    sync()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def fp8_runs(device: torch.device) -> bool:
    """Whether ``torch._scaled_mm`` runs here (an FP8 tensor core: Hopper, Ada, Blackwell)."""
    if device.type != "cuda":
        return False
    try:
        a = torch.zeros(16, 16, device=device).to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return True
    except (RuntimeError, AttributeError, TypeError):
        return False


def gemm_seconds(m: int, k: int, n: int, device: torch.device, dtype, fp8: bool, repeats: int) -> float:
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(n, k, device=device, dtype=dtype)
    if fp8:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        return timed(
            lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), device, repeats
        )
    return timed(lambda: a @ b.t(), device, repeats)


def attention_seconds(
    batch: int, heads: int, seq: int, head_dim: int, device: torch.device, dtype, repeats: int
) -> tuple[float, float]:
    """(seconds of one causal SDPA forward + backward, its FLOPs: 4·b·s²·h/2 forward, 2.5x that backward)."""
    q, k, v = (
        torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3)
    )

    def step():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(torch.ones_like(out))

    flops = 4 * batch * seq * seq * heads * head_dim * 0.5 * 3.5
    return timed(step, device, repeats), flops


def bins(rows, edges=EDGES) -> list:
    """[(GFLOP upper bound, median efficiency)] over the measured (GFLOP, efficiency) rows."""
    out, lo = [], 0.0
    for hi in edges:
        inside = [e for g, e in rows if lo < g <= hi]
        if inside:
            out.append((hi, round(statistics.median(inside), 3)))
        lo = hi
    return out


def measure(
    device: torch.device,
    peak: float,
    fp8_peak: float = 0.0,
    repeats: int = 5,
    gemms=None,
    seqs=(2048, 4096, 8192),
    head_dim: int = 128,
    dtype=torch.bfloat16,
    on_row=None,
) -> dict:
    """{"gemm_table", "fp8_gemm_table" (when ``fp8_peak`` and FP8 runs), "attention_efficiency", "rows"}: each
    shape of ``gemms`` (default :func:`shapes`) timed on ``device``, its efficiency against ``peak`` (FP8's
    against ``fp8_peak``), binned; ``on_row(label, m, k, n, seconds, efficiency)`` after each."""
    gemms = shapes() if gemms is None else gemms
    out, rows = {}, []
    name = "bf16" if dtype == torch.bfloat16 else str(dtype).removeprefix("torch.")
    for label, fp8, top in ((name, False, peak), ("fp8", True, fp8_peak if fp8_runs(device) else 0.0)):
        if not top:
            continue
        effs = []
        for m, k, n in gemms:
            sec = gemm_seconds(m, k, n, device, dtype, fp8, repeats)
            eff = 2 * m * k * n / sec / top
            effs.append((2 * m * k * n / 1e9, eff))
            rows.append({"dtype": label, "m": m, "k": k, "n": n, "seconds": sec, "efficiency": eff})
            if on_row:
                on_row(label, m, k, n, sec, eff)
        out["fp8_gemm_table" if fp8 else "gemm_table"] = bins(effs)
    att = []
    for seq in seqs:
        sec, flops = attention_seconds(1, 8, seq, head_dim, device, dtype, repeats)
        att.append(flops / sec / peak)
        rows.append({"dtype": "attention", "seq": seq, "seconds": sec, "efficiency": att[-1]})
    out["attention_efficiency"] = round(statistics.median(att), 3)
    out["rows"] = rows
    return out
