"""Consistency models on real processes: the semantics the issue names, checked exactly."""

import json

import numpy as np
import pytest

from netmorph.cli import main
from netmorph.consistency import Config, run
from netmorph.consistency.problems import make

pytestmark = pytest.mark.timeout(120)

FAST = dict(compute_ms=0.0, model="convex", lr=40.0, snapshots=5)


def test_bsp_equals_single_process_sgd_on_the_combined_batch():
    cfg = Config(mode="bsp", workers=3, steps=15, **FAST)
    got = run(cfg).final
    prob = make("convex")
    w = prob.init(0)
    for t in range(cfg.steps):
        idx = np.concatenate([prob.batch(i, t) for i in range(cfg.workers)])  # (3 * B,)
        w = w - cfg.lr * prob.grad(w, idx)[1]
    np.testing.assert_allclose(got, w, rtol=1e-10, atol=1e-12)


def test_ssp_with_zero_staleness_is_bsp():
    bsp = run(Config(mode="bsp", workers=3, steps=12, **FAST)).final
    ssp = run(Config(mode="ssp", workers=3, steps=12, staleness=0, shared_budget=False, **FAST))
    np.testing.assert_allclose(ssp.final, bsp, rtol=1e-10, atol=1e-12)
    assert ssp.summary["max_staleness"] == 0


@pytest.mark.parametrize("s", [1, 3])
def test_ssp_gate_blocks_and_bounds_every_read(s):
    r = run(
        Config(
            mode="ssp",
            workers=3,
            steps=25,
            staleness=s,
            straggler=(2, 6),
            compute_ms=1.0,
            shared_budget=False,
            model="convex",
            lr=40.0,
            snapshots=5,
        )
    )
    assert r.summary["max_staleness"] <= s  # no read older than the bound, ever
    assert r.summary["max_clock_gap"] == s  # fast workers ran exactly s clocks ahead, no further
    assert r.summary["held_pulls"] > 0  # ... because the server held their reads
    assert sum(r.summary["staleness_histogram"].values()) == 3 * 25


def test_parameter_server_applies_every_push_exactly_once():
    cfg = Config(
        mode="async",
        workers=3,
        servers=2,
        steps=20,
        n_push=3,
        straggler=(0, 3),
        compute_ms=0.5,
        model="convex",
        lr=40.0,
        snapshots=5,
    )
    r = run(cfg)
    res = r.ranks
    workers = [x for x in res if x["role"] == "worker"]
    servers = [x for x in res if x["role"] == "server"]
    pushes = np.array([x["pushes"] for x in workers])
    for srv in servers:
        np.testing.assert_array_equal(srv["applied"], pushes)  # counted per worker, on every shard
    want = make("convex").init(0) - cfg.lr / cfg.workers * np.sum([x["pushed_sum"] for x in workers], axis=0)
    np.testing.assert_allclose(r.final, want, rtol=1e-9, atol=1e-12)
    assert r.summary["updates"] == sum(x["updates"] for x in workers) >= cfg.steps * cfg.workers


def test_local_sgd_with_h1_is_bsp():
    bsp = run(Config(mode="bsp", workers=2, steps=10, **FAST)).final
    loc = run(Config(mode="local", workers=2, steps=10, local_steps=1, **FAST)).final
    np.testing.assert_allclose(loc, bsp, rtol=1e-10, atol=1e-12)


def test_hogwild_collides_rarely_on_sparse_and_always_on_dense():
    sparse = run(Config(mode="hogwild", workers=4, steps=150, model="sparse", lr=0.5, compute_ms=0.3, snapshots=5))
    dense = run(Config(mode="hogwild", workers=4, steps=150, model="convex", lr=40.0, compute_ms=0.3, snapshots=5))
    assert sparse.summary["conflict_rate"] < 0.2 < 0.6 < dense.summary["conflict_rate"]
    assert (
        sparse.summary["final_loss"] < sparse.summary["initial_loss"]
        and dense.summary["final_loss"] < dense.summary["initial_loss"]
    )
    assert sparse.summary["bytes_on_wire"] < 1000  # shared memory, not messages


def test_straggler_holds_bsp_in_lockstep_not_async():
    """BSP: the fast workers wait for the straggler every step, so all finish together (alone they
    would need a fifth of its time); async: the fast workers make more updates than the straggler.
    (How much faster async runs is a benchmark: benchmarks/consistency.py, not a timed test.)"""
    kw = dict(workers=3, steps=30, straggler=(1, 5), compute_ms=2.0, model="convex", lr=40.0, snapshots=5)
    bsp = run(Config(mode="bsp", **kw))
    walls = [x["wall"] for x in bsp.ranks]
    assert min(walls) > 0.5 * max(walls) and max(walls) >= 30 * 5 * 2e-3
    asy = run(Config(mode="async", **kw))
    per_worker = [x["updates"] for x in asy.ranks if x["role"] == "worker"]
    assert sum(per_worker) == asy.summary["updates"] >= 90
    assert per_worker[1] < min(per_worker[0], per_worker[2])


def test_mlp_on_digits_learns():
    r = run(Config(mode="bsp", workers=2, steps=60, model="mlp", lr=0.5, compute_ms=0.0, snapshots=5))
    assert r.summary["final_loss"] < 0.6 * r.summary["initial_loss"] and r.summary["test_accuracy"] > 0.8


def test_cli_json(capsys):
    code = main(["sgd", "--mode", "ssp", "--workers", "2", "--steps", "10", "--compute-ms", "0", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0 and len(rows) == 1
    for k in (
        "mode",
        "workers",
        "updates",
        "wall_s",
        "updates_per_s",
        "final_loss",
        "loss_curve",
        "max_staleness",
        "staleness_histogram",
        "bytes_on_wire",
    ):
        assert k in rows[0]
    assert all(len(x) == 3 for x in rows[0]["loss_curve"])


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["sgd", "--mode", "gossip"], "--mode"),
        (["sgd", "--straggler", "7:2", "--workers", "4"], "--straggler"),
        (["sgd", "--straggler", "one"], "--straggler"),
        (["sgd", "--model", "resnet"], "--model"),
        (["sgd", "--staleness", "-1"], "--staleness"),
        (["sgd", "--slow-link", "0:9:10:100"], "--slow-link"),
    ],
)
def test_cli_bad_input(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
