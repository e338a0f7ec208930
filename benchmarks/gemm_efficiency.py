"""Measure matmul and FlashAttention efficiency on this machine's GPU: the table the planner's hardware takes.

The planner prices every transformer GEMM at one ``gemm_efficiency`` unless the hardware
carries a ``gemm_table`` -- efficiency binned by GFLOP per GEMM, Calculon's approach -- and
prices the fused attention core at ``attention_efficiency``. This script measures both on the
GEMM shapes the planner's models actually run (QKV, output projection, MLP up and down, for
Llama-3 8B/70B/405B, MPT 7B-70B and GPT-3 175B at tp 1-8 and 2k-16k tokens per microbatch), in
bf16 and, where ``torch._scaled_mm`` runs, FP8, and FlashAttention forward+backward through
``scaled_dot_product_attention`` (causal). It prints the measured efficiency per shape, the
binned table, and the JSON fields to add to a hardware file:

    python benchmarks/gemm_efficiency.py --peak 989e12 --fp8-peak 1979e12 [--json h100.json]

On a machine without CUDA it runs the same shapes, smaller, on the CPU -- a check that it works,
not a measurement of anything the planner uses.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch

from netmorph.mesh.presets import PRESETS

MODELS = ("llama-3-8b", "llama-3-70b", "llama-3-405b", "mpt-7b", "mpt-30b", "mpt-70b", "gpt3-175b")


def shapes(tokens_list, tps):
    """{(m, k, n)}: the dense GEMMs of each model's layer, as (tokens, in, out) per rank."""
    out = set()
    for name in MODELS:
        m = PRESETS[name]
        h, f, kv = m.hidden, m.f, m.h_kv
        for tokens in tokens_list:
            for t in tps:
                if m.heads % t or m.kv % t:
                    continue
                out |= {(tokens, h, (h + 2 * kv) // t), (tokens, h // t, h), (tokens, h, (m.mlp_mats - 1) * f // t),
                        (tokens, f // t, h)}
    return sorted(out)


def timed(fn, device, repeats: int) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def gemm(m, k, n, device, dtype, fp8: bool, repeats: int) -> float:
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(n, k, device=device, dtype=dtype)
    if fp8:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        return timed(lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                     device, repeats)
    return timed(lambda: a @ b.t(), device, repeats)


def attention(batch, heads, seq, head_dim, device, dtype, repeats: int) -> tuple[float, float]:
    """(seconds of one causal SDPA forward + backward, its FLOPs: 4·b·s²·h/2 forward, 2.5x that backward)."""
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))

    def step():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(torch.ones_like(out))
    flops = 4 * batch * seq * seq * heads * head_dim * 0.5 * 3.5
    return timed(step, device, repeats), flops


def bins(rows, edges):
    """[(GFLOP upper bound, median efficiency)] over the measured (GFLOP, efficiency) rows."""
    out, lo = [], 0.0
    for hi in edges:
        inside = [e for g, e in rows if lo < g <= hi]
        if inside:
            out.append((hi, round(statistics.median(inside), 3)))
        lo = hi
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peak", type=float, default=989e12, help="the GPU's dense bf16 FLOP/s (default H100 SXM)")
    ap.add_argument("--fp8-peak", type=float, default=1979e12, help="its dense FP8 FLOP/s (0: skip FP8)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the hardware fields (gemm_table, fp8_gemm_table, attention_efficiency)")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        tokens_list, tps, dtype = (2048, 4096, 8192, 16384), (1, 2, 4, 8), torch.bfloat16
        print(f"# {torch.cuda.get_device_name()}: peak {args.peak / 1e12:.0f} TFLOP/s bf16, "
              f"{args.fp8_peak / 1e12:.0f} FP8")
    else:
        tokens_list, tps, dtype = (64,), (8,), torch.float32
        args.fp8_peak = 0
        print("# no CUDA: the shapes shrunk to 64 tokens on the CPU in float32, a check that the script runs")
    edges = [2 ** k for k in range(-4, 14)]          # GFLOP per GEMM: 1/16 .. 8192
    out = {}
    for label, fp8, peak in (("bf16", False, args.peak), ("fp8", True, args.fp8_peak)):
        if not peak:
            continue
        rows = []
        print(f"{'m':>6} {'k':>6} {'n':>6} {'GFLOP':>9} {label + ' TFLOP/s':>13} {'efficiency':>10}")
        for m, k, n in shapes(tokens_list, tps) if cuda else shapes(tokens_list, tps)[:6]:
            flops = 2 * m * k * n
            sec = gemm(m, k, n, device, dtype, fp8, args.repeats)
            eff = flops / sec / peak
            rows.append((flops / 1e9, eff))
            print(f"{m:>6} {k:>6} {n:>6} {flops / 1e9:>9.1f} {flops / sec / 1e12:>13.1f} {eff:>10.3f}")
        table = bins(rows, edges)
        out["fp8_gemm_table" if fp8 else "gemm_table"] = table
        print(f"# {label} table (GFLOP upper bound, median efficiency): {table}")
    att = []
    for seq in ((2048, 4096, 8192) if cuda else (128,)):
        sec, flops = attention(1, 8, seq, 128 if cuda else 32, device, dtype, args.repeats)
        att.append(flops / sec / args.peak)
        print(f"# causal attention s {seq}: {flops / sec / 1e12:.1f} TFLOP/s forward+backward, "
              f"efficiency {att[-1]:.3f}")
    out["attention_efficiency"] = round(statistics.median(att), 3)
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
