"""Write docs/validation.md: the planner's predictions beside published figures.

    python scripts/validate_planner.py            # rewrites docs/validation.md
    python scripts/validate_planner.py --check    # exits 1 if the calibration errors grow or a run does not fit

Published figures (the expected values; the planner computes its numbers from first
principles and never reads these):

- ZeRO (Rajbhandari et al. 2020), Table 1: model-state memory per device for 7.5B,
  128B and 1T parameters, K = 12, over N_d = 1 .. 1024, stages P_os, P_os+g, P_os+g+p.
- Narayanan et al. 2021 (PTD-P), Table 1: achieved TFLOP/s per A100 for ten GPT models
  at the published (t, p, GPUs, batch), full activation recomputation. The paper does not
  list microbatch size or interleaving per row: the planner picks them by its own search.
- Korthikanti et al. 2022, Tables 3-4: iteration time of 22B, 175B, 530B and 1T models
  with full recomputation and with sequence parallelism + selective recomputation
  (configurations as in Calculon's validation inputs: t 8, microbatch 1 (22B: 4),
  interleaving 3 for 175B and 530B).

These three are the calibration set: the planner's constants (matmul efficiency, elementwise
passes) were chosen on them. The validation set is held apart -- published runs from three
kinds of source, on A100 and H100, that the constants never saw:

- model paper: Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4 -- Llama 3 405B on
  8,192 and 16,384 H100s, TFLOP/s per GPU (BF16), with the first and last pipeline stages one
  layer short (section 3.3.2);
- framework benchmarks: NVIDIA NeMo 24.07 performance summary (NVIDIA/NeMo
  docs/source/performance/performance_summary.md at 070a0bb1), FP8 pre-training on DGX-H100,
  tokens/s per GPU, every GPT-3 and Llama row (the Nemotron rows are left out: their
  architectures are not given); MosaicML llm-foundry's MPT benchmarks
  (mosaicml/llm-foundry scripts/train/benchmarking/README.md at 061f2c7c), FSDP (ZeRO-3),
  tokens/s per GPU, every row of a model of 7B or more at sequence 2048, on H100-80GB,
  A100-80GB and A100-40GB;
- framework benchmarks, added later and judged as they came: torchtitan's FSDP2 table
  (pytorch/torchtitan docs/performance.md at 04133643), Llama 3 and Llama 2 on 64 A100-80GB,
  tokens/s per GPU, local batch = the microbatch (no accumulation); the rows with no or full
  activation checkpointing (its "selective" policies -- every other layer, every other matmul --
  are not the planner's selective recomputation, so those rows are left out, not forced);
- training log: BLOOM-176B (BigScience 2022) on 384 A100-80GB of Jean Zay, "about 150
  TFLOPs" per GPU (Megatron-DeepSpeed's count, full recomputation), TP 4, PP 12, DP 8,
  micro-batch 2, global batch 2048, ZeRO-1, on a 4 x 100 Gb/s Omni-Path network per node.

Where a source does not give a setting (microbatch, interleaving, recomputation) the planner
picks it by its own search among those that fit, as for Narayanan's rows.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from netmorph.mesh.layout import Batch, Knobs, Layout, Precision
from netmorph.mesh.presets import PRESETS as MODELS
from netmorph.mesh.shape import ModelShape
from netmorph.planner.hardware import PRESETS as HARDWARE
from netmorph.planner.memory import memory
from netmorph.planner.search import check, estimate, search

ZERO_TABLE1 = {  # (Psi, N_d): (P_os, P_os+g, P_os+g+p) in GB
    (7.5e9, 1): (120, 120, 120),
    (7.5e9, 4): (52.5, 41.3, 30),
    (7.5e9, 16): (35.6, 21.6, 7.5),
    (7.5e9, 64): (31.4, 16.6, 1.88),
    (7.5e9, 256): (30.4, 15.4, 0.47),
    (7.5e9, 1024): (30.1, 15.1, 0.12),
    (128e9, 1): (2048, 2048, 2048),
    (128e9, 4): (896, 704, 512),
    (128e9, 16): (608, 368, 128),
    (128e9, 64): (536, 284, 32),
    (128e9, 256): (518, 263, 8),
    (128e9, 1024): (513, 257, 2),
    (1e12, 1): (16000, 16000, 16000),
    (1e12, 4): (7000, 5500, 4000),
    (1e12, 16): (4750, 2875, 1000),
    (1e12, 64): (4187, 2218, 250),
    (1e12, 256): (4046, 2054, 62.5),
    (1e12, 1024): (4011, 2013, 15.6),
}
PTDP_TABLE1 = [  # model, t, p, GPUs, batch, achieved TFLOP/s per GPU
    ("ptdp-1.7b", 1, 1, 32, 512, 137),
    ("ptdp-3.6b", 2, 1, 64, 512, 138),
    ("ptdp-7.5b", 4, 1, 128, 512, 142),
    ("ptdp-18.4b", 8, 1, 256, 1024, 135),
    ("ptdp-39.1b", 8, 2, 512, 1536, 138),
    ("ptdp-76.1b", 8, 4, 1024, 1792, 140),
    ("ptdp-145.6b", 8, 8, 1536, 2304, 148),
    ("ptdp-310.1b", 8, 16, 1920, 2160, 155),
    ("ptdp-529.6b", 8, 35, 2520, 2520, 163),
    ("ptdp-1t", 8, 64, 3072, 3072, 163),
]
KORTHIKANTI = [  # model, t, p, GPUs, batch, microbatch, v, seconds (full recompute), seconds (SP + selective)
    ("mt-22b", 8, 1, 8, 4, 4, 1, 1.42, 1.10),
    ("mt-175b", 8, 8, 64, 64, 1, 3, 18.13, 13.75),
    ("mt-530b", 8, 35, 280, 280, 1, 3, 49.05, 37.83),
    ("mt-1t", 8, 64, 512, 512, 1, 1, 94.42, 71.49),
]


# --- the validation set (held apart from the constants) ---------------------------------------------------
# Llama 3 405B, Dubey et al. 2024 Table 4: GPUs, tp, cp, pp, dp, sequence, batch per DP rank, TFLOP/s per GPU
LLAMA3 = [
    (8192, 8, 1, 16, 64, 8192, 32, 430),
    (16384, 8, 1, 16, 128, 8192, 16, 400),
    (16384, 8, 16, 16, 8, 131072, 16, 380),
]
# NeMo 24.07, FP8, DGX-H100: model, GPUs, GBS, MBS, seq, tp, pp, cp, vp, tokens/s/GPU
NEMO = [
    ("gpt3-175b", 128, 256, 1, 2048, 4, 8, 1, 6, 726),
    ("gpt3-175b", 512, 2048, 2, 2048, 4, 8, 1, 6, 782),
    ("llama-2-7b", 8, 128, 1, 4096, 1, 1, 1, 1, 16847),
    ("llama-2-13b", 16, 128, 1, 4096, 1, 4, 1, 10, 8646),
    ("llama-2-70b", 64, 128, 1, 4096, 4, 4, 1, 20, 1707),
    ("llama-3-8b", 8, 128, 1, 8192, 1, 1, 2, 1, 12036),
    ("llama-3-70b", 64, 128, 1, 8192, 4, 4, 2, 5, 1533),
]
# llm-foundry MPT benchmarks, sequence 2048, FSDP FULL_SHARD: hardware, model, GPUs, microbatch, global batch,
# activation checkpointing, tokens/s/GPU
MPT = [
    ("h100-80g", "mpt-70b", 64, 8, 2048, True, 1039),
    ("h100-80g", "mpt-70b", 32, 2, 1024, True, 882),
    ("h100-80g", "mpt-30b", 32, 14, 1344, True, 2308),
    ("h100-80g", "mpt-30b", 16, 10, 480, True, 2263),
    ("h100-80g", "mpt-30b", 8, 3, 504, True, 2002),
    ("h100-80g", "mpt-13b", 64, 2, 128, False, 4800),
    ("h100-80g", "mpt-13b", 32, 2, 64, False, 4811),
    ("h100-80g", "mpt-13b", 16, 2, 32, False, 4767),
    ("h100-80g", "mpt-13b", 8, 2, 16, False, 4792),
    ("h100-80g", "mpt-7b", 8, 6, 48, False, 10643),
    ("a100-80g", "mpt-70b", 64, 8, 2048, True, 410),
    ("a100-80g", "mpt-70b", 32, 2, 1024, True, 373),
    ("a100-80g", "mpt-30b", 8, 3, 504, True, 916),
    ("a100-80g", "mpt-13b", 8, 2, 48, False, 2262),
    ("a100-80g", "mpt-7b", 8, 6, 96, False, 4641),
    ("a100-40g", "mpt-70b", 128, 4, 512, True, 376),
    ("a100-40g", "mpt-70b", 64, 2, 128, True, 276),
    ("a100-40g", "mpt-30b", 128, 6, 768, True, 865),
    ("a100-40g", "mpt-30b", 32, 4, 128, True, 857),
    ("a100-40g", "mpt-13b", 128, 16, 2048, True, 1972),
    ("a100-40g", "mpt-13b", 64, 16, 1024, True, 1976),
    ("a100-40g", "mpt-13b", 32, 14, 448, True, 1998),
    ("a100-40g", "mpt-13b", 16, 10, 160, True, 1993),
    ("a100-40g", "mpt-13b", 8, 4, 512, True, 1668),
    ("a100-40g", "mpt-7b", 128, 18, 2304, True, 3623),
    ("a100-40g", "mpt-7b", 64, 18, 1152, True, 3665),
    ("a100-40g", "mpt-7b", 32, 18, 576, True, 3725),
    ("a100-40g", "mpt-7b", 16, 16, 256, True, 3645),
    ("a100-40g", "mpt-7b", 8, 12, 384, True, 3679),
]
# the runs llm-foundry's table lists with MP Mode PURE (bf16 weights, gradients and reductions)
# torchtitan docs/performance.md (2024): FSDP2 on 64 A100-80GB: model, sequence, local batch, checkpointing
# ("none" | "full"), tokens/s per GPU
TORCHTITAN = [
    ("llama-3-70b", 8192, 1, "full", 331),
    ("llama-2-13b", 4096, 2, "none", 2162),
    ("llama-2-70b", 4096, 2, "full", 353),
]
PURE = {("a100-80g", "mpt-70b")} | {("a100-40g", n) for n in ("mpt-70b", "mpt-30b", "mpt-13b", "mpt-7b")}
# BLOOM-176B on Jean Zay: A100-80GB nodes with 4 x 100 Gb/s Omni-Path (6.25 GB/s per GPU)
JEAN_ZAY = replace(HARDWARE["a100-80g"], name="jean-zay-a100", nic_bandwidth=4 * 100e9 / 8 / 8)
LLAMA2_13B = ModelShape(
    "llama-2-13b",
    40,
    5120,
    40,
    4096,
    32000,
    13824,
    ffn_type="swiglu",
    position="rope",
    tied=False,
    bias=False,
    attention="flash",
    dropout=True,
)


def best_fit(model, hw, c, free=("micro_batch_size", "interleave", "recompute"), max_interleave=16):
    """The fastest configuration that fits among the settings in ``free`` (the ones a source does not give),
    with everything else as ``c``: what a user of the planner would run."""
    choices = {
        "micro_batch_size": (1, 2, 4, 8),
        "interleave": range(1, max_interleave + 1),
        "recompute": ("none", "selective", "full"),
    }
    best = None
    for values in itertools.product(*(choices[k] if k in free else (c.get(k),) for k in choices)):
        cand = c.replace(**dict(zip(choices, values)))
        if check(model, cand, hw):  # also: the batch splits into whole microbatches
            continue
        if memory(model, cand).total > hw.memory_bytes:
            continue
        e = estimate(model, cand, hw)
        if best is None or e.step.step_time_s < best.step.step_time_s:
            best = e
    return best


def mpt_config(hw_name, name, gpus, mbs, gbs, ckpt, overlap=True):
    """An llm-foundry run as the planner's split: FSDP FULL_SHARD is ZeRO-3 over every GPU; the table's MP Mode
    DEFAULT reduces gradients in fp32, PURE in bf16."""
    return Layout(
        tp=1,
        pp=1,
        dp=gpus,
        zero=3,
        batch=Batch(micro_batch_size=mbs, global_batch=gbs),
        knobs=Knobs(recompute="full" if ckpt else "none", dp_overlap=overlap),
        precision=Precision(grad_bytes=2 if (hw_name, name) in PURE else 4),
    )


def mpt_exposed_errors():
    """[(hardware, tokens per microbatch per GPU, activation checkpointing, error with FSDP's collectives
    overlapped, error with them exposed, missed time / hidden communication, exposed communication / compute)]
    for the MPT runs: how much of the miss their overlap accounts for. The fifth is the published step time less
    the overlapped prediction, over the communication time the overlap hid (1: the run behaves as if none of it
    were hidden)."""
    out = []
    for hw_name, name, gpus, mbs, gbs, ckpt, pub in MPT:
        over, bare = (
            estimate(MODELS[name], mpt_config(hw_name, name, gpus, mbs, gbs, ckpt, overlap), HARDWARE[hw_name])
            for overlap in (True, False)
        )
        published_s = gbs * MODELS[name].seq / gpus / pub
        hidden = bare.step.step_time_s - over.step.step_time_s
        comm = bare.step.parts.zero3_gather + bare.step.parts.data_parallel
        out.append(
            (
                hw_name,
                mbs * MODELS[name].seq,
                ckpt,
                err(over.rates.tokens_per_s_per_gpu, pub),
                err(bare.rates.tokens_per_s_per_gpu, pub),
                (published_s - over.step.step_time_s) / hidden,
                comm / bare.step.compute_s,
            )
        )
    return out


def llama3_run(row, **changes) -> tuple:
    """(model, layout) of a Llama 3 Table 4 row as the paper ran it, with ``changes``: section 3.3.2, "Our use of
    FSDP for Llama 3 shards the optimizer states and gradients, but for model shards we do not reshard after
    forward computation" -- ZeRO-2 with the pipeline (Layout.sharding); section 3.3.4: gradients reduce-scattered
    in FP32 (grad_bytes 4); section 3.3.2 again: context parallelism all-gathers K and V ("all-gather based
    method"), not a ring; the first and last stages one layer short."""
    gpus, t, cp, p, d, seq, per_dp, pub = row
    c = Layout(
        tp=t,
        pp=p,
        dp=d,
        zero=2,
        cp=cp,
        batch=Batch(micro_batch_size=1, global_batch=per_dp * d),
        knobs=Knobs(
            sequence_parallel=True,
            dp_overlap=True,
            cp_comm_type="all_gather",
            first_stage_layers=7,
            last_stage_layers=7,
        ),
    )
    return replace(MODELS["llama-3-405b"], seq=seq), c.replace(**changes)


def validation_rows():
    """(source, run, hardware, published, unit, predicted estimate or None when nothing fits)."""
    rows = []
    hw = HARDWARE["h100-80g"]
    for row in LLAMA3:
        gpus, t, cp, p, d, seq, per_dp, pub = row
        model, c = llama3_run(row)
        e = best_fit(model, hw, c)
        rows.append(
            (
                "Llama 3 (Dubey et al. 2024), Table 4",
                f"405B, {gpus:,} GPUs, tp{t} cp{cp} pp{p} dp{d}, s {seq:,}",
                hw.name,
                pub,
                "TFLOP/s",
                e,
            )
        )
    for name, gpus, gbs, mbs, seq, t, p, cp, vp, pub in NEMO:
        model = replace(LLAMA2_13B if name == "llama-2-13b" else MODELS[name], seq=seq)
        if name == "gpt3-175b":
            model = replace(model, attention="flash")  # Transformer Engine's fused attention
        d = gpus // (t * p * cp)
        # NeMo's recipes run the distributed optimizer with overlap_grad_reduce and overlap_param_gather
        # (their DistributedDataParallelConfig)
        c = Layout(
            tp=t,
            pp=p,
            dp=d,
            interleave=vp,
            zero=1,
            cp=cp,
            batch=Batch(micro_batch_size=mbs, global_batch=gbs),
            knobs=Knobs(sequence_parallel=t > 1, dp_overlap=True, param_gather_overlap=True),
            precision=Precision(name="fp8"),
        )
        rows.append(
            (
                "NeMo 24.07 performance summary (FP8)",
                f"{name}, {gpus} GPUs, tp{t} pp{p} cp{cp} vp{vp}, s {seq}",
                hw.name,
                pub,
                "tokens/s/GPU",
                best_fit(model, hw, c, free=("recompute",)),
            )
        )
    for hw_name, name, gpus, mbs, gbs, ckpt, pub in MPT:
        c = mpt_config(hw_name, name, gpus, mbs, gbs, ckpt)
        rows.append(
            (
                "llm-foundry MPT benchmarks (FSDP)",
                f"{name}, {gpus} GPUs, mb {mbs}, batch {gbs}" + (", act. ckpt" if ckpt else ""),
                hw_name,
                pub,
                "tokens/s/GPU",
                best_fit(MODELS[name], HARDWARE[hw_name], c, free=()),
            )
        )
    for name, seq, local, ckpt, pub in TORCHTITAN:
        model = replace(LLAMA2_13B if name == "llama-2-13b" else MODELS[name], seq=seq, dropout=False)
        c = Layout(
            dp=64,
            zero=3,
            batch=Batch(micro_batch_size=local, global_batch=64 * local),
            knobs=Knobs(recompute=ckpt, dp_overlap=True),
        )  # FSDP2: bf16 weights gathered, fp32 gradients reduced
        rows.append(
            (
                "torchtitan (FSDP2), docs/performance.md",
                f"{name}, 64 GPUs, s {seq}, local batch {local}" + (", full AC" if ckpt == "full" else ""),
                "a100-80g",
                pub,
                "tokens/s/GPU",
                best_fit(model, HARDWARE["a100-80g"], c, free=()),
            )
        )
    c = Layout(
        tp=4, pp=12, dp=8, zero=1, batch=Batch(micro_batch_size=2, global_batch=2048), knobs=Knobs(recompute="full")
    )
    rows.append(
        (
            "BLOOM-176B (BigScience 2022), training log",
            "176B, 384 GPUs, tp4 pp12 dp8, mb 2",
            JEAN_ZAY.name,
            150,
            "TFLOP/s",
            best_fit(MODELS["bloom-176b"], JEAN_ZAY, c, free=("interleave",)),
        )
    )
    return rows


def predicted(unit, e, source):
    if e is None:
        return None
    if unit == "tokens/s/GPU":
        return e.rates.tokens_per_s_per_gpu
    if source.startswith("BLOOM"):
        return e.rates.tflops_per_gpu  # Megatron-DeepSpeed counts the recomputation
    return e.flops.megatron / e.step.step_time_s / e.layout.gpus / 1e12


def _num(x):
    return f"{x:,.0f}" if x >= 1000 else f"{x:.3g}"


def err(pred, pub):
    return pred / pub - 1


def zero_rows():
    rows = []
    for (psi, nd), pub in ZERO_TABLE1.items():
        model = ModelShape(f"{psi:.3g}", 0, 0, 0, params_only=psi)
        preds = [memory(model, Layout(dp=nd, zero=z, precision=Precision(grad_bytes=2))).total / 1e9 for z in (1, 2, 3)]
        rows.append((psi, nd, pub, preds))
    return rows


def ptdp_rows(hw):
    rows = []
    for name, t, p, n, batch, pub in PTDP_TABLE1:
        c = Layout(
            tp=t,
            pp=p,
            dp=n // (t * p),
            interleave=1,
            zero=0,
            batch=Batch(micro_batch_size=1, global_batch=batch),
            knobs=Knobs(recompute="full"),
        )
        rows.append(
            (
                name,
                t,
                p,
                n,
                batch,
                pub,
                best_fit(MODELS[name], hw, c, ("micro_batch_size", "interleave"), max_interleave=8),
            )
        )
    return rows


def korthikanti_rows(hw):
    rows = []
    for name, t, p, n, batch, mb, v, full, sel in KORTHIKANTI:
        model = MODELS[name]
        d = n // (t * p)
        for mode, pub in (("full", full), ("selective", sel)):
            c = Layout(
                tp=t,
                pp=p,
                dp=d,
                interleave=v,
                zero=0,
                batch=Batch(micro_batch_size=mb, global_batch=batch),
                knobs=Knobs(recompute=mode, sequence_parallel=mode == "selective"),
            )
            rows.append((name, mode, t, p, n, batch, mb, v, pub, estimate(model, c, hw)))
    return rows


# the calibration fit's grid: the A100 16-bit matmul efficiency and the elementwise passes over the activations
FIT_EFFICIENCY = tuple(round(0.64 + 0.01 * i, 2) for i in range(13))
FIT_PASSES = tuple(float(p) for p in range(4, 13))


def calibration_grid() -> dict:
    """{(matmul efficiency, elementwise passes): (Narayanan mean |error|, Korthikanti mean |error|)} over the fit
    grid, on the A100 preset with those two constants."""
    out = {}
    for e in FIT_EFFICIENCY:
        for passes in FIT_PASSES:
            hw = replace(HARDWARE["a100-80g"], gemm_efficiency=e, elementwise_passes=passes)
            out[(e, passes)] = (
                statistics.mean(abs(err(x.rates.tflops_per_gpu, pub)) for *_, pub, x in ptdp_rows(hw)),
                statistics.mean(abs(err(x.step.step_time_s, pub)) for *_, pub, x in korthikanti_rows(hw)),
            )
    return out


def calibration_fit(grid: dict) -> tuple:
    """The two constants fitted on the calibration set: the grid point whose worse source is best (each source's
    mean |error| counts, not the one with more rows)."""
    return min(grid, key=lambda c: max(grid[c]))


def loso(grid: dict) -> list:
    """Leave-one-source-out for the two fitted constants: fitted on one calibration source alone (the grid point
    with the least mean |error| there), judged on the other. [(held-out source, (efficiency, passes) fitted
    without it, its out-of-fold mean |error|, in-sample mean |error| with the shipped constants)]."""
    shipped = (HARDWARE["a100-80g"].gemm_efficiency, HARDWARE["a100-80g"].elementwise_passes)
    out = []
    for held, other in ((0, 1), (1, 0)):
        fitted = min(grid, key=lambda c: grid[c][other])
        out.append((("Narayanan", "Korthikanti")[held], fitted, grid[fitted][held], grid[shipped][held]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "docs" / "validation.md"))
    ap.add_argument("--check", action="store_true", help="exit 1 if a mean error exceeds the goal")
    args = ap.parse_args()
    hw = HARDWARE["a100-80g"]
    z, n, k, vrows = zero_rows(), ptdp_rows(hw), korthikanti_rows(hw), validation_rows()
    grid = calibration_grid()
    fit = calibration_fit(grid)
    t0 = time.perf_counter()
    n_fit = search(MODELS["ptdp-1t"], 3072, hw, 3072).fits
    t_search = time.perf_counter() - t0
    t0 = time.perf_counter()
    big = search(MODELS["llama-3-405b"], 16384, HARDWARE["h100-80g"], 2048)
    t_big = time.perf_counter() - t0

    out = [
        "# Planner validation",
        "",
        "Generated by `python scripts/validate_planner.py`; do not edit by hand. The planner computes every",
        "predicted number from first principles (Narayanan et al. 2021 eq. 2-3, Korthikanti et al. 2022",
        "activation memory, ZeRO's partitioning, the event-simulated collectives on the hardware topology);",
        "the published numbers are the papers'. Hardware: `a100-80g` preset, matmul efficiency "
        f"{hw.gemm_efficiency}, {hw.elementwise_passes:g} elementwise passes over the activations -- the same",
        "defaults for every row, not fitted per row. Other parts carry the matmul efficiency by their measured",
        "matmul ceiling (MAMF, see `netmorph/planner/hardware.py`): "
        + ", ".join(
            f"{h.name} {h.gemm_efficiency:.3f}" + (f" (FP8 {h.fp8_efficiency:.3f})" if h.fp8_flops else "")
            for h in (HARDWARE["h100-80g"], HARDWARE["h200"])
        )
        + ".",
        "",
    ]
    ze = [abs(err(p, q)) for _, _, pub, pr in z for p, q in zip(pr, pub)]
    out += [
        "## ZeRO (Rajbhandari et al. 2020), Table 1: model-state memory per device (GB)",
        "",
        "16 bytes per parameter (2 weights + 2 gradients + 12 Adam), N_d-way data parallelism.",
        "",
        "| Ψ | N_d | P_os published | predicted | P_os+g published | predicted | P_os+g+p published | predicted |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for psi, nd, pub, pr in z:
        cells = " | ".join(f"{a:g} | {_num(b)}" for a, b in zip(pub, pr))
        out.append(f"| {psi / 1e9:g}B | {nd} | {cells} |")
    out += [
        "",
        f"Mean absolute error {100 * statistics.mean(ze):.2f}%, worst {100 * max(ze):.2f}% "
        "(the published table rounds to 3 significant figures).",
        "",
    ]

    ne = [err(e.rates.tflops_per_gpu, pub) for *_, pub, e in n]
    out += [
        "## Narayanan et al. 2021, Table 1: achieved TFLOP/s per GPU (A100, full recomputation)",
        "",
        "| model | params (eq. 2) | t | p | GPUs | batch | planner's mb, v | published | predicted | error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (name, t, p, gpus, batch, pub, e), er in zip(n, ne):
        out.append(
            f"| {name} | {e.model.params() / 1e9:.1f}B | {t} | {p} | {gpus} | {batch} | "
            f"{e.layout.batch.micro_batch_size}, {e.layout.interleave} | {pub} | "
            f"{e.rates.tflops_per_gpu:.1f} | {100 * er:+.1f}% |"
        )
    out += [
        "",
        f"Mean absolute error {100 * statistics.mean(map(abs, ne)):.1f}%, worst {100 * max(map(abs, ne)):.1f}%.",
        "",
    ]

    ke = [err(e.step.step_time_s, pub) for *_, pub, e in k]
    out += [
        "## Korthikanti et al. 2022: iteration time (s)",
        "",
        "| model | recompute | t | p | GPUs | batch | mb | v | published | predicted | error | memory/GPU predicted |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (name, mode, t, p, gpus, batch, mb, v, pub, e), er in zip(k, ke):
        label = "full" if mode == "full" else "selective + SP"
        mem = e.memory.total
        out.append(
            f"| {name} | {label} | {t} | {p} | {gpus} | {batch} | {mb} | {v} | {pub} | "
            f"{e.step.step_time_s:.2f} | {100 * er:+.1f}% | {mem / 1e9:.1f} GB ({mem / 2**30:.1f} GiB) |"
        )
    out += [
        "",
        f"Mean absolute error {100 * statistics.mean(map(abs, ke)):.1f}%, worst {100 * max(map(abs, ke)):.1f}% "
        "(Calculon reports 3.65% on these runs).",
        "",
        "The paper gives per-GPU memory as bar charts, not numbers; the last column is the planner's",
        "prediction for the same runs (every one fits in 80 GiB, as the runs did).",
        "",
        "## The calibration fit, and leaving one source out",
        "",
        "Two constants are fitted on the calibration set: the A100's 16-bit matmul efficiency "
        f"({HARDWARE['a100-80g'].gemm_efficiency:.2f}) and the elementwise passes over a layer's activations "
        f"({HARDWARE['a100-80g'].elementwise_passes:g}), jointly, on a grid (efficiency "
        f"{FIT_EFFICIENCY[0]:.2f}..{FIT_EFFICIENCY[-1]:.2f} by 0.01, passes {FIT_PASSES[0]:g}..{FIT_PASSES[-1]:g} "
        "by 1): the point whose worse source is best, here "
        f"{fit[0]:.2f} and {fit[1]:g} (Narayanan {100 * grid[fit][0]:.2f}%, Korthikanti {100 * grid[fit][1]:.2f}%); "
        "the shipped constants are that point (`--check` fails otherwise). Fitted on one calibration source "
        "alone and judged on the other (out of fold), beside the error there with the shipped constants (in "
        "sample):",
        "",
        "| held-out source | efficiency, passes fitted without it | out-of-fold mean error | in-sample mean error |",
        "|---|---:|---:|---:|",
    ]
    for held, fitted, oof, ins in loso(grid):
        out.append(f"| {held} | {fitted[0]:.2f}, {fitted[1]:g} | {100 * oof:.1f}% | {100 * ins:.1f}% |")
    out += [
        "",
        "The validation set below is out of sample for every constant: nothing is fitted on it.",
        "",
        "## Validation set: published runs the constants never saw",
        "",
        "Every number below is predicted with the same constants as above (fitted on the calibration set",
        "only). TFLOP/s are compared in the source's own convention: Megatron's model FLOPs (full s x s",
        "attention, as torchtitan also counts) for Llama 3; Megatron-DeepSpeed's count with the recomputed",
        "forward for BLOOM. Settings a source does not give are the planner's own pick (column 'chosen').",
        "",
        "| source | run | hardware | published | predicted | error | chosen |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    verr, by_source = [], {}
    for source, run, hw_name, pub, unit, e in vrows:
        pred = predicted(unit, e, source)
        if pred is None:
            out.append(f"| {source} | {run} | {hw_name} | {pub:,} {unit} | does not fit | - | - |")
            by_source.setdefault(source, []).append(None)
            continue
        er = err(pred, pub)
        verr.append(er)
        by_source.setdefault(source, []).append(er)
        chosen = f"mb {e.layout.batch.micro_batch_size}, v {e.layout.interleave}, {e.layout.knobs.recompute}"
        out.append(f"| {source} | {run} | {hw_name} | {pub:,} {unit} | {pred:,.0f} | {100 * er:+.1f}% | {chosen} |")
    misfits = sum(er is None for ers in by_source.values() for er in ers)
    out += ["", "| source | runs | mean abs. error | worst |", "|---|---:|---:|---:|"]
    for source, ers in by_source.items():
        ok = [abs(x) for x in ers if x is not None]
        out.append(
            f"| {source} | {len(ers)} | {100 * statistics.mean(ok):.1f}% | {100 * max(ok):.1f}% |"
            if ok
            else f"| {source} | {len(ers)} | - | - |"
        )
    out += [
        "",
        f"Validation set: {len(verr)} runs, mean absolute error {100 * statistics.mean(map(abs, verr)):.1f}%, "
        f"worst {100 * max(map(abs, verr)):.1f}%; {misfits} reported as not fitting (goal: mean <= 10%, none "
        f"over 20%, none that does not fit).",
        "",
    ]

    exposed = mpt_exposed_errors()

    def mean_abs(xs):
        return 100 * statistics.mean(map(abs, xs))

    def errs(pred):
        return [100 * err(predicted(u, e, src), pub) for src, run, hwn, pub, u, e in vrows if e and pred(src, run, hwn)]

    a100 = errs(lambda src, run, hwn: "MPT" in src and hwn.startswith("a100"))
    h100 = errs(lambda src, run, hwn: "MPT" in src and hwn.startswith("h100"))
    llama8k = errs(lambda src, run, hwn: src.startswith("Llama") and run.endswith("s 8,192"))
    llama128k = errs(lambda src, run, hwn: src.startswith("Llama") and run.endswith("s 131,072"))[0]
    nemo_small = errs(
        lambda src, run, hwn: "NeMo" in src and run.split(",")[0] in ("llama-2-7b", "llama-2-13b", "llama-3-8b")
    )
    nemo_big = errs(
        lambda src, run, hwn: "NeMo" in src and run.split(",")[0] in ("llama-2-70b", "llama-3-70b", "gpt3-175b")
    )
    h100_small = [x for x in exposed if x[0].startswith("h100") and not x[2]]
    # Llama 3 405B at 8K as the paper ran it, without recomputation: plain 1F1B, and interleaved as the planner
    # picks for the row
    gpus, t, cp, p, d, seq, per_dp, pub = LLAMA3[0]
    l3v = next(
        e.layout.interleave for src, run, hwn, _, _, e in vrows if src.startswith("Llama") and e.layout.gpus == gpus
    )
    (l3, l3c1), (_, l3c) = (llama3_run(LLAMA3[0], interleave=v, recompute="none") for v in (1, l3v))
    l3e1, l3e = estimate(l3, l3c1, HARDWARE["h100-80g"]), estimate(l3, l3c, HARDWARE["h100-80g"])
    l128 = next(e for src, run, _, _, _, e in vrows if src.startswith("Llama") and run.endswith("s 131,072"))
    pub128 = LLAMA3[2][-1]
    c128 = l128.layout
    ring = estimate(
        *llama3_run(
            LLAMA3[2],
            cp_comm_type="p2p",
            micro_batch_size=c128.batch.micro_batch_size,
            interleave=c128.interleave,
            recompute=c128.knobs.recompute,
        ),
        HARDWARE["h100-80g"],
    )
    h100_hw, a100_hw = HARDWARE["h100-80g"], HARDWARE["a100-80g"]
    mm = h100_hw.peak_flops * h100_hw.gemm_efficiency / (a100_hw.peak_flops * a100_hw.gemm_efficiency)
    nvlink = h100_hw.nvlink_bandwidth / a100_hw.nvlink_bandwidth
    missed = [x[5] for x in exposed if x[0].startswith("h100")]
    share = [x[6] for x in h100_small]
    out += [
        "Where it misses, and why:",
        "",
        f"- **MPT on H100** ({min(h100):+.0f}% to {max(h100):+.0f}%; on A100 the same table is within "
        f"{statistics.mean(map(abs, a100)):.1f}% on average). The worst are the runs without activation "
        "checkpointing, a few thousand tokens per microbatch: there FSDP's gathers and reduce-scatters are "
        + f"{100 * min(share):.0f}-{100 * max(share):.0f}% of the compute on an H100 (in the planner its "
        f"matmuls are {mm:.1f}x an A100's, its NVLink {nvlink:.1f}x). The planner now overlaps them by FSDP's "
        "mechanics -- each layer's gather one layer ahead of its forward and backward, its reduce-scatter one "
        "behind, the first gather and last reduce-scatter of every microbatch exposed -- and slows the "
        f"compute beside them by {100 * h100_hw.comm_slowdown:.1f}% (Lee et al. 2025's mean, a sourced "
        "figure, not fitted here); at these sizes each layer's compute still covers its collectives, so "
        "little more is exposed. llm-foundry's own table says more was: MPT-13B on 8 H100s reaches 39.8% HFU "
        "(39.8% MFU) with 4,096 tokens per microbatch and no checkpointing, 55.5% HFU (41.6% MFU) with 40,960 "
        "and checkpointing; on every H100 run the time the planner misses is "
        f"{min(missed):.2f}-{max(missed):.2f} times the communication it hid. Priced with the collectives "
        f"exposed instead (`--dp-overlap` off), the H100 runs without checkpointing are off by "
        f"{mean_abs([x[4] for x in h100_small]):.1f}% on average (overlapped: "
        f"{mean_abs([x[3] for x in h100_small]):.1f}%) and all {len(exposed)} MPT runs by "
        f"{mean_abs([x[4] for x in exposed]):.1f}% (overlapped: {mean_abs([x[3] for x in exposed]):.1f}%) -- "
        "but switching now would be choosing the setting by the validation set, so the table keeps FSDP's "
        "prefetching as llm-foundry runs it. What would close it is the slowdown measured on an H100 "
        "(`netmorph calibrate` under torchrun with NCCL) rather than a four-GPU average, and the small "
        "microbatches' kernels (4,096 tokens) measured rather than carried from large GEMMs.",
        f"- **NeMo FP8, Llama-2 7B/13B and Llama-3 8B** ({min(nemo_small):+.0f}% to {max(nemo_small):+.0f}%): "
        "one FP8 matmul efficiency for every GEMM, carried from the measured FP8 ceiling; at hidden "
        "4096-5120 the FP8 GEMMs and their casts run further from peak than the 8k-12k-wide GEMMs of the "
        f"70B and 175B rows ({min(nemo_big):+.1f}% to {max(nemo_big):+.1f}%). A measured GEMM-shape table "
        "(`benchmarks/gemm_efficiency.py --json` on the GPU) is the fix.",
        "- **MPT-70B on 64 A100-40GB, one microbatch per step**: llm-foundry reports 36% MFU there against "
        "49% for the same model on 128 GPUs; by FSDP's mechanics the planner exposes only a gather and a "
        "reduce-scatter a microbatch in both. The difference is something it does not model (memory pressure "
        "at 40 GB, the allocator's retries, is the likely one).",
        f"- **Llama 3 405B** (8K: {min(llama8k):+.0f}% and {max(llama8k):+.0f}%; 128K: {llama128k:+.0f}%): the "
        "paper trained the 8K split without activation checkpointing and with its own FSDP (section 3.3.2: "
        "optimizer states and gradients sharded, the weights not resharded after the forward -- ZeRO-2 with "
        "the pipeline, a reduce-scatter after every microbatch's backward). Priced so, the split fits as Meta "
        f"ran it: interleaved (v = {l3v}) without recomputation, "
        f"{l3e.memory.total / 2**30:.0f} GiB on the most loaded rank "
        + ("(fits" if l3e.fits else "(DOES NOT FIT")
        + f"; plain 1F1B {l3e1.memory.total / 2**30:.0f} "
        f"GiB, {predicted('TFLOP/s', l3e1, 'Llama'):.0f} TFLOP/s with its (p-1)/m = {p - 1}/{l3c1.microbatches} "
        f"bubble), predicting {predicted('TFLOP/s', l3e, 'Llama'):.0f} TFLOP/s against {pub}. With the "
        "distributed optimizer's sharding instead (ZeRO-1: the FP32 gradients whole) the same split needs "
        "recomputation and the planner was 17% low. At 128K (cp 16) the planner's pick is also without "
        f"recomputation; context parallelism is priced as the paper runs it (section 3.3.2: K and V "
        f"all-gathered before the attention core, their gradients reduce-scattered after, exposed -- "
        f"{l128.step.parts.context_parallel:.2f} s of a {l128.step.step_time_s:.1f} s step; as a ring behind "
        f"the core it would be {100 * err(predicted('TFLOP/s', ring, 'Llama'), pub128):+.0f}%). What is left is the attention core: 40% of a layer's FLOPs at 128K (causal), "
        f"priced at one FlashAttention efficiency ({HARDWARE['h100-80g'].attention_efficiency:g} "
        "of peak) for every sequence length and for Llama 3's document-masked attention alike.",
        "- **BLOOM-176B** (+15%): Megatron-DeepSpeed on 2022 Jean Zay software, with one Omni-Path NIC per "
        "two GPUs; the planner's A100 constants are the calibration set's (NVIDIA's own Selene runs).",
        "",
        "## Search speed",
        "",
        f"Planning the 1T model of Narayanan et al. on 3072 GPUs (global batch 3072): {t_search:.2f} s for the "
        f"whole search, {n_fit:,} configurations fit; Llama 3 405B on 16,384 H100s (global batch 2048, also "
        f"over cp, precision, interleaving to 16 and uneven stages): {t_big:.2f} s for {big.searched:,} "
        f"configurations, {big.fits:,} fit, the first search on that hardware (it simulates its collectives "
        f"once). `python benchmarks/planner.py` times them cold and warm.",
        "",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(out))
    summary = (
        f"ZeRO table: mean {100 * statistics.mean(ze):.2f}%; Narayanan Table 1: mean "
        f"{100 * statistics.mean(map(abs, ne)):.1f}% worst {100 * max(map(abs, ne)):.1f}%; Korthikanti: mean "
        f"{100 * statistics.mean(map(abs, ke)):.1f}% worst {100 * max(map(abs, ke)):.1f}%; validation "
        f"{len(verr)} runs: mean {100 * statistics.mean(map(abs, verr)):.1f}% worst "
        f"{100 * max(map(abs, verr)):.1f}%, {misfits} do not fit; search {t_search:.2f} s"
    )
    print(summary)
    print(f"wrote {args.out}")
    # --check: the calibration set no worse than when the validation set was added (ZeRO <= 0.5%, Narayanan
    # <= 6.2%, Korthikanti <= 5.0%), and no published run reported as not fitting on its own hardware. The
    # validation set's errors are reported, not gated: its goal (mean <= 10%) is not met yet (see the table).
    # --check: the must-hold for the calibration set (ZeRO exact to the table's rounding, Narayanan and
    # Korthikanti within 5% on average), the shipped constants the calibration fit, the fit inside its grid (not
    # held at an edge), and no published run reported as not fitting on its own hardware.
    shipped = (hw.gemm_efficiency, hw.elementwise_passes)
    inside = FIT_EFFICIENCY[0] < fit[0] < FIT_EFFICIENCY[-1] and FIT_PASSES[0] < fit[1] < FIT_PASSES[-1]
    if args.check and (
        statistics.mean(ze) > 0.005
        or statistics.mean(map(abs, ne)) > 0.05
        or statistics.mean(map(abs, ke)) > 0.05
        or misfits
        or shipped != fit
        or not inside
    ):
        print(
            f"check failed: shipped constants {shipped}, calibration fit {fit}"
            + ("" if inside else " (at the grid's edge)")
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
