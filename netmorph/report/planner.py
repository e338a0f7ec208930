"""Tour section: one model across its parallel splits -- memory per GPU and throughput, the plan marked."""

from __future__ import annotations

import numpy as np

from netmorph.files import save_figure
from netmorph.report.html import Section
from netmorph.tour.planner import BATCH, GPUS, MODEL, Planning


def build_section(res: Planning, out_dir) -> Section:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result, elapsed, n_fit, best = res.result, res.seconds, res.result.fits, res.result.ranked[0]
    b, bs, br = best.layout, best.step, best.rates  # the plan
    splits = [(t, p) for t, p, _, _ in res.splits]
    mems = [m for _, _, m, _ in res.splits]
    thr = [v for _, _, _, v in res.splits]
    labels = [f"t{t}\np{p}" for t, p in splits]
    fig, axes = plt.subplots(2, 1, figsize=(13, 8), sharex=True)
    x = np.arange(len(splits))
    bottom = np.zeros(len(splits))
    for key, color in (
        ("params", "#1f77b4"),
        ("grads", "#ff7f0e"),
        ("optimizer", "#2ca02c"),
        ("activations", "#d62728"),
    ):
        vals = np.array([getattr(m, key) / 2**30 for m in mems])
        axes[0].bar(x, vals, bottom=bottom, color=color, label=key)
        bottom += vals
    axes[0].axhline(res.memory_bytes / 2**30, color="black", ls="--", lw=1, label="80 GiB per A100")
    axes[0].set_yscale("log")
    axes[0].set_ylim(1, None)
    axes[0].set_ylabel("GiB per GPU (ZeRO-1, selective recompute, mb 1)")
    axes[0].legend(fontsize=8, ncol=5)
    colors = ["#999999" if v == 0 else "#1f77b4" for v in thr]
    bi = splits.index((b.tp, b.pp)) if (b.tp, b.pp) in splits else None
    if bi is not None:
        colors[bi] = "#d62728"
    axes[1].bar(x, thr, color=colors)
    for i, v in enumerate(thr):
        if v == 0:
            axes[1].text(i, 2, "no fit", ha="center", fontsize=7, rotation=90)
    if bi is not None:
        axes[1].annotate(
            f"plan: {b.tp}x{b.pp}x{b.dp}, mb {b.batch.micro_batch_size}, v {b.interleave}"
            f", ZeRO-{b.zero}, {b.knobs.recompute}",
            (bi, thr[bi]),
            xytext=(bi - 6, thr[bi] * 1.08),
            arrowprops={"arrowstyle": "->"},
            fontsize=9,
        )
    axes[1].set_ylabel("best predicted MFU (%)")
    axes[1].set_xticks(x, labels, fontsize=8)
    axes[1].set_xlabel("tensor x pipeline split (data parallel = 1024 / (t·p))")
    fig.suptitle(f"GPT-3 175B on {GPUS} A100-80GB, global batch {BATCH}: what each split costs", fontsize=11)
    fig.tight_layout()
    save_figure(fig, out_dir / "plan_splits.png")
    plt.close(fig)
    mem = best.memory
    big, t_big = res.big, res.big_seconds
    g, gs, gr = big.ranked[0].layout, big.ranked[0].step, big.ranked[0].rates
    html = f"""
<p>The planner's memory model (ZeRO's partitioning, Megatron's sharding, Korthikanti et al.'s activations) and
time model (Narayanan et al.'s FLOPs, the pipeline bubble, every collective simulated on the DGX A100 cluster
topology) over every split of GPT-3 175B on {GPUS} A100s: {result.searched:,} configurations in
{elapsed:.2f} s, {n_fit:,} of which fit. Without tensor or pipeline parallelism a GPU would hold
{mems[0].total / 2**40:.1f} TiB; tensor parallelism beyond one node's 8 GPUs is rejected outright (an all-reduce per
layer on InfiniBand).</p>
<p><b>The plan:</b> tp {b.tp}, pp {b.pp}, dp {b.dp}, microbatch {b.batch.micro_batch_size},
interleaving {b.interleave}, ZeRO-{b.zero}, {b.knobs.recompute} recomputation
{"with" if b.knobs.sequence_parallel else "without"} sequence parallelism: {bs.step_time_s:.2f} s per iteration,
{br.tflops_per_gpu:.0f} TFLOP/s per GPU, MFU {100 * br.mfu:.0f}%, bubble {100 * bs.bubble_fraction:.1f}%,
{mem.total / 2**30:.1f} GiB per GPU. Its accuracy against the papers' published runs is in
<code>docs/validation.md</code>.</p>
<p>The same search for Llama 3 405B (grouped-query attention, SwiGLU, FlashAttention, 126 layers with the first
and last pipeline stages one layer short, as Meta ran it) on 16,384 H100s, over context parallelism and
interleaving to 16 as well: {big.searched:,} configurations in {t_big:.2f} s, {big.fits:,} fit; the plan is
tp {g.tp}, cp {g.cp}, pp {g.pp}, dp {g.dp}, microbatch {g.batch.micro_batch_size}, v {g.interleave},
ZeRO-{g.zero}, {g.knobs.recompute} recomputation: {gs.step_time_s:.2f} s per 16M-token step,
MFU {100 * gr.mfu:.0f}% (Meta reports 38-43% on tp 8, pp 16).</p>
<p>Reproduce: <code>netmorph plan --model gpt3-175b --gpus 1024 --global-batch 1536</code>;
<code>netmorph plan estimate --model gpt3-175b --tp 8 --pp 8 --dp 16 --global-batch 1536 --recompute full</code>.</p>
"""
    summary = [
        f"{MODEL} on {GPUS} x a100-80g: {n_fit:,} of {result.searched:,} configurations fit "
        f"(searched in {elapsed:.2f} s)",
        f"plan: tp{b.tp} pp{b.pp} dp{b.dp} mb{b.batch.micro_batch_size} v{b.interleave} "
        f"ZeRO-{b.zero} {b.knobs.recompute}: {bs.step_time_s:.2f} s/iter, "
        f"{br.tflops_per_gpu:.0f} TFLOP/s/GPU, MFU {100 * br.mfu:.0f}%",
        f"llama-3-405b on 16,384 x h100-80g: {big.fits:,} of {big.searched:,} configurations fit "
        f"(searched in {t_big:.2f} s); plan: tp{g.tp} cp{g.cp} pp{g.pp} dp{g.dp} "
        f"mb{g.batch.micro_batch_size} v{g.interleave} ZeRO-{g.zero} {g.knobs.recompute}: "
        f"{gs.step_time_s:.2f} s/iter, MFU {100 * gr.mfu:.0f}%",
    ]
    return Section(
        "Parallelism planner: what each DP/TP/PP split costs",
        html,
        [("plan_splits.png", "Memory per GPU and best throughput for each tensor x pipeline split.")],
        summary,
    )
