"""The command line as a user meets it: tables, JSON, and one-line errors with exit code 2."""

import json
import subprocess
import sys

import pytest

from netmorph.cli import main
from netmorph.collectives import ALGORITHMS, build
from netmorph.schedule import count


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_allreduce_all_table(capsys):
    code, out, err = run(
        capsys, "collective", "allreduce", "--world", "8", "--bytes", "8MiB", "--algo", "all", "--formula"
    )
    assert code == 0 and err == ""
    rows = [l for l in out.splitlines() if not l.startswith("#")]
    assert len(rows) == len(ALGORITHMS["allreduce"]) == 8
    ring = next(l for l in rows if " ring " in l)
    assert "14,680,064" in ring and "117,440,512" in ring and " 14 " in ring and " 112 " in ring
    assert out.count("✓") >= 15 and "✗" not in out
    assert "*rabenseifner" in out  # fastest marked


def test_json_keys_and_auto(capsys):
    code, out, _ = run(capsys, "collective", "allreduce", "-p", "8", "--sizes", "1KiB:1GiB", "--algo", "auto", "--json")
    recs = json.loads(out)
    assert code == 0 and len(recs) == 21
    for r in recs:
        for k in (
            "op",
            "algo",
            "world",
            "bytes",
            "rounds",
            "messages",
            "bytes_on_wire",
            "bytes_sent_per_rank",
            "bytes_reduced_per_rank",
            "predicted_time_s",
        ):
            assert k in r
        assert r["auto"] is True and r["reason"]
    algos = [r["algo"] for r in recs]
    assert algos[0] == "recursive_doubling" and algos[-1] in ("rabenseifner", "ring")


