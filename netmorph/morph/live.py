"""One launch for the whole run: the control loop inside the ranks, every move made between live ranks.

Varuna and Oobleck morph a job without restarting it; so does this loop. Every rank runs :func:`live_rank`:

1. it trains a segment with the trainer's own :func:`~netmorph.parallel.hybrid.train_rank` on the same
   communicator, its groups formed from the current layout (a move re-forms them: the next segment builds them
   from the new layout);
2. the ranks agree on what the segment measured: the slowest rank's step times and busy slots (all-reduce MAX)
   and the inter-node link's price (a probe from rank 0, broadcast);
3. rank 0's :class:`~netmorph.morph.decide.Controller` decides on the twin and broadcasts the decision (the
   index of the target among the candidates, or -1);
4. a move runs the reshard plan on the same ranks (:func:`~netmorph.morph.reshard.run_rank`): no process is
   started and nothing goes through the launcher.

The scenario's link changes reach each rank's own link clock at the same segment boundary
(:meth:`Comm.emulate <netmorph.runtime.base.CommBase.emulate>`); a longer context or less memory re-plans there.
A node lost or joining changes the membership itself: those scenarios run on the relaunching path of
:mod:`netmorph.morph.controller` (each segment its own launch) until the elastic rendezvous carries them.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import numpy as np

from netmorph.cost.topology import Topology
from netmorph.mesh.layout import Layout
from netmorph.mesh.shape import ModelShape
from netmorph.morph.decide import Controller, Decision, Look, Run
from netmorph.morph.layouts import train_config
from netmorph.morph.reshard import plan, run_rank
from netmorph.morph.scenario import Scenario
from netmorph.morph.twin import Twin, candidates
from netmorph.parallel.hybrid import train_rank

__all__ = ["LiveJob", "live_rank", "membership_changes"]

PROBE_BYTES, PROBES = 1 << 18, 3


def membership_changes(scenario: Scenario) -> bool:
    """Whether the scenario loses or adds ranks (the relaunching path's, for now)."""
    return any(e.kind in ("node-lost", "node-joins") for e in scenario.events)


@dataclass(frozen=True)
class LiveJob:
    """What every rank of a live run is given."""

    model: ModelShape
    global_batch: int
    device_flops: float
    base: Topology                  # the healthy emulated cluster
    twin: Twin
    start: Layout
    steps: int
    segment: int
    scenario: Scenario
    hysteresis: float = 0.10
    confirm: int = 2
    verbose: bool = False           # rank 0 prints each look's line as it goes


def probe(comm, gpn: int) -> float | None:
    """Seconds per byte one way across the node boundary (rank 0 to rank ``gpn`` and back, the fastest of
    :data:`PROBES`), known on every rank (broadcast from rank 0); None on one node."""
    if comm.world <= gpn:
        return None
    buf, best = np.zeros(PROBE_BYTES // 8), math.inf
    with comm.phase("morph.probe"):
        for _ in range(PROBES):
            if comm.rank == 0:
                t0 = time.perf_counter()
                comm.send(buf, gpn)
                comm.recv(buf, gpn)
                best = min(best, (time.perf_counter() - t0) / 2)
            elif comm.rank == gpn:
                comm.recv(buf, 0)
                comm.send(buf, 0)
        out = np.array([best / PROBE_BYTES if comm.rank == 0 else 0.0])
        comm.broadcast(out, 0)
    return float(out[0])


def _max(comm, values) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64).copy()
    with comm.phase("morph.agree"):
        comm.all_reduce(a, op="max")
    return a


def live_rank(comm, job: LiveJob) -> dict:
    """This rank's part of the whole adaptive run: {"losses": per step where this rank computes them, else None;
    "run": the :class:`~netmorph.morph.decide.Run` on rank 0 (its losses filled by the caller)}."""
    gpn = job.base.gpus_per_node
    layout, model, state, step, share = job.start, job.model, None, 0, math.inf
    ctl = Controller(job.twin, job.steps, job.hysteresis, job.confirm) if comm.rank == 0 else None
    run = Run([(0, layout.tag())], [])
    losses: list = []
    lines: list = []                # rank 0's log, returned when it is not printed as it goes

    def say(line):
        if comm.rank == 0:
            lines.append(line)
            if job.verbose:
                print(line, flush=True)

    def move(target, grown=None):
        nonlocal state
        p = plan(model, layout, target, gpus_per_node=gpn, grown=grown)
        if state is None:
            return p, 0.0
        state = run_rank(comm, p, state)
        return p, float(_max(comm, [state["seconds"]])[0])

    while step < job.steps:
        comm.emulate(job.scenario.topology(job.base, step))
        new_model, new_share = job.scenario.model(job.model, step), job.scenario.memory(step)
        if new_model != model or new_share != share:
            what = "; ".join(w for w, c in ((f"sequence grew to {new_model.seq}", new_model != model),
                                            (f"memory down to {100 * new_share:.0f}% of a replica",
                                             new_share != share)) if c)
            pick = np.array([-1.0])
            if comm.rank == 0:
                best, predicted, current, top = ctl.replan(layout, layout.world, new_model.seq, new_share)
                pick[0] = candidates(new_model, layout.world, job.global_batch, zero=True).index(best)
            with comm.phase("morph.agree"):
                comm.broadcast(pick, 0)
            target = candidates(new_model, layout.world, job.global_batch, zero=True)[int(pick[0])]
            p, spent = move(target, new_model if new_model != model else None)
            run.reshard_s += spent
            run.events.append((len(run.step_s), spent, step, f"{layout.tag()} -> {target.tag()}"))
            if comm.rank == 0:
                say(f"  -> at step {step}, {what}: {layout.tag()} -> {target.tag()} (model {1e3 * predicted:.0f} "
                    f"ms/step; staying {'does not fit' if math.isinf(current) else f'{1e3 * current:.0f} ms'}); "
                    f"{p.bytes:,} B between live ranks in {1e3 * spent:.0f} ms")
                if target != layout:
                    run.decisions.append(Decision(step, layout.tag(), target.tag(), math.nan, current, predicted,
                                                  p.bytes, spent, spent / max(current - predicted, 1e-12), what, top))
            if target != layout:
                run.layout_path.append((step, target.tag()))
            layout, model, share = target, new_model, new_share
        n = min(job.segment, job.steps - step)
        cfg = train_config(model, layout, n, job.global_batch, step, device_flops=job.device_flops)
        out = train_rank(comm, cfg, None, None if state is None else {comm.rank: state})
        state = out.state.flat
        losses.append(out.losses)
        times = _max(comm, out.step_times)
        if n > 1:
            times[0] = statistics.median(times[1:])       # the segment's first step builds the layout's modules
        busy = float(_max(comm, [statistics.median(out.busy_s[1:] or out.busy_s)])[0])
        beta = probe(comm, gpn)
        run.step_s += times.tolist()
        run.tokens += [job.global_batch * model.seq] * n
        step += n
        pick = np.array([-1.0])
        if comm.rank == 0:
            t0 = time.perf_counter()
            line, d = ctl.look(Look(step, layout, model.seq, statistics.median(times), busy, beta))
            run.decide_s.append(time.perf_counter() - t0)
            say(line)
            if d is not None:
                pick[0] = [lay.tag() for lay in candidates(model, layout.world, job.global_batch, zero=True)] \
                    .index(d.after)
        with comm.phase("morph.agree"):
            comm.broadcast(pick, 0)
        if pick[0] < 0:
            continue
        target = candidates(model, layout.world, job.global_batch, zero=True)[int(pick[0])]
        p, spent = move(target)
        run.reshard_s += spent
        run.events.append((len(run.step_s), spent, step, f"{layout.tag()} -> {target.tag()}"))
        run.layout_path.append((step, target.tag()))
        if comm.rank == 0:
            predicted_cost, d.reshard_s = d.reshard_s, spent
            d.payback_steps = spent / (d.predicted_current_s - d.predicted_best_s)
            run.decisions.append(d)
            say(f"  -> reshard {d.before} to {d.after} at step {d.step} between live ranks: {p.bytes:,} B in "
                f"{1e3 * spent:.0f} ms (model {1e3 * predicted_cost:.0f} ms), pays back in {d.payback_steps:.1f} "
                f"steps")
        layout = target
    if ctl is not None:
        run.twin = ctl.twin
    return {"losses": losses, "run": run if comm.rank == 0 else None, "lines": lines}


def run_live(job: LiveJob, world: int, timeout: float, log=lambda line: None) -> Run:
    """The whole adaptive run in one launch of ``world`` ranks on the emulated cluster; its :class:`Run`, the
    losses gathered from the ranks that computed them (rank 0's lines go to ``log`` at the end unless
    ``job.verbose`` printed them as they came)."""
    from netmorph.runtime.launch import launch
    outs = launch(live_rank, world, job, topology=job.base, timeout=timeout)
    if not job.verbose:
        for line in outs[0]["lines"]:
            log(line)
    run = outs[0]["run"]
    for k in range(len(outs[0]["losses"])):
        run.losses += next(o["losses"][k] for o in outs if o["losses"][k])
    return run
