"""The trainer's configuration: the model, the :class:`~netmorph.mesh.layout.Layout` and the run options
(Megatron's arguments split in two: the parallel degrees are the layout's, the rest are here), checked before
any rank starts (:meth:`TrainConfig.check`: the trainer's own limits, :mod:`netmorph.parallel.limits`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from netmorph.checkpoint import Checkpointing
from netmorph.errors import UsageError
from netmorph.mesh.layout import Batch, Knobs, Layout
from netmorph.mesh.presets import check_shape
from netmorph.mesh.shape import ModelShape
from netmorph.models.capacity import POLICIES
from netmorph.models.moe import Router
from netmorph.parallel import limits
from netmorph.parallel.algos import CollectiveAlgos
from netmorph.parallel.pipeline import check, schedule

# bfloat16: mixed precision (Megatron's --bf16): bf16 parameters, activations and matmuls, float32 main gradients,
# master weights and Adam moments, the loss in float32
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
REDUCE_DTYPES = ("bfloat16", "float32")


# the trainer's own defaults where a Layout's differ: two microbatches of two sequences, DDP's overlapped buckets
BUCKET_MB = 1.0  # the trainer's gradient bucket where the layout names none (DDP's bucket_cap_mb is 25)
TRAIN_LAYOUT = Layout(
    batch=Batch(global_batch=4, micro_batch_size=2), knobs=Knobs(dp_overlap=True, dp_bucket_mb=BUCKET_MB)
)
RUN_FIELDS = (
    "steps",
    "lr",
    "dtype",
    "grad_reduce_dtype",
    "dp_mode",
    "compute_ms",
    "device_flops",
    "trace",
    "start_step",
    "router",
    "checkpoint",
    "algos",
)


@dataclass(frozen=True)
class TrainConfig:
    """One training run: the model, its layout, and how long and how it runs (Megatron's arguments in three
    groups: ``TransformerConfig``, the parallel sizes, the training options)."""

    model: ModelShape = field(default_factory=ModelShape)
    layout: Layout = TRAIN_LAYOUT
    steps: int = 4
    lr: float = 3e-3
    dtype: str = "float64"
    grad_reduce_dtype: str = ""  # mixed precision: the gradients' reduction on the wire, bfloat16 (the default,
    # Megatron's --grad-reduce-in-bf16) or float32 (its accumulate-allreduce in fp32)
    dp_mode: str = "bucket"  # "bucket" (DDP's reducer) or "naive" (one all-reduce per gradient)
    compute_ms: float = 0.0  # emulated compute per microbatch forward on a stage, shared by its interleaved
    # chunks (backward: twice)
    device_flops: float = 0.0  # an emulated accelerator of this many FLOP/s: each microbatch's forward also
    # sleeps the rank's share of its layers' and LM head's FLOPs (slots.device_ms)
    trace: bool = False  # return every rank's ledger records too (for a Chrome trace)
    start_step: int = 0  # the first step's index: the data a resumed (or resharded) run continues on
    router: Router = Router()  # a mixture of experts' routing and auxiliary losses
    checkpoint: Checkpointing = Checkpointing()  # --save / --load (netmorph.checkpoint)
    algos: CollectiveAlgos = CollectiveAlgos()  # each collective's algorithm (--dp-algo, --tp-algo; ring)

    @classmethod
    def make(
        cls,
        model: ModelShape | None = None,
        microbatches: int = 2,
        micro_batch_size: int = 2,
        overlap: bool = True,
        **kw,
    ) -> TrainConfig:
        """Megatron's flat arguments: the run options by name, every other keyword a :class:`Layout` field
        (``microbatches`` per step and data-parallel rank gives the global batch)."""
        run = {k: kw.pop(k) for k in RUN_FIELDS if k in kw}
        if "bucket_mb" in kw:  # --bucket-mb: the layout's one field the planner prices too
            kw["dp_bucket_mb"] = kw.pop("bucket_mb")
        kw.setdefault("dp_bucket_mb", BUCKET_MB)
        dp = kw.get("dp", 1)
        kw.setdefault("expert_tp", 1)  # the trainer keeps each expert whole on every tp rank
        layout = Layout.of(
            global_batch=dp * microbatches * micro_batch_size,
            micro_batch_size=micro_batch_size,
            dp_overlap=overlap,
            **kw,
        )
        return cls(model=model or ModelShape(), layout=layout, **run)

    @property
    def world(self) -> int:
        return self.layout.world

    @property
    def mixed(self) -> bool:
        """bf16 mixed precision: 16-bit parameters and activations beside float32 master state."""
        return self.dtype == "bfloat16"

    def state_sizes(self) -> tuple:
        """Bytes per element of (the parameters, their gradients, the optimizer's state) as the trainer holds them:
        2, 4 and 4 + 4 + 4 (master, Adam's two moments) under mixed precision, else 2 x one element for Adam."""
        isz = DTYPES[self.dtype].itemsize
        return (2, 4, 12) if self.mixed else (isz, isz, 2 * isz)

    def wire_sizes(self) -> tuple:
        """Bytes per element on the wire of (activations, the gradients' data-parallel reduction, the replicated
        and tied gradients' all-reduces, the vocab-parallel loss): mixed precision sends bf16 activations, its
        reduction in ``grad_reduce_dtype``, the float32 main gradients and a float32 loss (Megatron's)."""
        isz = DTYPES[self.dtype].itemsize
        if not self.mixed:
            return isz, isz, isz, isz
        return 2, DTYPES[self.grad_reduce_dtype or "bfloat16"].itemsize, 4, 4

    @property
    def bucket_mb(self) -> float:
        """The gradient bucket the trainer fills: the layout's ``dp_bucket_mb`` (0, the planner's "a bucket per
        layer": :data:`BUCKET_MB`)."""
        return self.layout.knobs.dp_bucket_mb or BUCKET_MB

    def check(self) -> None:
        if not 1 <= self.steps <= 1 << 24:
            raise UsageError(f"{{steps}} must be >= 1, got {self.steps}", "steps")
        b = self.layout.knobs.dp_bucket_mb
        if not (0 <= b < 1 << 20 and math.isfinite(b)):  # 0: the trainer's default bucket
            raise UsageError(f"{{bucket_mb}} must be a size in MiB > 0, got {b}", "bucket_mb")
        if not 0 <= self.compute_ms < 1e4:
            raise UsageError(f"{{compute_ms}} must be in [0, 10000), got {self.compute_ms}", "compute_ms")
        if not (0 <= self.device_flops < 1e20 and math.isfinite(self.device_flops)):
            raise UsageError(f"{{device_flops}} must be in [0, 1e20), got {self.device_flops}", "device_flops")
        if self.dtype not in DTYPES:
            raise UsageError(f"{{dtype}} must be float64, float32 or bfloat16, got {self.dtype!r}", "dtype")
        if self.grad_reduce_dtype and (not self.mixed or self.grad_reduce_dtype not in REDUCE_DTYPES):
            raise UsageError(
                f"{{grad_reduce_dtype}} {self.grad_reduce_dtype!r}: bfloat16 or float32, with bf16 mixed "
                "precision only",
                "grad_reduce_dtype",
            )
        if self.dp_mode not in ("bucket", "naive"):
            raise UsageError(f"{{dp_mode}} must be bucket or naive, got {self.dp_mode!r}", "dp_mode")
        check_shape(self.model)
        lay = limits.require(self.layout, self.model)
        r = self.router
        if r.drop_policy not in POLICIES:
            raise UsageError(
                f"{{drop_policy}} must be one of {', '.join(POLICIES)}, got {r.drop_policy!r}", "drop_policy"
            )
        for k in ("aux_loss_coeff", "z_loss_coeff", "jitter_eps"):
            v = getattr(r, k)
            if not (0 <= v <= 100 and math.isfinite(v)) or k == "jitter_eps" and v >= 1:
                raise UsageError(f"{{{k}}} must be in [0, {1 if k == 'jitter_eps' else 100}), got {v}", k)
        check(schedule(lay.pipeline_schedule, lay.pp, lay.microbatches, lay.interleave), lay.interleave, lay.v_shaped)
        self.algos.check(self.layout)
        ck = self.checkpoint
        if not 0 <= ck.every <= 1 << 24 or not 0 <= ck.keep <= 1 << 20:
            raise UsageError(f"{{save_every}} and {{keep}} must be >= 0, got {ck.every} and {ck.keep}", "save_every")
