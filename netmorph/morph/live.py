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

Losses, hangs and joins -- the job's membership changing under the loop -- are
:class:`~netmorph.morph.members.Members`' part of a rank.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, replace

import numpy as np

from netmorph.cost.topology import Topology
from netmorph.mesh.layout import Layout
from netmorph.mesh.shape import ModelShape
from netmorph.morph.decide import Controller, Decision, Look, Run, resized
from netmorph.morph.layouts import train_config
from netmorph.morph.members import Members, agreed_max, membership_changes
from netmorph.morph.reshard import plan, run_rank
from netmorph.morph.scenario import LOSSES, Scenario
from netmorph.morph.twin import Twin, candidates
from netmorph.parallel.hybrid import train_rank

__all__ = ["LiveJob", "live_rank", "membership_changes"]

PROBE_BYTES, PROBES = 1 << 18, 3


@dataclass(frozen=True)
class LiveJob:
    """What every rank of a live run is given."""

    model: ModelShape
    global_batch: int
    device_flops: float
    base: Topology  # the healthy emulated cluster
    twin: Twin
    start: Layout
    steps: int
    segment: int
    scenario: Scenario
    hysteresis: float = 0.10
    confirm: int = 2
    verbose: bool = False  # rank 0 prints each look's line as it goes
    checkpoint_every: int = 20
    checkpoints: str = ""  # a folder every rank writes its checkpoints to (a node may be lost), or ""
    static: bool = False  # hold the start split as torchelastic would: fewer (more) data-parallel replicas
    # after a loss (join), no look; the run ends when the split no longer fits


def probe(comm, gpn: int) -> float | None:
    """Seconds per byte one way across the node boundary (rank 0 to rank ``gpn`` and back, the fastest of
    :data:`PROBES`), known on every rank (broadcast from rank 0); None on one node."""
    if comm.WORLD.size() <= gpn:  # one node (the survivors of a lost one too)
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