@pytest.mark.parametrize("op", ["allgather", "reduce_scatter", "broadcast", "reduce", "alltoall"])
def test_every_op_prints_every_algorithm_with_its_counts(capsys, op):
    """One row per algorithm, and each row's rounds, messages and bytes are its schedule's counts."""
    code, out, _ = run(
        capsys, "collective", op, "--world", "6", "--bytes", "1MiB", "--topology", "dgx-a100-cluster", "--root", "2"
    )
    assert code == 0 and "dgx-a100-cluster (two-level)" in out.splitlines()[0]
    rows = [l.split() for l in out.splitlines() if not l.startswith("#")]
    assert [r[4].lstrip("*") for r in rows] == list(ALGORITHMS[op])
    assert sum(r[4].startswith("*") for r in rows) == 1  # the fastest, marked once
    for r in rows:
        algo = r[4].lstrip("*")
        c = count(build(op, algo, 6, (1 << 20) // 4, 4, root=2))
        assert (int(r[8]), int(r[9]), int(r[10].replace(",", "")), int(r[11].replace(",", ""))) == (
            c.rounds,
            c.messages,
            c.bytes_on_wire,
            c.max_bytes_sent,
        ), algo


def test_alpha_beta_override(capsys):
    code, out, _ = run(
        capsys,
        "collective",
        "allreduce",
        "-p",
        "4",
        "-b",
        "1MB",
        "--algo",
        "ring",
        "--alpha",
        "0",
        "--beta",
        "1e-10",
        "--json",
    )
    (rec,) = json.loads(out)
    assert rec["predicted_time_s"] == pytest.approx(2 * 1e6 * 3 / 4 * 1e-10)


def test_topology_json_file(capsys, tmp_path):
    f = tmp_path / "mine.json"
    f.write_text(
        json.dumps({"alpha": 1e-6, "beta": 1e-10, "gpus_per_node": 4, "alpha_inter": 1e-5, "beta_inter": 1e-9})
    )
    code, out, _ = run(capsys, "collective", "allreduce", "-p", "8", "-b", "1MiB", "-t", str(f), "--json")
    assert code == 0 and json.loads(out)[0]["topology"] == "mine"


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["collective", "allreduse", "-p", "8", "-b", "1MiB"], "unknown op"),
        (["collective", "allreduce", "-p", "8", "-b", "1MiB", "--algo", "fast"], "--algo"),
        (["collective", "allreduce", "-p", "0", "-b", "1MiB"], "--world"),
        (["collective", "allreduce", "-p", "8", "-b", "-5"], "--bytes"),
        (["collective", "allreduce", "-p", "8", "-b", "12XB"], "--bytes"),
        (["collective", "allreduce", "-p", "8", "-b", "6"], "float32"),
        (["collective", "allreduce", "-p", "16", "-b", "1MiB", "-t", "dgx-a100"], "--world 16"),
        (["collective", "allreduce", "-p", "8", "-b", "1MiB", "-t", "nowhere"], "--topology"),
        (["collective", "broadcast", "-p", "8", "-b", "1MiB", "--root", "9"], "--root"),
        (["collective", "allgather", "-p", "8", "-b", "1MiB", "--segments", "4"], "--segments"),
        (["collective", "allreduce", "-p", "8", "-b", "1MiB", "--sizes", "1:2"], "not allowed"),
        (["mesh", "--world", "16", "--tp", "3"], "--world 16"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        sys.exit(main(argv))
    out, err = capsys.readouterr()
    assert e.value.code == 2
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.timeout(60)
def test_console_script_bad_input_has_no_traceback():
    r = subprocess.run(
        [sys.executable, "-m", "netmorph", "collective", "allreduce", "--world", "8", "--bytes", "lots"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--bytes" in r.stderr


def test_mesh_command(capsys):
    code, out, _ = run(capsys, "mesh", "--world", "16", "--tp", "2", "--pp", "4", "--rank", "3")
    assert code == 0 and "TP(2)-PP(4)-DP(2)" in out and "[0, 4, 8, 12]" in out and "tp=1 pp=0 dp=1" in out


SECTIONS = (
    "Collectives: one all-reduce, eight schedules, and the cheapest one morphs",
    "Real ranks: the shared-memory fabric, gloo, and the model",
    "Parallel training: DP, ZeRO, TP and PP on real ranks",
    "Mixture of experts: the router rewires the all-to-all every batch",
    "Elastic membership: a worker dies, the job keeps going",
    "Serving: paged KV cache and iteration-level scheduling",
    "Failures at scale: checkpoint interval and goodput",
    "Consistency models for SGD: throughput against convergence",
    "Parallelism planner: what each DP/TP/PP split costs",
    "Cluster scale: one step simulated on 1024 ranks",
    "Adaptive parallelism: the split follows the bottleneck",
)
FIGURES = (
    "allreduce_tp_vs_dp.png",
    "allreduce_winner_map.png",
    "allreduce_rounds_bytes.png",
    "fabric_busbw.png",
    "fabric_measured_vs_predicted.png",
    "train_pipeline.png",
    "train_traffic.png",
    "train_zero_memory.png",
    "moe_traffic.png",
    "moe_balance.png",
    "moe_drops.png",
    "elastic_recovery.png",
    "serve_kv_and_latency.png",
    "serve_phases.png",
    "failures_goodput.png",
    "sgd_balanced.png",
    "sgd_straggler.png",
    "plan_splits.png",
    "simulate_step.png",
    "morph_throughput.png",
    "morph_plan.png",
)


@pytest.mark.timeout(600)
def test_tour_writes_every_section_and_figure(tmp_path, capsys):
    import os

    import matplotlib.image as mpimg
    import numpy as np

    code, out, err = run(capsys, "tour", "--quick", "--out", str(tmp_path / "rep"))
    assert code == 0
    page = (tmp_path / "rep" / "index.html").read_text()
    for title in SECTIONS:
        assert title in out and title in page
    assert "could not run" not in out + err and "did not run" not in page
    # the simulated parts are deterministic: the tour prints what the cost model and the planner compute
    assert (
        "TP all-reduce (8 GPUs, one node):   recursive_doubling 1 KiB–512 KiB, rabenseifner 1 MiB–8 MiB, "
        "two_shot 16 MiB–1 GiB"
    ) in out
    assert "gpt3-175b on 1024 x a100-80g: 2,511 of 107,280 configurations fit" in out
    assert "plan: tp4 pp8 dp32 mb1 v7 ZeRO-1 selective: 19.37 s/iter" in out
    assert "llama-3-405b on 16,384 x h100-80g: 7,726 of 561,588 configurations fit" in out
    assert "updates/s bsp" in out and "world 2:" in out and "x gloo" not in err
    assert "traffic = closed form on every rank (zero, tp, pp, pp.emb)" in out
    assert "in place equals the failure-free run" in out and "netmorph in place: wall" in out
    assert "16,384 GPUs: MTBF 3.09 h, Daly 18.6 min, goodput restart 85.3%" in out  # closed forms: deterministic
    assert "step 29.11 s simulated vs 29.19 s planner (-0.3%)" in out  # the simulation too
    assert f"This machine has {os.cpu_count()} core" in page
    for png in FIGURES:
        assert png in page and f"figure: {tmp_path / 'rep' / png}" in out
        img = mpimg.imread(tmp_path / "rep" / png)  # a real PNG, drawn on
        assert img.shape[0] > 300 and img.shape[1] > 400
        assert float(np.std(img[..., :3])) > 0.05, f"{png} is blank"


def test_tour_write_check_follows_no_planted_link(tmp_path):
    """Proving --out writable must not truncate what a link under a fixed name points at."""
    import os

    from netmorph.cli.tour import check_writable

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "rep"
    out.mkdir()
    os.symlink(victim, out / ".netmorph-write-test")
    check_writable(out)
    assert victim.read_text() == "keep me" and sorted(os.listdir(out)) == [".netmorph-write-test"]


@pytest.mark.timeout(120)
def test_sgd_writes_a_figure_only_when_asked_and_says_only_what_applies(tmp_path, monkeypatch, capsys):
    from netmorph.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["sgd", "--steps", "20", "--workers", "2", "--compute-ms", "0"]) == 0
    out = capsys.readouterr().out
    assert "server" not in out.splitlines()[0]  # BSP has no parameter server
    bsp = next(line for line in out.splitlines() if line.startswith("bsp"))
    assert "never" not in bsp and " - " in bsp  # one mode alone has no target to reach
    assert main(["sgd", "--compare", "--steps", "10", "--workers", "2", "--compute-ms", "0"]) == 0
    assert list(tmp_path.iterdir()) == []  # nothing written into the working directory
    capsys.readouterr()
    assert main(["sgd", "--plot", "x.png", "--steps", "5"]) == 2
    assert "add --compare" in capsys.readouterr().err


def test_every_flag_says_what_it_does():
    from netmorph.cli import _subparsers, build_parser

    sub = _subparsers(build_parser())
    silent = [
        (name, a.option_strings or a.dest)
        for name, p in sub.choices.items()
        for a in p._actions
        if a.help is None and a.dest != "help"
    ]
    assert silent == []


def test_a_run_split_under_torchrun_is_the_job_and_outside_it_a_local_launch(monkeypatch):
    """train and moe size their run the same way: torchrun's WORLD_SIZE sets --dp and must equal the split, the
    backend defaults to torch there (local refused) and to local here, where the processes are capped."""
    import argparse

    from netmorph.cli import job_split
    from netmorph.errors import UsageError

    def args(**kw):
        return argparse.Namespace(**{"tp": 1, "pp": 1, "ep": 1, "dp": None, "backend": None, **kw})

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    a = args(tp=2)
    assert job_split(a, ("tp", "pp"), cap=16) is None and (a.dp, a.backend) == (1, "local")
    with pytest.raises(UsageError, match="keep it <= 16"):
        job_split(args(tp=4, pp=2, dp=4), ("tp", "pp"), cap=16)
    monkeypatch.setenv("WORLD_SIZE", "8")
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(k, v)
    a = args(ep=2, tp=2)
    assert job_split(a, ("ep", "tp", "pp"), cap=32) == 8 and (a.dp, a.backend) == (2, "torch")
    a = args(tp=4, pp=2, dp=4)  # the job, not this machine, sets the size
    with pytest.raises(UsageError, match="!= torchrun's WORLD_SIZE 8"):
        job_split(a, ("tp", "pp"), cap=16)
    for bad, words in (
        (args(tp=3), "does not divide torchrun's WORLD_SIZE 8"),
        (args(backend="local"), "cannot span torchrun's processes"),
        (args(pp=0), "--pp must be"),
    ):
        with pytest.raises(UsageError, match=words):
            job_split(bad, ("tp", "pp"), cap=16)
