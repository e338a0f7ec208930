"""The control loop: measure the running split, re-plan, reshard when the gain pays for the move.

Varuna's job morphing and Oobleck's re-planning, on a GPT training for real on an emulated
two-node cluster (the local fabric's per-link α/β, :mod:`netmorph.runtime.links`):

1. **Calibrate.** Each candidate layout (tp, pp, dp, ZeRO) runs a few steps on the healthy
   cluster: its step time T₀ and, from the ledger, the bytes its busiest rank sends across
   the node boundary per step, X. The model of a layout under an inter-node link of
   inverse bandwidth β is then T(β) = T₀ + X·(β − β₀): compute and intra-node traffic as
   measured, the inter-node bytes at the link's new price. The split the model ranks first
   on the healthy cluster is what a user would start on. A scenario that changes the job
   itself -- fewer ranks after a node's loss, a longer context -- has its layouts calibrated
   the same way, on the cluster and model it will be.
2. **Measure.** Training runs in segments; after each, the loop takes the current layout's
   median step time, and the inter-node link's price β̂ from a message timed across the
   node boundary after the segment (the current split may send too little across to
   show it: a pipeline's activations are kilobytes).
3. **Decide.** Every layout is re-predicted at β̂. The best replaces the current one only if
   it would save more than ``hysteresis`` of the step time, for ``confirm`` segments in a
   row (so noise does not flap the split), and the saving over the remaining steps pays for
   the move: the reshard plan's busiest rank's bytes at β̂ plus its measured overhead.
4. **Reshard** (:mod:`netmorph.morph.reshard`) and continue from the same step on the same data.

When the job itself changes at a segment boundary, the loop re-plans at once: after a node's
loss it moves to the best layout of the survivors (from what they hold, or from the last
checkpoint when the loss took state no survivor has); when the context grows it moves, or
stays, to the best layout of the longer sequences. A static split meets the same events as
torchelastic and Megatron would run it: fewer data-parallel replicas after a loss (or the end
of the run, if its model-parallel group no longer fits), the same split on longer sequences.

Every decision is logged with its numbers; the same scenario runs on every static layout
for the comparison. Times are the measured step times (the slowest rank's) plus the
measured reshard times; the processes a segment starts are not counted, for any run.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, replace

import numpy as np

from netmorph.cost.topology import Topology, node_of, two_nodes
from netmorph.errors import UsageError
from netmorph.mesh.layout import Layout
from netmorph.morph.layouts import train_config
from netmorph.morph.reshard import StateLost, execute, plan, restore
from netmorph.morph.scenario import Scenario, parse_scenario
from netmorph.parallel.hybrid import train_rank
from netmorph.runtime.launch import launch

__all__ = ["Calibration", "Decision", "Run", "Scenario", "Trainer", "calibrate", "candidates",
           "parse_scenario", "regimes", "run_adaptive", "run_static", "shrunk"]


@dataclass
class Decision:
    step: int
    before: str
    after: str
    measured_step_s: float
    predicted_current_s: float                  # the current split (after a node loss: it shrunk to the survivors)
    predicted_best_s: float
    reshard_bytes: int
    reshard_s: float
    payback_steps: float
    reason: str = "bottleneck moved"


@dataclass
class Run:
    layout_path: list                           # (first step, layout label)
    step_s: list                                # every step run's time (the slowest rank's), redone steps included
    reshard_s: float = 0.0                      # moving state: reshards, and reading a checkpoint back
    decisions: list = field(default_factory=list)
    losses: list = field(default_factory=list)  # one per step of the run's data, as the surviving run saw it
    events: list = field(default_factory=list)  # (steps run so far, seconds spent, step, what): every move
    tokens: list = field(default_factory=list)  # every step run's tokens (the sequence may grow)
    redone: int = 0                             # steps trained again after going back to a checkpoint
    failed: str = ""                            # why the run could not go on ("" if it finished)

    @property
    def total_s(self) -> float:
        return math.inf if self.failed else sum(self.step_s) + self.reshard_s

    def throughput(self) -> list:
        """Tokens/s of every step run."""
        return [n / t for n, t in zip(self.tokens, self.step_s)]


PROBE_BYTES = 1 << 18


def _segment_rank(comm, cfg, inits, gpn: int) -> tuple:
    """(the rank's report, seconds one way across the nodes or None): train, then (on two nodes) time one message
    across the node boundary (rank 0 to rank ``gpn`` and back): the link's price as the traffic sees it."""
    out, probe = train_rank(comm, cfg, None, inits), None
    if comm.world <= gpn:
        return out, probe
    buf = np.zeros(PROBE_BYTES // 8)
    with comm.phase("morph.probe"):
        if comm.rank == 0:
            t0 = time.perf_counter()
            comm.send(buf, gpn)
            comm.recv(buf, gpn)
            probe = (time.perf_counter() - t0) / 2
        elif comm.rank == gpn:
            comm.recv(buf, 0)
            comm.send(buf, 0)
    return out, probe


class Trainer:
    """Runs segments of a layout on the emulated cluster, starting from given states.

    Each rank's accelerator is emulated as ``compute_ms`` of forward per sequence of the base model's length for
    the whole model (the backward twice that; longer sequences in proportion; a sleep, so eight ranks on two
    cores still compute in parallel), divided by the rank's share of the model, tp x pp: GPU-like compute that
    tensor and pipeline parallelism split, so a pipeline's bubble and a data-parallel all-reduce cost what they
    would on a cluster. Every ``checkpoint_every`` steps the runs keep a checkpoint of the whole state (its
    writing is not timed), to go back to when a node's loss takes state no survivor holds."""

    def __init__(self, model, global_batch: int, world: int, timeout: float = 60.0, compute_ms: float = 40.0,
                 inter_mbps: float = 50.0, checkpoint_every: int = 20):
        self.model, self.global_batch, self.world, self.timeout = model, global_batch, world, timeout
        self.compute_ms, self.checkpoint_every = compute_ms, checkpoint_every
        self.base = two_nodes(world, inter_mbps)

    def segment(self, layout: Layout, steps: int, start: int, inits, topo: Topology, model=None):
        """(states, step times, losses, busiest rank's inter-node bytes per step, probed s/byte across nodes or
        None on one node), training ``model`` (default the base model).

        A segment starts fresh processes, whose first step also pays for their warm-up: that step is counted
        at the segment's median instead (for every run alike)."""
        model = model or self.model
        cfg = train_config(model, layout, steps, self.global_batch, start,
                           self.compute_ms * model.seq / self.model.seq / (layout.tp * layout.pp))
        gpn = topo.gpus_per_node
        pairs, ledger = launch(_segment_rank, layout.world, cfg, inits, gpn, topology=topo, ledger=True,
                               timeout=self.timeout)
        res = [r for r, _ in pairs]
        times = [max(r.step_times[k] for r in res) for k in range(steps)]
        if steps > 1:
            times[0] = statistics.median(times[1:])
        sent = [0] * layout.world
        for rec in ledger.records:
            if node_of(rec.src, gpn) != node_of(rec.dst, gpn) and rec.phase != "morph.probe":
                sent[rec.src] += rec.bytes
        losses = next(r.losses for r in res if r.losses)
        probe = pairs[0][1]
        return ([r.state.flat for r in res], times, losses, max(sent) / steps,
                None if probe is None else probe / PROBE_BYTES)


def candidates(model, world: int, global_batch: int, max_tp: int = 8) -> list:
    """Every (tp, pp, dp) layout of ``world`` the trainer runs for this model and batch (ZeRO off; tp up to
    ``max_tp``)."""
    out = []
    for tp in (t for t in (1, 2, 4, 8) if t <= max_tp):
        for pp in (1, 2, 4, 8):
            if world % (tp * pp):
                continue
            lay = Layout(tp=tp, pp=pp, dp=world // (tp * pp))
            if any(r.key != "batch" for r in lay.check(model, trainer=True)):
                continue
            if global_batch % lay.dp or global_batch // lay.dp < lay.pp or model.seq % tp:
                continue
            out.append(lay)
    return out


def regimes(trainer: Trainer, scenario: Scenario, steps: int) -> list:
    """[(ranks, model)]: the job as it starts, then as the scenario leaves it, if that differs."""
    out = [(trainer.world, trainer.model)]
    after = (scenario.world(trainer.world, steps), scenario.model(trainer.model, steps))
    return out if after == out[0] else out + [after]


@dataclass
class Calibration:
    step_s: dict                                 # (layout, seq) -> T0 on the healthy cluster
    inter_bytes: dict                            # (layout, seq) -> busiest rank's inter-node bytes per step
    beta0: float

    def predict(self, layout: Layout, beta: float, seq: int) -> float:
        return self.step_s[layout, seq] + self.inter_bytes[layout, seq] * (beta - self.beta0)

    def layouts(self, world: int, seq: int) -> list:
        """The calibrated layouts of ``world`` ranks training ``seq``-long sequences, fastest first (healthy)."""
        return sorted((lay for lay, s in self.step_s if lay.world == world and s == seq),
                      key=lambda lay: self.step_s[lay, seq])

    def best(self, beta: float, world: int, seq: int) -> Layout:
        return min(self.layouts(world, seq), key=lambda lay: self.predict(lay, beta, seq))


def calibrate(trainer: Trainer, scenario: Scenario, steps_total: int, steps: int = 4, max_tp: int = 8,
              log=lambda *a, **k: None) -> Calibration:
    """Every candidate layout of every regime the scenario brings (:func:`regimes`) a few steps on the healthy
    cluster (fewer ranks: on the first node alone): its median step time and inter-node bytes."""
    t0, x, probes = {}, {}, []
    todo = []
    for world, model in regimes(trainer, scenario, steps_total):
        todo.append((model, candidates(model, world, trainer.global_batch, max_tp)))
        if not todo[-1][1]:
            raise UsageError(f"no layout of {world} ranks fits a {model.layers}-layer GPT of {model.heads} heads "
                             f"and sequence {model.seq} with {{global_batch}} {trainer.global_batch}", "global_batch")
    for model, layouts in todo:
        for lay in layouts:
            _, times, _, inter, probe = trainer.segment(lay, steps, 0, None, trainer.base, model)
            t0[lay, model.seq], x[lay, model.seq] = statistics.median(times), inter
            if probe is not None:
                probes.append(probe)
            log(lay, model.seq, t0[lay, model.seq], inter)
    return Calibration(t0, x, statistics.median(probes) if probes else trainer.base.beta_inter)


def shrunk(layout: Layout, world: int):
    """What a static split becomes on ``world`` survivors -- torchelastic's restart with fewer data-parallel
    replicas: the same tp, pp and ZeRO, dp scaled down -- or None when its model-parallel group no longer fits."""
    if layout.world % world or layout.dp % (layout.world // world):
        return None
    return replace(layout, dp=layout.dp // (layout.world // world))


class _Job:
    """One run between segments: its layout and model, every rank's training state, its step and checkpoint."""

    def __init__(self, trainer: Trainer, layout: Layout):
        self.trainer, self.layout, self.model, self.states, self.step = trainer, layout, trainer.model, None, 0
        self.checkpoint = (0, layout, trainer.model, None)   # step 0: the initial weights, which any run rebuilds
        self.run = Run([(0, layout.tag())], [])

    def train(self, n: int, topo: Topology):
        st, times, losses, inter, beta = self.trainer.segment(self.layout, n, self.step, self.states, topo, self.model)
        self.states = st
        self.run.step_s += times
        self.run.tokens += [self.trainer.global_batch * self.model.seq] * n
        del self.run.losses[self.step:]               # steps redone after going back to a checkpoint
        self.run.losses += losses
        self.step += n
        if self.step - self.checkpoint[0] >= self.trainer.checkpoint_every:
            self.checkpoint = (self.step, self.layout, self.model, st)
        return times, inter, beta

    def event(self, scenario: Scenario) -> str:
        """What the scenario does to the job at this segment boundary: "node-lost", "seq-grows" or ""."""
        if scenario.world(self.trainer.world, self.step) < self.layout.world:
            return "node-lost"
        if scenario.model(self.trainer.model, self.step) != self.model:
            return "seq-grows"
        return ""

    def move(self, target: Layout, topo: Topology, alive=None, p=None, model=None) -> tuple:
        """Reshard to ``target`` (on the survivors ``alive``; of ``model`` if it grew) by plan ``p`` (made here if
        not given); from the last checkpoint when the survivors lack some state. (the plan run or None, seconds,
        what happened)."""
        t = self.trainer
        model = model or self.model
        grown = model if model != self.model else None
        spent, how, at = 0.0, "nothing trained yet", self.step
        if self.states is not None:
            try:
                p = p or plan(self.model, self.layout, target, gpus_per_node=topo.gpus_per_node, alive=alive,
                              grown=grown)
            except StateLost as e:
                step, layout, old, states = self.checkpoint
                t0 = time.perf_counter()
                self.states = None if states is None else restore(old, layout, states, target,
                                                                  model if model != old else None)
                spent = time.perf_counter() - t0
                how = f"{e}: back to the checkpoint of step {step}, {self.step - step} steps to redo"
                self.run.redone += self.step - step
                self.step, p = step, None
            else:
                alive = range(self.layout.world) if alive is None else alive
                new, _ = execute(p, [self.states[r] for r in sorted(alive)], topology=topo, timeout=t.timeout)
                self.states = new               # the trainer reads params, m, v and t; "seconds" rides along
                spent = max(st["seconds"] for st in new)
                how = f"{p.bytes:,} B over the fabric in {1e3 * spent:.1f} ms"
        self.run.reshard_s += spent
        what = f"{self.layout.tag()} -> {target.tag()}" if target != self.layout else self.layout.tag()
        if grown:
            what += f", sequence {model.seq}"
        self.run.events.append((len(self.run.step_s), spent, at, what))
        if target != self.layout:
            self.run.layout_path.append((self.step, target.tag()))
        self.layout, self.model = target, model
        return p, spent, how


def run_static(trainer: Trainer, layout: Layout, steps: int, segment: int, scenario: Scenario,
               log=lambda *a, **k: None) -> Run:
    """``layout`` throughout: after a node's loss with fewer replicas (:func:`shrunk`), or the end of the run if
    it no longer fits; on longer sequences as it is."""
    job = _Job(trainer, layout)
    while job.step < steps:
        topo = scenario.topology(trainer.base, job.step)
        event, at = job.event(scenario), job.step
        if event == "node-lost":
            survivors = scenario.world(trainer.world, at)
            target = shrunk(job.layout, survivors)
            if target is None:
                job.run.failed = f"tp x pp = {layout.tp * layout.pp} does not fit the {survivors} surviving ranks"
                log(f"  static {layout.tag()}: {job.run.failed}")
                break
            _, _, how = job.move(target, topo, alive=range(survivors))
            log(f"  static {layout.tag()}: node lost at step {at}, on as {target.tag()} ({how})")
        elif event == "seq-grows":
            model = scenario.model(trainer.model, at)
            _, _, how = job.move(job.layout, topo, model=model)
            log(f"  static {layout.tag()}: sequence {job.model.seq} from step {at} ({how})")
        job.train(min(segment, steps - job.step), topo)
    return job.run


def run_adaptive(trainer: Trainer, cal: Calibration, start: Layout, steps: int, segment: int, scenario: Scenario,
                 hysteresis: float = 0.10, confirm: int = 2, log=print) -> Run:
    """The control loop (module docstring); ``log`` gets one line per segment and per decision."""
    job = _Job(trainer, start)
    run = job.run
    streak, wanted, beta, measured = 0, None, cal.beta0, math.nan
    while job.step < steps:
        topo = scenario.topology(trainer.base, job.step)
        event, at, before = job.event(scenario), job.step, job.layout
        if event:
            world, model = scenario.world(trainer.world, at), scenario.model(trainer.model, at)
            best = cal.best(beta, world, model.seq)
            same = shrunk(before, world)
            current = cal.predict(same, beta, model.seq) if (same, model.seq) in cal.step_s else math.inf
            predicted = cal.predict(best, beta, model.seq)
            p, spent, how = job.move(best, topo, alive=range(world) if world < before.world else None, model=model)
            what = f"node lost ({world} ranks left)" if event == "node-lost" else f"sequence grew to {model.seq}"
            verb = "shrinking to" if event == "node-lost" else "keeping"
            if same is None:
                staying = f"{before.tag()} with fewer replicas does not fit {world} ranks"
            else:
                staying = f"{verb} {same.tag()}: " + ("the best" if same == best else f"{1e3 * current:.1f} ms")
            log(f"  -> at step {at}, {what}: {before.tag()} -> {best.tag()} (model {1e3 * predicted:.1f} "
                f"ms/step; {staying}); {how}")
            if best != same:
                gain = current - predicted
                run.decisions.append(Decision(at, before.tag(), best.tag(), measured, current, predicted,
                                              0 if p is None else p.bytes, spent,
                                              spent / gain if gain > 0 else math.inf, what))
            streak, wanted = 0, None
        n = min(segment, steps - job.step)
        times, _, probed = job.train(n, topo)
        beta = beta if probed is None else probed
        step, layout, seq = job.step, job.layout, job.model.seq
        measured = statistics.median(times)
        best = cal.best(beta, layout.world, seq)
        current = cal.predict(layout, beta, seq)
        predicted_best = cal.predict(best, beta, seq)
        gain = measured - predicted_best
        link = "one node" if probed is None else f"inter-node link {1 / beta / 1e6:.1f} MB/s probed"
        log(f"  step {step:>4}: {layout.tag()} {1e3 * measured:.1f} ms/step (model {1e3 * current:.1f}); {link}; "
            f"best {best.tag()} {1e3 * predicted_best:.1f} ms")
        if best == layout or gain <= hysteresis * measured or step >= steps:
            streak, wanted = 0, None
            continue
        streak = streak + 1 if best == wanted else 1
        wanted = best
        if streak < confirm:
            continue
        p = plan(job.model, layout, best, gpus_per_node=topo.gpus_per_node)
        moved = p.bytes_matrix()
        busiest = int(max(moved.sum(axis=1).max(), moved.sum(axis=0).max()))
        if gain * (steps - step) <= busiest * beta:
            continue
        _, spent, _ = job.move(best, topo, p=p)
        d = Decision(step, layout.tag(), best.tag(), measured, current, predicted_best, p.bytes, spent,
                     spent / gain if gain > 0 else math.inf)
        run.decisions.append(d)
        log(f"  -> reshard {d.before} to {d.after} at step {step}: {p.bytes:,} B in {1e3 * spent:.1f} ms, pays back "
            f"in {d.payback_steps:.1f} steps")
        streak, wanted = 0, None
    return run
