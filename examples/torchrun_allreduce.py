"""Run netmorph's all-reduce schedules under torchrun, on one machine or several, CPU or GPU.

One node:

    torchrun --nproc-per-node 4 examples/torchrun_allreduce.py

Two nodes (run on each; HOST is node 0's address, reachable from node 1):

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        --rdzv-id allreduce-demo examples/torchrun_allreduce.py

Each rank joins the job from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT); with GPUs, rank r's tensors live on ``cuda:LOCAL_RANK`` and
travel over NCCL, on CPU over gloo. Every all-reduce algorithm runs on a
``--bytes`` tensor, is checked against the closed-form sum, and timed; rank 0
prints one row per algorithm and one for torch.distributed's own all_reduce.
``--die-rank R`` makes rank R exit abruptly after the first algorithm (the
failure report should name R, wherever it ran).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

from netmorph.collectives import ALGORITHMS, bandwidths
from netmorph.runtime import init_from_env
from netmorph.units import parse_size


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bytes", default="1MiB", help="message size (default 1MiB)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--die-rank", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    comm = init_from_env()
    dev, p = torch.device(comm.device), comm.world
    n = parse_size(args.bytes) // 4
    want = p * (p + 1) / 2
    rows = []
    with comm:
        for algo in [*ALGORITHMS["allreduce"], "torch"]:
            x = torch.full((n,), comm.rank + 1.0, device=dev)
            if algo == "torch":
                dist.all_reduce(x)
            else:
                comm.all_reduce(x, algo=algo)
            ok = bool((x == want).all())
            _sync(dev)
            t0 = time.perf_counter()
            for _ in range(args.iters):
                y = torch.full((n,), 1.0, device=dev)
                dist.all_reduce(y) if algo == "torch" else comm.all_reduce(y, algo=algo)
            _sync(dev)
            t = (time.perf_counter() - t0) / args.iters
            rows.append((algo, t, bandwidths("allreduce", 4 * n, t, p)[1], ok))
            if comm.rank == args.die_rank:
                os._exit(1)
    if comm.rank == 0:
        print(f"# world {p} on {dev.type}, {4 * n:,} B float32 all-reduce, {args.iters} iterations")
        print(f"{'algorithm':<20} {'time(us)':>10} {'busbw(GB/s)':>11} {'check':>6}")
        for algo, t, bw, ok in rows:
            print(f"{algo:<20} {t * 1e6:>10.1f} {bw:>11.3f} {'ok' if ok else 'WRONG':>6}", flush=True)


if __name__ == "__main__":
    main()
