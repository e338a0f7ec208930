"""Parallel training on real ranks: DP, ZeRO, Megatron TP (+SP), pipeline schedules, composed as 3D.

Rooms: ``flat`` (flat parameter/gradient buffers, Adam), ``data_parallel`` (naive and
bucketed+overlap), ``zero`` (stages 1-3), ``tensor_parallel`` (Megatron's layers and
regions), ``pipeline`` (schedules as data, the executor), ``config`` (TrainConfig),
``hybrid`` (the SPMD rank function on the mesh), ``traffic`` (the closed forms), ``baseline`` (DDP and the
no-communication bound), ``run`` (launch, summarise, the 1-rank reference).
"""

from netmorph.parallel.config import TrainConfig
from netmorph.parallel.hybrid import train_rank
from netmorph.parallel.pipeline import SCHEDULES, Slot, schedule
from netmorph.parallel.run import reference, train
from netmorph.parallel.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallel,
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "SCHEDULES",
    "Slot",
    "TensorParallel",
    "TrainConfig",
    "copy_to_tensor_model_parallel_region",
    "gather_from_sequence_parallel_region",
    "reduce_from_tensor_model_parallel_region",
    "reduce_scatter_to_sequence_parallel_region",
    "reference",
    "schedule",
    "train",
    "train_rank",
]
