"""The event simulation: closed forms on a flat topology, the port model, two-level links, the tuner."""

import pytest
from cases import ALL

from netmorph.collectives import build
from netmorph.collectives.formulas import closed_form
from netmorph.cost.simulate import simulate
from netmorph.cost.topology import PRESETS, Topology
from netmorph.cost.tuner import choose, predict

A, B, G = 2e-6, 1e-9, 0.25e-9
FLAT = PRESETS["flat"].with_flat(A, B, G)


@pytest.mark.parametrize("op,algo", [x for x in ALL if x != ("allreduce", "double_binary_tree")])
@pytest.mark.parametrize("p", [1, 2, 4, 8, 16, 32, 3, 6, 12])
def test_simulated_time_equals_closed_form(op, algo, p):
    n = p * (1 << p.bit_length()) * 64 * 4
    f = closed_form(op, algo, p, n, A, B, G)
    t = simulate(build(op, algo, p, n // 4, 4), FLAT).time
    if f.time is None:  # only where the docstring says no simple form exists
        assert (p & (p - 1)) or (op, algo) == ("alltoall", "naive")
        return
    assert t == pytest.approx(f.time, rel=1e-12), f.time_expr


def test_ring_formula_literally():
    p, n = 8, 8 << 20
    t = simulate(build("allreduce", "ring", p, n // 4, 4), FLAT).time
    assert t == pytest.approx(2 * (p - 1) * A + 2 * n * (p - 1) / p * B + n * (p - 1) / p * G)


def test_root_receiving_from_seven_pays_for_seven():
    n = 1 << 20
    t = simulate(build("reduce", "naive", 8, n // 4, 4), PRESETS["flat"]).time
    assert t == pytest.approx(7 * (1e-6 + n * 1e-9))


def test_naive_alltoall_hot_spot_costs_more_than_pairwise():
    n = 8 * 4096
    naive = simulate(build("alltoall", "naive", 8, n // 4, 4), PRESETS["flat"]).time
    pair = simulate(build("alltoall", "pairwise", 8, n // 4, 4), PRESETS["flat"]).time
    assert pair == pytest.approx(7 * (1e-6 + n / 8 * 1e-9))
    assert naive > 1.3 * pair


def test_placement_tp_vs_dp():
    topo = PRESETS["dgx-a100-cluster"]
    s = build("allreduce", "ring", 8, (64 << 20) // 4, 4)
    tp = simulate(s, topo, placement=range(8)).time
    dp = simulate(s, topo, placement=range(0, 64, 8)).time
    n = 64 << 20
    # ring on NVLink vs on one 25 GB/s NIC per GPU: the bandwidth term scales by 300/25
    assert tp == pytest.approx(14 * 2e-6 + 2 * n * 7 / 8 / 300e9 + n * 7 / 8 * topo.gamma, rel=1e-9)
    assert dp == pytest.approx(14 * 5e-6 + 2 * n * 7 / 8 / 25e9 + n * 7 / 8 * topo.gamma, rel=1e-9)


def test_shared_node_nic():
    """8 flows leaving a node through one 12.5 GB/s NIC each get an eighth of it."""
    topo = Topology(
        "t", alpha=0.0, beta=1e-12, gpus_per_node=8, alpha_inter=0.0, beta_inter=1 / 12.5e9, node_bandwidth=12.5e9
    )
    s = build("allreduce", "recursive_doubling", 16, (8 << 20) // 4, 4)
    # rounds 1-3 stay inside a node (distance 1, 2, 4): ~free; round 4 (distance 8): 8 flows of 8 MiB share the NIC
    n = 8 << 20
    intra = 3 * n * 1e-12
    assert simulate(s, topo).time == pytest.approx(intra + 8 * n / 12.5e9, rel=1e-9)
    unshared = Topology("t", alpha=0.0, beta=1e-12, gpus_per_node=8, alpha_inter=0.0, beta_inter=1 / 12.5e9)
    assert simulate(s, unshared).time == pytest.approx(intra + n / 12.5e9, rel=1e-9)


def test_auto_choice_moves_with_size_and_world():
    flat = PRESETS["flat"]
    small = choose("allreduce", 8, 64, flat)
    large = choose("allreduce", 8, 256 << 20, flat)
    assert small.best.algo == "recursive_doubling"  # fewest rounds when α dominates
    assert large.best.algo in ("rabenseifner", "ring")  # fewest bytes when β dominates
    assert large.best.counts.max_bytes_sent < small.ranking[0].counts.max_bytes_sent * (256 << 20) / 64
    assert "latency-bound" in small.reason and "bandwidth-bound" in large.reason
    # non-power-of-two world: Rabenseifner pays the fold's 2n bytes and the ring takes large messages
    assert choose("allreduce", 6, 256 << 20, flat).best.algo == "ring"
    assert choose("allreduce", 8, 256 << 20, flat).best.algo == "rabenseifner"

    def crossover(p):
        for e in range(10, 31):
            if choose("allreduce", p, 1 << e, flat).best.algo != "recursive_doubling":
                return 1 << e

    # the α-β model: RD costs log p(α + nβ), Rabenseifner 2 log p α + 2n(p-1)/p β -> crossover n ≈ α/β · log p / (log p - 2 + 2/p)
    assert crossover(4) > crossover(64)


def test_prediction_parts_add_up():
    pr = predict("allreduce", "ring", 8, 8 << 20, PRESETS["flat"], parts=True)
    assert pr.latency_part == pytest.approx(14e-6)
    assert pr.latency_part + pr.bandwidth_part == pytest.approx(pr.time)


def test_world_one_costs_nothing():
    for op, algo in ALL:
        assert simulate(build(op, algo, 1, 100, 4), PRESETS["dgx-a100"]).time == 0.0


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_direct_algorithms_against_the_textbook_limits(p):
    """naive / one_shot / two_shot timed from first principles, not from formulas.py: with free
    reductions a root that receives p-1 whole vectors through one port pays (p-1)(α+nβ) (Thakur et
    al.'s linear algorithm); when reducing is slower than receiving it pays the first message and
    then p-1 reductions back to back, α+nβ + (p-1)nγ. Two-shot moves n/p per message, twice."""
    a, b, n = 3e-6, 1e-9, p * 8192 * 4
    T, Tb = a + n * b, a + n / p * b
    free = Topology("free-reduce", alpha=a, beta=b, gamma=0.0)
    slow = Topology("slow-reduce", alpha=a, beta=b, gamma=10 * b)
    t = {
        key: simulate(build(*key, p, n // 4, 4), free).time
        for key in (("reduce", "naive"), ("allreduce", "naive"), ("allreduce", "one_shot"), ("allreduce", "two_shot"))
    }
    assert t["reduce", "naive"] == pytest.approx((p - 1) * T, rel=1e-12)
    assert t["allreduce", "naive"] == pytest.approx(2 * (p - 1) * T, rel=1e-12)  # to a root, then back out
    assert t["allreduce", "one_shot"] == pytest.approx((p - 1) * T, rel=1e-12)  # every rank gathers every vector
    assert t["allreduce", "two_shot"] == pytest.approx(2 * (p - 1) * Tb, rel=1e-12)  # reduce-scatter + all-gather
    if p > 2:
        g = 10 * b * n
        assert simulate(build("reduce", "naive", p, n // 4, 4), slow).time == pytest.approx(T + (p - 1) * g, rel=1e-12)


@pytest.mark.parametrize("algo", ["one_shot", "two_shot"])
@pytest.mark.parametrize("topo", ["dgx-a100-cluster", "pcie-ethernet-cluster"])
def test_a_round_of_matchings_timed_run_by_run_is_the_message_by_message_time(algo, topo, monkeypatch):
    """The direct all-reduces post "every rank to the rank k after it" for k = 1 .. p-1: timed run by run as
    arrays, they give the very numbers the one-message-at-a-time walk gives (every rank's finish, bitwise)."""
    import numpy as np

    import netmorph.cost.simulate as sim

    s = build("allreduce", algo, 24, 3 << 20, 4)
    fast = simulate(s, PRESETS[topo])
    monkeypatch.setattr(sim, "_matching_rows", lambda src, dst: None)
    slow = simulate(s, PRESETS[topo])
    assert fast.time == slow.time and np.array_equal(fast.finish, slow.finish)
