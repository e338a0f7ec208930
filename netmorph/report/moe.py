"""Figures of a mixture-of-experts run: the router's traffic matrix, batch to batch, and the balance."""

from __future__ import annotations

import numpy as np

from netmorph.files import save_figure
from netmorph.report.html import Section
from netmorph.tour.moe import ALPHA, FACTORS, LAST, MoE


def plot_traffic(out: dict, path, steps: int = 4) -> None:
    """The rank -> rank token matrix of ``steps`` consecutive steps side by side (the wiring the router
    chose for each batch), then load imbalance and dropped fraction over training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = out["config"]
    shown = out["steps"][:steps]
    mats = [np.array(s["traffic"]) for s in shown]
    vmax = max(int(m.max()) for m in mats) or 1
    k = len(mats)
    # the matrices, a column of their own for the colour scale, then the balance plot
    fig, axes = plt.subplots(
        1, k + 3, figsize=(3.2 * (k + 1) + 3, 3.6), gridspec_kw={"width_ratios": [1] * k + [0.07, 0.25, 1.3]}
    )
    axes[k + 1].axis("off")  # room between the colour scale's label and the balance plot
    for i, (ax, m) in enumerate(zip(axes, mats)):
        im = ax.imshow(m, cmap="viridis", vmin=0, vmax=vmax)
        for (r, c), n in np.ndenumerate(m):
            ax.text(c, r, str(n), ha="center", va="center", fontsize=7, color="white" if n < vmax / 2 else "black")
        ax.set_title(f"step {i + 1}", fontsize=9)
        ax.set_xlabel("to rank")
        ax.set_xticks(range(len(m)))
        ax.set_yticks(range(len(m)))
        if i == 0:
            ax.set_ylabel("from rank")
    fig.colorbar(im, cax=axes[k], label="tokens")
    ax = axes[-1]
    xs = range(1, len(out["steps"]) + 1)
    ax.plot(xs, [s["load_imbalance"] for s in out["steps"]], "-o", ms=3, label="load imbalance (max/mean)")
    ax2 = ax.twinx()
    ax2.plot(xs, [100 * s["drop_fraction"] for s in out["steps"]], "-s", ms=3, color="tab:red", label="dropped %")
    ax.set_xlabel("step")
    ax.set_ylabel("max / mean tokens per expert")
    ax2.set_ylabel("assignments dropped (%)", color="tab:red")
    ax2.set_ylim(0, max(1.0, 1.1 * max(100 * s["drop_fraction"] for s in out["steps"])))
    ax.set_title("balance over training", fontsize=9)
    fig.suptitle(
        f"router traffic: {cfg['experts']} experts on ep {cfg['ep']} x dp {cfg['dp']}, top-{cfg['top_k']}", fontsize=10
    )
    fig.subplots_adjust(bottom=0.2, top=0.82, left=0.05, right=0.95, wspace=0.45)
    save_figure(fig, path)
    plt.close(fig)


def build_section(res: MoE, out_dir) -> Section:
    """The traffic of consecutive batches, the balance over training, and the drops by capacity factor."""
    on, off, cfg, drops, uniform = res.on, res.off, res.cfg, res.drops, res.uniform
    runs = {ALPHA: on, 0.0: off}
    plot_traffic(on, out_dir / "moe_traffic.png")
    _plot_balance(on, off, cfg, out_dir / "moe_balance.png")
    _plot_drops(drops, uniform, res.simulated, out_dir / "moe_drops.png")
    im_on, im_off = res.imbalance[ALPHA], res.imbalance[0.0]
    last = min(LAST, cfg.train.steps)
    exact = all(s["exact"] for r in runs.values() for s in r["steps"])
    i1 = FACTORS.index(1.0)
    html = f"""
<p>A small MoE language model (8 experts over 4 expert-parallel ranks, top-2, {cfg.tokens_per_rank} tokens per rank
per step) trained for {cfg.train.steps} steps, dropless, with Switch's load-balancing loss at &alpha; = {ALPHA} and without it.
Each rank routes its own tokens; the router's choices decide how many rows every rank sends every other rank in
the all-to-all, so the communication pattern is a function of the batch.</p>
<ul>
<li><b>Traffic.</b> The rank-to-rank token matrices of four consecutive steps differ: the wiring diagram changes batch
to batch. The ledger's all-to-all bytes equal matrix &times; h &times; 4 B on every link and step
({"✓" if exact else "✗"}).</li>
<li><b>Balance.</b> Over the last {last} steps the busiest expert takes {im_on:.2f}&times; the mean with the aux loss and
{im_off:.2f}&times; without it.</li>
<li><b>Capacity.</b> At capacity factor 1.0 the trained router would drop {100 * drops[ALPHA][i1]:.1f}% of its
assignments with the aux loss, {100 * drops[0.0][i1]:.1f}% without; uniformly random routing drops
{100 * uniform[i1]:.1f}% (exact, from Binomial(T, k/E)).</li>
</ul>
<p>Reproduce: <code>netmorph moe --dropless --steps {cfg.train.steps} --batch 16 --lr 1e-2 --aux-loss-coeff {ALPHA} --plot moe.png</code> (and
<code>--aux-loss-coeff 0</code>); <code>netmorph moe drops --tokens {cfg.tokens_per_rank} --experts 8
--capacity-factor 1.0</code>.</p>
"""
    files = [
        (
            "moe_traffic.png",
            "Router traffic (tokens from rank to rank) for four consecutive steps, and balance over training.",
        ),
        ("moe_balance.png", "Load imbalance (max / mean tokens per expert) over training, aux loss on and off."),
        ("moe_drops.png", "Assignments dropped against capacity factor: the trained routers and uniform routing."),
    ]
    summary = [
        f"load imbalance (last {last} steps): {im_on:.2f} with aux loss {ALPHA}, {im_off:.2f} without",
        f"capacity factor 1.0 drops: trained {100 * drops[ALPHA][i1]:.1f}% (aux) / {100 * drops[0.0][i1]:.1f}% "
        f"(no aux), uniform {100 * uniform[i1]:.1f}%",
        f"all-to-all bytes = traffic matrix x h x 4 B on every link and step: {'yes' if exact else 'NO'}",
    ]
    return Section("Mixture of experts: the router rewires the all-to-all every batch", html, files, summary)


def _plot_balance(on, off, cfg, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for run, label in ((on, f"aux loss {ALPHA}"), (off, "no aux loss")):
        ax.plot(range(1, len(run["steps"]) + 1), [s["load_imbalance"] for s in run["steps"]], "-", label=label)
    ax.axhline(1.0, color="gray", ls=":", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("max / mean tokens per expert")
    ax.set_title(f"{cfg.train.model.experts} experts, top-{cfg.train.model.top_k}, dropless", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _plot_drops(drops, uniform, simulated, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(FACTORS, [100 * d for d in drops[ALPHA]], "-o", label=f"trained router, aux loss {ALPHA}")
    ax.plot(FACTORS, [100 * d for d in drops[0.0]], "-s", label="trained router, no aux loss")
    ax.plot(FACTORS, [100 * d for d in uniform], "--", color="gray", label="uniform routing, exact (binomial)")
    ax.plot(FACTORS, [100 * d for d in simulated], "x", color="black", label="uniform routing, simulated (300 trials)")
    ax.set_xlabel("capacity factor")
    ax.set_ylabel("assignments dropped (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
