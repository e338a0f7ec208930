"""sgd and serve join a torchrun job: the job's ranks are the run's, over torch.distributed point-to-point, and
the answer is the one netmorph's own ranks give (the same losses, tokens and bytes); rank 0 alone prints."""

import json
import os
import subprocess
import sys

import pytest

from netmorph.cli import main

pytestmark = pytest.mark.timeout(180)


def _torchrun(tmp_path, n, *args):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(n),
            "-m",
            "netmorph",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # torchrun's torchelastic_* log folder
    return r


def _local(*args):
    r = subprocess.run([sys.executable, "-m", "netmorph", *args], capture_output=True, text=True, timeout=170)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_sgd_bsp_under_torchrun_equals_the_local_run(tmp_path):
    args = ["sgd", "--mode", "bsp", "--workers", "4", "--steps", "30", "--json"]
    r = _torchrun(tmp_path, 4, *args)
    assert r.returncode == 0, r.stderr[-2000:]
    (job,) = json.loads(r.stdout)  # one document: rank 0's
    (local,) = _local(*args)
    assert job["final_loss"] == local["final_loss"] and job["updates"] == local["updates"] == 120
    assert job["bytes_on_wire"] == local["bytes_on_wire"] > 0


def test_serve_tensor_parallel_under_torchrun_gives_the_same_tokens_and_bytes(tmp_path):
    args = ["serve", "--tp", "2", "--requests", "4", "--json"]
    r = _torchrun(tmp_path, 2, *args, "--check", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    job, local = json.loads(r.stdout), _local(*args)  # the same run on one box (the job did the 1-rank check)
    assert job["check"] == {"requests": 2, "identical": 2}
    assert job["tp_allreduce_bytes"] == job["tp_allreduce_bytes_formula"] == local["tp_allreduce_bytes"]
    assert job["completed"] == local["completed"] == 4


def test_serve_disaggregated_under_torchrun_moves_the_kv_the_formula_says(tmp_path):
    r = _torchrun(tmp_path, 2, "serve", "--disaggregate", "1:1", "--requests", "8", "--check", "2", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    job = json.loads(r.stdout)
    assert job["completed"] == 8 and job["check"] == {"requests": 2, "identical": 2}
    assert job["kv_transfer_bytes"] == job["kv_transfer_bytes_formula"] > 0


def test_a_job_of_the_wrong_size_is_one_line(tmp_path):
    r = _torchrun(tmp_path, 3, "sgd", "--mode", "bsp", "--workers", "4", "--steps", "5")
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("netmorph sgd: error:")]
    assert lines and "torchrun's WORLD_SIZE is 3" in lines[0] and "--nproc-per-node 4" in lines[0]
    # torchrun's agent prints its own ChildFailedError; no frame of netmorph's is in it (the worker said one line)
    assert not [ln for ln in r.stderr.splitlines() if 'File "' in ln and "/torch/" not in ln and "/netmorph/" in ln], (
        r.stderr[-2000:]
    )


@pytest.mark.parametrize(
    "argv,words",
    [
        (["sgd", "--compare"], "one --mode per job"),
        (["sgd", "--mode", "hogwild"], "shares one address space"),
        (["sgd", "--slow-link", "0:1:1e-3:1e8"], "--slow-link"),
        (["serve", "--requests", "5"], "give --tp N or --disaggregate P:D"),
    ],
)
def test_what_cannot_run_under_torchrun_is_refused_before_joining(argv, words, monkeypatch, capsys):
    for k, v in {
        "RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }.items():
        monkeypatch.setenv(k, v)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
