"""Tour section: the schedules on real processes -- measured, against gloo and against the model.

Two measurements, both on this machine: bus bandwidth against message size for
the local shared-memory fabric and for ``torch.distributed`` on gloo, with one
core's memory-copy bandwidth drawn as the bound; and, on an emulated two-level
topology (per-link α and β imposed by the fabric), measured time against the
event simulation's prediction for the same schedules.
"""

from __future__ import annotations

import numpy as np

from netmorph.files import save_figure
from netmorph.report.html import Section
from netmorph.tour.collectives import color
from netmorph.tour.fabric import EMU_ALGOS, EMU_SIZES, LAB, LOCAL, WORLDS, Fabric
from netmorph.units import fmt_bytes


def build_section(res: Fabric, out_dir) -> Section:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bw, copy, pts, sizes = res.busbw, res.memcpy_gbps, res.emulated, res.sizes
    fig, axes = plt.subplots(1, len(WORLDS), figsize=(13, 4.8), sharey=True)
    ratios = {}
    for ax, p in zip(axes, WORLDS):
        rows = bw[p]
        for a in LOCAL:
            ys = [r["busbw_gbps"] for r in rows if r["algo"] == a and r["backend"] == "local"]
            ax.plot(sizes, ys, "o-", color=color(a), label=f"netmorph local: {a}")
        gl = [r["busbw_gbps"] for r in rows if r["backend"] == "torch-native"]
        ax.plot(sizes, gl, "s--", color="black", label="torch.distributed gloo")
        ax.axhline(copy, ls=":", color="gray", lw=2, label="memcpy, one core, out of cache")
        best_local = max(r["busbw_gbps"] for r in rows if r["backend"] == "local" and r["bytes"] == sizes[-1])
        ratios[p] = (best_local, gl[-1])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [fmt_bytes(n).replace(" ", "") for n in sizes])
        ax.set_xlabel("all-reduce size (float32)")
        ax.set_title(f"world {p} on this machine", fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("measured bus bandwidth (GB/s)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Real processes: the shared-memory fabric vs gloo (busbw, nccl-tests' definition)")
    fig.tight_layout()
    save_figure(fig, out_dir / "fabric_busbw.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    for a in EMU_ALGOS:
        xs = [q[3] * 1e3 for q in pts if q[0] == a]
        ys = [q[2] * 1e3 for q in pts if q[0] == a]
        ax.scatter(xs, ys, color=color(a), label=a, s=40)
    lim = [0, max(max(q[2], q[3]) for q in pts) * 1e3 * 1.1]
    ax.plot(lim, lim, color="gray", lw=1)
    ax.set_xlabel("predicted by the event simulation (ms)")
    ax.set_ylabel("measured on 4 processes (ms)")
    ax.set_title(f"Emulated {LAB.name}: all-reduce of {', '.join(fmt_bytes(n) for n in EMU_SIZES)}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    save_figure(fig, out_dir / "fabric_measured_vs_predicted.png")
    plt.close(fig)

    err = [abs(m / q - 1) for _, _, m, q in pts]
    rows_html = "".join(
        f"<tr><td>{a}</td><td>{fmt_bytes(n)}</td><td>{q * 1e3:.2f}</td><td>{m * 1e3:.2f}</td>"
        f"<td>{100 * (m / q - 1):+.0f}%</td></tr>"
        for a, n, m, q in pts
    )
    ratio_txt = "; ".join(
        f"world {p}: {b:.2f} GB/s vs gloo {g:.2f} GB/s ({b / g:.1f}x)" for p, (b, g) in ratios.items()
    )
    html = f"""
<p>The schedules of the previous section run here on real OS processes. The local fabric moves messages through
shared memory: per pair of ranks a ring of slots (NCCL's SHM transport FIFO); buffers allocated with
<code>comm.alloc</code> (registered memory, like <code>ncclMemAlloc</code>) are read by peers in place, so each byte
moves once. At {fmt_bytes(sizes[-1])}: {ratio_txt}. {_cores_note(max(ratios, default=1), res.cores)}</p>
<p>Below, the fabric imposes the α and β of an emulated two-level topology ({LAB.description}) on every message,
and the measured time of each schedule is set against the event simulation's prediction. Mean absolute error
{100 * float(np.mean(err)):.0f}%; what the model leaves out is the Python cost of each round and the receive port
(the fabric lets a rank receive from several peers at once, which is why <code>two_shot</code> beats its prediction).</p>
<table><tr><th>algorithm</th><th>size</th><th>predicted (ms)</th><th>measured (ms)</th><th>error</th></tr>
{rows_html}</table>
<p>Reproduce: <code>netmorph bench allreduce --world 4 -b 16M -e 16M</code>; <code>python benchmarks/fabric.py</code>.</p>
"""
    summary = [
        f"{fmt_bytes(sizes[-1])} all-reduce busbw, " + ratio_txt,
        f"emulated {LAB.name}: measured vs predicted, mean |error| {100 * float(np.mean(err)):.0f}% "
        f"over {len(pts)} (algorithm, size) pairs",
    ]
    return Section(
        "Real ranks: the shared-memory fabric, gloo, and the model",
        html,
        [
            ("fabric_busbw.png", "Measured bus bandwidth vs size: local fabric, gloo, memcpy bound."),
            ("fabric_measured_vs_predicted.png", "Measured vs predicted on an emulated two-level topology."),
        ],
        summary,
    )


def _cores_note(world: int, cores: int) -> str:
    """What the core count of the machine that ran the tour means for the busbw above."""
    if world > cores:
        return (
            f"This machine has {cores} core{'s' if cores > 1 else ''}, so world {world} runs more than one rank "
            f"per core and memory bandwidth, not the fabric, sets the ceiling."
        )
    return f"This machine has {cores} cores: every rank has a core of its own."
