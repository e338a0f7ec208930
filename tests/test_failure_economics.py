"""Failure economics: Young's and Daly's intervals, Daly's complete model, and a Monte-Carlo that agrees."""

import json
import math

import numpy as np
import pytest

from netmorph.cli import main
from netmorph.failures import daly, fleet, goodput, inplace_goodput, monte_carlo, optimum, young
from netmorph.failures.montecarlo import uptimes

H, MIN = 3600.0, 60.0


def test_youngs_interval_for_a_day_mtbf_and_five_minute_checkpoints_is_two_hours():
    assert young(5 * MIN, 24 * H) == pytest.approx(120 * MIN, rel=1e-12)


@pytest.mark.parametrize("C,M", [(60, 3.1 * H), (300, 24 * H), (600, 2 * H), (5, 0.5 * H)])
def test_dalys_estimate_is_close_to_the_exact_optimum_of_the_complete_model(C, M):
    """Daly's expansion approximates the maximiser of his complete model; the goodput lost by using it
    instead of the exact optimum is negligible."""
    t = optimum(C, 600, M)
    assert daly(C, M) == pytest.approx(t, rel=0.02)
    assert goodput(daly(C, M), C, 600, M) == pytest.approx(goodput(t, C, 600, M), rel=1e-4)
    assert daly(C, M) < young(C, M)  # the higher-order terms and -C pull the interval in


def test_daly_caps_the_interval_at_the_mtbf_when_checkpoints_are_that_slow():
    assert daly(3 * H, H) == H


def test_goodput_limits():
    """Without failures only the checkpoint overhead remains; in place with M >> step loses almost nothing."""
    assert goodput(600, 60, 600, 1e15) == pytest.approx(600 / 660, rel=1e-9)
    assert inplace_goodput(10, 30, 1e15) == pytest.approx(1.0, abs=1e-9)
    assert goodput(600, 60, 1e9, 1.0) == 0.0  # restarts longer than hundreds of MTBFs: nothing completes


@pytest.mark.parametrize("tau,C,R", [(daly(60, 3.1 * H), 60, 600), (2 * H, 300, 1200), (10, 0, 60)])
def test_monte_carlo_mean_goodput_converges_to_the_closed_form(tau, C, R):
    """Exponential failures: the simulated runs' mean is the closed form within its standard error
    (3 s.e., plus the end-of-run edge: a run starts without a restart and loses its last partial segment)."""
    M, hours = 3.1 * H, 54 * 24
    g = monte_carlo(tau, C, R, M, hours=hours, trials=400, seed=3)
    se = g.std(ddof=1) / math.sqrt(len(g))
    edge = (tau + C + R) / (hours * H)
    assert abs(g.mean() - goodput(tau, C, R, M)) <= 3 * se + edge


def test_weibull_uptimes_keep_the_mean_and_cluster_for_shape_below_one():
    rng = np.random.default_rng(0)
    x = uptimes(rng, 400_000, 3 * H, "weibull", 0.7)
    assert x.mean() == pytest.approx(3 * H, rel=0.01)
    assert np.mean(x < 0.1 * 3 * H) > 1 - math.exp(-0.1)  # more short gaps than the exponential's


