"""Serving figures: KV memory over time (paged vs contiguous), and throughput against latency per scheduler."""

from __future__ import annotations

import numpy as np

from netmorph.files import save_figure
from netmorph.report.html import Section
from netmorph.tour.serving import RATES, TRAINING, Serving

PHASE_COLORS = {
    TRAINING: "tab:purple",
    "prefill: TP all-reduces": "tab:orange",
    "KV transfer (prefill -> decode ranks)": "tab:red",
    "decode: TP all-reduces": "tab:blue",
}


def plot_phases(runs: dict, path) -> dict:
    """Every message's bytes by phase over wall time, one panel per run; {phase: (messages, bytes)}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    totals = {}
    for ax, (title, msgs) in zip(axes, runs.items()):
        t0 = min(m[0] for m in msgs)
        span = max(m[0] for m in msgs) - t0 or 1e-3
        bins = np.linspace(0, span * 1.0001, 41)
        bottom = np.zeros(40)
        for ph, color in PHASE_COLORS.items():
            x = [m[0] - t0 for m in msgs if m[2] == ph]
            if not x:
                continue
            w = [m[1] for m in msgs if m[2] == ph]
            h, _ = np.histogram(x, bins, weights=w)
            ax.bar(
                1e3 * bins[:-1],
                h / 1024,
                width=1e3 * np.diff(bins),
                bottom=bottom,
                align="edge",
                color=color,
                label=f"{ph} ({len(x):,} msgs, {sum(w) / 2**20:.1f} MiB)",
            )
            bottom += h / 1024
            totals[ph] = (len(x), sum(w))
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("wall time (ms)")
        ax.set_ylim(0, 1.4 * (bottom.max() or 1.0))  # every bar whole, and the legend above them
        ax.legend(fontsize=6.5, loc="upper right")
    axes[0].set_ylabel("KiB sent per bin")
    fig.suptitle(
        "bytes on the fabric by phase: training's bursts, prefill's large all-reduces, the KV transfer, "
        "decode's stream of small ones",
        fontsize=10,
    )
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return totals


def build_section(res: Serving, out_dir) -> Section:
    """KV memory and the load curves, then the bytes by phase."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kv, curves = res.kv, res.curves
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, (timeline, m) in kv.items():
        t = [x[0] for x in timeline]
        ls = "-" if name == "paged" else "--"
        a.plot(t, [x[2] for x in timeline], ls, color="tab:gray", label=f"{name}: reserved")
        a.plot(
            t,
            [x[1] for x in timeline],
            ls,
            color="tab:blue" if name == "paged" else "tab:red",
            label=f"{name}: holding a token ({100 * m['kv_utilization']:.0f}%)",
        )
    a.set_xlabel("time (s, priced as Llama-3-8B on an A100)")
    a.set_ylabel("KV slots (64 blocks x 16)")
    a.set_title("KV memory: paged vs contiguous reservations", fontsize=10)
    a.legend(fontsize=7)
    for name, ms in curves.items():
        b.plot([m["throughput_tok_s"] for m in ms], [1e3 * m["ttft_s"]["p90"] for m in ms], "-o", label=name)
        for rate, m in zip(RATES, ms):
            b.annotate(
                f"{rate:g}/s",
                (m["throughput_tok_s"], 1e3 * m["ttft_s"]["p90"]),
                fontsize=7,
                textcoords="offset points",
                xytext=(4, 4),
            )
    b.set_yscale("log")
    b.set_xlabel("throughput (tokens/s)")
    b.set_ylabel("TTFT p90 (ms)")
    b.set_title(
        f"throughput vs latency at {', '.join(f'{r:g}' for r in RATES)} requests/s ({res.requests} requests each)",
        fontsize=10,
    )
    b.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out_dir / "serve_kv_and_latency.png")
    plt.close(fig)
    totals = plot_phases(res.phases, out_dir / "serve_phases.png")
    p, c = kv["paged"][1], kv["contiguous"][1]
    hi = {k: v[-1] for k, v in curves.items()}
    html = f"""
<p>The project's GPT serves a ShareGPT-shaped workload (lengths scaled down 4&times; to keep the tour quick), every
token computed for real, each iteration priced as Llama-3-8B's roofline on an A100. <b>Left</b>: the same 32 requests
through a pool of 64 blocks &times; 16 tokens. Paged blocks hold a token in {100 * p["kv_utilization"]:.0f}% of their
slots; reserving the whole 512-token context per request holds {100 * c["kv_utilization"]:.0f}%, so fewer requests
run at once and the run takes {c["duration_s"] / p["duration_s"]:.1f}&times; as long. <b>Right</b>: throughput
against the time to the first token (p90) as the arrival rate grows, for static batches, continuous batching, and continuous
batching with chunked prefill.</p>
<p>The second figure puts the phases of communication side by side on the same fabric: one data-parallel
training step's gradient all-reduce, a disaggregated serve (each prompt's KV sent from the prefill rank to a decode
rank) and a tensor-parallel serve (Megatron's two all-reduces per layer per iteration: large while prefilling, one
token's worth per sequence while decoding).</p>
<p>Reproduce: <code>netmorph serve --kv contiguous</code>, <code>--scheduler static</code>,
<code>--chunked-prefill 64</code>; <code>python benchmarks/serve.py</code> for the full-size comparison.</p>
"""
    files = [
        (
            "serve_kv_and_latency.png",
            "KV slots reserved and holding tokens over time, paged vs contiguous; "
            "throughput vs time to first token per scheduler.",
        ),
        (
            "serve_phases.png",
            "Bytes on the fabric by phase over wall time: a training step, disaggregated "
            "serving, tensor-parallel serving.",
        ),
    ]
    summary = [
        f"KV utilisation: paged {100 * p['kv_utilization']:.0f}%, contiguous {100 * c['kv_utilization']:.0f}% "
        f"(same 32 requests, 64 blocks); run {c['duration_s'] / p['duration_s']:.1f}x longer contiguous",
        "at 16 requests/s: " + ", ".join(f"{k} {m['throughput_tok_s']:,.0f} tok/s" for k, m in hi.items()),
        "bytes by phase: " + ", ".join(f"{k} {n:,} msgs / {b / 2**20:.1f} MiB" for k, (n, b) in totals.items()),
    ]
    return Section("Serving: paged KV cache and iteration-level scheduling", html, files, summary)
