"""Start N ranks, run ``fn(comm)`` on each, gather results or root-cause the failure.

Stands in for ``torchrun`` / ``torch.multiprocessing.spawn``: ``launch(fn,
world=4)`` forks 4 processes, hands each a :class:`~netmorph.runtime.comm.Comm` and
returns their results in rank order. If any rank fails, it raises one
:class:`LaunchError` that names the root cause first -- the rank, its exit code
or exception and traceback -- as torchrun's ``ChildFailedError`` summary does.

Failure semantics. When a rank dies or raises, the launcher sets the fabric's
abort word at once, so every peer blocked in the fabric fails with
:class:`PeerLost` naming that rank within milliseconds; a rank that stops
answering (alive but silent) makes its peers fail with :class:`PeerTimeout`
after ``timeout`` seconds. Stragglers are then terminated. Child processes die
with the launcher (``PR_SET_PDEATHSIG``) and ignore Ctrl-C, which the launcher
turns into a clean shutdown; the shared mapping is anonymous, so no
``/dev/shm`` name survives any exit path.

What each forked rank runs -- its fork guard, its communicator, its report back -- is
:mod:`netmorph.runtime.rank`'s.

``backend="torch"`` runs the same schedules over torch.distributed (gloo on
loopback); :func:`netmorph.runtime.torchrun.init_from_env` joins a job started
by ``torchrun``. What a local launch exposes: nothing beyond this host. The
rendezvous is a ``FileStore`` in a private temporary directory (mode 0700,
removed on every exit path the launcher sees) instead of a TCPStore, which
listens on every interface whatever address it is given; gloo's own sockets are
bound to the loopback interface (``GLOO_SOCKET_IFNAME``, unless the user set it).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
import time
from multiprocessing.connection import wait as mp_wait

from netmorph.errors import UsageError
from netmorph.runtime import links
from netmorph.runtime.failure import LaunchError, RankFailure, limit_error, root_cause_first
from netmorph.runtime.ledger import Ledger
from netmorph.runtime.rank import child, warm_imports
from netmorph.runtime.result import LaunchResult
from netmorph.runtime.transport import CollectiveMismatch, FabricError, PeerLost, PeerTimeout, blame, fingerprint

BACKENDS = ("local", "torch", "torch-native")
TIMEOUT_RANGE = (0.1, 86400.0)  # seconds a rank may wait on a silent peer: every command's --timeout
MAX_EPOCHS = 16  # membership views an elastic launch can go through (channel sets reserved)


def launch(
    fn,
    world: int,
    *args,
    backend: str = "local",
    timeout: float = 10.0,
    faults=(),
    topology=None,
    slow_links=None,
    ledger: bool = False,
    arena_bytes: int | None = None,
    fingerprints: bool = True,
    elastic: bool = False,
    torch_group: bool = False,
    **kwargs,
):
    """Run ``fn(comm, *args, **kwargs)`` on ``world`` processes and return their results in rank order.

    ``timeout``: seconds a rank waits on a silent peer before failing with PeerTimeout.
    ``faults``: :class:`~netmorph.runtime.comm.Fault` list (kill / hang / raise / delay a rank at its k-th op).
    ``topology``: a two-level or flat :class:`~netmorph.cost.topology.Topology` (or preset name) to
    emulate per-link α and β on the local fabric; ``slow_links``: ``{(src, dst): (alpha_s, bytes_per_s)}``.
    Returns a :class:`LaunchResult`: the results in rank order, its ``ledger`` (with ``ledger=True``: every message
    of the run) and ``deaths``.
    ``arena_bytes``: each rank's registered memory on the local fabric (``comm.alloc``; rank 0's also
    holds ``comm.shared`` arrays); default min(1 GiB, 8 GiB / world), reserved, not committed.
    ``fingerprints``: every message carries its call's 64-byte fingerprint, checked on receipt
    (:class:`~netmorph.runtime.transport.fingerprint.CollectiveMismatch` instead of wrong data); off
    only to measure what the check costs.
    ``elastic=True`` (local fabric): a rank that dies does not end the launch -- every peer's pending
    call raises PeerLost once, and the survivors may agree on a new view (``comm.store``, a FileStore
    for :class:`netmorph.elastic.Rendezvous`) and ``comm.reform(members, epoch)``; ``comm.respawn(ranks)`` starts
    new processes in dead ranks' slots (their ``comm.joined`` is true: they hold nothing and re-form before they
    communicate). The results of ranks dead at the end are None; ``deaths`` is ``[(rank, monotonic time)]``.
    ``backend="job"``: this process is one rank of a job torchrun started (WORLD_SIZE must be ``world``):
    ``fn`` runs here, rank 0 gets the results gathered, the others None
    (:func:`netmorph.runtime.torchrun.run_in_job`).
    ``torch_group=True`` (local fabric): every rank also joins torch.distributed's default process group
    (gloo on loopback) -- for a baseline such as DDP run side by side with netmorph's own collectives.
    """
    if world < 1:
        raise UsageError(f"{{world}} must be >= 1, got {world}", "world")
    if backend == "job":  # this process is a rank of a torchrun job: the job's ranks are the run's
        if faults or topology is not None or slow_links or elastic or torch_group:
            raise UsageError(
                "fault injection and link emulation need ranks of netmorph's own launch, not a torchrun job's",
                "backend",
            )
        from netmorph.runtime.torchrun import run_in_job

        return run_in_job(fn, world, *args, timeout=timeout, ledger=ledger, **kwargs)
    if backend not in BACKENDS:
        raise UsageError(f"{{backend}} must be one of {', '.join(BACKENDS)}, got {backend!r}", "backend")
    if arena_bytes is not None and not 4096 <= arena_bytes <= 1 << 40:
        raise UsageError(f"{{arena_bytes}} must be in 4 KiB..1 TiB, got {arena_bytes}", "arena_bytes")
    lo, hi = TIMEOUT_RANGE
    if not (isinstance(timeout, (int, float)) and lo <= timeout <= hi):
        raise UsageError(f"{{timeout}} must be {lo:g}..{hi:g} seconds, got {timeout}", "timeout")
    if isinstance(topology, str):
        from netmorph.cost.topology import load_topology

        topology = load_topology(topology)
    if elastic and backend != "local":
        raise UsageError("elastic launches re-form the local fabric; use {backend} 'local'", "backend")
    if (topology is not None or slow_links) and backend != "local":
        raise UsageError("link emulation (topology=, slow_links=) needs {backend} 'local'", "backend")
    ctx = mp.get_context("fork")
    warm_imports()
    fabric = None
    if backend == "local":
        from netmorph.runtime.transport.shm import ShmFabric

        try:
            fabric = ShmFabric(world, arena_bytes=arena_bytes, epochs=MAX_EPOCHS if elastic else 1)
        except (OSError, MemoryError) as e:
            raise limit_error(e, world) from None
    link_cost = links.link_cost(topology, slow_links)
    procs, conns = [], {}
    store_dir = None
    try:
        if backend != "local" or elastic or torch_group:
            store_dir = tempfile.mkdtemp(prefix="netmorph-store-")
        if elastic or torch_group:  # torch.distributed imported once here, not by every forked rank
            importlib.import_module("torch.distributed")
        store = os.path.join(store_dir, "store") if store_dir else ""

        def start(r, joined=False):
            try:
                rd, wr = ctx.Pipe(duplex=False)
                p = ctx.Process(
                    target=child,
                    name=f"netmorph-rank{r}",
                    daemon=True,
                    args=(
                        r,
                        world,
                        fn,
                        args,
                        kwargs,
                        wr,
                        fabric,
                        backend,
                        timeout,
                        list(faults),
                        link_cost,
                        store,
                        ledger,
                        fingerprints,
                        elastic,
                        joined,
                        torch_group and backend == "local",
                    ),
                )
                p.start()
            except OSError as e:
                raise limit_error(e, world) from None
            wr.close()
            conns[rd] = r
            return p

        for r in range(world):
            procs.append(start(r))
        try:
            results, ledgers, failures, deaths, trails = _monitor(procs, conns, fabric, timeout, elastic, start)
        except OSError as e:
            raise limit_error(e, world) from None
        if not failures and fabric is not None and not elastic:
            failures = _unreceived(fabric, trails, procs)
    except BaseException:
        _kill_all(procs)
        raise
    finally:
        _kill_all(procs)
        for c in list(conns):
            c.close()
        if fabric is not None:
            fabric.close()
        if store_dir is not None:
            shutil.rmtree(store_dir, ignore_errors=True)
    if failures:
        raise LaunchError(root_cause_first(failures), world)
    return LaunchResult(results, Ledger.merge(ledgers) if ledger else None, deaths if elastic else ())


def _monitor(procs, conns, fabric, timeout, elastic=False, start=None):
    world = len(procs)
    deaths = []  # elastic: ranks that died, not failures of the launch
    results, ledgers, trails = [None] * world, [None] * world, [None] * world
    reported, exited = set(), set()
    failures: dict[int, RankFailure] = {}
    first_fail = None
    # after the first failure: the abort word reaches every rank in a call of the local fabric at once,
    # so a rank that has not reported within a second is hung or computing; torch's ranks find out
    # from their own timeouts or closed connections
    grace = 1.0 if fabric is not None else timeout + 2.0
    sentinels = {p.sentinel: r for r, p in enumerate(procs)}

    def take(r, msg, now):
        nonlocal first_fail
        if msg[0] == "respawn":  # elastic: new processes in dead ranks' slots, joining the job
            for j in msg[2]:
                if j in exited and fabric.dead[j] and start is not None:
                    fabric.revive(j)
                    del sentinels[procs[j].sentinel]
                    procs[j] = start(j, joined=True)
                    sentinels[procs[j].sentinel] = j
                    exited.discard(j)
            return
        reported.add(r)
        if msg[0] == "ok":
            results[r], ledgers[r], trails[r] = msg[2], msg[3], msg[4]
            return
        _, _, etype, text, tb, when, culprit = msg
        if r in failures and failures[r].exc_type:
            return
        failures[r] = RankFailure(r, procs[r].pid, procs[r].exitcode, etype, text, tb, when, culprit)
        if etype not in ("PeerLost", "PeerTimeout") and fabric is not None:
            fabric.abort(r)
        if etype == "PeerTimeout" and not elastic and culprit is not None and 0 <= culprit < world:
            _end_silent(procs, fabric, failures, culprit, r, timeout, now)
        first_fail = first_fail or now

    while len(exited) < world:
        waitables = list(conns) + [s for s, r in sentinels.items() if r not in exited]
        ready = mp_wait(waitables, timeout=0.2)
        now = time.monotonic()
        for obj in ready:
            if obj in conns:
                r = conns[obj]
                try:
                    msg = pickle.loads(obj.recv_bytes())
                except (EOFError, OSError):
                    del conns[obj]
                    continue
                take(r, msg, now)
            else:
                r = sentinels[obj]
                procs[r].join(2.0)  # the sentinel fires as the process exits; reap it for its exit code
                exited.add(r)
                code = procs[r].exitcode
                if elastic and code != 0 and r not in reported:
                    deaths.append((r, now))
                    fabric.mark_dead(r)
                    continue
                if code != 0 and r not in reported and r not in failures:  # a message may still follow
                    failures[r] = RankFailure(r, procs[r].pid, code, when=now)
                    if fabric is not None:
                        fabric.abort(r)
                    first_fail = first_fail or now
                elif r in failures:
                    failures[r].exitcode = code
        if first_fail is not None and now - first_fail > grace:
            for r, p in enumerate(procs):
                if r not in exited and p.is_alive() and r not in reported:
                    failures.setdefault(
                        r,
                        RankFailure(
                            r,
                            p.pid,
                            None,
                            "",
                            "stopped answering; terminated by the launcher after its peers gave up on it",
                            "",
                            now,
                            hung=True,
                        ),
                    )
            _kill_all(procs)
            break
    # messages that arrived just before exit
    for c, r in list(conns.items()):
        while c.poll():
            try:
                msg = pickle.loads(c.recv_bytes())
            except (EOFError, OSError):
                break
            take(r, msg, time.monotonic())
    dead = {r for r, _ in deaths}
    for r, p in enumerate(procs):  # gone without a word: exit code 0 before fn returned is a failure too
        if r not in reported and r not in failures and r not in dead:
            failures[r] = RankFailure(r, p.pid, p.exitcode, "", "before returning a result", when=time.monotonic())
    return results, ledgers, list(failures.values()), deaths, trails


def _end_silent(procs, fabric, failures, culprit: int, reporter: int, timeout: float, now: float) -> None:
    """A rank timed out and the wait-for chain ends at ``culprit``: it is the root cause. Say what its
    process was doing (stopped by SIGSTOP, hung), SIGKILL it -- SIGTERM would wait for a stopped process
    to be continued -- and tell every other rank through the abort word, so the launch ends now rather
    than after each rank's own timeout."""
    if culprit in failures and failures[culprit].exc_type:
        return
    if any(f.hung for f in failures.values()):
        return  # one silent rank found already: later timeouts saw its peers fail around it
    p = procs[culprit]
    state = blame.process_state(p.pid)
    why = blame.why_silent(state) if state else "it is hung or far slower than its peers"
    failures[culprit] = RankFailure(
        culprit,
        p.pid,
        None,
        "",
        f"stopped answering ({why}): rank {reporter} timed "
        f"out after {timeout:g} s waiting on it; the launcher killed it",
        "",
        now,
        hung=True,
        detected_by=reporter,
    )
    if p.is_alive():
        p.kill()
    if fabric is not None:
        fabric.abort(culprit, silent=True)


