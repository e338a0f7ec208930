"""A simulated cluster step as a timeline: one rank of every pipeline stage, slots, sends and DP buckets."""

from __future__ import annotations

from netmorph.files import save_figure
from netmorph.report.html import Section
from netmorph.tour.simulate import LAYOUT

COLORS = {"F": "tab:blue", "B": "tab:green", "dp": "tab:red", "opt": "tab:purple"}


def plot_timeline(spans, pp: int, stage_size: int, path, title: str) -> None:
    """``spans``: (rank, name, category, start, end) of the traced ranks (rank 0 of every stage)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(11, 0.45 * pp + 1.6))
    rows = {}
    for g, name, cat, t0, t1 in spans:
        r = g // stage_size
        if cat == "slot":
            rows.setdefault((r, name[0]), []).append((t0, t1 - t0))
        elif cat == "dp":
            rows.setdefault((r, "dp"), []).append((t0, t1 - t0))
        elif name == "optimizer":
            rows.setdefault((r, "opt"), []).append((t0, t1 - t0))
    for (r, kind), bars in rows.items():
        y, hgt = (pp - 1 - r, 0.8) if kind in "FB" else (pp - 1 - r - 0.1, 0.2)
        ax.broken_barh(
            bars,
            (y - 0.4 if kind in "FB" else y - 0.4, hgt),
            facecolors=COLORS[kind],
            edgecolor="white" if kind in "FB" else None,
            linewidth=0.2,
        )
    ax.set_yticks(range(pp))
    ax.set_yticklabels([f"stage {pp - 1 - i} (rank {(pp - 1 - i) * stage_size})" for i in range(pp)], fontsize=7)
    ax.set_xlabel("simulated time in the step (s)")
    ax.set_title(title, fontsize=9)
    ax.legend(
        handles=[
            Patch(color=COLORS["F"], label="forward"),
            Patch(color=COLORS["B"], label="backward"),
            Patch(color=COLORS["dp"], label="DP gradient bucket"),
            Patch(color=COLORS["opt"], label="optimizer"),
        ],
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
    )
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def build_section(out: dict, out_dir) -> Section:
    """:func:`netmorph.tour.simulate.run`'s step: the timeline and the breakdown beside the planner's."""
    c = LAYOUT
    stage = c.tp * c.dp
    plot_timeline(
        out["spans"],
        c.pp,
        stage,
        out_dir / "simulate_step.png",
        f"GPT-3 175B, {c.label()}, 1F1B, 96 microbatches: rank 0 of each pipeline stage "
        f"(all {out['ranks']} ranks simulated)",
    )
    b, pb = out["breakdown_s"], out["planner_breakdown_s"]
    diff = out["step_time_s"] / out["planner_step_time_s"] - 1
    rows = "".join(
        f"<tr><td>{k}</td><td>{b[k]:.3f}</td><td>{pb[k]:.3f}</td></tr>"
        for k in ("compute", "tp", "pp", "dp", "bubble", "optimizer")
    )
    html = f"""
<p>Every rank's program for one iteration of GPT-3 175B on 1024 A100s ({c.label()}, 1F1B, gradient buckets
overlapped with the last backward): the pipeline schedule's slots, two tensor-parallel all-reduces per layer forward
and four backward (full recomputation), a send per stage boundary per microbatch, one data-parallel bucket per layer.
{out["events"]:,} events on {out["ranks"]} ranks in {out["sim_wall_s"]:.1f} s. Step time {out["step_time_s"]:.2f} s
simulated against {out["planner_step_time_s"]:.2f} s from the planner's formula ({100 * diff:+.1f}%).</p>
<table><tr><th>part (s)</th><th>simulated (the rank that finishes last)</th><th>planner (the most loaded stage)</th>
</tr>{rows}</table>
<p>The two agree on the collectives; the simulator sees that only the last stage carries the LM head, so the other
stages compute less but wait for it (their bubble is larger), and that a pipeline send sharing a NIC with a
gradient bucket is slowed. Reproduce: <code>netmorph simulate step --model gpt3-175b --tp 8 --pp 8 --dp 16
--global-batch 1536 --recompute full --dp-overlap --trace step.json</code> (open the trace in ui.perfetto.dev).</p>
"""
    files = [
        (
            "simulate_step.png",
            "One simulated step, rank 0 of every pipeline stage: forward and backward slots, "
            "the warm-up and cool-down bubble, the gradient buckets at the end.",
        )
    ]
    summary = [
        f"gpt3-175b on {out['ranks']} x a100-80g ({c.label()}): {out['events']:,} events in "
        f"{out['sim_wall_s']:.1f} s; step {out['step_time_s']:.2f} s simulated vs {out['planner_step_time_s']:.2f}"
        f" s planner ({100 * diff:+.1f}%)"
    ]
    return Section("Cluster scale: one step simulated on 1024 ranks", html, files, summary)
