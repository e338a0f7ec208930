"""One parallel configuration: how a model is split over the devices and trained."""

from __future__ import annotations

from dataclasses import dataclass

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class ParallelConfig:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    microbatch: int = 1
    global_batch: int = 1
    interleave: int = 1            # v: model chunks per pipeline stage (Megatron's interleaved 1F1B)
    zero: int = 0                  # DeepSpeed ZeRO stage over the data-parallel group
    recompute: str = "none"        # none | selective | full
    sequence_parallel: bool = False
    dp_overlap: bool = False       # overlap the gradient reduction with the last backward pass
    param_bytes: int = 2           # fp16/bf16 weights
    grad_bytes: int = 4            # Megatron's fp32 main gradients (2 gives ZeRO's 16 B/parameter)
    optimizer_bytes: int = 12      # mixed-precision Adam: fp32 master weights, momentum, variance

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def microbatches(self) -> int:
        """m: microbatches per pipeline per iteration."""
        return self.global_batch // (self.dp * self.microbatch)

    def label(self) -> str:
        extra = []
        if self.interleave > 1:
            extra.append(f"v={self.interleave}")
        if self.zero:
            extra.append(f"zero{self.zero}")
        if self.recompute != "none":
            extra.append(f"rc={self.recompute}")
        if self.sequence_parallel:
            extra.append("sp")
        return f"tp{self.tp} pp{self.pp} dp{self.dp} mb{self.microbatch}" + (" " + " ".join(extra) if extra else "")
