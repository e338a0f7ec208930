"""The control loop: measure the running split, re-plan, reshard when the gain pays for the move.

Varuna's job morphing and Oobleck's re-planning, on a GPT training for real on an emulated
two-node cluster (the local fabric's per-link α/β, :mod:`netmorph.runtime.links`):

1. **Calibrate.** Each candidate layout (tp, pp, dp, ZeRO) runs a few steps on the healthy
   cluster: its step time T₀ and, from the ledger, the bytes its busiest rank sends across
   the node boundary per step, X. The model of a layout under an inter-node link of
   inverse bandwidth β is then T(β) = T₀ + X·(β − β₀): compute and intra-node traffic as
   measured, the inter-node bytes at the link's new price. The split the model ranks first
   on the healthy cluster is what a user would start on.
2. **Measure.** Training runs in segments; after each, the loop takes the current layout's
   median step time, and the inter-node link's price β̂ from a message timed across the
   node boundary after the segment (the current split may send too little across to
   show it: a pipeline's activations are kilobytes).
3. **Decide.** Every layout is re-predicted at β̂. The best replaces the current one only if
   it would save more than ``hysteresis`` of the step time, for ``confirm`` segments in a
   row (so noise does not flap the split), and the saving over the remaining steps pays for
   the move: the reshard plan's busiest rank's bytes at β̂ plus its measured overhead.
4. **Reshard** (:mod:`netmorph.morph.reshard`) and continue from the same step on the same data.

Every decision is logged with its numbers; the same scenario runs on every static layout
for the comparison. Times are the measured step times (the slowest rank's) plus the
measured reshard times; the processes a segment starts are not counted, for any run.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

from netmorph.cost.topology import Topology
from netmorph.errors import UsageError
from netmorph.morph.layouts import Layout, train_config
from netmorph.morph.reshard import execute, plan


@dataclass(frozen=True)
class Scenario:
    """What changes mid-run: ``none``, or ``link-degrades`` -- the inter-node links' bandwidth divided by
    ``factor`` (and their latency multiplied by it) from step ``at`` on."""

    kind: str = "none"
    at: int = 0
    factor: float = 10.0

    def topology(self, base: Topology, step: int) -> Topology:
        if self.kind == "link-degrades" and step >= self.at:
            return replace(base, name=f"{base.name} (inter-node x{self.factor:g} slower)",
                           beta_inter=base.beta_inter * self.factor, alpha_inter=base.alpha_inter * self.factor)
        return base

    def label(self) -> str:
        return "none" if self.kind == "none" else f"{self.kind}@{self.at}"


def parse_scenario(text: str) -> Scenario:
    """``none``, ``link-degrades@STEP`` or ``link-degrades@STEPxFACTOR``."""
    if text == "none":
        return Scenario()
    kind, _, rest = text.partition("@")
    if kind != "link-degrades" or not rest:
        raise UsageError(f"{{scenario}} {text!r}: none or link-degrades@STEP[xFACTOR] (node-lost and seq-grows are "
                         f"not built yet)", "scenario")
    at, _, factor = rest.partition("x")
    try:
        s = Scenario(kind, int(at), float(factor) if factor else 10.0)
    except ValueError:
        raise UsageError(f"{{scenario}} {text!r}: STEP must be a whole number and FACTOR a number", "scenario") \
            from None
    if s.at < 0 or not 1 <= s.factor <= 1e4:
        raise UsageError(f"{{scenario}} {text!r}: STEP >= 0 and FACTOR in 1..10000", "scenario")
    return s


def cluster(world: int) -> Topology:
    """Two nodes of world/2 ranks: fast links inside a node, a slower one between (emulated)."""
    return Topology("two-node", alpha=10e-6, beta=1 / 2e9, gpus_per_node=world // 2, alpha_inter=50e-6,
                    beta_inter=1 / 50e6)


@dataclass
class Decision:
    step: int
    before: str
    after: str
    measured_step_s: float
    predicted_current_s: float
    predicted_best_s: float
    reshard_bytes: int
    reshard_s: float
    payback_steps: float


@dataclass
class Run:
    layout_path: list                           # (first step, layout label)
    step_s: list                                # every step's time (the slowest rank's)
    reshard_s: float = 0.0
    decisions: list = field(default_factory=list)
    losses: list = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return sum(self.step_s) + self.reshard_s


PROBE_BYTES = 1 << 18


def _segment_rank(comm, cfg, inits, gpn: int) -> dict:
    """Train, then time one message across the node boundary (rank 0 to rank ``gpn`` and back): the link's
    price as the traffic sees it."""
    import time

    import numpy as np

    from netmorph.parallel.hybrid import train_rank
    out = train_rank(comm, cfg, None, inits)
    buf = np.zeros(PROBE_BYTES // 8)
    with comm.phase("morph.probe"):
        if comm.rank == 0:
            t0 = time.perf_counter()
            comm.send(buf, gpn)
            comm.recv(buf, gpn)
            out["probe_s"] = (time.perf_counter() - t0) / 2
        elif comm.rank == gpn:
            comm.recv(buf, 0)
            comm.send(buf, 0)
    return out


class Trainer:
    """Runs segments of a layout on the emulated cluster, starting from given states.

    Each rank's accelerator is emulated as ``compute_ms`` of forward per sequence for the whole model (the
    backward twice that; a sleep, so eight ranks on two cores still compute in parallel), divided by the rank's
    share of the model, tp x pp: GPU-like compute that tensor and pipeline parallelism split, so a pipeline's
    bubble and a data-parallel all-reduce cost what they would on a cluster."""

    def __init__(self, model, global_batch: int, world: int, timeout: float = 60.0, compute_ms: float = 40.0):
        self.model, self.global_batch, self.world, self.timeout = model, global_batch, world, timeout
        self.compute_ms = compute_ms
        self.base = cluster(world)

    def segment(self, layout: Layout, steps: int, start: int, inits, topo: Topology):
        """(states, step times, losses, busiest rank's inter-node bytes per step, probed s/byte across nodes).

        A segment starts fresh processes, whose first step also pays for their warm-up: that step is counted
        at the segment's median instead (for every run alike)."""
        from netmorph.runtime.launch import launch
        cfg = train_config(self.model, layout, steps, self.global_batch, start,
                           self.compute_ms / (layout.tp * layout.pp))
        gpn = topo.gpus_per_node
        res, ledger = launch(_segment_rank, self.world, cfg, inits, gpn, topology=topo, ledger=True,
                             timeout=self.timeout)
        times = [max(r["step_times"][k] for r in res) for k in range(steps)]
        if steps > 1:
            times[0] = statistics.median(times[1:])
        sent = [0] * self.world
        for src, dst, nbytes, _, _, phase, *_ in ledger.records:
            if src // gpn != dst // gpn and phase != "morph.probe":
                sent[src] += nbytes
        losses = next(r["losses"] for r in res if r["losses"])
        return [r["flat_state"] for r in res], times, losses, max(sent) / steps, res[0]["probe_s"] / PROBE_BYTES


def candidates(model, world: int, global_batch: int) -> list:
    """Every (tp, pp, dp) layout of ``world`` the trainer runs for this model and batch (ZeRO off)."""
    out = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            if world % (tp * pp):
                continue
            lay = Layout(tp, pp, world // (tp * pp))
            try:
                lay.check(model)
            except UsageError:
                continue
            if global_batch % lay.dp or global_batch // lay.dp < lay.pp or model.seq % tp:
                continue
            out.append(lay)
    return out


@dataclass
class Calibration:
    step_s: dict                                 # layout -> T0 on the healthy cluster
    inter_bytes: dict                            # layout -> busiest rank's inter-node bytes per step
    beta0: float

    def predict(self, layout: Layout, beta: float) -> float:
        return self.step_s[layout] + self.inter_bytes[layout] * (beta - self.beta0)

    def best(self, beta: float) -> Layout:
        return min(self.step_s, key=lambda lay: self.predict(lay, beta))


def calibrate(trainer: Trainer, layouts: list, steps: int = 4) -> Calibration:
    """Each layout a few steps on the healthy cluster: its median step time and inter-node bytes."""
    t0, x, probes = {}, {}, []
    for lay in layouts:
        _, times, _, inter, probe = trainer.segment(lay, steps, 0, None, trainer.base)
        t0[lay] = statistics.median(times)
        x[lay] = inter
        probes.append(probe)
    return Calibration(t0, x, statistics.median(probes))


def run_static(trainer: Trainer, layout: Layout, steps: int, segment: int, scenario: Scenario) -> Run:
    run, states, step = Run([(0, layout.label())], []), None, 0
    while step < steps:
        n = min(segment, steps - step)
        states, times, losses, _, _ = trainer.segment(layout, n, step, states, scenario.topology(trainer.base, step))
        run.step_s += times
        run.losses += losses
        step += n
    return run


def run_adaptive(trainer: Trainer, cal: Calibration, start: Layout, steps: int, segment: int, scenario: Scenario,
                 hysteresis: float = 0.10, confirm: int = 2, log=print) -> Run:
    """The control loop (module docstring); ``log`` gets one line per segment and per decision."""
    layout, states, step = start, None, 0
    run = Run([(0, start.label())], [])
    streak, wanted = 0, None
    while step < steps:
        n = min(segment, steps - step)
        topo = scenario.topology(trainer.base, step)
        states, times, losses, _, beta = trainer.segment(layout, n, step, states, topo)
        run.step_s += times
        run.losses += losses
        step += n
        measured = statistics.median(times)
        best = cal.best(beta)
        current = cal.predict(layout, beta)
        predicted_best = cal.predict(best, beta)
        gain = measured - predicted_best
        log(f"  step {step:>4}: {layout.label()} {1e3 * measured:.1f} ms/step (model {1e3 * current:.1f}); inter-node "
            f"link {1 / beta / 1e6:.1f} MB/s probed; best {best.label()} {1e3 * predicted_best:.1f} ms")
        if best == layout or gain <= hysteresis * measured or step >= steps:
            streak, wanted = 0, None
            continue
        streak = streak + 1 if best == wanted else 1
        wanted = best
        if streak < confirm:
            continue
        p = plan(trainer.model, layout, best)
        busiest = int(max(p.bytes_matrix().sum(axis=1).max(), p.bytes_matrix().sum(axis=0).max()))
        cost = busiest * beta
        remaining = steps - step
        if gain * remaining <= cost:
            continue
        new, _ = execute(p, states, topology=topo, timeout=trainer.timeout)
        spent = max(st["seconds"] for st in new)
        run.reshard_s += spent
        d = Decision(step, layout.label(), best.label(), measured, current, predicted_best, p.bytes, spent,
                     spent / gain if gain > 0 else math.inf)
        run.decisions.append(d)
        log(f"  -> reshard {d.before} to {d.after} at step {step}: {p.bytes:,} B in {1e3 * spent:.1f} ms, pays back "
            f"in {d.payback_steps:.1f} steps")
        states = new                            # the trainer reads params, m, v and t; "seconds" rides along
        layout, streak, wanted = best, 0, None
        run.layout_path.append((step, layout.label()))
    return run
