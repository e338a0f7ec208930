"""The one prepared run for a lent GPU: what the planner needs from the hardware, measured, in under 5 minutes.

    python scripts/device_check.py [--out DIR] [--budget 280]

1. GEMM-shape efficiency and FlashAttention's (``benchmarks/gemm_efficiency.py --json``): the ``gemm_table``,
   ``fp8_gemm_table`` and ``attention_efficiency`` a hardware preset takes;
2. interference: a bf16 GEMM loop alone, then beside a bucket's worth of device-to-device copies on a second
   CUDA stream -- on the one GPU a lease gives there is no peer for NCCL, so the copies stand in for the
   SM-driven copy kernels NCCL runs within a node, and the result says it is that proxy -- giving
   ``comm_slowdown``, the share by which compute slows beside communication (the presets carry Lee et al.
   2025's 0.189 until it is measured; an NCCL all-reduce beside the GEMMs on two or more GPUs is not built);
3. the torch.distributed path: ``netmorph calibrate --backend torch`` under torchrun on the GPUs (NCCL),
   its exit code and the tail of its output.

Everything goes to ``DIR/device.json`` (default ``$OUT`` where the device tool sets it, else ``device-out``) with
the date, the device's name, torch's and CUDA's versions and the command, so the numbers can go into
``netmorph/planner/hardware.py`` with their source. On a machine without CUDA it runs each step small on the
CPU: a check that the script works, not a measurement.
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


def _run(cmd: list, timeout: float) -> dict:
    """A step as a subprocess: its exit code, seconds and the tail of its output (never raises)."""
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        rc, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = 124, f"timed out after {timeout:.0f} s\n{(e.stdout or b'')[-2000:]!r}"
    return {"cmd": " ".join(cmd), "rc": rc, "seconds": round(time.perf_counter() - t0, 1), "tail": out[-3000:]}


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
    bucket = torch.empty(256 * 2 ** 20 // 2, device=dev, dtype=torch.bfloat16)     # 256 MiB, a large DP bucket
    dst = torch.empty_like(bucket)
    side = torch.cuda.Stream()
    iters = 50

    def gemms() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        _gemm_loop(a, b, iters)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    gemms()                                                       # warm up cuBLAS
    alone = min(gemms() for _ in range(3))
    beside, busy = [], 0
    deadline = time.perf_counter() + seconds
    for _ in range(3):
        with torch.cuda.stream(side):
            for _ in range(64):                                   # keep the side stream busy past the GEMMs
                dst.copy_(bucket)
                busy += 1
        beside.append(gemms())
        torch.cuda.synchronize()
        if time.perf_counter() > deadline:
            break
    with_comm = min(beside)
    flops = 2 * n ** 3 * iters
    return {"proxy": "device-to-device copies of a 256 MiB bucket on a side stream (one GPU: no NCCL peer)",
            "gemm_alone_s": alone, "gemm_beside_s": with_comm, "gemm_tflops_alone": flops / alone / 1e12,
            "comm_slowdown": round(with_comm / alone - 1, 3), "copies": busy}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "device-out", help="where device.json goes")
    ap.add_argument("--budget", type=float, default=280.0, help="seconds for all three steps (default 280)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    cuda = torch.cuda.is_available()
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.executable).name, *sys.argv]), "torch": torch.__version__,
              "cuda": torch.version.cuda, "device": torch.cuda.get_device_name() if cuda else "cpu",
              "gpus": torch.cuda.device_count() if cuda else 0}
    print(f"# {report['device']} ({report['gpus']} GPU), torch {report['torch']}, CUDA {report['cuda']}", flush=True)

    def left() -> float:
        return max(10.0, args.budget - (time.perf_counter() - start))

    gemm_json = out / "gemm.json"
    report["gemm"] = _run([sys.executable, "benchmarks/gemm_efficiency.py", "--repeats", "3",
                           "--json", str(gemm_json)], timeout=min(150.0, left()))
    if gemm_json.exists():
        report["gemm"]["fields"] = json.loads(gemm_json.read_text())
    print(f"# 1 GEMM shapes: rc {report['gemm']['rc']} in {report['gemm']['seconds']} s", flush=True)
    report["interference"] = interference(min(30.0, left()))
    print(f"# 2 interference: {json.dumps(report['interference'])}", flush=True)
    nproc = max(report["gpus"], 2)             # calibrate measures links: two ranks at least
    report["torch_distributed"] = _run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m",
         "netmorph", "calibrate", "--backend", "torch", "--quick", "--out", str(out / "profile.json")],
        timeout=min(120.0, left()))
    print(f"# 3 netmorph calibrate --backend torch: rc {report['torch_distributed']['rc']} in "
          f"{report['torch_distributed']['seconds']} s", flush=True)
    (out / "device.json").write_text(json.dumps(report, indent=1))
    print(f"# wrote {out / 'device.json'} in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
