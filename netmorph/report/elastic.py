"""The elastic job recovered three ways, over wall time: membership, throughput and progress, events marked."""

from __future__ import annotations

import numpy as np

from netmorph.files import save_figure
from netmorph.report.html import Section
from netmorph.tour.elastic import EVERY, KILLS

LABELS = {
    "inplace": "netmorph in place",
    "rollback": "Horovod Elastic: last commit",
    "restart": "torchrun-style: restart all + checkpoint",
}
COLORS = {"inplace": "tab:green", "rollback": "tab:orange", "restart": "tab:red"}


def throughput(timeline, batch: int, bins: np.ndarray):
    """Samples per second completed in each bin of wall time, from ``[(t, steps done, members)]``; redone
    steps count (they were computed), a restart's gap shows as zero."""
    t = np.array([t for t, _, n in timeline if n > 0])
    counts, _ = np.histogram(t, bins)
    return counts * batch / np.diff(bins)


def plot_recoveries(runs: dict, batch: int, path, title: str) -> None:
    """``runs``: name -> {"timeline": [(t, steps done, members)], "events": [{at_s, kind?, rank, step}]}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(8, 7.2), sharex=True, gridspec_kw={"height_ratios": [1, 1.4, 1.4]})
    origin = {name: run["timeline"][0][0] for name, run in runs.items()}  # each run's first completed step
    end = max(run["timeline"][-1][0] - origin[name] for name, run in runs.items())
    bins = np.linspace(0, end * 1.001, 41)
    for name, run in runs.items():
        tl = [(t - origin[name], s, n) for t, s, n in run["timeline"]]
        c, lab = COLORS[name], LABELS[name]
        axes[0].step(
            [0.0] + [t for t, _, _ in tl], [tl[0][2]] + [n for _, _, n in tl], where="post", color=c, label=lab
        )
        axes[1].stairs(throughput(tl, batch, bins), bins, color=c, lw=1.2, label=lab)
        done = [(t, s) for t, s, n in tl if n > 0]
        axes[2].plot([t for t, _ in done], [s for _, s in done], ".", ms=2.5, color=c, label=lab)
        for e in run["events"]:
            at = e["at_s"] - origin[name]
            for ax in axes:
                ax.axvline(at, color=c, ls=":", lw=1)
            what = "join" if e.get("kind") == "join" else f"{e.get('kind', 'kill')} r{e['rank']}"
            axes[0].annotate(what, (at, 0.3), rotation=90, fontsize=7, color=c, ha="right", va="bottom")
    axes[0].set_ylabel("members")
    axes[0].set_ylim(bottom=0)
    axes[0].legend(fontsize=8, loc="lower right")
    axes[1].set_ylabel(f"samples / s\n(per {1e3 * (bins[1] - bins[0]):.0f} ms)")
    axes[1].set_ylim(bottom=0)
    axes[2].set_ylabel("steps done")
    axes[2].set_xlabel("wall time from the first step (s); dotted: a worker dies")
    axes[0].set_title(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def build_section(res, out_dir) -> Section:
    """The figure and the table of :func:`netmorph.tour.elastic.run`'s three recoveries."""
    cfg, runs = res
    inplace = runs["inplace"]
    plot_recoveries(
        runs,
        cfg.global_batch,
        out_dir / "elastic_recovery.png",
        f"{cfg.workers} workers, {cfg.steps} steps, rank {KILLS[0][0]} killed in step {KILLS[0][1]} "
        f"and rank {KILLS[1][0]} in step {KILLS[1][1]}; commit / checkpoint every {EVERY}",
    )
    rows = []
    for name, r in runs.items():
        rows.append((LABELS[name], r["wall_s"], r["recovery_s"], r["caught_up_s"], r["steps_redone"]))
    ok = inplace["max_rel_param_diff"] <= 1e-9
    table = "".join(
        f"<tr><td>{n}</td><td>{w:.2f}</td><td>{1e3 * r:.1f}</td><td>{1e3 * c:.1f}</td><td>{s}</td></tr>"
        for n, w, r, c, s in rows
    )
    html = f"""
<p>Data-parallel training (BSP, float64 least squares) on {cfg.workers} processes; rank 2 is SIGKILLed inside
the all-reduce of step 60 and rank 1 in step 140. <b>In place</b>: the survivors' all-reduce raises
<code>PeerLost</code>, they agree on a new view through the store, re-form the ring on the fabric and redo at most
the step in flight, re-splitting the same global batch over fewer members. <b>Rollback</b> (Horovod Elastic)
does the same but resumes from the last in-memory commit (every {EVERY} steps). <b>Restart</b> (torchrun's
elastic agent) tears every worker down and starts {cfg.workers} new ones from the checkpoint on disk.</p>
<table><tr><th>recovery</th><th>wall (s)</th><th>recovery (ms, both kills)</th><th>caught up (ms)</th>
<th>steps redone</th></tr>{table}</table>
<p>The in-place run equals the failure-free run: max relative parameter difference
{inplace["max_rel_param_diff"]:.1e} {"✓" if ok else "✗"}. Recovery = from the death to the next completed step;
caught up = from the death until the job is back at the step it died in (the redone steps included). The
restart here forks warm processes; under real torchrun each restart also starts fresh interpreters
(<code>python benchmarks/elastic_torchrun.py</code> measures that).</p>
<p>Reproduce: <code>netmorph elastic --job lsq --steps 200 --kill 2@60 --kill 1@140 --compare --checkpoint-every {EVERY}
--check --plot elastic.png</code></p>
"""
    files = [
        (
            "elastic_recovery.png",
            "Membership, throughput and progress over wall time for the three recoveries; "
            "dotted lines mark the deaths. On a 2-core machine fewer workers can step "
            "faster (4 processes oversubscribe 2 cores); the gaps are the recoveries.",
        )
    ]
    summary = [
        f"{n}: wall {w:.2f} s, recovery {1e3 * r:.1f} ms, caught up {1e3 * c:.1f} ms, {s} steps redone"
        for n, w, r, c, s in rows
    ]
    summary.append(f"in place equals the failure-free run: max rel parameter diff {inplace['max_rel_param_diff']:.1e}")
    return Section("Elastic membership: a worker dies, the job keeps going", html, files, summary)
