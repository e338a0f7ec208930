"""The control loop: measure the running split, re-plan on the twin, reshard when the gain pays for the move.

Varuna's job morphing and Oobleck's re-planning, on a GPT training for real on an emulated two-node cluster
(the local fabric's per-link α/β, :mod:`netmorph.runtime.links`; accelerators emulated as a FLOP rate,
:func:`~netmorph.parallel.slots.device_ms`):

1. **Model.** The candidate layouts (tp, pp, dp) are priced by the planner on the cluster's profile
   (:class:`~netmorph.morph.twin.Twin`) -- none is trial-run. The profile's links and per-operator cost come
   from ``netmorph calibrate`` of the same ranks (or a profile file), its compute from the emulated accelerator.
2. **Measure.** Training runs in segments; after each, the loop takes the current layout's median step time,
   the busiest stage's compute (its slots, from the trainer's own spans), and the inter-node link's price β̂
   from a message timed across the node boundary after the segment (the current split may send too little
   across to show it: a pipeline's activations are kilobytes), and writes them into the twin.
3. **Decide** (:class:`~netmorph.morph.decide.Controller`): every layout re-priced; a move when the best saves
   more than ``hysteresis`` for ``confirm`` looks in a row and the saving over the remaining steps pays for
   the move (the reshard plan's bytes over the measured link).
4. **Reshard** (:mod:`netmorph.morph.reshard`) and continue from the same step on the same data.

When the job itself changes at a segment boundary, the loop re-plans at once: after a node's loss it moves to
the twin's best layout of the survivors (from what they hold, or from the last checkpoint when the loss took
state no survivor has); when the context grows, to the best layout of the longer sequences. A static split
meets the same events as torchelastic and Megatron would run it: fewer data-parallel replicas after a loss (or
the end of the run, if its model-parallel group no longer fits), the same split on longer sequences.

Times are the measured step times (the slowest rank's) plus the measured reshard times; the processes a
segment starts are not counted, for any run.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import replace

from netmorph.cost.topology import Topology, two_nodes
from netmorph.errors import UsageError
from netmorph.mesh.layout import Layout
from netmorph.morph.decide import Decision, Run, resized
from netmorph.morph.layouts import train_config
from netmorph.morph.live import LiveJob, run_live
from netmorph.morph.reshard import StateLost, execute, plan, restore
from netmorph.morph.scenario import LOSSES, Scenario, parse_scenario
from netmorph.morph.twin import Twin, candidates, emulated_hardware
from netmorph.parallel.hybrid import train_rank
from netmorph.runtime.launch import launch

__all__ = [
    "Decision",
    "Run",
    "Scenario",
    "Trainer",
    "Twin",
    "candidates",
    "check_run",
    "parse_scenario",
    "regimes",
    "relaunch_seconds",
    "resized",
    "run_adaptive",
    "run_static",
    "twin_of",
]


class Trainer:
    """Runs segments of a layout on the emulated cluster, starting from given states.

    Each rank's accelerator is emulated as a FLOP rate (:func:`~netmorph.parallel.slots.device_ms`: a sleep,
    so eight ranks on two cores still compute in parallel): the rate at which the base model's forward of one
    sequence takes ``compute_ms``. Its rank's share of the layers and the LM head is what it computes, so
    tensor and pipeline parallelism split it, a longer context costs its FLOPs, and a pipeline's bubble and a
    data-parallel all-reduce cost what they would on a cluster. Every ``checkpoint_every`` steps the runs keep
    a checkpoint of the whole state (its writing is not timed), to go back to when a node's loss takes state no
    survivor holds."""

    def __init__(
        self,
        model,
        global_batch: int,
        world: int,
        timeout: float = 60.0,
        compute_ms: float = 40.0,
        inter_mbps: float = 50.0,
        checkpoint_every: int = 20,
    ):
        self.model, self.global_batch, self.world, self.timeout = model, global_batch, world, timeout
        self.compute_ms, self.checkpoint_every = compute_ms, checkpoint_every
        self.base = two_nodes(world, inter_mbps)
        # the emulated accelerator: the base model's forward of one sequence in compute_ms
        fwd = model.layers * model.layer_flops_fwd(1, causal=model.attention == "flash") + model.logit_flops_fwd(1)
        self.device_flops = fwd / (compute_ms / 1e3) if compute_ms > 0 else 0.0

    def segment(self, layout: Layout, steps: int, start: int, inits, topo: Topology, model=None):
        """(states, step times, losses), training ``model`` (default the base model): a static run's segment (the
        control loop measures its own, in :mod:`netmorph.morph.live`).

        A segment starts fresh processes, whose first step also pays for their warm-up: that step is counted
        at the segment's median instead (for every run alike)."""
        model = model or self.model
        cfg = train_config(model, layout, steps, self.global_batch, start, device_flops=self.device_flops)
        res = launch(train_rank, layout.world, cfg, None, inits, topology=topo, timeout=self.timeout)
        times = [max(r.step_times[k] for r in res) for k in range(steps)]
        if steps > 1:
            times[0] = statistics.median(times[1:])
        losses = next(r.losses for r in res if r.losses)
        return [r.state.flat for r in res], times, losses


