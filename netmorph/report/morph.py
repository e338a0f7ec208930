"""Tour section: the control loop on a degrading link, and a reshard's transfer plan as a rank x rank matrix."""

from __future__ import annotations

import numpy as np

from netmorph.files import save_figure
from netmorph.report.html import Section
from netmorph.tour.morph import Morph


def _clock(run):
    """Each step's end on the run's wall clock: its steps' times plus the moves and recoveries where they happened."""
    t = np.cumsum(run.step_s)
    for at, spent, *_ in run.events:
        t[at:] += spent
    return t


def plot_throughput(path, adaptive, statics, scenario) -> None:
    """Tokens/s over the run's wall clock: the adaptive run against static splits (a stopped one ends with an x),
    its moves marked. Steps redone after going back to a checkpoint are drawn as run, so a rollback shows as
    time spent without progress."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for name, r in statics.items():
        if not r.step_s:
            continue
        t = _clock(r)
        (line,) = ax.plot(
            t, r.throughput(), lw=1, alpha=0.7, label=f"static {name}" + (" (stopped)" if r.failed else "")
        )
        if r.failed:
            ax.plot(t[-1], r.throughput()[-1], "x", color=line.get_color(), ms=9, mew=2)
    t = _clock(adaptive)
    ax.plot(t, adaptive.throughput(), lw=2.2, color="black", label="adaptive")
    top = ax.get_ylim()[1]
    for k, (at, _, step, what) in enumerate(adaptive.events):
        x = t[at - 1] if at else 0.0
        ax.axvline(x, color="red", ls="--", lw=1)
        ax.annotate(f"step {step}: {what}", (x, top * (0.95 - 0.06 * (k % 2))), fontsize=8, color="red")
    for e in scenario.events:
        if e.kind.startswith("link-") and 0 < e.at <= len(t):
            ax.axvline(t[e.at - 1], color="gray", ls=":", lw=1)
            ax.annotate(
                e.kind,
                (t[e.at - 1], top * 0.95),
                fontsize=8,
                color="gray",
                xytext=(3, 0),
                textcoords="offset points",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8},
            )
    others = [e.label() for e in scenario.events if not e.kind.startswith("link-")]
    if others:
        lost = any(e.loss for e in scenario.events)
        when = "a loss mid-step, the rest at the next segment boundary" if lost else "at the next segment boundary"
        ax.annotate(f"{', '.join(others)} ({when})", (0.01, 0.02), xycoords="axes fraction", fontsize=8, color="gray")
    ax.set_xlabel("wall-clock seconds (steps, moves and redone steps)")
    ax.set_ylabel("tokens/s")
    ax.set_title("throughput over time: the control loop against static splits")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def plot_plan(path, p) -> None:
    """The reshard plan's bytes, source rank by destination rank, with what each rank keeps on the diagonal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = p.bytes_matrix().astype(float)
    kept = np.zeros(p.world)
    for r, kinds in p.local.items():
        kept[r] = sum(len(a) for a, _ in kinds.values()) * p.itemsize
    fig, ax = plt.subplots(figsize=(6.2, 5))
    shown = m.copy()
    shown[shown == 0] = np.nan
    im = ax.imshow(shown / 1024, cmap="viridis")
    for i in range(p.world):
        for j in range(p.world):
            if m[i, j]:
                ax.text(j, i, f"{m[i, j] / 1024:.0f}", ha="center", va="center", fontsize=7, color="white")
            elif i == j:
                ax.text(j, i, f"keeps\n{kept[i] / 1024:.0f}", ha="center", va="center", fontsize=6, color="gray")
    ax.set_xticks(range(p.world))
    ax.set_yticks(range(p.world))
    ax.set_xlabel("destination rank")
    ax.set_ylabel("source rank")
    ax.set_title(
        f"{p.before.tag()} -> {p.after.tag()}: KiB moved\n{p.messages} messages, {p.rounds} rounds, "
        f"{p.bytes / 1024:,.0f} KiB on the wire",
        fontsize=9,
    )
    fig.colorbar(im, ax=ax, label="KiB")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def build_section(res: Morph, out_dir) -> Section:
    """:func:`netmorph.tour.morph.run`'s runs over wall time and its reshard plan."""
    scenario, segment, start, adaptive, statics, moved = (
        res.scenario,
        res.segment,
        res.start,
        res.adaptive,
        res.statics,
        res.moved,
    )
    plot_throughput(out_dir / "morph_throughput.png", adaptive, statics, scenario)
    plot_plan(out_dir / "morph_plan.png", moved)
    best = min(statics, key=lambda k: statics[k].total_s)
    ranked = ", ".join(f"{k} {1e3 * v:.0f} ms" for k, v in list(res.predicted.items())[:4]) + " a step"
    first = statics[start.tag()].total_s
    moves = "; ".join(f"step {d.step}: {d.before} -> {d.after}" for d in adaptive.decisions) or "no move"
    summary = [
        f"8 ranks on two emulated nodes, the inter-node link 10x slower from step {scenario.at}: {moves}",
        f"adaptive {adaptive.total_s:.2f} s, static {start.tag()} (the start) {first:.2f} s, best static "
        f"{best} {statics[best].total_s:.2f} s",
        f"reshard tp2·pp2·dp2 -> dp8·zero3: {moved.messages} messages in {moved.rounds} rounds, "
        f"{moved.bytes:,} B on the wire, {moved.kept_bytes():,} B kept in place",
    ]
    html = f"""
<p>A small GPT trains for real on 8 ranks laid out as two emulated nodes (the fabric's per-link α/β), each rank's
accelerator emulated as a FLOP rate (a sleep of its share of the compute). No layout is trial-run: the planner
prices every one on the cluster's twin -- the emulated accelerator, the links measured by <code>netmorph
calibrate</code>'s link phase -- {ranked}; the loop starts on the first, <b>{start.tag()}</b>. At step
{scenario.at} the link between the nodes becomes ten times slower. After each segment of {segment} steps the loop
writes what it measured into the twin (the step's compute, a message timed across the nodes), re-prices every
layout and moves when the best one saves more than 10% for two looks in a row and pays for the move: {moves}. It finished in {adaptive.total_s:.2f} s against
{first:.2f} s for staying on {start.tag()} and {statics[best].total_s:.2f} s for {best} all along.</p>
<p>Under dp8 every rank already holds the whole model and its Adam moments, so that move sends nothing. The second
figure is the move out of a sharded layout, tp2·pp2·dp2 to ZeRO-3 over 8 ranks: the plan, computed before
anything moves, as bytes from each source rank to each destination rank -- {moved.messages} messages in
{moved.rounds} rounds, {moved.bytes:,} B on the wire -- which the ledger then counts exactly.</p>
<p>The other scenarios change the job itself: <code>node-lost@STEP</code> takes the second node's ranks and the
state only they held (the loop moves to the survivors' best layout, from what they hold or from the last
checkpoint), <code>seq-grows@STEP</code> lengthens the sequences (the position table grows; the best split
moves with the compute).</p>
<p>Reproduce: <code>netmorph morph --scenario link-degrades@40 --plot morph.png</code>;
<code>netmorph morph --scenario node-lost@50 --inter-node-mbps 5</code>;
<code>netmorph morph reshard --world 8 --from tp2,pp2,dp2 --to dp8,zero3</code>.</p>
"""
    return Section(
        "Adaptive parallelism: the split follows the bottleneck",
        html,
        [
            ("morph_throughput.png", "Tokens/s over wall-clock time: the control loop against static splits."),
            ("morph_plan.png", "A reshard's transfer plan: KiB from each source rank to each destination."),
        ],
        summary,
    )
