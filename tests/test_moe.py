"""Mixture of experts: the router's conventions, capacity and drops, and expert parallelism equal to one rank."""

import math

import pytest
import torch

from netmorph.cli import main
from netmorph.mesh.layout import Layout
from netmorph.moe import (
    MoEConfig,
    Router,
    capacity,
    exact_drop_fraction,
    keep_mask,
    load_balancing_loss,
    moe_shape,
    simulated_drop_fraction,
    train,
    z_loss,
)


@pytest.mark.parametrize("experts,k", [(2, 1), (4, 1), (4, 2), (8, 2), (8, 3)])
def test_aux_loss_is_alpha_under_exactly_uniform_routing(experts, k):
    t = experts * 6
    probs = torch.full((t, experts), 1.0 / experts, dtype=torch.float64)
    chosen = torch.tensor([[(i * k + j) % experts for j in range(k)] for i in range(t)])  # every expert t·k/E times
    assert torch.bincount(chosen.reshape(-1), minlength=experts).tolist() == [t * k // experts] * experts
    assert load_balancing_loss(probs, chosen, experts, 0.01).item() == pytest.approx(0.01, rel=1e-12)


@pytest.mark.parametrize("experts", [2, 8, 64])
def test_aux_loss_is_alpha_times_experts_when_one_expert_takes_everything(experts):
    t = 10
    probs = torch.zeros(t, experts, dtype=torch.float64)
    probs[:, 3 % experts] = 1.0
    chosen = torch.full((t, 1), 3 % experts)
    assert load_balancing_loss(probs, chosen, experts, 0.01).item() == pytest.approx(0.01 * experts, rel=1e-12)


def test_z_loss_is_the_mean_squared_logsumexp():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]], dtype=torch.float64)
    want = (math.log(2.0) ** 2 + math.log(4.0) ** 2) / 2
    assert z_loss(logits, 0.5).item() == pytest.approx(0.5 * want, rel=1e-12)


def test_capacity_and_drops_on_hand_made_routings():
    assert capacity(64, 8, 2, 1.25) == 20 and capacity(10, 3, 1, 1.0) == 4 and capacity(7, 8, 1, 1.0) == 1
    experts = torch.tensor([[0], [0], [0], [1]])
    gates = torch.tensor([[0.1], [0.9], [0.5], [1.0]])
    assert keep_mask(experts, gates, 2, 2, "position").reshape(-1).tolist() == [True, True, False, True]
    assert keep_mask(experts, gates, 2, 2, "probs").reshape(-1).tolist() == [False, True, True, True]
    assert keep_mask(experts, gates, 2, None).all()
    top2 = torch.tensor([[0, 1], [1, 0], [0, 2]])  # expert 0 is chosen 3 times, capacity 2
    assert keep_mask(top2, torch.ones(3, 2), 3, 2, "position").tolist() == [[True, True], [True, True], [False, True]]


def test_expected_drops_exact_and_simulated():
    # T=2 tokens, E=2, top-1, C=1: both pick the same expert with probability 1/2, dropping 1 of 2
    assert exact_drop_fraction(2, 2, 1, 1) == pytest.approx(0.25, rel=1e-12)
    assert exact_drop_fraction(100, 4, 4, 100) == 0.0  # k = E: every expert gets every token
    cap = capacity(256, 8, 1, 1.0)
    exact = exact_drop_fraction(256, 8, 1, cap)
    sim = simulated_drop_fraction(256, 8, 1, cap, trials=3000, seed=1)
    assert 0.03 < exact < 0.08 and abs(sim - exact) < 0.004


@pytest.mark.timeout(120)
def test_expert_parallel_training_equals_one_rank():
    """ep 2 x dp 2, top-2 with capacity (drops happen): losses, routing, drops and final parameters equal
    the 1-rank model on the same tokens; the ledger's all-to-all bytes equal the traffic matrix exactly."""
    out = train(
        MoEConfig.make(
            moe_shape(experts=4, top_k=2, capacity_factor=1.0), split=Layout(ep=2, dp=4), steps=3, dtype="float64"
        ),
        check=True,
    )
    assert out["max_rel_loss_diff"] <= 1e-9 and out["max_param_diff"] <= 1e-9 and out["same_routing"]
    assert all(s["exact"] for s in out["steps"])
    assert any(s["drop_fraction"] > 0 for s in out["steps"])
    for s in out["steps"]:
        assert sum(map(sum, s["traffic"])) == sum(s["traffic"][r][c] for r in range(4) for c in range(4))
        assert max(s["a2a_bytes"]) > 0


@pytest.mark.timeout(120)
def test_dropless_pre_softmax_probs_policy_jitter_on_four_expert_ranks():
    out = train(
        MoEConfig.make(
            moe_shape(experts=8, top_k=1),
            Router(pre_softmax=True, jitter_eps=0.1, z_loss_coeff=1e-3, dropless=True),
            Layout(ep=4, dp=4),
            steps=2,
            dtype="float64",
        ),
        check=True,
    )
    assert out["max_rel_loss_diff"] <= 1e-9 and out["same_routing"]
    assert all(s["drop_fraction"] == 0 and s["exact"] for s in out["steps"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "argv,flag",
    [
        (["moe", "--top-k", "9", "--experts", "8"], "--top-k"),
        (["moe", "--experts", "6", "--ep", "4"], "--experts"),
        (["moe", "--capacity-factor", "0"], "--capacity-factor"),
        (["moe", "--capacity-factor", "-1"], "--capacity-factor"),
        (["moe", "--ep", "2", "--dp", "2", "--world", "3"], "--world"),
        (["moe", "drops", "--top-k", "9", "--experts", "8"], "--top-k"),
        (["moe", "--seed", "-5"], "--seed"),
    ],
)
def test_bad_moe_input_is_one_line_exit_2(argv, flag, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert flag in err and len(err.strip().splitlines()) == 1


@pytest.mark.timeout(120)
def test_moe_json_has_what_the_issue_lists(capsys):
    import json

    assert main(["moe", "--steps", "2", "--ep", "2", "--experts", "4", "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    for k in (
        "experts",
        "ep",
        "dp",
        "top_k",
        "capacity_factor",
        "capacity",
        "tokens_per_rank",
        "steps",
        "losses",
        "aux_losses",
        "drop_fraction",
        "load_imbalance",
        "traffic_matrices",
        "a2a_bytes_per_rank",
        "predicted_a2a_bytes_per_rank",
    ):
        assert k in j
    assert j["a2a_bytes_per_rank"] == j["predicted_a2a_bytes_per_rank"]
    assert main(["moe", "drops", "--tokens", "512", "--experts", "8", "--trials", "50", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["capacity"] == 160 and 0 <= d["exact_drop_fraction"] < 0.1


def test_a_routing_that_cannot_be_drawn_is_refused_by_the_capacity_model():
    """models.capacity.check_routing holds the drop simulation's rules (the CLI's `moe drops` calls it)."""
    from netmorph.errors import UsageError
    from netmorph.models.capacity import check_routing

    check_routing(4096, 8, 2, 200)
    for args, field in (
        ((64, 8, 9, 1), "top_k"),
        ((64, 5000, 1, 1), "experts"),
        ((1 << 20, 4096, 1, 10_000), "trials"),
    ):
        with pytest.raises(UsageError) as e:
            check_routing(*args)
        assert field in e.value.render(None)
