"""Goodput against the checkpoint interval, restart vs in place, at several cluster sizes."""

from __future__ import annotations

from netmorph.files import save_figure
from netmorph.report.html import Section
from netmorph.tour.failures import Failures


def plot_goodput(path, curves: list, C, R, r, s, tau=None, mc_points=None) -> None:
    """``curves``: :class:`netmorph.failures.Curve` per cluster size. Restart goodput against the interval
    (solid), in place (dashed), Daly's interval marked, ``tau`` (the interval used) dotted; ``mc_points``:
    {gpus: [(interval, mean, stderr)]} Monte-Carlo points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.4))
    for i, cv in enumerate(curves):
        c = f"C{i}"
        ax.plot(
            cv.taus / 60, 100 * cv.restart, color=c, label=f"{cv.gpus:,} GPUs (MTBF {cv.mtbf_s / 3600:.2f} h): restart"
        )
        ax.axhline(100 * cv.inplace, color=c, ls="--", lw=1, label=f"{cv.gpus:,} GPUs: in place")
        ax.plot([cv.daly_s / 60], [100 * cv.daly_goodput], "o", color=c, ms=5)
        for tt, mean, se in (mc_points or {}).get(cv.gpus, []):
            ax.errorbar([tt / 60], [100 * mean], yerr=[100 * 2 * se], fmt="x", color="black", ms=5, capsize=2)
    if tau is not None:
        ax.axvline(tau / 60, color="gray", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("compute between checkpoints (min); dots: Daly's interval; x: Monte-Carlo ± 2 s.e.")
    ax.set_ylabel("goodput (% of wall time useful)")
    ax.set_ylim(0, 101)
    ax.set_title(
        f"checkpoint write {C / 60:g} min, restart {R / 60:g} min; in place: recovery {r:g} s, step {s:g} s", fontsize=9
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def build_section(res: Failures, out_dir) -> Section:
    """Goodput vs checkpoint interval at 1k, 16k and 100k GPUs, per-GPU MTBF from Llama 3's published count."""
    f, per_gpu, (C, R, r, s), mc = res.run, res.per_gpu_mtbf_s, res.costs, res.monte_carlo
    plot_goodput(out_dir / "failures_goodput.png", res.curves, C, R, r, s, mc_points=mc)
    rows, summary = [], []
    for cv in res.curves:
        n, M, t, gr, gi = cv.gpus, cv.mtbf_s, cv.daly_s, cv.daly_goodput, cv.inplace
        lost = 54 * 24 * (1 - gr) * n - 54 * 24 * (1 - gi) * n
        rows.append(
            f"<tr><td>{n:,}</td><td>{M / 3600:.2f} h</td><td>{54 * 24 * 3600 / M:,.0f}</td>"
            f"<td>{t / 60:.1f} min</td><td>{100 * gr:.1f}%</td><td>{100 * mc[n][0][1]:.1f}%</td>"
            f"<td>{100 * gi:.2f}%</td><td>{lost:,.0f}</td></tr>"
        )
        summary.append(
            f"{n:,} GPUs: MTBF {M / 3600:.2f} h, Daly {t / 60:.1f} min, goodput restart {100 * gr:.1f}% "
            f"(Monte-Carlo {100 * mc[n][0][1]:.1f}%), in place {100 * gi:.2f}%"
        )
    html = f"""
<p>The failure rate grows with the GPU count. Llama 3's pre-training saw {f["interruptions"]} unexpected interruptions
in {f["days"]} days on {f["gpus"]:,} GPUs, one every {f["days"] * 24 / f["interruptions"]:.2f} hours; as a per-GPU
MTBF ({per_gpu / (3600 * 24 * 365):.1f} years) that predicts the job MTBF at any size. A restart-from-checkpoint job
trades checkpoint overhead against work lost per failure (half an interval plus the restart); in-place recovery
loses about half a step plus the recovery. Checkpoint write 1 min and restart 10 min are assumptions, not published
figures.</p>
<table><tr><th>GPUs</th><th>job MTBF</th><th>failures in 54 days</th><th>Daly interval</th><th>goodput, restart</th>
<th>Monte-Carlo</th><th>goodput, in place</th><th>GPU-hours saved in place</th></tr>{"".join(rows)}</table>
<p>Reproduce: <code>netmorph failures --gpus 16384 --checkpoint-write 1min --restart 10min --days 54 --plot
goodput.png</code>; <code>netmorph failures --fleet</code> for the published runs.</p>
"""
    files = [
        (
            "failures_goodput.png",
            "Goodput against the checkpoint interval for restart-all (solid) and in-place "
            "recovery (dashed) at three cluster sizes; Daly's interval dotted, the "
            "Monte-Carlo at it as x.",
        )
    ]
    return Section("Failures at scale: checkpoint interval and goodput", html, files, summary)