def regimes(world: int, model, scenario: Scenario, steps: int) -> list:
    """[(ranks, model)]: the job as it starts, then as the scenario leaves it, if that differs."""
    out = [(world, model)]
    after = (scenario.world(world, steps), scenario.model(model, steps))
    return out if after == out[0] else out + [after]


WORLDS = (2, 4, 8, 16)  # two emulated nodes of world/2 ranks
MAX_SEQ = 4096


def check_run(model, world: int, global_batch: int, steps: int, segment: int, scenario: Scenario) -> None:
    """The control loop can run ``scenario`` for ``steps`` steps on ``world`` ranks, looking every ``segment``,
    with some layout for every regime the scenario brings -- or the one line that says which field to change."""
    if world not in WORLDS:
        raise UsageError(f"{{world}} must be 2, 4, 8 or 16 (two nodes of world/2 ranks), got {world}", "world")
    if not 2 <= steps <= 10000:
        raise UsageError(f"{{steps}} must be in 2..10000, got {steps}", "steps")
    if not 2 <= segment <= steps:
        raise UsageError(f"{{segment}} must be in 2..{{steps}} ({steps}), got {segment}", "segment")
    if any(e.kind in LOSSES for e in scenario.events) and world < 4:
        raise UsageError(
            f"{{scenario}} {scenario.label()} needs {{world}} 4 or more (a node of world/2 ranks survives)", "scenario"
        )
    if scenario.model(model, steps).seq > MAX_SEQ:
        raise UsageError(f"{{scenario}} {scenario.label()}: {{seq}} {model.seq} grows past {MAX_SEQ}", "scenario")
    for w, m in regimes(world, model, scenario, steps):
        if not candidates(m, w, global_batch):
            raise UsageError(
                f"no layout of {w} ranks fits a {m.layers}-layer GPT of {m.heads} heads "
                f"and sequence {m.seq} with {{global_batch}} {global_batch}",
                "global_batch",
            )


def twin_of(trainer: Trainer, links: dict | None = None) -> Twin:
    """The twin of ``trainer``'s runs: its emulated accelerator on the links ``netmorph calibrate`` measured of
    the same ranks (:func:`~netmorph.calibrate.run.measure_links`: {"intra", "inter": {"alpha", "beta"}}, and the
    same-node rings' cost per call, "base"), or on
    the emulated fabric's nominal α and β when there are none (no software cost per message)."""
    hw = emulated_hardware(trainer.base, trainer.device_flops)
    if links:
        intra, inter = links.get("intra") or links["inter"], links.get("inter") or links["intra"]
        hw = replace(
            hw,
            alpha_intra=intra["alpha"],
            nvlink_bandwidth=1 / intra["beta"],
            alpha_inter=inter["alpha"],
            nic_bandwidth=1 / inter["beta"],
            collective_base_s=intra.get("base", 0.0),
            description=f"{hw.description}, links measured",
        )
    return Twin(trainer.model, trainer.global_batch, hw)


