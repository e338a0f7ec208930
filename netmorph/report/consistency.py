"""Tour section: consistency models for SGD -- throughput against convergence, with and without a straggler."""

from __future__ import annotations

from netmorph.files import save_figure
from netmorph.report.html import Section
from netmorph.tour.consistency import Consistency


def plot(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"bsp": "#1f77b4", "async": "#d62728", "ssp": "#2ca02c", "hogwild": "#ff7f0e", "local": "#9467bd"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for r in rows:
        c = r["loss_curve"]
        label = (
            r["mode"]
            + (f" (s={r['staleness_bound']})" if r["mode"] == "ssp" else "")
            + (f" (H={r['local_steps']})" if r["mode"] == "local" else "")
        )
        axes[0].plot([x[0] for x in c], [x[2] for x in c], "-o", ms=3, color=colors.get(r["mode"]), label=label)
        axes[1].plot([x[1] for x in c], [x[2] for x in c], "-o", ms=3, color=colors.get(r["mode"]), label=label)
    if rows and rows[0].get("target_loss") is not None:
        for ax in axes:
            ax.axhline(rows[0]["target_loss"], color="gray", ls=":", lw=1)
    axes[0].set_xlabel("wall-clock time (s)")
    axes[1].set_xlabel("updates applied")
    axes[0].set_ylabel("training loss")
    for ax in axes:
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _row(r) -> str:
    tt = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f}"
    return (
        f"<tr><td>{r['mode']}</td><td>{r['system']}</td><td>{r['updates_per_s']:.0f}</td>"
        f"<td>{r['wall_s']:.2f}</td><td>{tt}</td><td>{r['final_loss']:.4g}</td>"
        f"<td>{r['max_staleness']}</td><td>{r['bytes_on_wire']:,}</td></tr>"
    )


def build_section(res: Consistency, out_dir) -> Section:
    """:func:`netmorph.tour.consistency.run`'s rows: loss against time and against updates, and the tables."""
    runs, updates = res.runs, res.steps * res.workers
    files = []
    for i, (label, rows) in enumerate(runs.items()):
        name = f"sgd_{'straggler' if i else 'balanced'}.png"
        plot(rows, out_dir / name, f"least squares, {res.workers} workers, {updates} updates: {label}")
        files.append((name, f"Loss against wall-clock time and against updates, {label}."))
    tables = ""
    for label, rows in runs.items():
        head = "".join(
            f"<th>{h}</th>"
            for h in (
                "mode",
                "system",
                "updates/s",
                "wall (s)",
                "time to target (s)",
                "final loss",
                "max staleness",
                "bytes on wire",
            )
        )
        body = "".join(_row(r) for r in rows)
        tables += f"<h3>{label}</h3><table><tr>{head}</tr>{body}</table>"
    s = {r["mode"]: r for r in runs["worker 1 four times slower"]}
    b = {r["mode"]: r for r in runs["no straggler"]}
    html = f"""
<p>The same least-squares problem, the same {res.workers} worker processes and the same {updates} updates, under five consistency
models -- the ladder from linearizable (BSP: every worker sees the exact average) through bounded staleness (SSP,
s = 2) to eventual (asynchronous parameter server, Hogwild!). Each step stands for 2 ms of forward and backward
pass; the learning rate is about half the stability limit, where stale gradients start to cost.</p>
<ul>
<li><b>Throughput.</b> With a 4x straggler, BSP runs at the straggler's pace ({s["bsp"]["updates_per_s"]:.0f} updates/s);
the asynchronous server and Hogwild! let the fast workers carry on ({s["async"]["updates_per_s"]:.0f} and
{s["hogwild"]["updates_per_s"]:.0f} updates/s). SSP's bound holds the fast workers to s clocks ahead, so against a
<i>persistent</i> straggler it gains almost nothing ({s["ssp"]["updates_per_s"]:.0f} updates/s); its slack pays off
against random delays (try <code>--jitter 2</code>). Local SGD synchronises every 8 steps and still waits for the
straggler at each.</li>
<li><b>Convergence per update.</b> Staleness is measured in global steps between the parameters a gradient was
computed on and the moment it was applied. Under SSP nearly every fast worker's gradient is s steps old, and the
loss per update suffers (final {s["ssp"]["final_loss"]:.4g} vs BSP's {s["bsp"]["final_loss"]:.4g}); local SGD's
copies drift for 8 steps. The asynchronous server's gradients are mostly fresh -- only the straggler's are old.</li>
<li><b>Bytes.</b> BSP all-reduces every step; local SGD moves an eighth of that; the parameter server moves a push
and a pull per update; Hogwild! moves nothing over the fabric -- it writes shared memory.</li>
</ul>
{tables}
<p>Reproduce: <code>netmorph sgd --compare --workers {res.workers} --straggler 1:4 --steps {res.steps}</code>. Hogwild! on a sparse
problem against a dense one: <code>netmorph sgd --mode hogwild --model sparse</code> (few collisions) vs
<code>--model convex</code> (every update collides).</p>
"""
    summary = [
        f"4x straggler: updates/s bsp {s['bsp']['updates_per_s']:.0f}, ssp {s['ssp']['updates_per_s']:.0f}, "
        f"async {s['async']['updates_per_s']:.0f}, hogwild {s['hogwild']['updates_per_s']:.0f}, "
        f"local {s['local']['updates_per_s']:.0f}",
        "final loss with straggler: " + ", ".join(f"{m} {s[m]['final_loss']:.4g}" for m in s),
        f"no straggler: updates/s bsp {b['bsp']['updates_per_s']:.0f}, async {b['async']['updates_per_s']:.0f}",
    ]
    return Section("Consistency models for SGD: throughput against convergence", html, files, summary)
