"""What an elastic member does around a change of view, for either job (:mod:`~netmorph.elastic.train`'s least
squares, :mod:`~netmorph.elastic.gpt`'s GPT): fence a member that hung, agree on the survivors after a loss, admit
joiners, be admitted -- torchelastic's agent and rendezvous handler, done by the members themselves."""

from __future__ import annotations

import time

from netmorph.elastic.detector import FixedTimeout, PhiAccrual
from netmorph.elastic.heartbeat import Monitor, fence
from netmorph.elastic.membership import agree_after_loss, fabric_dead
from netmorph.runtime.faults import Fault

HEARTBEAT = 0.05  # seconds between a worker's heartbeats
FINISHED = "netmorph/finished"  # the members trained every step: a worker still asking to join goes home


def arm_faults(comm, kill_at=None, hang_at=None):
    """``arm(done)``, called before step ``done`` runs: the kill (SIGKILL) or hang (a stop that never returns,
    its start posted for the detector's figures) set for that step, at this member's next communication call
    -- its first gradient bucket, mid-backward."""
    clock = getattr(comm, "clock", time.monotonic)

    def stamp(key):
        return lambda: comm.store.set(f"netmorph/{key}/{comm.slot}", repr(clock()))

    def arm(done):
        if done == kill_at:
            comm.faults.append(Fault("kill", comm.rank, comm.ops + 1, before=stamp("killed")))
        if done == hang_at:
            comm.store.set(f"netmorph/hung/{comm.slot}", repr(clock()))
            comm.faults.append(Fault("stop", comm.rank, comm.ops + 1, before=stamp("hung")))

    return arm


def dead_of(comm):
    """``dead(slot)``: the local fabric's dead flags, or a cluster's heartbeat verdicts (``comm.liveness``) by
    node: a worker of a node one of whose workers is dead is dead too -- its torchrun tears the node down, and a
    survivor must not agree on a view that holds half a node (half a tensor-parallel group)."""
    liveness = getattr(comm, "liveness", None)
    if liveness is None:
        return fabric_dead(comm)
    k = comm.placement.local_world

    def dead(slot):
        first = slot - slot % k
        return any(liveness.dead(s) for s in range(first, first + k))

    return dead


def fence_hung(comm, view, cfg, among=None):
    """After a timeout: watch the members' heartbeats (``among`` them, default all but us) with the
    detector (φ accrual, or a fixed timeout of four heartbeat intervals); those whose beats have
    stopped are hung -- SIGKILL them (fencing: a hung worker must not wake up inside the new view) and wait
    until the launcher has marked them dead. A member that is slow but still beating is left alone."""
    dead = dead_of(comm)
    peers = [m for m in (view.members if among is None else among) if m != comm.slot and not dead(m)]
    if cfg.detector == "phi":

        def make():
            return PhiAccrual(first_heartbeat_estimate=HEARTBEAT, min_std_deviation=HEARTBEAT / 2)
    else:

        def make():
            return FixedTimeout(4 * HEARTBEAT)

    mon = Monitor(comm.store, peers, make, interval=HEARTBEAT / 5)
    seen = mon.watch(10 * HEARTBEAT)
    mon.poll()  # hung: suspected in the window and still at its end -- a member
    still = set(mon.suspects())  # starved of the CPU for a moment beats again and is left alone
    hung = [p for p, t in seen.items() if t is not None and p in still]
    hung_at = [float(comm.store.get(f"netmorph/hung/{p}")) for p in hung if comm.store.check([f"netmorph/hung/{p}"])]
    fence(comm.store, hung)
    liveness = getattr(comm, "liveness", None)
    for p in hung if liveness is not None else ():
        liveness.mark(p)  # a cluster: the view fences whoever this host cannot kill
    deadline = time.monotonic() + cfg.timeout
    while not all(dead(p) for p in hung) and time.monotonic() < deadline:
        time.sleep(0.002)
    return min(hung_at) if hung_at else None


def admit(comm, rdzv, view, new, step, cfg, renumber=False, order=tuple):
    """Members at a join step: wait until the joiners are up, agree on the view with them and re-form (the
    caller hands them the state); ``order(members)`` numbers the new communicator (default: the view's order)."""
    deadline = time.monotonic() + cfg.timeout
    while not all(comm.store.check([f"netmorph/ready/{r}"]) for r in new):
        if time.monotonic() > deadline:
            raise TimeoutError(f"joiners {new} did not come up within {cfg.timeout:g} s")
        time.sleep(0.002)
    for r in new:
        rdzv.announce(r, view.epoch)
    agreed = rdzv.propose(view, candidates=new, first_step=step)
    comm.reform(order(agreed.members), agreed.epoch, renumber)
    return agreed


def admitted(comm, rdzv, cfg, join_step, renumber=False):
    """A joiner: say it is up, wait for a view that includes it, re-form (the members then hand it the state)."""
    comm.store.set(f"netmorph/ready/{comm.slot}", "1")
    deadline = time.monotonic() + cfg.timeout * (1 + join_step)
    while True:
        view = rdzv.current()
        if view is not None and comm.slot in view.members:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {comm.slot} was not admitted by step {join_step}")
        time.sleep(0.002)
    comm.reform(view.members, view.epoch, renumber)
    return view


def requested(comm, rdzv, cfg, view, order=tuple):
    """A worker nobody scheduled (a node torchrun restarted, a node started later): say it is up, ask to join after
    the current view -- again after each newer view that does not hold it -- and wait until one does, then re-form
    (the members hand it the state). Waits for as long as the run may last (the members admit at a step's end)."""
    comm.store.set(f"netmorph/ready/{comm.slot}", "1")
    comm.asked_at = getattr(comm, "started_at", None) or getattr(comm, "clock", time.monotonic)()
    asked = None
    deadline = time.monotonic() + cfg.timeout * (2 + cfg.steps)
    while comm.slot not in view.members:
        if comm.store.check([FINISHED]):
            return None  # the members finished before they could admit it
        if view.epoch != asked:
            rdzv.request(comm.slot, view.epoch)
            asked = view.epoch
        if time.monotonic() > deadline:
            raise TimeoutError(f"slot {comm.slot} asked to join and was not admitted")
        time.sleep(0.01)
        view = rdzv.current() or view
    comm.reform(order(view.members), view.epoch, renumber=True)
    return view


def agree(comm, rdzv, view, step, cfg):
    """After PeerLost: the survivors' view (:func:`~netmorph.elastic.membership.agree_after_loss`), a member that
    neither posts nor dies within ``timeout`` being hung -- the heartbeat detector fences it (:func:`fence_hung`)
    and it drops out. Never an error naming a survivor; too few members left is the rendezvous'
    :class:`MembershipError`. Returns (agreed view, are we ahead)."""
    dead = dead_of(comm)

    def fence(silent):
        fence_hung(comm, view, cfg, among=silent)
        return [m for m in silent if dead(m)]

    agreed = agree_after_loss(comm, rdzv, view, step, cfg.timeout, fence, dead)
    return agreed, step > agreed.first_step
