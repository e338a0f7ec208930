"""The twin morph decides with: every candidate layout priced by the planner's step time on a profile of the
cluster the run is on -- Oobleck's and Varuna's planners ask a cost model, not the cluster, what a layout costs.

The profile is the planner's :class:`~netmorph.planner.hardware.Hardware`, built from what the run is made of:

- compute: the trainer's emulated accelerator (:func:`~netmorph.parallel.slots.device_ms`) -- ``peak_flops``
  its FLOP/s at efficiency 1, no elementwise or launch cost -- so the planner's layer and LM-head FLOPs are
  the seconds the ranks sleep; what the ranks really compute on top (eager PyTorch on shared cores) is
  ``op_overhead_s`` per operator, which the run measures from its own steps (:meth:`Twin.measured`);
- links: the emulated fabric's α and β inside a node and between the two nodes
  (:func:`~netmorph.cost.topology.two_nodes`); the inter-node β is what the run last measured of it.

Nothing here runs a layout: :meth:`Twin.best` over the 8-rank candidates takes milliseconds, and the same
planner prices a 1,024-GPU cluster's layouts (``benchmarks/morph.py --decide``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from functools import lru_cache

from netmorph.calibrate.validate import planner_layout
from netmorph.cost.topology import Topology
from netmorph.mesh.layout import Layout
from netmorph.mesh.shape import ModelShape
from netmorph.morph.layouts import train_config
from netmorph.parallel import limits
from netmorph.planner.hardware import Hardware
from netmorph.planner.memory import memory
from netmorph.planner.results import StepTime
from netmorph.planner.timing import step_time

__all__ = ["Twin", "candidates", "emulated_hardware"]


def emulated_hardware(topo: Topology, device_flops: float, op_overhead_s: float = 0.0) -> Hardware:
    """The planner's view of ranks that sleep ``device_flops`` FLOP/s on the fabric ``topo`` (two nodes)."""
    return Hardware(
        name="emulated",
        peak_flops=device_flops,
        memory_bytes=float(1 << 40),
        hbm_bandwidth=1e15,
        gpus_per_node=topo.gpus_per_node,
        nvlink_bandwidth=1 / topo.beta,
        nic_bandwidth=1 / (topo.beta_inter or topo.beta),
        alpha_intra=topo.alpha,
        alpha_inter=topo.alpha_inter or topo.alpha,
        gemm_efficiency=1.0,
        attention_efficiency=1.0,
        elementwise_passes=0.0,
        op_overhead_s=op_overhead_s,
        allreduce_algorithms=("ring",),
        multi_rail=False,
        description=f"{topo.name}: emulated accelerators of {device_flops / 1e9:g} GFLOP/s",
    )


def candidates(model: ModelShape, world: int, global_batch: int, max_tp: int = 8, zero: bool = False) -> list:
    """Every (tp, cp, pp, dp) layout of ``world`` the trainer runs for this model and batch (tp up to ``max_tp``;
    cp as ring attention, the sequence in 2·cp chunks), and with ``zero`` each with ZeRO 1-3 where dp > 1, as the
    trainer allows it beside a pipeline."""
    out = []
    for tp, cp, pp in itertools.product((t for t in (1, 2, 4, 8) if t <= max_tp), (1, 2, 4), (1, 2, 4, 8)):
        if world % (tp * cp * pp) or model.seq % (2 * cp):
            continue
        dp = world // (tp * cp * pp)
        for z in (0, 1, 2, 3) if dp > 1 and zero else (0,):
            lay = Layout(tp=tp, cp=cp, pp=pp, dp=dp, zero=z)
            if any(r.key != "batch" for r in limits.check(lay, model)):
                continue
            if global_batch % lay.dp or global_batch // lay.dp < lay.pp or model.seq % tp:
                continue
            out.append(lay)
    return out


@lru_cache(maxsize=4096)
def _priced(layout: Layout, model: ModelShape, global_batch: int, dtype: str) -> Layout:
    return planner_layout(train_config(model, layout, 1, global_batch).layout, dtype, model)


