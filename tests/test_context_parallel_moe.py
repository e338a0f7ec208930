"""A mixture of experts under context parallelism: each cp rank routes its part of every sequence, and what
routing decides over the whole microbatch -- the load-balancing loss's expert fractions, a capacity's drops, the
jitter's noise -- is decided over the cp group, so every cp x ep layout equals the 1-rank run in float64 and
sends its closed form."""

import pytest
import torch

from netmorph.cli import main
from netmorph.mesh.shape import ModelShape
from netmorph.models.moe import Router
from netmorph.models.router import load_balancing_loss
from netmorph.parallel.config import TrainConfig
from netmorph.parallel.hybrid import train_rank
from netmorph.parallel.run import reference, summarise
from netmorph.planner.memory import trainer_memory
from netmorph.runtime import launch

pytestmark = pytest.mark.timeout(120)

MOE = ModelShape(layers=2, hidden=16, heads=4, seq=16, vocab=32, experts=4, top_k=2)
DROPLESS = Router(dropless=True)


def test_the_cp_ranks_losses_with_the_sequences_fractions_average_to_the_sequences_loss():
    """Split 32 tokens' routing into head-and-tail parts of 4 ranks: with f_i summed over the parts, the mean of
    the parts' losses and its gradient are the whole's; with each part's own f_i they are not (the control)."""
    torch.manual_seed(0)
    T, E, k, cp = 32, 4, 2, 4
    logits = torch.randn(T, E, dtype=torch.float64, requires_grad=True)
    probs = torch.softmax(logits, -1)
    experts = torch.topk(probs, k, -1).indices
    whole = load_balancing_loss(probs, experts, E, 0.01)
    (g_whole,) = torch.autograd.grad(whole, logits, retain_graph=True)
    chunk = T // (2 * cp)
    parts = [
        torch.cat(
            [torch.arange(r * chunk, (r + 1) * chunk), torch.arange((2 * cp - 1 - r) * chunk, (2 * cp - r) * chunk)]
        )
        for r in range(cp)
    ]
    totals = (torch.bincount(experts.reshape(-1), minlength=E), T)
    mean = sum(load_balancing_loss(probs[p], experts[p], E, 0.01, totals) for p in parts) / cp
    (g_mean,) = torch.autograd.grad(mean, logits, retain_graph=True)
    assert abs(float(mean.detach()) - float(whole.detach())) < 1e-15 and float((g_mean - g_whole).abs().max()) < 1e-15
    local = sum(load_balancing_loss(probs[p], experts[p], E, 0.01) for p in parts) / cp
    assert abs(float(local.detach()) - float(whole.detach())) > 1e-6


LAYOUTS = [
    dict(cp=2),
    dict(cp=2, dp=2, ep=2),
    dict(cp=2, dp=2, ep=2, zero=1, cp_comm_type="a2a"),
    dict(cp=2, dp=2, ep=2, tp=2, cp_comm_type="all_gather"),
    dict(cp=2, dp=2, ep=2, pp=2),
    dict(cp=4, dp=2, ep=2, zero=2),
]


@pytest.mark.parametrize("kw", LAYOUTS, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_cp_with_experts_equals_the_one_rank_run_and_sends_its_closed_forms(kw):
    cfg = TrainConfig.make(model=MOE, steps=2, router=DROPLESS, dtype="float64", **kw)
    cfg.check()
    out = summarise(cfg, launch(train_rank, cfg.world, cfg, timeout=60), "local", reference(cfg))
    assert out.max_rel_loss_diff < 1e-9 and out.max_abs_weight_diff < 1e-9, out.losses
    want = {"cp", "moe.cp"} | ({"moe.dispatch", "moe.combine", "moe.counts"} if cfg.layout.ep > 1 else set())
    assert want <= set(out.traffic_exact) and all(out.traffic_exact.values()), (
        out.bytes_per_rank_by_phase,
        out.predicted_bytes_per_rank_by_phase,
    )
    # the experts' replicas (and their ZeRO shards) span cp x dp / ep: the planner's count of the same buffers
    assert {k: out.memory_bytes[k] for k in ("params", "grads", "optimizer")} == {
        k: v for k, v in trainer_memory(cfg.model, cfg.layout, 8).items() if k != "activations"
    }


ROUTERS = [
    (Router(), dict(cp=2, dp=2, ep=2)),
    (Router(drop_policy="probs"), dict(cp=4, dp=2, ep=2)),
    (Router(jitter_eps=0.1), dict(cp=2, dp=2, ep=2, pp=2)),
    (Router(dropless=True, jitter_eps=0.2), dict(cp=2, tp=2, cp_comm_type="a2a")),
]


@pytest.mark.parametrize("router, kw", ROUTERS, ids=["capacity", "capacity-probs-cp4", "jitter-pp2", "jitter-a2a"])
def test_a_capacity_and_the_jitter_under_cp_drop_and_draw_what_the_one_rank_run_does(router, kw):
    """A capacity drops by position (or gate) among the whole microbatch's assignments, and the jitter's noise is
    the whole microbatch's: each cp rank gathers the microbatch's routing (moe.cp) and takes its own rows, so the
    run equals the 1-rank run with assignments really dropped, and the gather's bytes are its closed form."""
    cfg = TrainConfig.make(model=MOE, steps=2, router=router, dtype="float64", **kw)
    cfg.check()
    res = launch(train_rank, cfg.world, cfg, timeout=60)
    out = summarise(cfg, res, "local", reference(cfg))
    assert out.max_rel_loss_diff < 1e-9 and out.max_abs_weight_diff < 1e-9, out.losses
    assert out.traffic_exact["moe.cp"] and all(out.traffic_exact.values())
    dropped = sum(sum(a) - sum(b) for r in res for e in r.experts for a, b in zip(e["routed"], e["kept"]))
    assert (dropped > 0) == (not router.dropless), dropped


def test_cli_trains_experts_under_cp_prints_the_gathers_closed_form_and_resumes_without_cp(capsys, tmp_path):
    """ZeRO-1 over cp x dp with a capacity, saved, resumed by torch.distributed.checkpoint on tp 2 with no cp, both
    the 1-rank run's."""
    ck = str(tmp_path / "ck")
    common = ["--experts", "4", "--ep", "2", "--dp", "2", "--layers", "2", "--dtype", "float64", "--check"]
    assert main(["train", *common, "--cp", "2", "--zero", "1", "--steps", "2", "--save", ck]) == 0
    out = capsys.readouterr().out
    line = next(s for s in out.splitlines() if s.startswith("#   moe.cp "))
    assert "✓" in line and "(experts and gates)" in line and "<= 1e-09 ✓" in out
    assert main(["train", *common, "--tp", "2", "--steps", "4", "--load", ck]) == 0
    out = capsys.readouterr().out
    assert "resumed from" in out and "<= 1e-09 ✓" in out, out