class _Job:
    """One run between segments: its layout and model, every rank's training state, its step and checkpoint."""

    def __init__(self, trainer: Trainer, layout: Layout):
        self.trainer, self.layout, self.model, self.states, self.step = trainer, layout, trainer.model, None, 0
        self.share = math.inf  # memory as a share of a whole replica
        self.checkpoint = (0, layout, trainer.model, None)  # step 0: the initial weights, which any run rebuilds
        self.run = Run([(0, layout.tag())], [])

    def train(self, n: int, topo: Topology) -> None:
        st, times, losses = self.trainer.segment(self.layout, n, self.step, self.states, topo, self.model)
        self.states = st
        self.run.step_s += times
        self.run.tokens += [self.trainer.global_batch * self.model.seq] * n
        del self.run.losses[self.step :]  # steps redone after going back to a checkpoint
        self.run.losses += losses
        self.step += n
        if self.step - self.checkpoint[0] >= self.trainer.checkpoint_every:
            self.checkpoint = (self.step, self.layout, self.model, st)

    @property
    def clock(self) -> int:
        """Steps run so far, redone ones included: the cluster's clock, which a scenario's events are set on (a
        run that goes back to a checkpoint does not go back in time: the lost node stays lost)."""
        return len(self.run.step_s)

    def event(self, scenario: Scenario) -> tuple:
        """(what the scenario does to the job at this segment boundary -- "node lost (4 ranks left)", "a node
        joined (8 ranks)", "sequence grew to 64", "memory down to 50% of a replica", joined by "; ", or "" --, the
        ranks, the model and the memory share from here)."""
        world = scenario.world(self.trainer.world, self.clock)
        model, share = scenario.model(self.trainer.model, self.clock), scenario.memory(self.clock)
        what = []
        if world < self.layout.world:
            what.append(f"node lost ({world} ranks left)")
        elif world > self.layout.world:
            what.append(f"a node joined ({world} ranks)")
        if model != self.model:
            what.append(f"sequence grew to {model.seq}")
        if share != self.share:
            what.append(f"memory down to {100 * share:.0f}% of a replica")
            self.share = share
        return "; ".join(what), world, model, share

    def move(self, target: Layout, topo: Topology, alive=None, p=None, model=None, restart: bool = False) -> tuple:
        """Reshard to ``target`` (on the survivors ``alive``; of ``model`` if it grew) by plan ``p`` (made here if
        not given); from the last checkpoint when the survivors lack some state, or always with ``restart`` (as
        torchrun restarts every worker). (the plan run or None, seconds, what happened)."""
        t = self.trainer
        model = model or self.model
        grown = model if model != self.model else None
        spent, how, at = 0.0, "nothing trained yet", self.step
        if self.states is not None:
            try:
                if restart:
                    raise StateLost("every rank restarted")
                p = p or plan(
                    self.model, self.layout, target, gpus_per_node=topo.gpus_per_node, alive=alive, grown=grown
                )
            except StateLost as e:
                step, layout, old, states = self.checkpoint
                t0 = time.perf_counter()
                self.states = (
                    None if states is None else restore(old, layout, states, target, model if model != old else None)
                )
                spent = time.perf_counter() - t0
                how = f"{e}: back to the checkpoint of step {step}, {self.step - step} steps to redo"
                self.run.redone += self.step - step
                self.step, p = step, None
            else:
                alive = range(min(self.layout.world, target.world)) if alive is None else alive
                new, _ = execute(p, [self.states[r] for r in sorted(alive)], topology=topo, timeout=t.timeout)
                self.states = new  # the trainer reads params, m, v and t; "seconds" rides along
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


def relaunch_seconds(world: int, topo: Topology, timeout: float = 60.0) -> float:
    """Seconds to start ``world`` ranks and meet at the rendezvous (a TCPStore), doing nothing else: what a
    torchrun-style restart pays before it reads the checkpoint (the median of three)."""
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        launch(_nothing, world, topology=topo, timeout=timeout)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _nothing(comm) -> None:
    comm.barrier()


