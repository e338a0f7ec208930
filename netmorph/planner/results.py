"""The planner's typed results: one iteration's predicted seconds split into parts that sum to it
(:class:`StepTime`, what :func:`~netmorph.planner.timing.step_time` returns), as Megatron's timers split a
measured one (``forward-backward``, ``all-grads-sync``, ``optimizer``) and ``plan --json`` prints it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

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
        return {"step_time_s": self.step_time_s, "step_parts_s": asdict(self.parts),
                "bubble_fraction": self.bubble_fraction, "overlap_slowdown_s": self.overlap_slowdown_s,
                "comm_hidden_s": self.comm_hidden_s, "compute_s": self.compute_s, "matmul_s": self.matmul_s,
                "elementwise_s": self.elementwise_s, "bubble_s": self.bubble_s, "comm_s": self.comm_s,
                "optimizer_s": self.optimizer_s}
