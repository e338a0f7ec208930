"""Membership views with epochs, agreed through a store: who is in the job from which step on.

Stands in for the state torch's c10d rendezvous keeps in its store (a round number,
the participants, a last-call window for late joiners, ``compare_set`` so that
exactly one writer's state wins). A :class:`View` is ``(epoch, members, first_step)``; its members' order is
the rank order of a renumbered communicator (the survivors keep theirs, joiners come after them).

The agreement rule, the one thing every member must apply identically:

    the view of epoch e + 1 is the first proposal written to ``netmorph/view/<e+1>``;
    a proposal is written with ``compare_set(key, "", proposal)``, so exactly one
    wins, and every member -- the losers included -- adopts the stored view, never
    its own proposal.

Two survivors that suspect each other at the same moment both propose; one
proposal lands; both adopt it (and the member it excluded learns it is out). No
split brain. A proposal drops the ranks its proposer suspects and adds the
workers that announced themselves (:meth:`Rendezvous.announce`) before the last
call closed; a view smaller than ``min_workers`` is refused with
:class:`MembershipError` (the job ends with that as its root cause).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

VIEW = "netmorph/view/{}"
JOIN = "netmorph/join/{}"
REQUESTS = "netmorph/join/{}/requests"
LATEST = "netmorph/view/latest"
PROGRESS = "netmorph/progress/{}/{}"  # epoch, rank: the steps that member completed before the loss


class MembershipError(RuntimeError):
    """The members fell below ``min_workers``, or a rank acted outside the view."""


@dataclass(frozen=True)
class View:
    epoch: int
    members: tuple
    first_step: int

    def to_json(self) -> str:
        return json.dumps([self.epoch, list(self.members), self.first_step])

    @classmethod
    def from_json(cls, text) -> View:
        epoch, members, first = json.loads(text)
        return cls(int(epoch), tuple(int(m) for m in members), int(first))


class Rendezvous:
    def __init__(self, store, min_workers: int = 1, max_workers: int = 1 << 16, last_call: float = 0.0):
        if not 1 <= min_workers <= max_workers:
            raise ValueError(f"need 1 <= min_workers <= max_workers, got {min_workers}, {max_workers}")
        self.store, self.min_workers, self.max_workers, self.last_call = store, min_workers, max_workers, last_call

    def start(self, members, first_step: int = 0) -> View:
        """Epoch 0: the launch's members (every rank calls it; the first write wins, as always)."""
        return self._agree(View(0, tuple(sorted(members)), first_step))

    def current(self) -> View | None:
        """The newest agreed view, or None before :meth:`start`."""
        if not self.store.check([LATEST]):
            return None
        return self._stored(int(self.store.get(LATEST)))

    def view(self, epoch: int) -> View:
        """The agreed view of ``epoch``."""
        return self._stored(epoch)

    def announce(self, rank: int, epoch: int) -> None:
        """A worker asks to join the view after ``epoch``."""
        self.store.set(JOIN.format(epoch) + f"/{rank}", "1")

    def joiners(self, epoch: int, candidates) -> list:
        return [r for r in candidates if self.store.check([JOIN.format(epoch) + f"/{r}"])]

    def request(self, rank: int, epoch: int) -> None:
        """A worker nobody scheduled asks to join after ``epoch`` (a node back, a node added): announced, and
        listed in arrival order so the members can find it (a store has no listing of its keys)."""
        self.announce(rank, epoch)
        i = self.store.add(REQUESTS.format(epoch), 1)
        self.store.set(REQUESTS.format(epoch) + f"/{i}", str(rank))

    def requests(self, epoch: int, first: int | None = None) -> list:
        """The workers that asked to join after ``epoch``, in arrival order (the first ``first`` of them)."""
        key = REQUESTS.format(epoch)
        n = int(self.store.add(key, 0)) if first is None else first
        return [int(self.store.get(f"{key}/{i}")) for i in range(1, n + 1)]

    def propose(self, after: View, suspects=(), candidates=(), first_step: int | None = None) -> View:
        """The next view after ``after``: its members minus ``suspects`` plus the announced joiners among
        ``candidates`` (waiting ``last_call`` seconds for late ones). Returns the *agreed* view of epoch
        ``after.epoch + 1`` -- this proposal or the one that landed first."""
        if self.last_call and candidates:
            time.sleep(self.last_call)
        joined = self.joiners(after.epoch, candidates)
        # the survivors in their order, the joiners after them (a renumbered communicator's ranks: ncclCommGrow)
        members = (
            tuple(m for m in after.members if m not in set(suspects)) + tuple(sorted(set(joined) - set(after.members)))
        )[: self.max_workers]
        step = after.first_step if first_step is None else first_step
        return self._agree(View(after.epoch + 1, members, step))

    def _agree(self, proposal: View) -> View:
        key = VIEW.format(proposal.epoch)
        stored = self.store.compare_set(key, "", proposal.to_json())
        view = View.from_json(stored.decode() if isinstance(stored, bytes) else stored)
        self._advance_latest(view.epoch)
        if len(view.members) < self.min_workers:
            raise MembershipError(
                f"epoch {view.epoch}: {len(view.members)} member(s) {list(view.members)}, "
                f"fewer than min_workers {self.min_workers}"
            )
        return view

    def _stored(self, epoch: int) -> View:
        return View.from_json(self.store.get(VIEW.format(epoch)).decode())

    def _advance_latest(self, epoch: int) -> None:
        """``latest`` only moves forward (compare_set until it is at least ``epoch``)."""
        while True:
            cur = self.store.get(LATEST).decode() if self.store.check([LATEST]) else ""
            if cur and int(cur) >= epoch:
                return
            got = self.store.compare_set(LATEST, cur, str(epoch))
            got = got.decode() if isinstance(got, bytes) else got
            if int(got) >= epoch:
                return


def fabric_dead(comm):
    """The local fabric's dead flags (the launcher marks a rank as its process goes), as ``dead(slot)``."""
    f = comm.transport.f
    return lambda r: bool(f.dead[r])


def agree_after_loss(comm, rdzv: Rendezvous, view: View, step: int, timeout: float, on_silent, dead=None) -> View:
    """After a member is lost (``PeerLost`` on an elastic launch): post the steps this rank completed, wait for
    every surviving member's, and propose the view without the dead, resuming at the fewest steps any survivor
    completed. Returns the *agreed* view (:meth:`Rendezvous.propose`).

    Who survives is read again on every look (``dead(slot)``: the fabric's dead flags by default, a cluster's
    heartbeat verdicts): members killed in the same step die a few milliseconds apart, and the launcher marks each
    as its process goes -- a member that dies while we wait drops out of the wait. One that neither posts nor dies
    within ``timeout`` is silent: ``on_silent(silent)`` decides -- it returns the members it fenced (they drop out
    too; the wait starts over) or raises."""
    dead_of = dead or fabric_dead(comm)
    nxt = view.epoch + 1
    comm.store.set(PROGRESS.format(nxt, comm.slot), str(step))
    done, fenced = {}, set()
    deadline = time.monotonic() + timeout
    while True:
        dead = {r for r in view.members if dead_of(r)} | fenced
        alive = [m for m in view.members if m not in dead]
        for m in alive:
            key = PROGRESS.format(nxt, m)
            if m not in done and comm.store.check([key]):
                done[m] = int(comm.store.get(key))
        if all(m in done for m in alive):
            break
        if time.monotonic() > deadline:
            fenced |= set(on_silent([m for m in alive if m not in done]))
            deadline = time.monotonic() + timeout
        time.sleep(0.002)
    return rdzv.propose(view, suspects=dead, first_step=min(done[m] for m in alive))
