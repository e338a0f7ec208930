"""calibrate on a cluster's GPUs: under torchrun it measures the job's ranks (gloo here, NCCL there), on GPUs the
published models' GEMM shapes against a preset's datasheet, and what a lent GPU measured goes into the presets
(planner/measured.json, scripts/device_check.py --apply)."""

import json
import os

import pytest

from netmorph.cli import main
from netmorph.mesh.layout import Batch, Layout
from netmorph.mesh.shape import ModelShape
from netmorph.planner.hardware import PRESETS as HW
from netmorph.planner.hardware import load_hardware
from netmorph.planner.timing import step_time

pytestmark = pytest.mark.timeout(120)


@pytest.mark.timeout(180)
def test_calibrate_under_torchrun_measures_the_jobs_ranks_and_rank_0_writes(tmp_path):
    """On a cluster calibrate runs under torchrun: the job's ranks are measured (their GPUs and NCCL where there
    are; gloo on this CPU), not ranks each worker forks of its own, and one profile comes out, from rank 0."""
    import subprocess
    import sys

    out = tmp_path / "job.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "netmorph",
            "calibrate",
            "--quick",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=170,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # torchrun's torchelastic_* log folder
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("# netmorph calibrate: 2 torch ranks") == 1  # rank 1 prints nothing
    prof = json.loads(out.read_text())
    assert prof["machine"]["ranks"] == prof["hardware"]["gpus_per_node"] == 2 and prof["machine"]["device"] == "cpu"
    assert len(prof["compute"]["alone"]["gemm"]) == len(prof["compute"]["busy"]["gemm"]) == 2 * 3 * 4
    link = prof["links"]["intra"]
    assert link["ring_groups"] == [2] and len(link["ring_s"]["2"]) == len(link["ring_sizes"])
    assert [r["p"] for r in prof["compute"]["busy"]["relay"]] == [2]
    assert load_hardware(str(out)).alpha_intra == link["alpha"]


