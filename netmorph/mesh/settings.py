"""What a layout carries beside its degrees: the batch, the precision, and the knobs of how the split runs.

Each is a small frozen value with its own ranges (:meth:`check`), as torchtitan keeps its ``ParallelDims``
apart from the job config's training, mixed-precision and activation-checkpoint sections:

- :class:`Batch`: Megatron's ``--global-batch-size`` and ``--micro-batch-size``, and the order the pipeline
  runs the microbatches in (``--pipeline-schedule``, the interleaved schedule's microbatch group);
- :class:`Precision`: the matmuls' format (Megatron's ``--bf16``, Transformer Engine's FP8) and the bytes
  each model state and activation takes;
- :class:`Knobs`: what the run recomputes (``--recompute-granularity``), splits further
  (``--sequence-parallel``), overlaps (``--overlap-grad-reduce``, ``--overlap-param-gather``,
  ``--tp-comm-overlap``, ``--overlap-p2p-communication``), buckets, and where the pipeline cuts the layers.

The planner prices all of them; netmorph's trainer runs the batch, sequence parallelism, recomputation's
absence, the gradient buckets and their overlap (the rest it refuses in :mod:`netmorph.parallel.limits`).
"""

from __future__ import annotations

from dataclasses import dataclass

from netmorph.mesh.rejection import Rejection, in_range, one_of

RECOMPUTE = ("none", "selective", "full")
PRECISION = ("bf16", "fp8")
SCHEDULES = ("afab", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipev")  # the last three: zero bubble (B, W apart)
V_SHAPED = ("zbv", "dualpipev")  # two chunks a rank in a V: chunk 0 on ranks 0..p-1, chunk 1 back on p-1..0
SPLIT_BACKWARD = ("zb-h1", "zbv", "dualpipev")  # the backward as B (input gradient) and a later W (weights)
CP_COMM = ("p2p", "all_gather", "a2a")  # Megatron-Core's --cp-comm-type (a2a: DeepSpeed-Ulysses)


@dataclass(frozen=True, kw_only=True)
class Batch:
    """The step's sequences and how they split: ``global_batch`` over every replica, ``micro_batch_size``
    a microbatch, and the pipeline's order of the microbatches."""

    global_batch: int = 1  # sequences per step over every replica
    micro_batch_size: int = 1
    schedule: str = ""  # one of SCHEDULES; "": 1f1b, or interleaved when interleave > 1
    microbatch_group: int = 0  # interleaved: microbatches a chunk runs before the next chunk (Megatron's
    # --microbatch-group-size-per-virtual-pipeline-stage, Llama 3's N); 0: pp

    def check(self) -> list:
        """Every range :class:`Rejection` of the fields alone."""
        out = in_range(self, ("microbatch_group",), low=0)
        out += in_range(self, ("global_batch", "micro_batch_size"))
        return out + one_of(self, {"schedule": ("",) + SCHEDULES})


@dataclass(frozen=True, kw_only=True)
class Precision:
    """Megatron's mixed precision by default: bf16 weights and activations, fp32 main gradients, and Adam's
    fp32 master weights, momentum and variance (12 bytes a parameter)."""

    name: str = "bf16"  # bf16 | fp8 (Transformer Engine: FP8 matmuls, fp32 master weights)
    param_bytes: int = 2  # fp16/bf16 weights
    grad_bytes: int = 4  # Megatron's fp32 main gradients (2 gives ZeRO's 16 B/parameter)
    optimizer_bytes: int = 12  # mixed-precision Adam: fp32 master weights, momentum, variance
    activation_bytes: int = 2  # an activation on the wire (pipeline sends, TP collectives): 16-bit

    def check(self) -> list:
        if self.name not in PRECISION:
            return [
                Rejection(
                    "range",
                    "precision",
                    self.name,
                    f"precision must be one of {', '.join(PRECISION)}, got {self.name!r}",
                )
            ]
        return []


@dataclass(frozen=True, kw_only=True)
class Knobs:
    """How the split runs: none of them changes what is computed, each what it costs."""

    sequence_parallel: bool = False
    sp_regather: bool = True  # under SP each rank keeps its sequence shard of the QKV and fc1 inputs and
    # all-gathers it again for the weight gradients (Megatron); False: the gathered
    # input is kept (netmorph's trainer, whose autograd saves it)
    recompute: str = "none"  # none | selective | full
    dp_overlap: bool = False  # the gradient reduction overlaps the backward (DDP's buckets)
    param_gather_overlap: bool = False  # Megatron's --overlap-param-gather: the distributed optimizer's
    # parameter all-gather hides behind the next forward, bucket by bucket
    tp_overlap: bool = False  # Megatron --tp-comm-overlap: TP collectives pipelined with the GEMMs
    pp_overlap: bool = False  # Megatron --overlap-p2p-communication
    zero_memory: str = "paper"  # ZeRO's model states as Rajbhandari et al.'s Table 1 counts them ("paper") or
    # as DeepSpeed allocates them ("deepspeed": its estimate_zero2/3 functions)
    dp_bucket_mb: float = 0.0  # gradient bucket size (DDP's bucket_cap_mb, netmorph train's --bucket-mb);
    # 0: a bucket per layer (Megatron at scale: 40M-parameter buckets)
    cp_comm_type: str = "p2p"  # how cp ranks get each other's K and V (Megatron's --cp-comm-type): "p2p", ring
    # attention passing blocks behind the attention core; "all_gather", Llama 3's
    # all-gather before the core and reduce-scatter of their gradients after, exposed;
    # "a2a", Ulysses' all-to-alls trading the sequence split for a head split
    first_stage_layers: int = 0  # Megatron's --decoder-first/last-pipeline-num-layers (0: an even split)
    last_stage_layers: int = 0

    def check(self) -> list:
        return one_of(self, {"recompute": RECOMPUTE, "zero_memory": ("paper", "deepspeed"), "cp_comm_type": CP_COMM})