@dataclass
class Twin:
    """The model of the run: ``predict`` a layout's step time at an inter-node β, ``best`` of a world's
    candidates. ``hardware`` is the current profile; ``measured`` writes what a run saw into it."""

    model: ModelShape
    global_batch: int
    hardware: Hardware
    dtype: str = "float64"
    max_tp: int = 8
    memory_share: float = math.inf  # each rank's memory, as a share of a whole replica of the training state

    @property
    def beta0(self) -> float:
        """The inter-node link's seconds per byte in the profile."""
        return 1 / self.hardware.nic_bandwidth

    def _model(self, seq: int | None) -> ModelShape:
        return self.model if seq in (None, self.model.seq) else replace(self.model, seq=seq)

    def _priced(self, layout: Layout, model: ModelShape) -> Layout:
        """``layout`` as the trainer runs it (its microbatches) and the planner prices it (byte widths, buckets)."""
        return _priced(layout, model, self.global_batch, self.dtype)

    def step(self, layout: Layout, beta: float | None = None, seq: int | None = None) -> StepTime:
        """The planner's :func:`~netmorph.planner.timing.step_time` of ``layout`` as the trainer runs it (its
        microbatches, byte widths and buckets), the inter-node link at ``beta`` s/B."""
        model = self._model(seq)
        hw = self.hardware if beta is None else replace(self.hardware, nic_bandwidth=1 / beta)
        return step_time(model, self._priced(layout, model), hw)

    def memory_bytes(self, layout: Layout, seq: int | None = None) -> float:
        """The most loaded rank's bytes under ``layout`` (the planner's memory model: weights, gradients, Adam's
        moments, activations in flight)."""
        model = self._model(seq)
        return memory(model, self._priced(layout, model)).total

    def fits(self, layout: Layout, seq: int | None = None) -> bool:
        """Whether ``layout`` fits :attr:`memory_share` of a whole replica (one rank holding everything)."""
        if math.isinf(self.memory_share):
            return True
        return self.memory_bytes(layout, seq) <= self.memory_share * self.memory_bytes(Layout(), seq)

    def predict(self, layout: Layout, beta: float | None = None, seq: int | None = None) -> float:
        return self.step(layout, beta, seq).step_time_s

    def layouts(self, world: int, seq: int | None = None, beta: float | None = None) -> list:
        """The candidate layouts of ``world`` ranks that fit the memory, fastest first as predicted."""
        model = self._model(seq)
        # ZeRO only under memory pressure: it saves memory, not time (its sharded Adam step is shorter by a
        # millisecond here), and a node's loss takes its shards with it -- a rollback to the last checkpoint that
        # replicated state never needs
        zero = not math.isinf(self.memory_share)
        return sorted(
            (
                lay
                for lay in candidates(model, world, self.global_batch, self.max_tp, zero)
                if self.fits(lay, model.seq)
            ),
            key=lambda lay: self.predict(lay, beta, model.seq),
        )

    def best(self, beta: float | None, world: int, seq: int | None = None) -> Layout:
        return self.layouts(world, seq, beta)[0]

    def compute_s(self, layout: Layout, seq: int | None = None) -> float:
        """The busiest stage's compute in a step (forward and backward of its microbatches), as predicted."""
        return self.step(layout, None, seq).compute_s

    def measured(self, layout: Layout, busy_s: float, beta: float | None, seq: int | None = None) -> Twin:
        """The twin after a segment: the inter-node β the run measured (None: as before) and the per-operator
        cost that makes the busiest stage's predicted slots -- its compute and the TP collectives inside them --
        its measured ``busy_s`` a step (the emulated FLOPs are known; what is left over is the ranks' real work,
        paid per operator, as a profile's ``op_overhead_s``)."""
        hw = self.hardware if beta is None else replace(self.hardware, nic_bandwidth=1 / beta)
        bare = replace(self, hardware=replace(hw, op_overhead_s=0.0)).step(layout, None, seq)
        per_op = replace(self, hardware=replace(hw, op_overhead_s=1.0)).compute_s(layout, seq) - bare.compute_s
        left = busy_s - bare.compute_s - bare.parts.tensor_parallel
        return replace(self, hardware=replace(hw, op_overhead_s=min(1.0, max(0.0, left / per_op))))