def _unreceived(fabric, trails, procs) -> list[RankFailure]:
    """Every rank returned: a message still in a channel was sent and never received -- its sender and
    receiver were in different calls (each of two ranks ``broadcast(x, src=own rank)``: both only send),
    or a send had no receive at all. One CollectiveMismatch per receiver, naming both calls."""
    out = {}
    for src, dst, head in fabric.leftovers():
        if dst in out:
            continue
        if head is None:
            text = f"rank {src} sent rank {dst} a message it never received (no fingerprint: run with fingerprints on)"
            out[dst] = RankFailure(
                dst, procs[dst].pid, procs[dst].exitcode, "CollectiveMismatch", text, when=time.monotonic(), blames=src
            )
            continue
        calls = (trails[dst] or {}).get(fingerprint.slot(head), {})
        err = CollectiveMismatch(dst, src, calls.get(int(head[1])), head, sent=True)
        out[dst] = RankFailure(
            dst, procs[dst].pid, procs[dst].exitcode, "CollectiveMismatch", str(err), when=time.monotonic(), blames=src
        )
    return list(out.values())


def _kill_all(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 1.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(10.0)  # SIGKILL always ends it; a big process on a busy machine takes a moment to go


__all__ = ["launch", "LaunchError", "RankFailure", "PeerLost", "PeerTimeout", "FabricError"]
