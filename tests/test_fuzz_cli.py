"""Every subcommand, every flag and every config file's fields, driven with hostile values (hypothesis), and
ranks that disagree or stop: a bounded sample of tests/fuzz.py's cases (scripts/fuzz.py runs thousands).

A flag or field case must end clean -- exit 0 with a value that may be valid, or 2 with exactly one line --
never a traceback, never past the time limit, never exit 0 on a value no flag takes, never replacing an
output path that is not a regular file. A program whose ranks disagree must fail with a named mismatch or
deadlock; a stopped rank must be named as the root cause.
"""

import random

import fuzz
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FLAGS = [f for f in fuzz.flags() if f[0] not in fuzz.PROCESSES]
# launch's and the lighthouse's flags: each a process tree of its own (seconds a case), so each once, below
CLUSTER_FLAGS = [f for f in fuzz.flags() if f[0] in fuzz.PROCESSES]
CONFIGS = fuzz.config_cases()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("fuzz"))
    return tmp, fuzz.specials(tmp), fuzz.bad_files(tmp)


@pytest.mark.timeout(600)
@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_every_flag_ends_clean_on_hostile_values(data, scratch, monkeypatch):
    tmp, paths, files = scratch
    monkeypatch.chdir(tmp)
    name, flag, action = data.draw(st.sampled_from(FLAGS), label="flag")
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    value = fuzz.flag_value(rng, flag, action, tmp, paths, files)
    cls, detail = fuzz.run_flag(name, flag, action, value, tmp, paths)
    assert cls == "clean", (cls, detail)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", CLUSTER_FLAGS, ids=lambda c: f"{c[0]} {c[1]}")
def test_launch_and_lighthouse_flags_end_clean_on_hostile_values(case, scratch, monkeypatch):
    """Run as a user runs them (their own process); the lighthouse, which serves until stopped, gets Ctrl-C."""
    tmp, paths, files = scratch
    monkeypatch.chdir(tmp)
    name, flag, action = case
    value = fuzz.flag_value(random.Random(f"{name}{flag}"), flag, action, tmp, paths, files)
    cls, detail = fuzz.run_flag(name, flag, action, value, tmp, paths)
    assert cls == "clean", (cls, detail)


def test_the_cluster_flags_are_fuzzed():
    assert {f"{n} {f}" for n, f, _ in CLUSTER_FLAGS} >= {
        "launch --nodes",
        "launch --nproc-per-node",
        "launch --max-restarts",
        "launch --join",
        "launch --port",
        "lighthouse --port",
        "lighthouse --host",
    }


@pytest.mark.timeout(600)
@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=st.sampled_from(CONFIGS), value=st.sampled_from(fuzz.BAD_JSON + fuzz.EITHER_JSON))
def test_every_config_field_ends_clean_on_hostile_values(case, value, scratch, monkeypatch):
    tmp, _, _ = scratch
    monkeypatch.chdir(tmp)
    kind, path = case
    cls, detail = fuzz.run_config(kind, path, value, tmp)
    assert cls == "clean", (cls, detail)


@pytest.mark.timeout(300)
@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=st.sampled_from(fuzz.switch_cases()))
def test_output_switches_give_what_they_promise(case, scratch, monkeypatch):
    """--json is one document, --trace a JSON trace, --plot a PNG, alone or together, and nothing is left."""
    tmp, _, _ = scratch
    monkeypatch.chdir(tmp)
    cls, detail = fuzz.run_switches(*case, tmp)
    assert cls == "clean", (cls, detail)


@pytest.mark.timeout(300)
@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    case=st.sampled_from([(n, f, a, v) for n, f, a in FLAGS if a.dest in fuzz.IMPLIED for v in fuzz.IMPLIED[a.dest]])
)
def test_size_flags_whose_cost_is_implied_are_held_against_the_machine(case, scratch, monkeypatch):
    """A valid but huge world, size or count: refused in one line, or done within the time and memory caps."""
    tmp, paths, _ = scratch
    monkeypatch.chdir(tmp)
    name, flag, action, value = case
    cls, detail = fuzz.run_flag(name, flag, action, value, tmp, paths)
    assert cls == "clean", (cls, detail)


def test_a_leftover_is_seen():
    import multiprocessing as mp
    import os
    import time

    state = fuzz.snapshot()
    p = mp.get_context("fork").Process(target=time.sleep, args=(5,))
    p.start()
    left = os.path.join(fuzz.scratch_dir(), "netmorph-store-x")
    os.mkdir(left)
    try:
        found = fuzz.leftovers(state, grace=0.2)
        assert "processes" in found and "netmorph-store-x" in found, found
    finally:
        p.kill()
        p.join()
        os.rmdir(left)
    assert fuzz.leftovers(state, grace=2.0) == ""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", [0, 5, 6, 8])  # the rest are test_desync's and test_blame's cases
def test_ranks_that_disagree_never_pass_silently(case):
    cls, detail = fuzz.run_mismatch(case, 3, "local", timeout=1.0)
    assert cls == "clean", detail


@pytest.mark.timeout(120)
def test_a_stopped_rank_in_a_random_layout_is_the_root_cause():
    cls, detail = fuzz.run_blame(random.Random(11))
    assert cls == "clean", detail


def test_the_classes_mean_what_they_say():
    assert fuzz.classify("train", 0, "", None, invalid=True) == "nonsense"
    assert fuzz.classify("train", 2, "netmorph train: error: x\nmore\n", None, invalid=False) == "traceback"
    assert fuzz.classify("train", 2, "netmorph train: error: x\n", None, invalid=True) == "clean"
    assert fuzz.classify("plan", 1, "", None, invalid=False) == "clean"
    assert fuzz.classify("train", 1, "", None, invalid=False) == "traceback"
    assert fuzz.classify("train", "unbounded", "", None, invalid=False) == "unbounded"