class _Rank(Members):
    """One rank of a live run: its layout, model, state and step, its in-memory commits; on rank 0 the controller
    and the log -- and, where a node can be lost, on rank ``gpn`` (the second node's first) a standby of both that
    sees what rank 0 sees and decides the same, so that the run goes on whichever node is lost."""

    def __init__(self, comm, job: LiveJob):
        self.comm, self.job, self.gpn = comm, job, job.base.gpus_per_node
        self.layout, self.model, self.state, self.step, self.share = job.start, job.model, None, 0, math.inf
        standby = bool(job.checkpoints) and comm.rank == self.gpn
        self.ctl = Controller(job.twin, job.steps, job.hysteresis, job.confirm) if comm.rank == 0 or standby else None
        self.run = Run([(0, job.start.tag())], [])
        self.losses: dict = {}  # step -> loss, where this rank computes it (redone steps overwrite)
        self.lines: list = []  # rank 0's log, returned when it is not printed as it goes
        self.clock = 0  # steps run, redone ones included: the scenario's clock
        self.commits: list = []  # the last two (steps done, state): a loss redoes one step at most
        self.ends: list = []  # when each step of the segment in hand ended (perf_counter)
        self.accounted = False  # the segment's step times are in the run
        lost = [e for e in job.scenario.events if e.kind in LOSSES]
        mine = lost and comm.slot // self.gpn == lost[0].node
        self.dies_at = lost[0].at if mine else None  # (a loss comes with checkpoints)
        self.how = signal.SIGSTOP if lost and lost[0].kind == "node-hangs" else signal.SIGKILL
        self.doomed = False  # armed to go with its node
        self.rdzv = self.view = self.heart = self.dog = None
        self.joined = getattr(comm, "joined", False)  # started in a lost rank's slot: a node back
        if job.checkpoints:
            self.watch()

    def say(self, line: str) -> None:
        if self.ctl is not None:  # rank 0 and its standby keep the log; rank 0 prints it
            self.lines.append(line)
            if self.job.verbose and self.comm.rank == 0:
                print(line, flush=True)

    def commit(self, done: int, state, loss) -> None:
        """After each step: its loss; and where a node may be lost, keep the state (the last two), write a
        checkpoint every ``checkpoint_every`` steps (rank 0 the layout it is under), and -- a rank of the node the
        scenario loses, at its step on the cluster's clock -- arm the SIGKILL (or, a node that hangs, the SIGSTOP)
        that takes this process in the middle of the next step."""
        self.clock += 1
        self.ends.append(time.perf_counter())
        if loss is not None:
            self.losses[done - 1] = loss
        if not self.job.checkpoints:  # no node can be lost (nor dies): nothing to keep
            return
        self.commits = (self.commits + [(done, state())])[-2:]
        if done % self.job.checkpoint_every == 0:  # the trainer's checkpoint (DCP), under the layout in hand
            from netmorph.checkpoint.training import save_state

            save_state(self.comm, self.job.checkpoints, done, self.model, self.layout, self.commits[-1][1])
        if self.dies_at is not None and self.clock == self.dies_at:
            took = self.run.step_s[-1] if self.run.step_s else 0.1
            threading.Timer(took / 2, os.kill, (os.getpid(), self.how)).start()
            self.doomed = True

    def move(self, target: Layout, grown=None) -> tuple:
        p = plan(self.model, self.layout, target, gpus_per_node=self.gpn, grown=grown)
        if self.state is None:
            return p, 0.0
        self.state = run_rank(self.comm, p, self.state)
        return p, float(agreed_max(self.comm, [self.state["seconds"]])[0])

    def pick(self, choose, model: ModelShape, world: int) -> Layout:
        """Rank 0's choice among the candidates (``choose()`` where the controller is: a Layout, or None to stay),
        on every rank; None when it stays. The standby chooses too (its state stays rank 0's); rank 0's counts."""
        options = candidates(model, world, self.job.global_batch, zero=True)
        pick = np.array([-1.0])
        if self.ctl is not None:
            chosen = choose()
            pick[0] = -1 if chosen is None else [lay.tag() for lay in options].index(chosen.tag())
        with self.comm.phase("morph.agree"):
            self.comm.broadcast(pick, 0)
        return None if pick[0] < 0 else options[int(pick[0])]

    def replanned(self, world: int, model: ModelShape, share: float) -> tuple:
        """Rank 0's twin re-plans from the layout in hand for ``world`` ranks of ``model`` with memory ``share``:
        (the layout it picks, on every rank; rank 0's (best, predicted, current, top), None elsewhere). A static
        run takes the layout in hand resized (:func:`~netmorph.morph.decide.resized`), or raises :class:`Stopped`
        when that no longer fits the ranks or the memory."""
        out = {}

        def choose():
            out["best"] = best = self.ctl.replan(self.layout, world, model.seq, share)
            if self.job.static:  # its prediction is the resized split's
                same = resized(self.layout, world) if math.isfinite(best[2]) else None
                out["best"] = (same, best[2], best[2], best[3])
                return same
            return best[0]

        target = self.pick(choose, model, world)
        if target is None:  # only a static run picks nothing here
            same = resized(self.layout, world)
            raise Stopped(
                f"tp x pp = {self.layout.tp * self.layout.pp} does not fit the {world} surviving ranks"
                if same is None
                else f"{same.tag()} does not fit {100 * share:.0f}% of a replica's memory"
            )
        return target, out.get("best")

    def stop(self, stop: Stopped) -> None:
        """A static split that no longer fits: its run ends here, saying why."""
        self.run.failed = str(stop)
        self.say(f"  -> {stop}: the run ends at step {self.step}")

    def record(self, d: Decision) -> None:
        """A decision in the run's record (where the controller is; a static run decides nothing)."""
        if self.ctl is not None and not self.job.static:
            self.run.decisions.append(d)

    def moved(self, at: int, before: Layout, target: Layout, spent: float) -> None:
        """A move from ``before`` to ``target`` at step ``at`` that took ``spent`` seconds, in the run's record."""
        self.run.reshard_s += spent
        self.run.events.append((len(self.run.step_s), spent, at, f"{before.tag()} -> {target.tag()}"))
        if target != before:
            self.run.layout_path.append((at, target.tag()))

    def replan(self) -> None:
        """The context grew or the memory shrank at this boundary: rank 0's twin picks the layout; move there."""
        job, layout = self.job, self.layout
        model, share = job.scenario.model(job.model, self.clock), job.scenario.memory(self.clock)
        if model == self.model and share == self.share:
            return
        what = "; ".join(
            w
            for w, c in (
                (f"sequence grew to {model.seq}", model != self.model),
                (f"memory down to {100 * share:.0f}% of a replica", share != self.share),
            )
            if c
        )
        target, best = self.replanned(layout.world, model, share)
        p, spent = self.move(target, model if model != self.model else None)
        self.moved(self.step, layout, target, spent)
        if self.ctl is not None:
            _, predicted, current, top = best
            self.say(
                f"  -> at step {self.step}, {what}: {layout.tag()} -> {target.tag()} (model "
                f"{1e3 * predicted:.0f} ms/step; staying "
                f"{'does not fit' if math.isinf(current) else f'{1e3 * current:.0f} ms'}); {p.bytes:,} B between "
                f"live ranks in {1e3 * spent:.0f} ms"
            )
            if target != layout:
                self.record(
                    Decision(
                        self.step,
                        layout.tag(),
                        target.tag(),
                        math.nan,
                        current,
                        predicted,
                        p.bytes,
                        spent,
                        spent / max(current - predicted, 1e-12),
                        what,
                        top,
                    )
                )
        self.layout, self.model, self.share = target, model, share

    def segment(self) -> None:
        """Train a segment, agree on what it measured, look, and move if the controller says so."""
        job, comm = self.job, self.comm
        n = min(job.segment, job.steps - self.step)
        cfg = train_config(self.model, self.layout, n, job.global_batch, self.step, device_flops=job.device_flops)
        self.commits, self.ends, self.accounted = [(self.step, self.state)], [time.perf_counter()], False
        out = train_rank(comm, cfg, None, None if self.state is None else {comm.rank: self.state}, commit=self.commit)
        self.state = out.state.flat
        # every rank learns the segment's losses (the ranks that compute them may be the ones a loss takes)
        first = self.step
        # (this segment's own: a rank that learned the losses of steps a rollback redoes must not add them again)
        mine = list(out.losses or [0.0] * n) + [1.0 if out.losses else 0.0]
        total = np.asarray(mine, dtype=np.float64)
        with comm.phase("morph.agree"):
            comm.all_reduce(total)
        self.losses.update({first + k: float(v) / total[-1] for k, v in enumerate(total[:-1])})
        times = agreed_max(comm, out.step_times)
        if n > 1:
            times[0] = statistics.median(times[1:])  # the segment's first step builds the layout's modules
        self.run.step_s += times.tolist()
        self.run.tokens += [job.global_batch * self.model.seq] * n
        self.accounted = True
        self.step += n
        if job.static:  # held: nothing to look at
            return
        busy = float(agreed_max(comm, [statistics.median(out.busy_s[1:] or out.busy_s)])[0])
        beta = probe(comm, self.gpn)
        line = d = None

        def choose():
            nonlocal line, d
            t0 = time.perf_counter()
            line, d = self.ctl.look(Look(self.step, self.layout, self.model.seq, statistics.median(times), busy, beta))
            self.run.decide_s.append(time.perf_counter() - t0)
            self.say(line)
            return None if d is None else d.target

        target = self.pick(choose, self.model, self.layout.world)
        if target is None:
            return
        p, spent = self.move(target)
        self.moved(self.step, self.layout, target, spent)
        if self.ctl is not None:
            predicted_cost, d.reshard_s = d.reshard_s, spent
            d.payback_steps = spent / (d.predicted_current_s - d.predicted_best_s)
            self.run.decisions.append(d)
            self.say(
                f"  -> reshard {d.before} to {d.after} at step {d.step} between live ranks: {p.bytes:,} B in "
                f"{1e3 * spent:.0f} ms (model {1e3 * predicted_cost:.0f} ms), pays back in "
                f"{d.payback_steps:.1f} steps"
            )
        self.layout = target

    def main(self) -> dict:
        from netmorph.runtime.transport import PeerLost

        if self.joined:
            self.join()
        while self.step < self.job.steps:
            self.comm.emulate(self.job.scenario.topology(self.job.base, self.clock))
            try:
                if self.view is not None and self.job.scenario.world(self.launched, self.clock) > len(
                    self.view.members
                ):
                    self.grow()
                self.replan()
                self.segment()
            except PeerLost as e:
                if not self.job.checkpoints:
                    raise
                if self.doomed:  # the node goes as one: a rank whose peer went first goes now,
                    os.kill(os.getpid(), self.how)  # never into the survivors' agreement
                try:
                    self.recover(e)
                except Stopped as stop:
                    self.stop(stop)
                    break
            except Stopped as stop:
                self.stop(stop)
                break
        if self.ctl is not None and not self.job.static:
            self.run.twin = self.ctl.twin
        self.unwatch()
        return {"losses": self.losses, "run": self.run if self.comm.rank == 0 else None, "lines": self.lines}


