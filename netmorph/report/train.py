"""Tour section: a network trained split across real ranks -- the pipeline's timeline, the bytes
each phase sent against its closed form, and what each ZeRO stage keeps per rank."""

from __future__ import annotations

import numpy as np

from netmorph.files import save_figure
from netmorph.report.html import Section
from netmorph.tour.train import Training

COLORS = {"F": "#1f77b4", "B": "#ff7f0e", "W": "#2ca02c"}


def build_section(res: Training, out_dir) -> Section:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, out3 = res.schedules, res.three_d
    fig, axes = plt.subplots(len(runs), 1, figsize=(13, 2.3 * len(runs)), sharex=True)  # one clock: compare
    for ax, (name, v, out) in zip(axes, runs):
        spans = out.timeline
        t0 = min(s[3] for rank in spans.values() for s in rank)
        for rank, rows in spans.items():
            y = out.pp_rank[rank]
            bars = {}  # one bar collection per kind and chunk on a rank: hundreds of spans, a few artists
            for kind, mb, chunk, a, b in rows:
                bars.setdefault((kind, chunk), []).append(((a - t0) * 1e3, (b - a) * 1e3))
            for (kind, chunk), xs in bars.items():
                ax.broken_barh(
                    xs, (y - 0.4, 0.8), color=COLORS[kind], alpha=0.55 + 0.45 * (chunk == 0), edgecolor="white"
                )
            for kind, mb, chunk, a, b in rows:
                ax.text(
                    (a - t0) * 1e3 + (b - a) * 5e2,
                    y,
                    f"{mb}" + ("'" if chunk else ""),
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white",
                )
        b = out.bubble_fraction
        label = {
            "afab": "GPipe (all forward, all backward)",
            "1f1b": "1F1B (PipeDream-flush)",
            "interleaved": "interleaved 1F1B, 2 chunks per rank",
            "zb-h1": "ZB-H1 (zero bubble: W, the weight gradients, fill the drain)",
            "zbv": "ZB-V (two chunks in a V, W's fill the bubble; 1F1B's memory)",
            "dualpipev": "DualPipeV (DeepSeek-V3's, cut in half; F&B pairs, one chunk more in flight)",
        }[name]
        form = b["form"]
        ax.set_title(
            f"{label}: bubble measured {b['measured']:.0%}, {form} = {b['theory']:.0%}; "
            f"step {out.step_time_s * 1e3:.0f} ms",
            fontsize=9,
        )
        ax.set_yticks(range(4), [f"rank {i}" for i in range(4)], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("ms", fontsize=8)
    fig.suptitle(
        "One training step on 4 pipeline ranks, 8 microbatches: blue forward, orange backward (in the "
        "zero-bubble ones the input gradient alone),\ngreen the weight gradient; ' the second chunk (in a V "
        "the one back up the ranks, rank 0 ending in the loss)",
        fontsize=10,
    )
    fig.tight_layout()
    save_figure(fig, out_dir / "train_pipeline.png")
    plt.close(fig)

    # 2. 3D: every phase's bytes against its closed form
    phases = [p for p in ("zero", "tp", "pp", "pp.emb") if p in out3.bytes_per_rank_by_phase]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    x = np.arange(len(phases))
    ax.bar(x - 0.2, [out3.bytes_per_rank_by_phase[p] / 1e3 for p in phases], 0.4, label="measured (ledger)")
    ax.bar(
        x + 0.2,
        [out3.predicted_bytes_per_rank_by_phase[p] / 1e3 for p in phases],
        0.4,
        label="closed form",
        color="#aaaaaa",
    )
    ax.set_xticks(x, phases)
    _finish(
        plt,
        fig,
        ax,
        "kB sent per rank per step (max over ranks)",
        "tp2 pp2 dp2 ZeRO-1: what each phase sent vs its closed form",
        out_dir / "train_traffic.png",
    )

    # 3. ZeRO stages on dp 4: model-state bytes per rank
    mems, plans = [m for _, m, _ in res.zero_memory], [q for _, _, q in res.zero_memory]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    bottom = np.zeros(4)
    for key, color in (("params", "#1f77b4"), ("grads", "#ff7f0e"), ("optimizer", "#2ca02c")):
        vals = np.array([m[key] / 1e6 for m in mems])
        ax.bar(range(4), vals, bottom=bottom, color=color, label=key)
        bottom += vals
    ax.scatter(
        range(4), [v / 1e6 for v in plans], marker="_", s=2500, color="black", zorder=3, label="netmorph plan estimate"
    )
    ax.set_xticks(range(4), ["DP", "ZeRO-1", "ZeRO-2", "ZeRO-3"])
    _finish(
        plt,
        fig,
        ax,
        "MB per rank held between steps",
        "The default GPT on 4 data-parallel ranks, fp32 Adam: ZeRO shards what the paper says",
        out_dir / "train_zero_memory.png",
    )

    exact = all(out3.traffic_exact.values())
    bub = {name: out.bubble_fraction for name, _, out in runs}
    html = f"""
<p>A small GPT (Megatron's parameter layout, {res.params:,} parameters) trained split across real
processes. Every layout -- data parallel, ZeRO 1-3, Megatron's tensor parallelism with and without sequence
parallelism, each pipeline schedule, and their 3D composition -- reproduces the 1-rank run on the same global
batches (float64: to about 1e-15); here tp2 pp2 dp2 ZeRO-1 differs from it by {out3.max_rel_loss_diff:.1e}
in loss.</p>
<p><b>The pipeline timeline</b> shows each schedule's bubble: GPipe runs all 8 forwards before any backward, so
every stage holds 8 microbatches; 1F1B interleaves them after a warm-up, holding at most 4 on stage 0 for the same
bubble; two model chunks per rank shrink the bubble to (p-1)/(v·m+p-1); ZB-H1 splits each backward into B, the
input gradient the stage before waits for, and W, the weight gradient only the optimizer needs, and runs the W's
in the drain's waits -- (p-1)/(3m+p-1) at F = B = W, a third of 1F1B's bubble at 1F1B's activations. Compute is
emulated (15 ms per forward, 30 ms per backward, ZB-H1's as 15 for B and 15 for W), so 4 processes on this
machine's cores time the schedule, not the scheduler.</p>
<p><b>Traffic</b>: the ledger's bytes per phase {"equal" if exact else "differ from"} the closed forms on every rank
and step (ZeRO's reduce-scatter + all-gather 2(d-1)/d·Ψ, Megatron's 8(t-1)/t·bsh per layer per microbatch plus the
embedding, LM head and vocab-parallel loss, one activation and one gradient per stage boundary per microbatch).
<b>Memory</b>: ZeRO-1 divides the optimizer state by d, ZeRO-2 the gradients too, ZeRO-3 the parameters; the
bytes each rank holds equal the planner's formula for the same layout (the black marks).</p>
<p>Reproduce: <code>netmorph train --tp 2 --pp 2 --dp 2 --zero 1 --microbatches 4 --check</code>;
<code>netmorph train --pp 4 --schedule 1f1b --microbatches 8 --layers 8 --compute-ms 15 --trace run.json</code>.</p>
"""
    summary = [
        f"tp2 pp2 dp2 ZeRO-1: loss vs the 1-rank run {out3.max_rel_loss_diff:.1e}; traffic "
        f"{'= closed form on every rank' if exact else 'differs from the closed form'} "
        f"({', '.join(phases)})",
        "pipeline bubble, 4 stages x 8 microbatches: "
        + ", ".join(f"{n} {b['measured']:.0%} (theory {b['theory']:.0%})" for n, b in bub.items()),
        "ZeRO on dp 4, model states MB per rank (= planner): "
        + ", ".join(
            f"{lab} {sum(m[k] for k in ('params', 'grads', 'optimizer')) / 1e6:.2f}"
            + ("" if abs(sum(m[k] for k in ("params", "grads", "optimizer")) - q) < 1 else " (planner differs)")
            for lab, m, q in zip(("DP", "Z1", "Z2", "Z3"), mems, plans)
        ),
    ]
    return Section(
        "Parallel training: DP, ZeRO, TP and PP on real ranks",
        html,
        [
            ("train_pipeline.png", "One step's timeline under GPipe, 1F1B and interleaved 1F1B."),
            ("train_traffic.png", "Bytes per rank per step by phase: ledger vs closed form."),
            ("train_zero_memory.png", "Model-state bytes per rank for DP and each ZeRO stage."),
        ],
        summary,
    )


def _finish(plt, fig, ax, ylabel: str, title: str, path) -> None:
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
