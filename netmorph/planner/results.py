"""The planner's typed results, each with the ``as_dict()`` that ``plan --json`` prints:

- :class:`StepTime`: one iteration's predicted seconds split into parts that sum to it (what
  :func:`~netmorph.planner.timing.step_time` returns), as Megatron's timers split a measured one
  (``forward-backward``, ``all-grads-sync``, ``optimizer``);
- :class:`Memory`: the most loaded device's bytes, four parts that sum to the total (what
  :func:`~netmorph.planner.memory.memory` returns), as DeepSpeed's ``estimate_zero*_model_states_mem_needs``
  and Megatron's ``report_theoretical_memory`` split them;
- :class:`Estimate`: one configuration priced -- its layout, memory, step time, FLOPs and rates (what
  :func:`~netmorph.planner.search.estimate` returns and the search ranks).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from netmorph.mesh.layout import Layout
    from netmorph.mesh.shape import ModelShape
    from netmorph.planner.hardware import Hardware

# the communication parts, in the order plan's JSON names them (its "comm_s")
COMM = ("tensor_parallel", "context_parallel", "expert_parallel", "pipeline_p2p", "data_parallel", "zero3_gather")


@dataclass(frozen=True)
class StepParts:
    """Every second of the step in exactly one part: the matmuls and the memory-bound kernels of the slowest
    stage's m microbatches, the pipeline's bubble, each communication's exposed time (tensor-parallel with
    sequence parallelism's gradient all-reduce), the optimizer, and the compute that ran slower beside overlapped
    communication (:attr:`~netmorph.planner.hardware.Hardware.comm_slowdown`)."""

    matmul: float
    elementwise: float
    bubble: float
    tensor_parallel: float
    context_parallel: float
    expert_parallel: float
    pipeline_p2p: float
    data_parallel: float
    zero3_gather: float
    optimizer: float
    overlap_slowdown: float

    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True)
class StepTime:
    """One iteration as the planner prices it: ``step_time_s`` (the parts' sum, added in the order the schedule
    runs them), ``parts``, the pipeline's ``bubble_fraction`` of the ideal (unit-cost) schedule, and the
    communication that ran hidden behind compute (``comm_hidden_s``, in no part). ``compute_s`` is the matmuls
    and the memory-bound kernels of the m microbatches (m·(gemm + elementwise))."""

    step_time_s: float
    parts: StepParts
    bubble_fraction: float
    comm_hidden_s: float
    compute_s: float

    @property
    def matmul_s(self) -> float:
        return self.parts.matmul

    @property
    def elementwise_s(self) -> float:
        return self.parts.elementwise

    @property
    def bubble_s(self) -> float:
        return self.parts.bubble

    @property
    def optimizer_s(self) -> float:
        return self.parts.optimizer

    @property
    def overlap_slowdown_s(self) -> float:
        return self.parts.overlap_slowdown

    @property
    def comm_s(self) -> dict:
        """{communication part: exposed seconds}, the six of :data:`COMM`."""
        return {k: getattr(self.parts, k) for k in COMM}

    def as_dict(self) -> dict:
        """The JSON ``plan estimate --json`` prints (its keys and their order)."""
        return {
            "step_time_s": self.step_time_s,
            "step_parts_s": asdict(self.parts),
            "bubble_fraction": self.bubble_fraction,
            "overlap_slowdown_s": self.overlap_slowdown_s,
            "comm_hidden_s": self.comm_hidden_s,
            "compute_s": self.compute_s,
            "matmul_s": self.matmul_s,
            "elementwise_s": self.elementwise_s,
            "bubble_s": self.bubble_s,
            "comm_s": self.comm_s,
            "optimizer_s": self.optimizer_s,
        }


@dataclass(frozen=True)
class Memory:
    """Bytes on the most loaded device: weights, gradients, optimizer state and activations (``total``, their
    sum, is what must fit)."""

    params: float
    grads: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


@dataclass(frozen=True)
class Flops:
    """FLOPs of one iteration: ``executed`` (Narayanan et al.'s eq. 3, the recomputation included: what TFLOP/s
    per GPU divides), ``causal`` (what the causal model needs) and ``megatron`` (Megatron's convention, the full
    s x s attention product: what MFU divides)."""

    executed: float
    causal: float
    megatron: float


@dataclass(frozen=True)
class Rates:
    """Throughput of one priced step: executed TFLOP/s per GPU, MFU (Megatron's model FLOPs over the 16-bit peak),
    tokens/s in all and per GPU."""

    tflops_per_gpu: float
    mfu: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float


# the layout's flags in plan's JSON, in its order (the flat names Layout.get reads; "microbatch" is its
# micro_batch_size)
CONFIG_KEYS = (
    "tp",
    "cp",
    "pp",
    "dp",
    "ep",
    "microbatch",
    "global_batch",
    "interleave",
    "zero",
    "recompute",
    "sequence_parallel",
    "precision",
    "first_stage_layers",
    "last_stage_layers",
    "tp_overlap",
    "pp_overlap",
)


@dataclass(frozen=True)
class Estimate:
    """One configuration as the planner prices it. ``step``, ``flops`` and ``rates`` are None for a bare
    parameter count (a model with no layers has memory and nothing to time)."""

    layout: Layout
    model: ModelShape
    hardware: Hardware
    memory: Memory
    step: StepTime | None = None
    flops: Flops | None = None
    rates: Rates | None = None

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.hardware.memory_bytes

    def as_dict(self) -> dict:
        """The JSON ``plan estimate --json`` prints, and each of ``plan --json``'s plans (its keys and order)."""
        c, model = self.layout, self.model
        out = {
            **{k: c.get("micro_batch_size" if k == "microbatch" else k) for k in CONFIG_KEYS},
            "schedule": c.pipeline_schedule if c.pp > 1 else "",
            "gpus": c.gpus,
            "hardware": self.hardware.name,
            "model": model.name,
            **(
                {}
                if model.bare
                else {
                    "kv_heads": model.kv,
                    "ffn_type": model.ffn_type,
                    "ffn": model.f,
                    "position": model.position,
                    "tied": model.tied,
                    "attention": model.attention,
                    "dropout": model.dropout,
                    "experts": model.experts,
                    "top_k": model.top_k if model.experts else 0,
                }
            ),
            "memory_bytes": self.memory.as_dict(),
            "device_memory_bytes": self.hardware.memory_bytes,
            "fits": self.fits,
            "params_count": model.params(),
        }
        if model.experts:
            out["active_params_count"] = model.active_params()
        if self.step is None:
            return out
        out["stage_layers"] = c.stage_layers(model.layers)
        out.update(self.step.as_dict())
        out.update(
            {
                "flops_per_iteration": self.flops.executed,
                "model_flops_per_iteration": self.flops.causal,
                "megatron_flops_per_iteration": self.flops.megatron,
                **asdict(self.rates),
            }
        )
        return out
