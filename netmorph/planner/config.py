"""One parallel configuration: how a model is split over the devices and trained.

Megatron-LM's order of the groups, innermost first: tp, cp, (ep inside) dp, pp -- a TP group
is consecutive devices, a CP group strides by t, a DP group by t·c, a PP group by t·c·d.
Expert parallelism (``ep``) folds the experts over ``ep`` of the data-parallel ranks, as
Megatron-Core does. Pipeline stages need not hold equal layer counts: ``first_stage_layers``
and ``last_stage_layers`` (Megatron's ``--decoder-first/last-pipeline-num-layers``) take
fewer layers on the stages that also carry the embedding and the output layer, and a layer
count that pp does not divide is spread as evenly as it goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

RECOMPUTE = ("none", "selective", "full")
PRECISION = ("bf16", "fp8")


@dataclass(frozen=True)
class ParallelConfig:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    microbatch: int = 1
    global_batch: int = 1
    interleave: int = 1            # v: model chunks per pipeline stage (Megatron's interleaved 1F1B)
    zero: int = 0                  # DeepSpeed ZeRO stage over the data-parallel group (3: FSDP)
    recompute: str = "none"        # none | selective | full
    sequence_parallel: bool = False
    dp_overlap: bool = False       # overlap the gradient reduction with the last backward pass
    param_bytes: int = 2           # fp16/bf16 weights
    grad_bytes: int = 4            # Megatron's fp32 main gradients (2 gives ZeRO's 16 B/parameter)
    optimizer_bytes: int = 12      # mixed-precision Adam: fp32 master weights, momentum, variance
    cp: int = 1                    # context parallel: the sequence split over cp ranks (ring attention)
    ep: int = 1                    # expert parallel: the experts split over ep of the dp ranks
    precision: str = "bf16"        # bf16 | fp8 (Transformer Engine: FP8 matmuls, fp32 master weights)
    first_stage_layers: int = 0    # 0: an even split
    last_stage_layers: int = 0
    tp_overlap: bool = False       # Megatron --tp-comm-overlap: TP collectives pipelined with the GEMMs
    pp_overlap: bool = False       # Megatron --overlap-p2p-communication

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def microbatches(self) -> int:
        """m: microbatches per pipeline per iteration."""
        return self.global_batch // (self.dp * self.microbatch)

    def stage_layers(self, layers: int) -> list:
        """Layers on each pipeline stage: the fixed first/last counts, the rest as evenly as it goes (the
        extra layers on the middle stages, away from the embedding and the output layer)."""
        return list(_stage_layers(layers, self.pp, self.first_stage_layers, self.last_stage_layers))

    def label(self) -> str:
        extra = []
        if self.cp > 1:
            extra.append(f"cp{self.cp}")
        if self.ep > 1:
            extra.append(f"ep{self.ep}")
        if self.interleave > 1:
            extra.append(f"v={self.interleave}")
        if self.zero:
            extra.append(f"zero{self.zero}")
        if self.recompute != "none":
            extra.append(f"rc={self.recompute}")
        if self.sequence_parallel:
            extra.append("sp")
        if self.precision != "bf16":
            extra.append(self.precision)
        if self.first_stage_layers or self.last_stage_layers:
            extra.append(f"stages {self.first_stage_layers or '-'}/{self.last_stage_layers or '-'}")
        return f"tp{self.tp} pp{self.pp} dp{self.dp} mb{self.microbatch}" + (" " + " ".join(extra) if extra else "")


@lru_cache(maxsize=4096)
def _stage_layers(layers: int, p: int, first: int, last: int) -> tuple:
    if p == 1:
        return (layers,)
    free = p - bool(first) - bool(last)                 # stages whose count is not fixed
    base, extra = divmod(layers - first - last, free) if free else (0, 0)
    counts = [base] * free
    order = list(range(0 if first else 1, free - (0 if last else 1))) + ([0] if not first else []) + \
        ([free - 1] if not last else [])
    for i in order[:extra]:
        counts[i] += 1
    return tuple(([first] if first else []) + counts + ([last] if last else []))
