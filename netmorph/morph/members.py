"""The job's membership changing under the control loop: a node lost, hung or back, inside the one launch.

A node lost is not applied by anyone: at the scenario's step its ranks SIGKILL themselves in the middle of the
next step (an elastic launch, ``launch(elastic=True)``). The fabric marks them dead and every survivor's pending
call raises ``PeerLost``; the survivors post the steps they completed, agree on the view without the dead and
on the step to resume at (the fewest any completed: each keeps its last two steps' state in memory, Horovod
Elastic's commit) through :class:`~netmorph.elastic.membership.Rendezvous`, re-form the communicator on the
epoch's fresh channels, and rank 0's twin picks the survivors' layout. The state is resharded from what the
survivors hold -- or, when the node took state no survivor has (a pipeline stage, a ZeRO shard), read from the
last checkpoint every rank wrote to a shared folder -- and the line says which. At most the step in flight is
redone when the survivors hold everything.

A node that hangs instead (its ranks SIGSTOP themselves mid-step: alive, silent) is found by its heartbeats: every
rank beats into the store and watches the others' beats with the φ accrual detector of ``netmorph elastic``
(:class:`~netmorph.elastic.heartbeat.Watchdog`); a rank suspected is fenced (SIGKILL) and from there it is a loss.

A node back: rank 0 asks the launcher for processes in the lost ranks' slots (``comm.respawn``, as torchelastic
starts workers where lost ones were), they announce themselves, the members agree on the grown view, rank 0's
twin picks its layout and the reshard plan sends the joiners everything they hold. One launch from start to end.
"""

from __future__ import annotations

import json
import math
import pickle
import signal
import time
from dataclasses import replace

import numpy as np

from netmorph.checkpoint import folder
from netmorph.elastic.agent import dead_of
from netmorph.elastic.cluster import confirm_lost, node_of, on_suspect, stopped_after
from netmorph.elastic.detector import PhiAccrual
from netmorph.elastic.heartbeat import Heartbeat, Watchdog, publish_pid
from netmorph.elastic.membership import Rendezvous, agree_after_loss
from netmorph.mesh.layout import Layout
from netmorph.morph.decide import Decision
from netmorph.morph.reshard import StateLost, plan, run_rank
from netmorph.morph.scenario import LOSSES, Scenario
from netmorph.morph.twin import candidates
from netmorph.parallel.config import TrainConfig

__all__ = ["Members", "agreed_max", "membership_changes"]

# heartbeats every 0.1 s; a peer silent about a second past its usual beat is suspected (φ > 8 with Akka's
# acceptable pause of 1 s: eight ranks sharing two cores can miss a few beats, and fencing a live rank loses it)
HEARTBEAT, PAUSE = 0.1, 1.0


def membership_changes(scenario: Scenario) -> bool:
    """Whether the scenario loses or adds ranks."""
    return any(e.kind in LOSSES + ("node-joins",) for e in scenario.events)


def agreed_max(comm, values) -> np.ndarray:
    """The largest of every rank's ``values``, on every rank (all-reduce MAX in the ``morph.agree`` phase)."""
    a = np.asarray(values, dtype=np.float64).copy()
    with comm.phase("morph.agree"):
        comm.all_reduce(a, op="max")
    return a