def test_calibrate_under_torchrun_refuses_what_cannot_work(monkeypatch, capsys):
    for k, v in (
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "1"),
    ):
        monkeypatch.setenv(k, v)
    for argv, words in (
        (["--backend", "local"], "--backend local forks its own ranks"),
        (["--world", "4"], "--world 4 != torchrun's WORLD_SIZE 2"),
        (["--inter-node-mbps", "10"], "torchrun's nodes are real"),
        (["--preset", "tpu-v9"], "--preset must be one of"),
    ):
        assert main(["calibrate", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
    monkeypatch.delenv("WORLD_SIZE")
    assert main(["calibrate", "--preset", "h200"]) == 2
    assert "under torchrun" in capsys.readouterr().err


def test_measured_fields_lay_over_their_preset_and_say_where_they_come_from():
    from netmorph.errors import UsageError
    from netmorph.planner.hardware import MEASURED_FILE, with_measured

    source = {"date": "2026-12-03", "device": "NVIDIA H200", "command": "python scripts/device_check.py"}
    data = {
        "format": "netmorph-measured/1",
        "presets": {
            "h200": {"fields": {"gemm_table": [[1, 0.3], [8192, 0.5]], "attention_efficiency": 0.41}, "source": source}
        },
    }
    hw = with_measured(HW, data, "x")["h200"]
    assert hw.gemm_table == ((1.0, 0.3), (8192.0, 0.5)) and hw.attention_efficiency == 0.41
    assert hw.peak_flops == HW["h200"].peak_flops and hw.comm_slowdown == HW["h200"].comm_slowdown
    assert "measured on NVIDIA H200 2026-12-03: attention_efficiency, gemm_table" in hw.description
    # the table now prices the GEMMs: a 7B layer's on one H200 are slower at 50% of peak than at the carried 66%
    llama = ModelShape(layers=32, hidden=4096, heads=32, seq=4096, vocab=32000)
    lay = Layout(batch=Batch(micro_batch_size=1, global_batch=1))
    assert step_time(llama, lay, hw).matmul_s > step_time(llama, lay, HW["h200"]).matmul_s
    for preset, fields, src, words in (
        ("h300", {}, source, "must be a preset"),
        ("h200", {"peak_flops": 1e15}, source, "peak_flops not measured here"),
        ("h200", {"attention_efficiency": 1.5}, source, "attention_efficiency must be"),
        ("h200", {}, {"date": "2026-12-03"}, "source lacks device, command"),
    ):
        bad = {"format": "netmorph-measured/1", "presets": {preset: {"fields": fields, "source": src}}}
        with pytest.raises(UsageError, match=words):
            with_measured(HW, bad, "x")
    shipped = json.loads(MEASURED_FILE.read_text())  # what the package ships: valid, every entry sourced
    assert with_measured(HW, shipped, "measured.json").keys() == HW.keys()


def test_the_device_script_writes_what_a_gpu_measured_into_the_presets(tmp_path):
    """scripts/device_check.py's report of a GPU run (its shape, as calibrate under torchrun --preset writes the
    profile) becomes measured.json's entry; a CPU run's report has nothing for the presets and is refused."""
    import importlib.util

    from netmorph.planner.hardware import MEASURED_FILE, with_measured

    spec = importlib.util.spec_from_file_location(
        "device_check", MEASURED_FILE.parents[2] / "scripts" / "device_check.py"
    )
    dc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dc)
    assert [
        dc.preset_for(n)
        for n in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "Tesla T4")
    ] == ["h200", "h100-80g", "a100-40g", "a100-80g", None]
    fields = {
        "peak_flops": 989e12,
        "fp8_flops": 1979e12,
        "gemm_table": [[1, 0.45], [64, 0.78]],
        "fp8_gemm_table": [[64, 0.6]],
        "attention_efficiency": 0.39,
    }
    report = {
        "date": "2026-12-03T08:00:00+00:00",
        "device": "NVIDIA H200",
        "command": "python device_check.py",
        "torch": "2.13.0",
        "cuda": "12.8",
        "preset": "h200",
        "profile": {"preset_fields": fields, "links": {}, "hardware": {}},
    }
    path = tmp_path / "device.json"
    path.write_text(json.dumps(report))
    measured = tmp_path / "measured.json"
    measured.write_text(MEASURED_FILE.read_text())
    line = dc.apply(path, measured)
    assert "h200 <- attention_efficiency, fp8_gemm_table, gemm_table" in line
    data = json.loads(measured.read_text())
    hw = with_measured(HW, data, "x")["h200"]
    assert hw.fp8_gemm_table == ((64.0, 0.6),) and hw.attention_efficiency == 0.39
    assert data["presets"]["h200"]["source"]["cuda"] == "12.8"
    path.write_text(json.dumps({**report, "device": "cpu", "preset": None}))
    with pytest.raises(SystemExit, match="nothing to apply"):
        dc.apply(path, measured)


def test_the_gpu_measurement_bins_what_it_timed():
    """calibrate.gpu on the CPU, shrunk (what it measures on a GPU under torchrun --preset): every GEMM shape
    timed against the peak given, binned by GFLOP as the presets' gemm_table; the attention core beside it."""
    import torch

    from netmorph.calibrate import gpu

    shapes = gpu.shapes((64,), (8,))[:4]
    assert all(m == 64 for m, _, _ in shapes) and len(gpu.shapes()) > 50  # the published models' layers
    out = gpu.measure(
        torch.device("cpu"), peak=2e11, gemms=shapes, seqs=(64,), head_dim=16, dtype=torch.float32, repeats=1
    )
    rows = [r for r in out["rows"] if r["dtype"] == "float32"]
    assert [(r["m"], r["k"], r["n"]) for r in rows] == shapes and "fp8_gemm_table" not in out  # no FP8 on a CPU
    gflops = [2 * m * k * n / 1e9 for m, k, n in shapes]
    assert [b for b, _ in out["gemm_table"]] == sorted({min(e for e in gpu.EDGES if e >= g) for g in gflops})
    assert all(0 < e <= 1 for _, e in out["gemm_table"]) and 0 < out["attention_efficiency"] <= 1
