"""Measure matmul and FlashAttention efficiency on this machine's GPU: the table the planner's hardware takes.

The measurement is :mod:`netmorph.calibrate.gpu` (what ``netmorph calibrate`` runs on every GPU of a torchrun
job): each published model's layer GEMMs (QKV, output projection, MLP up and down, for Llama-3 8B/70B/405B,
MPT 7B-70B and GPT-3 175B at tp 1-8 and 2k-16k tokens per microbatch) in bf16 and, where ``torch._scaled_mm``
runs, FP8, and FlashAttention forward+backward through ``scaled_dot_product_attention`` (causal). This script
prints the efficiency per shape, the binned table, and the JSON fields to add to a hardware file:

    python benchmarks/gemm_efficiency.py --peak 989e12 --fp8-peak 1979e12 [--json h100.json]

On a machine without CUDA it runs a few of the shapes, shrunk, on the CPU -- a check that it works, not a
measurement of anything the planner uses.
"""

from __future__ import annotations

import argparse
import json

import torch

from netmorph.calibrate import gpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peak", type=float, default=989e12, help="the GPU's dense bf16 FLOP/s (default H100 SXM)")
    ap.add_argument("--fp8-peak", type=float, default=1979e12, help="its dense FP8 FLOP/s (0: skip FP8)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the hardware fields (gemm_table, fp8_gemm_table, attention_efficiency)")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if cuda:
        device, kw = torch.device("cuda"), {}
        print(
            f"# {torch.cuda.get_device_name()}: peak {args.peak / 1e12:.0f} TFLOP/s bf16, "
            f"{args.fp8_peak / 1e12:.0f} FP8"
        )
    else:
        device, args.fp8_peak = torch.device("cpu"), 0
        kw = {"gemms": gpu.shapes((64,), (8,))[:6], "seqs": (128,), "head_dim": 32, "dtype": torch.float32}
        print("# no CUDA: the shapes shrunk to 64 tokens on the CPU in float32, a check that the script runs")
    print(f"{'':>8} {'m':>6} {'k':>6} {'n':>6} {'GFLOP':>9} {'TFLOP/s':>9} {'efficiency':>10}")

    def row(label, m, k, n, sec, eff):
        flops = 2 * m * k * n
        print(f"{label:>8} {m:>6} {k:>6} {n:>6} {flops / 1e9:>9.1f} {flops / sec / 1e12:>9.1f} {eff:>10.3f}")

    out = gpu.measure(device, args.peak, args.fp8_peak, args.repeats, on_row=row, **kw)
    for r in out.pop("rows"):
        if r["dtype"] == "attention":
            print(f"# causal attention s {r['seq']}: efficiency {r['efficiency']:.3f} (forward+backward)")
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
