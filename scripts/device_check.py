"""The one prepared run for a lent GPU: what the planner needs from the hardware, measured, in under 6 minutes.

    python scripts/device_check.py [--out DIR] [--budget 330]      # on the GPU machine
    python scripts/device_check.py --apply DIR/device.json          # here: into the presets

1. ``netmorph calibrate`` under torchrun on every GPU (bf16, NCCL between them), against the datasheet peaks of
   the preset the device is (``--preset``, from its name): the published models' GEMM-shape efficiency
   (``gemm_table``, ``fp8_gemm_table``) and FlashAttention's (``attention_efficiency``) -- what
   ``benchmarks/gemm_efficiency.py`` prints, now :mod:`netmorph.calibrate.gpu` inside calibrate -- and with two
   GPUs or more the NCCL link's α, β and cost per call, fitted as on any machine; the whole profile too;
2. interference: a bf16 GEMM loop alone, then beside a bucket's worth of device-to-device copies on a second
   CUDA stream -- on the one GPU a lease gives there is no peer for NCCL, so the copies stand in for the
   SM-driven copy kernels NCCL runs within a node, and the result says it is that proxy (kept in device.json,
   not written into the preset: the presets carry Lee et al. 2025's 0.189 until an NCCL collective beside the
   GEMMs is measured on two GPUs or more);
3. ``netmorph train --precision bf16`` under torchrun on the GPU (NCCL, one rank per GPU): mixed precision on
   CUDA -- bf16 weights and activations on the device, float32 master state -- held by ``--check`` against the
   float32 1-rank run, and its step time beside float32's (on CPUs bf16 is slower; on tensor cores it is not).

Everything goes to ``DIR/device.json`` (default ``$OUT`` where the device tool sets it, else ``device-out``) with
the date, the device's name, torch's and CUDA's versions and the command, and ``entry`` -- the fields for
``netmorph/planner/measured.json``, which ``--apply`` merges there (the planner lays them over the preset and its
description names the date, device and command). On a machine without CUDA it runs each step small on the
CPU: a check that the script works, not a measurement (``--apply`` refuses such a report).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "netmorph" / "planner" / "measured.json"
# what torch.cuda.get_device_name() says -> the preset whose datasheet the efficiencies are measured against
NAMES = (
    ("H200", "h200"),
    ("H100", "h100-80g"),
    ("A100-SXM4-40GB", "a100-40g"),
    ("A100", "a100-80g"),
    ("V100", "v100-32g"),
)


def preset_for(device_name: str) -> str | None:
    """The hardware preset a GPU is, by the name CUDA gives it; None for one netmorph has no preset of."""
    return next((preset for key, preset in NAMES if key in device_name), None)


def entry(report: dict) -> dict | None:
    """The measured fields of ``report`` for the presets (``measured.json``'s entry), or None when it measured
    nothing a preset takes (no CUDA, no preset, or calibrate failed)."""
    prof = report.get("profile") or {}
    fields = dict(prof.get("preset_fields") or {})
    if not report.get("preset") or not fields:
        return None
    fields.pop("peak_flops", None)
    fields.pop("fp8_flops", None)
    hw = prof.get("hardware", {})
    if prof.get("links"):  # two GPUs or more: NCCL inside the node, fitted
        fields.update({k: hw[k] for k in ("alpha_intra", "nvlink_bandwidth", "collective_base_s")})
    return {"fields": fields, "source": {k: str(report[k]) for k in ("date", "device", "command", "torch", "cuda")}}


def apply(report_path: Path, measured: Path = MEASURED) -> str:
    """Merge a device report's entry into ``measured``; the line that says what changed."""
    sys.path.insert(0, str(ROOT))
    from netmorph.planner.hardware import PRESETS, with_measured

    report = json.loads(report_path.read_text())
    new = entry(report)
    if new is None:
        raise SystemExit(
            f"{report_path}: nothing to apply (device {report.get('device')!r}, preset "
            f"{report.get('preset')!r}): only a CUDA run against a preset measures a preset's fields"
        )
    data = json.loads(measured.read_text())
    data["presets"][report["preset"]] = new
    with_measured(PRESETS, data, str(measured))  # every field checked before anything is written
    measured.write_text(json.dumps(data, indent=1) + "\n")
    return f"{measured}: {report['preset']} <- {', '.join(sorted(new['fields']))} ({new['source']['date']})"


def _run(cmd: list, timeout: float) -> dict:
    """A step as a subprocess: its exit code, seconds, the tail of its output and its stdout (never raises)."""
    t0 = time.perf_counter()
    stdout = ""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        rc, out, stdout = r.returncode, r.stdout + r.stderr, r.stdout
    except subprocess.TimeoutExpired as e:
        rc, out = 124, f"timed out after {timeout:.0f} s\n{(e.stdout or b'')[-2000:]!r}"
    return {
        "cmd": " ".join(cmd),
        "rc": rc,
        "seconds": round(time.perf_counter() - t0, 1),
        "tail": out[-3000:],
        "stdout": stdout,
    }


def _gemm_loop(a, b, iters: int) -> None:
    for _ in range(iters):
        a @ b


def interference(seconds: float = 20.0) -> dict:
    """GEMM time alone and beside a collective (or its copy-kernel proxy) on a side stream: comm_slowdown."""
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA: nothing beside the GEMMs shares a GPU's SMs"}
    dev = torch.device("cuda")
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    bucket = torch.empty(256 * 2**20 // 2, device=dev, dtype=torch.bfloat16)  # 256 MiB, a large DP bucket
    dst = torch.empty_like(bucket)
    side = torch.cuda.Stream()
    iters = 50

    def gemms() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        _gemm_loop(a, b, iters)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    gemms()  # warm up cuBLAS
    alone = min(gemms() for _ in range(3))
    beside, busy = [], 0
    deadline = time.perf_counter() + seconds
    for _ in range(3):
        with torch.cuda.stream(side):
            for _ in range(64):  # keep the side stream busy past the GEMMs
                dst.copy_(bucket)
                busy += 1
        beside.append(gemms())
        torch.cuda.synchronize()
        if time.perf_counter() > deadline:
            break
    with_comm = min(beside)
    flops = 2 * n**3 * iters
    return {
        "proxy": "device-to-device copies of a 256 MiB bucket on a side stream (one GPU: no NCCL peer)",
        "gemm_alone_s": alone,
        "gemm_beside_s": with_comm,
        "gemm_tflops_alone": flops / alone / 1e12,
        "comm_slowdown": round(with_comm / alone - 1, 3),
        "copies": busy,
    }


def mixed_precision(nproc: int, left) -> dict:
    """bf16 and float32 training of one GPT under torchrun, 20 steps each: the largest loss gap to the float32
    1-rank run and the median step times."""
    out = {}
    for name, flags in (("float32", []), ("bf16", ["--precision", "bf16"])):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            "netmorph",
            "train",
            "--steps",
            "20",
            "--hidden",
            "256",
            "--layers",
            "4",
            "--seq",
            "256",
            "--check",
            "--json",
            *flags,
        ]
        run = _run(cmd, timeout=min(40.0, left()))
        try:
            res = json.loads(run.pop("stdout") or "{}")
        except ValueError:
            res = {}
        out[name] = {
            "rc": run["rc"],
            "seconds": run["seconds"],
            "tail": run["tail"][-500:] if run["rc"] else "",
            "step_time_s": res.get("step_time_s"),
            "max_rel_loss_diff": res.get("max_rel_loss_diff"),
            "memory_bytes": res.get("memory_bytes"),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "device-out", help="where device.json goes")
    ap.add_argument("--budget", type=float, default=330.0, help="seconds for the three steps (default 330)")
    ap.add_argument(
        "--apply",
        type=Path,
        metavar="DEVICE_JSON",
        help="merge a device.json's measured fields into netmorph/planner/measured.json and stop",
    )
    args = ap.parse_args()
    if args.apply:
        print(apply(args.apply))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    cuda = torch.cuda.is_available()
    name = torch.cuda.get_device_name() if cuda else "cpu"
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": name,
        "gpus": torch.cuda.device_count() if cuda else 0,
        "preset": preset_for(name) if cuda else None,
    }
    print(
        f"# {report['device']} ({report['gpus']} GPU, preset {report['preset']}), torch {report['torch']}, "
        f"CUDA {report['cuda']}",
        flush=True,
    )

    def left() -> float:
        return max(10.0, args.budget - (time.perf_counter() - start))

    nproc = max(report["gpus"], 1) if cuda else 2  # on the CPU: two ranks, links measured over gloo
    profile = out / "profile.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "netmorph",
        "calibrate",
        "--out",
        str(profile),
    ]
    if not cuda:
        cmd += ["--quick"]
    else:
        cmd += ["--dtype", "bfloat16"] + (["--preset", report["preset"]] if report["preset"] else [])
    report["calibrate"] = _run(cmd, timeout=min(200.0, left()))
    report["calibrate"].pop("stdout")
    if profile.exists() and report["calibrate"]["rc"] == 0:
        report["profile"] = json.loads(profile.read_text())
    print(
        f"# 1 netmorph calibrate under torchrun: rc {report['calibrate']['rc']} in {report['calibrate']['seconds']} s",
        flush=True,
    )
    report["interference"] = interference(min(30.0, left()))
    print(f"# 2 interference: {json.dumps(report['interference'])}", flush=True)
    report["mixed_precision"] = mixed_precision(nproc, left)
    print(f"# 3 bf16 training: {json.dumps(report['mixed_precision'])}", flush=True)
    report["entry"] = entry(report)
    (out / "device.json").write_text(json.dumps(report, indent=1))
    print(
        f"# wrote {out / 'device.json'} in {time.perf_counter() - start:.0f} s; "
        + (
            "the presets' fields: python scripts/device_check.py --apply device.json"
            if report["entry"]
            else "nothing for the presets (no CUDA, or no preset of this device)"
        )
    )
    return 0 if report["calibrate"]["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
