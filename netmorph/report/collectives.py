"""Tour section: the same all-reduce eight ways, and why the cheapest one morphs.

A tensor-parallel all-reduce runs among 8 GPUs of one node (NVLink, small
activations, latency-bound); a data-parallel one runs among the same-index GPUs
of 8 nodes (InfiniBand, large gradients, bandwidth-bound). Same p, same op,
different placement on the same cluster -- and different winners.
"""

from __future__ import annotations

import numpy as np

from netmorph.files import save_figure
from netmorph.report.html import Section
from netmorph.report.table import size_bands
from netmorph.tour.collectives import MAP_SIZES, SIZES, WORLDS, Collectives, color, winners
from netmorph.units import fmt_bytes, fmt_time


def build_section(res: Collectives, out_dir) -> Section:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves, maps, preds, names = res.curves, res.maps, res.flat, res.algos
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    band_text = {}
    for ax, (label, cv) in zip(axes, curves.items()):
        win = winners(cv)
        best = np.min(np.array([cv[a] for a in names]), axis=0)
        ax.plot(SIZES, best, color="black", lw=7, alpha=0.12, label="fastest (tuner's pick)")
        for a in names:
            ax.plot(SIZES, cv[a], color=color(a), lw=1.8, label=a)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("all-reduce size per rank (bytes)")
        ticks = [1 << e for e in range(10, 31, 4)]
        ax.set_xticks(ticks, [fmt_bytes(t).replace(" ", "") for t in ticks])
        ax.grid(True, which="major", alpha=0.3)
        band_text[label] = size_bands(win, SIZES)
    axes[0].set_ylabel("predicted time (s)")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle("One all-reduce, p = 8, on a DGX A100 cluster: tensor-parallel vs data-parallel placement")
    fig.tight_layout()
    save_figure(fig, out_dir / "allreduce_tp_vs_dp.png")
    plt.close(fig)

    from matplotlib.colors import ListedColormap

    cmap = ListedColormap([color(a) for a in names])
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, (name, grid) in zip(axes, maps.items()):
        ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(names) - 0.5, aspect="auto", origin="lower")
        ax.set_xticks(range(len(MAP_SIZES)), [fmt_bytes(n).replace(" ", "") for n in MAP_SIZES], rotation=45)
        ax.set_yticks(range(len(WORLDS)), [str(p) for p in WORLDS])
        ax.set_xlabel("message size per rank")
        ax.set_ylabel("world size p (ranks 0..p-1, 8 per node)")
        ax.set_title(f"{name}: fastest all-reduce", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=color(a)) for a in names]
    fig.legend(handles, names, loc="lower center", ncol=8, fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    save_figure(fig, out_dir / "allreduce_winner_map.png")
    plt.close(fig)

    # what each algorithm costs in the two hardware-independent quantities
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    axes[0].bar(names, [p.counts.rounds for p in preds], color=[color(a) for a in names])
    axes[0].set_ylabel("rounds on the critical path")
    axes[1].bar(names, [p.counts.max_bytes_sent / 2**20 for p in preds], color=[color(a) for a in names])
    axes[1].set_ylabel("MiB sent by the busiest rank")
    for ax in axes:
        ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.suptitle("8 MiB all-reduce on 8 ranks: message rounds vs bytes on the wire")
    fig.tight_layout()
    save_figure(fig, out_dir / "allreduce_rounds_bytes.png")
    plt.close(fig)

    tp_label, dp_label = list(curves)
    tp_small, dp_small = curves[tp_label], curves[dp_label]
    one_kib_ratio = dp_small["recursive_doubling"][0] / tp_small["recursive_doubling"][0]
    gib = -1
    big_ratio = min(dp_small[a][gib] for a in names) / min(tp_small[a][gib] for a in names)
    rows = "".join(
        f"<tr><td>{a}</td><td>{p.counts.rounds}</td><td>{p.counts.messages}</td>"
        f"<td>{p.counts.max_bytes_sent:,}</td><td>{p.counts.bytes_on_wire:,}</td><td>{fmt_time(p.time)}</td></tr>"
        for a, p in zip(names, preds)
    )
    map_lines = []
    for name, grid in maps.items():
        p64 = WORLDS.index(64)
        map_lines.append(f"{name}, p = 64: " + size_bands([names[i] for i in grid[p64]], MAP_SIZES))
    html = f"""
<p>The same all-reduce, written eight ways as schedules of point-to-point transfers, counted and timed by
event simulation on a modelled DGX A100 cluster (NVLink 300 GB/s inside a node, 8 × 25 GB/s InfiniBand
between nodes). The left panel places the 8 ranks inside one node, as a tensor-parallel group is placed;
the right panel places them on 8 different nodes, as a data-parallel group is.</p>
<ul>
<li><b>Tensor-parallel placement:</b> {band_text[tp_label]}.</li>
<li><b>Data-parallel placement:</b> {band_text[dp_label]}.</li>
<li>A 1 KiB all-reduce costs {one_kib_ratio:.1f}× more across nodes (latency: α 5 µs vs 2 µs);
a 1 GiB one {big_ratio:.1f}× more (bandwidth: 25 GB/s vs 300 GB/s per GPU).</li>
</ul>
<p>Small messages are latency-bound: the fewest rounds win (recursive doubling, log<sub>2</sub> p rounds,
but every rank sends the whole vector each round). Large messages are bandwidth-bound: the fewest bytes win
(ring, Rabenseifner and two-shot all send 2n(p−1)/p per rank, the lower bound; two-shot also hides each
reduction behind its next receive, which is why it edges ahead once γ matters). The winner map shows the choice moving
with the world size too: where p is not a power of two, Rabenseifner must fold (2n extra bytes) and the ring
wins large messages; on a cluster whose nodes share one NIC, the ring's single inter-node flow per node beats
Rabenseifner's eight.</p>
<ul>{"".join(f"<li>{x}</li>" for x in map_lines)}</ul>
<table><tr><th>algorithm (p = 8, 8 MiB, flat α = 1 µs, β = 1 ns/B)</th><th>rounds</th><th>messages</th>
<th>max bytes sent by a rank</th><th>bytes on the wire</th><th>predicted time</th></tr>{rows}</table>
<p>Reproduce any row: <code>netmorph collective allreduce --world 8 --bytes 8MiB --algo all --formula</code>;
any placement or sweep: <code>netmorph collective allreduce --world 64 --sizes 1KiB:1GiB
--topology pcie-ethernet-cluster</code>.</p>
"""
    summary = [
        f"TP all-reduce (8 GPUs, one node):   {band_text[tp_label]}",
        f"DP all-reduce (8 nodes, IB):        {band_text[dp_label]}",
        f"cross-node penalty: {one_kib_ratio:.1f}x at 1 KiB (latency), {big_ratio:.1f}x at 1 GiB (bandwidth)",
    ] + map_lines
    return Section(
        "Collectives: one all-reduce, eight schedules, and the cheapest one morphs",
        html,
        [
            ("allreduce_tp_vs_dp.png", "Predicted time vs size at p = 8: TP placement (left) vs DP placement (right)."),
            ("allreduce_winner_map.png", "Fastest all-reduce by world size and message size, on two clusters."),
            ("allreduce_rounds_bytes.png", "The two hardware-independent quantities: rounds and bytes."),
        ],
        summary,
    )