class Members:
    """A live rank's membership part (mixed into :class:`netmorph.morph.live._Rank`, whose fields it reads: comm,
    job, layout, model, state, step, clock, share, commits, ends, run, ctl, rdzv, view, heart, dog, joined; and
    whose ``pick``, ``replanned``, ``moved``, ``record`` and ``say`` it calls)."""

    def watch(self) -> None:
        """Beat, and fence a peer that stops beating (a run whose scenario changes its membership)."""
        comm = self.comm
        self.rdzv = Rendezvous(comm.store, 1)
        self.view = None if self.joined else self.rdzv.start(range(self.launched))
        publish_pid(comm.store, comm.slot)
        self.heart = Heartbeat(comm.store, comm.slot, HEARTBEAT).start()
        # a joiner watches the members once they admit it (:meth:`_welcome`): until then it holds nothing to lose
        peers = [] if self.joined else [r for r in range(self.launched) if r != comm.slot]
        self.dog = Watchdog(
            comm.store,
            peers,
            lambda: PhiAccrual(
                first_heartbeat_estimate=HEARTBEAT, min_std_deviation=HEARTBEAT / 2, acceptable_heartbeat_pause=PAUSE
            ),
            interval=HEARTBEAT / 2,
            on_suspect=on_suspect(comm),
        ).start()
        stopped_after(comm, self.dog, HEARTBEAT)

    @property
    def launched(self) -> int:
        """The launch's ranks: the scenario's world before any loss (a cluster's nodes x K, whatever slot this
        worker was restarted in)."""
        place = getattr(self.comm, "placement", None)
        return self.comm.launched if place is None else place.launched

    def unwatch(self) -> None:
        """Done: stop watching, and say so in the store, so that no watchdog fences a rank that finished."""
        if self.heart is not None:
            self.dog.stop()
            self.heart.stop()

    def recover(self, err) -> None:
        """A peer died (the fabric marked it: ``err``): agree with the other survivors on the new view and the
        step to resume at (the fewest any of them completed), re-form, let rank 0's twin pick the survivors'
        layout, and reshard from what the survivors hold -- from the last checkpoint when they lack some state."""
        comm, job, t0 = self.comm, self.job, time.perf_counter()
        done = max(d for d, _ in self.commits)

        def silent(ranks):  # neither posted nor died nor fenced by the watchdog in time
            raise err

        confirm_lost(comm, err)  # a closed connection from a peer that stopped beating: gone, now
        before = list(self.view.members)  # old rank i is before[i] (the numbering the layout in hand uses)
        view = agree_after_loss(comm, self.rdzv, self.view, done, comm.transport.timeout, silent, dead_of(comm))
        dead = sorted(set(self.view.members) - set(view.members))
        if self.dog is not None:
            self.dog.forget(dead)
        comm.reform(view.members, view.epoch, renumber=True)  # the survivors are ranks 0..world-1 from here
        self.view, world, first = view, len(view.members), view.first_step
        if not self.accounted:  # the segment's steps done before the loss, as this rank timed them
            kept = first - self.step  # (the segment started at self.step)
            self.run.step_s += np.diff(self.ends[: kept + 1]).tolist()
            self.run.tokens += [job.global_batch * self.model.seq] * kept
            t0 = self.ends[kept]  # from here on the time is the loss's: the step in flight too
        state = dict(self.commits).get(first, self.state)
        layout, agreed = self.layout, first
        target, best = self.replanned(world, self.model, self.share)
        try:
            if state is None:
                raise StateLost("nothing trained yet")
            p = plan(self.model, layout, target, gpus_per_node=self.gpn, alive=[before.index(m) for m in view.members])
            self.state = run_rank(comm, p, state)
            how = f"{p.bytes:,} B from the survivors' shards"
        except StateLost as e:
            at = max(folder.steps(job.checkpoints), default=0)
            self.state = self._restore(at, target) if at else None
            how = f"{e}: from the checkpoint of step {at}, {first - at} steps to redo"
            first = at
        spent = float(agreed_max(comm, [time.perf_counter() - t0])[0])
        self.run.redone += agreed - first + 1  # the step in flight, and the steps since the checkpoint
        self.moved(first, layout, target, spent)
        if self.ctl is not None:
            _, predicted, current, top = best
            silent = list(self.dog.silence(dead).values())
            found = (
                "the fabric" if getattr(comm, "liveness", None) is None else "their closed connections and heartbeats"
            )
            what = (
                f"node lost ({world} ranks left, ranks {dead} killed mid-step, detected by {found})"
                if self.how == signal.SIGKILL
                else f"node hung ({world} ranks left, ranks {dead} stopped mid-step: "
                + (
                    f"{max(silent):.1f} s without a heartbeat when φ accrual suspected them"
                    if silent
                    else "suspected by a watchdog"
                )
                + ", fenced with SIGKILL)"
            )
            self.say(
                f"  -> {what}: agreed to resume at step {agreed} (the step in flight redone); {layout.tag()} -> "
                f"{target.tag()} (model {1e3 * predicted:.0f} ms/step); {how}; {1e3 * spent:.0f} ms from the last "
                f"step done to going on"
            )
            self.record(
                Decision(first, layout.tag(), target.tag(), math.nan, current, predicted, 0, spent, math.inf, what, top)
            )
        self.layout, self.step, self.accounted = target, first, True

    def grow(self) -> None:
        """The scenario brings the lost node back at this boundary, and the members wait until each of its ranks
        has announced itself, agree on the view with them, and :meth:`_welcome` them. On one box rank 0 asks the
        launcher for processes in the dead ranks' slots (``comm.respawn``); on a cluster the node is the workers
        its torchrun job restarted, new slots that asked to join (:meth:`Rendezvous.request`), a whole node's."""
        comm, t0 = self.comm, time.perf_counter()
        world = self.job.scenario.world(self.launched, self.clock)
        deadline = time.monotonic() + comm.transport.timeout
        place = getattr(comm, "placement", None)
        if place is None:
            new = [r for r in range(world) if r not in self.view.members]
            if comm.rank == 0:
                comm.respawn(new)
        while True:
            if place is not None:
                from netmorph.elastic.gpt import whole_nodes

                new = whole_nodes(self.rdzv.requests(self.view.epoch), place.local_world)[
                    : world - len(self.view.members)
                ]
            if self.rdzv.joiners(self.view.epoch, new) == new and len(self.view.members) + len(new) == world:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the node back (ranks {new or 'none yet'}) did not come up within "
                    f"{comm.transport.timeout:g} s"
                    + ("" if place is None else " (is its torchrun job restarting it? --max-restarts)")
                )
            time.sleep(0.005)
        self._welcome(self.rdzv.propose(self.view, candidates=new, first_step=self.step), t0)

    def join(self) -> None:
        """A rank started in a lost one's slot (or, on a cluster, a worker its node's torchrun job restarted): ask
        to join (beating already) -- again after each newer view that does not hold it --, wait for a view that
        holds it, and be welcomed: it learns the run's step, clock and layout and receives its state."""
        comm = self.comm
        cluster = getattr(comm, "placement", None) is not None
        # on one box the members ask for it and wait; a restarted worker may wait the run's length to be admitted
        deadline = time.monotonic() + comm.transport.timeout * (1 if not cluster else 2 + self.job.steps)
        asked = None
        while True:
            view = self.rdzv.current()
            if comm.slot in view.members:
                break
            if view.epoch != asked:
                (self.rdzv.request if cluster else self.rdzv.announce)(comm.slot, view.epoch)
                asked = view.epoch
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {comm.slot} was not admitted within {comm.transport.timeout:g} s")
            time.sleep(0.005)
        self._welcome(view, time.perf_counter())  # the members time the join from asking for it

    def _welcome(self, view, t0: float) -> None:
        """Every member of ``view`` (the ranks not in the view before it joined it): re-form, agree on where the run is (rank 0 says: step,
        clock, sequence, memory share, Adam's step, the layout in hand), let rank 0's twin pick the layout of the
        grown world, and send the joiners their state by the reshard plan -- they hold nothing."""
        comm, job = self.comm, self.job
        new = [r for r in view.members if r not in self.rdzv.view(view.epoch - 1).members]
        comm.reform(view.members, view.epoch, renumber=True)  # the joiners after the members (ncclCommGrow)
        self.view = view
        if self.dog is not None:  # a joiner watches every member, a member the joiners
            self.dog.add([r for r in (view.members if comm.slot in new else new) if r != comm.slot])
        if len(view.members) > self.gpn and view.members[self.gpn] in new:
            self._hand_standby()
        before = len(view.members) - len(new)
        where = np.zeros(6)
        if comm.rank == 0:
            options = [lay.tag() for lay in candidates(self.model, before, job.global_batch, zero=True)]
            where[:] = (
                self.step,
                self.clock,
                self.model.seq,
                -1 if math.isinf(self.share) else self.share,
                self.state["t"] if self.state is not None else 0,
                options.index(self.layout.tag()),
            )
        with comm.phase("morph.agree"):
            comm.broadcast(where, 0)
        if self.joined and comm.slot in new:
            self.step, self.clock = int(where[0]), int(where[1])
            self.model = self.model if int(where[2]) == self.model.seq else replace(self.model, seq=int(where[2]))
            self.share = math.inf if where[3] < 0 else float(where[3])
            self.layout = candidates(self.model, before, job.global_batch, zero=True)[int(where[5])]
            # a joiner holds nothing (the trainer's dtype: train_config leaves TrainConfig's default)
            self.state = {"params": np.zeros(0, dtype=np.dtype(TrainConfig.dtype)), "t": int(where[4])}
        layout = self.layout
        target, best = self.replanned(len(view.members), self.model, self.share)
        p = plan(self.model, layout, target, gpus_per_node=self.gpn)
        self.state = run_rank(comm, p, self.state)
        spent = float(agreed_max(comm, [time.perf_counter() - t0])[0])
        self.commits, self.accounted = [(self.step, self.state)], True
        self.moved(self.step, layout, target, spent)
        if self.ctl is not None:
            _, predicted, current, top = best
            place = getattr(comm, "placement", None)
            what = (
                f"a node joined ({len(view.members)} ranks: {new} started in the lost ranks' slots, one launch)"
                if place is None
                else f"a node joined ({len(view.members)} ranks: {new}, the workers node "
                f"{node_of(min(new), place.nodes, place.local_world)}'s torchrun job restarted)"
            )
            self.say(
                f"  -> at step {self.step}, {what}: {layout.tag()} -> {target.tag()} (model "
                f"{1e3 * predicted:.0f} ms/step); {p.bytes:,} B to the ranks that joined; {1e3 * spent:.0f} ms "
                f"from {'asking for the ranks' if getattr(comm, 'placement', None) is None else 'the boundary'} "
                f"to going on"
            )
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
                    math.inf,
                    what,
                    top,
                )
            )
        self.layout = target

    def _hand_standby(self) -> None:
        """Rank 0 gives the new standby (rank ``gpn``, a joiner: the controller's second copy) the controller, the
        run's record and the log, pickled -- what it needs to carry on should rank 0's node be lost next."""
        comm, n = self.comm, np.zeros(1)
        with comm.phase("morph.agree"):
            if comm.rank == 0:
                blob = np.frombuffer(pickle.dumps((self.ctl, self.run, self.lines)), dtype=np.uint8).copy()
                n[0] = blob.size
                comm.send(n, self.gpn)
                comm.send(blob, self.gpn)
            elif comm.rank == self.gpn:
                comm.recv(n, 0)
                blob = np.empty(int(n[0]), np.uint8)
                comm.recv(blob, 0)
                self.ctl, self.run, self.lines = pickle.loads(blob.tobytes())

    def _restore(self, at: int, target: Layout) -> dict:
        """This rank's state under ``target`` from the checkpoint of step ``at`` (DCP's resharding: the boxes it
        holds under ``target``, from whichever old ranks wrote them)."""
        from netmorph.checkpoint.dcp import read_train
        from netmorph.checkpoint.training import load_state

        d = folder.step_dir(self.job.checkpoints, at)
        seq = json.loads(read_train(d)["meta"])["model"]["seq"]
        model = self.job.model if seq == self.job.model.seq else replace(self.job.model, seq=seq)
        return load_state(d, model, target, self.comm.rank)