class Stopped(Exception):
    """A static split that no longer fits the ranks or the memory: the end of its run (the reason)."""


def live_rank(comm, job: LiveJob) -> dict:
    """This rank's part of the whole adaptive run: {"losses": {step: loss} where this rank computes them; "run":
    the :class:`~netmorph.morph.decide.Run` on rank 0 (its losses filled by the caller); "lines": its log}."""
    return _Rank(comm, job).main()


def run_live(job: LiveJob, world: int, timeout: float, log=lambda line: None, comm=None) -> Run | None:
    """The whole adaptive run in one launch of ``world`` ranks on the emulated cluster; its :class:`Run`, the
    losses gathered from the ranks that computed them (rank 0's lines go to ``log`` at the end unless
    ``job.verbose`` printed them as they came). With ``comm`` (a cluster's worker, :mod:`netmorph.morph.cluster`)
    this process is one of the ranks, launched already: the Run on rank 0 (every rank learns every loss), None
    elsewhere."""
    from netmorph.runtime.launch import launch

    if comm is not None:
        if membership_changes(job.scenario):  # a cluster's folder every rank writes to (Cluster.scratch)
            job = replace(job, checkpoints=comm.checkpoints)
        out = live_rank(comm, job)
        if out["run"] is None:
            return None
        outs = [out]
    elif membership_changes(job.scenario):
        with tempfile.TemporaryDirectory(prefix=".netmorph-ckpt-") as d:
            outs = launch(
                live_rank, world, replace(job, checkpoints=d), topology=job.base, timeout=timeout, elastic=True
            )
    else:
        outs = launch(live_rank, world, job, topology=job.base, timeout=timeout)
    head = next(o for o in outs if o is not None and o["run"] is not None)  # rank 0 at the end
    if not job.verbose:
        for line in head["lines"]:
            log(line)
    run = head["run"]
    losses = {}
    for o in outs:
        if o is not None:
            losses.update(o["losses"])
    run.losses = [losses[k] for k in sorted(losses)]
    return run
