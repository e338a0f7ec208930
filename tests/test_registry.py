"""One record per collective algorithm: a new all-reduce registered once is offered by ``collective``, priced by
the planner (``plan``, ``simulate step``) once a hardware file names it, and drawn by the tour -- no other list
to edit."""

import dataclasses
import json

import numpy as np
import pytest

from netmorph.cli import main
from netmorph.collectives import Algorithm, base, register, unregister
from netmorph.collectives.formulas import Formula, closed_form
from netmorph.schedule import COPY, REDUCE


def star(p: int, count: int, itemsize: int = 4):
    """Every rank's vector into rank 0 in one round, rank 0's sum back out in the next."""
    s = base.layout("allreduce", "star", p, count, itemsize)
    if p > 1 and count:
        r = np.arange(1, p, dtype=np.int64)
        z = np.zeros(p - 1, dtype=np.int64)
        n = np.full(p - 1, count, dtype=np.int64)
        s.add(r, z, z, z, n, REDUCE)
        s.add(z, r, z, z, n, COPY)
    return s


def star_form(p, n, alpha, beta, gamma):
    # rank 0's port takes one message a round: p - 1 in, p - 1 out
    return Formula(2 * (p - 1), "2(p−1)", (p - 1) * n, "(p−1)·n", None, "— (port contention: simulated)")


def test_a_registered_algorithm_takes_the_next_header_code_and_moves_no_other():
    """The fabric's message header codes an algorithm by its index: registering one must not renumber the rest
    (a header template cached before would then name another algorithm)."""
    from netmorph.runtime.transport.fingerprint import algos

    before = algos()
    register(Algorithm("allreduce", "aaa_first_by_name", star))
    try:
        assert algos() == (*before, "aaa_first_by_name")
    finally:
        unregister("allreduce", "aaa_first_by_name")
    assert algos()[: len(before)] == before


@pytest.fixture
def registered():
    rec = register(Algorithm("allreduce", "star", star, color="#000000", form=star_form))
    yield rec
    unregister("allreduce", "star")


def test_collective_runs_a_registered_algorithm_and_holds_it_to_its_closed_form(registered, capsys):
    assert registered.label == "star" and closed_form("allreduce", "star", 8, 1.0, 0, 0, 0).rounds == 14
    assert (
        main(["collective", "allreduce", "--algo", "star", "--world", "8", "--bytes", "1MiB", "--formula", "--json"])
        == 0
    )
    row = json.loads(capsys.readouterr().out)[0]
    assert row["algo"] == "star" and row["rounds"] == 14 and row["max_bytes_sent"] == 7 << 20
    assert row["closed_form"]["rounds"] == 14 and row["closed_form"]["max_bytes_sent"] == 7 << 20
    assert main(["collective", "allreduce", "--algo", "all", "--world", "4", "--bytes", "4KiB", "--json"]) == 0
    assert "star" in [r["algo"] for r in json.loads(capsys.readouterr().out)]
    with pytest.raises(ValueError, match="already has"):
        register(Algorithm("allreduce", "ring", star))


def test_the_planner_and_simulate_step_price_a_registered_algorithm_a_hardware_file_names(registered, tmp_path, capsys):
    """Star all-reduces are slower than ring for large gradients: the planner's data-parallel time grows
    when the hardware file allows star alone, and ``simulate step`` plays the same."""
    from netmorph.planner.hardware import PRESETS

    hw = dataclasses.asdict(PRESETS["a100-80g"])
    hw.update(name="star-only", allreduce_algorithms=["star"])
    path = tmp_path / "star.json"
    path.write_text(json.dumps(hw))
    argv = ["--model", "llama-3-8b", "--gpus", "16", "--tp", "2", "--dp", "8", "--json"]
    got = {}
    for name, hardware in (("ring", "a100-80g"), ("star", str(path))):
        assert main(["plan", "estimate", *argv, "--hardware", hardware]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert main(["simulate", "step", *argv, "--hardware", hardware]) == 0
        sim = json.loads(capsys.readouterr().out)
        got[name] = plan["comm_s"]["data_parallel"], sim["step_time_s"]
    assert got["star"][0] > 2 * got["ring"][0] and got["star"][1] > got["ring"][1]
    path.write_text(json.dumps({**hw, "allreduce_algorithms": ["starr"]}))
    assert main(["plan", "estimate", *argv, "--hardware", str(path)]) == 2
    assert "star" in capsys.readouterr().err


def test_the_tours_collectives_section_draws_a_registered_algorithm(registered, tmp_path):
    from netmorph.report.collectives import build_section
    from netmorph.tour import collectives

    res = collectives.run()
    assert "star" in res.algos and set(res.curves[next(iter(res.curves))]) == set(res.algos)
    section = build_section(res, tmp_path)
    assert "star" in json.dumps(dataclasses.asdict(section), default=str)