def run_static(
    trainer: Trainer,
    layout: Layout,
    steps: int,
    segment: int,
    scenario: Scenario,
    log=lambda *a, **k: None,
    twin: Twin | None = None,
    restart_s: float | None = None,
    comm=None,
) -> Run | None:
    """``layout`` throughout, as torchelastic and Megatron would run it: after a node's loss with fewer
    data-parallel replicas (:func:`resized`), after a node joins with as many as it started with, on longer
    sequences as it is; the end of the run when its model-parallel group no longer fits the ranks, or (priced by
    ``twin``, default :func:`twin_of` the trainer) its memory. It runs in the control loop's one launch with
    nothing to decide (:class:`~netmorph.morph.live.LiveJob` ``static``), so a node lost mid-step is detected and
    recovered from -- redone steps, a checkpoint read, processes started for a node back -- as the adaptive run
    pays it (with ``comm``, on a cluster's workers: :func:`~netmorph.morph.live.run_live`). With ``restart_s``,
    torchrun's restart: a node lost or joining restarts every rank (``restart_s``
    seconds, :func:`relaunch_seconds`) from the last checkpoint, redoing the steps since."""
    if restart_s is None:
        live = LiveJob(
            trainer.model,
            trainer.global_batch,
            trainer.device_flops,
            trainer.base,
            twin or twin_of(trainer),
            layout,
            steps,
            segment,
            scenario,
            checkpoint_every=trainer.checkpoint_every,
            static=True,
        )
        return run_live(
            live,
            trainer.world,
            trainer.timeout,
            lambda line: log(f"  static {layout.tag()}: {line.strip().removeprefix('-> ')}"),
            comm,
        )
    job = _Job(trainer, layout)
    while job.step < steps:
        topo = scenario.topology(trainer.base, job.clock)
        what, world, model, share = job.event(scenario)
        if what:
            target = resized(job.layout, world)
            if target is None:
                job.run.failed = f"tp x pp = {layout.tp * layout.pp} does not fit the {world} surviving ranks"
            elif twin is not None and not replace(twin, memory_share=share).fits(target, model.seq):
                job.run.failed = f"{target.tag()} does not fit {100 * share:.0f}% of a replica's memory"
            if job.run.failed:
                log(f"  restart {layout.tag()}: {job.run.failed}")
                break
            at = job.step
            if target == job.layout and model == job.model:
                log(f"  restart {layout.tag()}: {what} at step {at}, on as it was")
                job.train(min(segment, steps - job.step), topo)
                continue
            restart = target.world != job.layout.world
            _, _, how = job.move(
                target, topo, alive=range(world) if world < job.layout.world else None, model=model, restart=restart
            )
            if restart:
                job.run.reshard_s += restart_s
                how += f", after restarting every rank ({restart_s:.2f} s)"
            log(f"  restart {layout.tag()}: {what} at step {at}, on as {target.tag()} ({how})")
        job.train(min(segment, steps - job.step), topo)
    return job.run


def run_adaptive(
    trainer: Trainer,
    twin: Twin,
    start: Layout,
    steps: int,
    segment: int,
    scenario: Scenario,
    hysteresis: float = 0.10,
    confirm: int = 2,
    log=print,
    comm=None,
    verbose: bool | None = None,
) -> Run | None:
    """The control loop (module docstring) deciding on ``twin``; ``log`` gets one line per segment and per
    decision -- printed by rank 0 as they come where ``verbose`` (default: ``log`` is print), else at the end.
    The whole run is one launch whose ranks stay alive across moves, losses and joins (:mod:`netmorph.morph.live`);
    with ``comm``, this process is one of a cluster's ranks (None off rank 0)."""
    live = LiveJob(
        trainer.model,
        trainer.global_batch,
        trainer.device_flops,
        trainer.base,
        twin,
        start,
        steps,
        segment,
        scenario,
        hysteresis,
        confirm,
        verbose=log is print if verbose is None else verbose,
        checkpoint_every=trainer.checkpoint_every,
    )
    return run_live(live, trainer.world, trainer.timeout, log, comm)
