"""Run netmorph's schedules under torchrun, across processes or machines.

    torchrun --nproc_per_node 4 examples/torchrun_allreduce.py
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_endpoint HOST:29500 examples/torchrun_allreduce.py

Each rank joins the job torchrun started (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
and runs every all-reduce algorithm over torch.distributed point-to-point, checks
the result, and rank 0 prints one line per algorithm.
"""

import numpy as np

from netmorph.collectives import ALGORITHMS
from netmorph.runtime import init_from_env


def main() -> None:
    comm = init_from_env()
    n = 1 << 16
    for algo in ALGORITHMS["allreduce"]:
        x = np.full(n, comm.rank + 1, dtype=np.float32)
        comm.all_reduce(x, algo=algo)
        ok = bool((x == comm.world * (comm.world + 1) / 2).all())
        if comm.rank == 0:
            print(f"{algo:<20} world {comm.world}: {'ok' if ok else 'WRONG'}", flush=True)
    comm.transport.close()


if __name__ == "__main__":
    main()