def test_the_issues_command_prints_the_closed_forms_beside_the_simulation(capsys):
    assert (
        main(
            [
                "failures",
                "--gpus",
                "16384",
                "--job-mtbf",
                "3.1h",
                "--checkpoint-write",
                "1min",
                "--restart",
                "10min",
                "--days",
                "54",
                "--trials",
                "50",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    M = 3.1 * H
    assert out["expected_interruptions"] == pytest.approx(54 * 24 / 3.1)
    assert out["interval_young_min"] == pytest.approx(math.sqrt(2 * 60 * M) / 60)
    assert out["interval_daly_min"] == pytest.approx(daly(60, M) / 60)
    assert out["goodput"]["restart"] == pytest.approx(goodput(daly(60, M), 60, 600, M))
    assert out["goodput"]["inplace"] > out["goodput"]["restart"]
    for k in ("restart", "inplace"):
        assert abs(out["simulated_goodput"][k] - out["goodput"][k]) < 5 * out["simulated_stderr"][k] + 0.002
        assert out["lost_hours"][k] == pytest.approx(54 * 24 * (1 - out["goodput"][k]))
    assert main(["failures", "--gpus", "1024", "--per-gpu-mtbf", "1024h", "--trials", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["job_mtbf_h"] == pytest.approx(1.0)


def test_fleet_derives_llama3s_mtbf_from_the_published_counts(capsys):
    raw = fleet()["llama3-405b"]
    assert (raw["gpus"], raw["days"], raw["interruptions"]) == (16384, 54, 419) and "Llama 3" in raw["source"]
    assert main(["failures", "--fleet", "--json"]) == 0
    rows = {r["run"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["llama3-405b"]["job_mtbf_h"] == pytest.approx(54 * 24 / 419)
    assert rows["opt-175b"]["per_gpu_mtbf_years"] == pytest.approx(60 * 24 / 35 * 992 / (24 * 365))


def test_plot_draws_the_goodput_curve(tmp_path, capsys):
    png = tmp_path / "g.png"
    assert main(["failures", "--trials", "5", "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["--job-mtbf", "0h"], "--job-mtbf"),
        (["--job-mtbf", "-3h"], "--job-mtbf"),
        (["--job-mtbf", "3.1"], "--job-mtbf"),
        (["--job-mtbf", "30s"], "--checkpoint-write"),
        (["--job-mtbf", "1h", "--per-gpu-mtbf", "1000h"], "--per-gpu-mtbf"),
        (["--restart", "ten minutes"], "--restart"),
        (["--gpus", "0"], "--gpus"),
        (["--days", "0"], "--days"),
        (["--job-mtbf", "61s", "--days", "3650"], "--trials"),
    ],
)
def test_bad_failures_input_is_one_line_exit_2(argv, flag, capsys):
    assert main(["failures", *argv]) == 2
    err = capsys.readouterr().err
    assert flag in err and len(err.strip().splitlines()) == 1


def test_the_jobs_own_rules_live_in_the_model_and_name_the_field():
    """What cannot be modelled is refused by failures.model.check_job, for the CLI and a Python caller alike:
    the message names the parameter (the CLI spells it as its flag)."""
    from netmorph.errors import UsageError
    from netmorph.failures.model import check_job

    check_job(3600.0, 60.0, 5.0, 1.0, 10)  # a job that fits: no error
    for args, field in (
        ((30.0, 60.0, 5.0, 1.0, 10), "checkpoint_write"),
        ((30.0, 1.0, 40.0, 1.0, 10), "step_time"),
        ((61.0, 1.0, 1.0, 3650.0, 200), "trials"),
    ):
        with pytest.raises(UsageError) as e:
            check_job(*args)
        assert e.value.render(None).startswith(field) or f" {field} " in e.value.render(None)


def test_from_run_takes_the_measured_costs_as_the_typed_flags_would(tmp_path, capsys):
    """A replay's --json (benchmarks/failures_replay.py) sets MTBF, checkpoint write, restart and step time: the
    same figures as typing them in."""
    run = tmp_path / "run.json"
    run.write_text(
        json.dumps(
            {"job_mtbf_s": 20.0, "checkpoint_write_s": 0.3, "restart_s": 4.2, "step_time_s": 0.05, "intervals": []}
        )
    )
    common = ["--gpus", "2", "--days", "0.01", "--trials", "20", "--json"]
    assert main(["failures", "--from-run", str(run), *common]) == 0
    measured = json.loads(capsys.readouterr().out)
    assert (
        main(
            [
                "failures",
                "--job-mtbf",
                "20s",
                "--checkpoint-write",
                "0.3s",
                "--restart",
                "4.2s",
                "--step-time",
                "0.05s",
                *common,
            ]
        )
        == 0
    )
    typed = json.loads(capsys.readouterr().out)
    assert measured == typed
    assert measured["restart_s"] == 4.2 and measured["interval_daly_min"] == pytest.approx(daly(0.3, 20.0) / 60)


@pytest.mark.parametrize(
    "doc, argv, flag",
    [
        (
            {"job_mtbf_s": 20, "checkpoint_write_s": 0.3, "restart_s": 4, "step_time_s": 0.1},
            ["--restart", "1min"],
            "--restart",
        ),
        (
            {"job_mtbf_s": 20, "checkpoint_write_s": 0.3, "restart_s": 4, "step_time_s": 0.1},
            ["--per-gpu-mtbf", "1h"],
            "--per-gpu-mtbf",
        ),
        (
            {"job_mtbf_s": 20, "checkpoint_write_s": "fast", "restart_s": 4, "step_time_s": 0.1},
            [],
            "checkpoint_write_s",
        ),
        ([1, 2], [], "--from-run"),
    ],
)
def test_from_run_refuses_a_bad_file_or_a_flag_beside_it_in_one_line(tmp_path, capsys, doc, argv, flag):
    run = tmp_path / "run.json"
    run.write_text(json.dumps(doc))
    assert main(["failures", "--from-run", str(run), *argv]) == 2
    err = capsys.readouterr().err
    assert flag in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
