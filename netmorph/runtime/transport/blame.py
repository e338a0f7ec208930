"""Who is to blame when a rank times out: the wait-for chain, walked.

Stands in for what torch's flight recorder analysis (``torch.distributed.flight_recorder``,
the ``fr_trace`` tool) does after an NCCL watchdog timeout: read the call every rank
was in and whom it waited for, and find the rank the others wait on. Here each rank
says where it can be read (the local fabric's mapping as it goes to sleep; the job's
store as it times out) which call it is in and which peer it waits for, and the
rank that times out follows the chain from the peer it waited for:

- the chain ends at a rank in no communication call, or one whose process is
  stopped: that rank is hung (SIGSTOP, a loop in compute, far slower than its peers)
  and is the root cause -- :class:`PeerTimeout` names it, not the neighbour that
  happened to be waited on;
- two ranks next to each other on the chain are in the same group at the same call
  index with different fingerprints: they disagree on the call --
  :class:`~netmorph.runtime.transport.fingerprint.CollectiveMismatch`. Ranks in
  different groups, or at different calls of one group, only wait on each other;
- the chain comes back to a rank already on it: every rank of the cycle waits for
  the next and none can move (two sends to each other, with no receive) --
  :class:`Deadlock`, naming the cycle.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np

from netmorph.runtime.transport.errors import FabricError, PeerTimeout
from netmorph.runtime.transport.fingerprint import CollectiveMismatch, conflict, describe

# what a waiting rank waits for from its peer
WHAT = ("no data arrived", "its send was not received", "no message from any of the ranks")


class Waiting:
    """What a rank is blocked in: its call's fingerprint (None without fingerprints), the peer it waits
    for (-1: any) and what it waits for (an index into :data:`WHAT`)."""

    __slots__ = ("fp", "peer", "what")

    def __init__(self, fp, peer: int, what: int):
        self.fp = None if fp is None else np.asarray(fp, dtype=np.int64)
        self.peer, self.what = int(peer), int(what)


class Deadlock(FabricError):
    """Every rank on a cycle waits for the next, each in a call the next is not in -- not a hung rank,
    not a mismatch (a send/send deadlock: two ranks each send to the other, neither receives)."""

    def __init__(self, cycle: list[tuple[int, Waiting]]):
        self.cycle = [r for r, _ in cycle]
        self.rank = cycle[0][1].peer  # whom the reporting rank blames: the next on the cycle
        links = [f"rank {r} waits for rank {w.peer} in {_call(w)} ({WHAT[w.what]})" for r, w in cycle]
        super().__init__("deadlock: " + "; ".join(links) + " -- none can move until another does")


def _call(w: Waiting) -> str:
    if w.fp is None:
        return "an unfingerprinted call"
    text = describe(w.fp)
    if text.startswith("send/recv("):  # a point-to-point message: say which end this is
        text = ("send" if w.what == 1 else "recv") + text[len("send/recv") :]
    return text


def _stat(pid) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (state, parent pid, ...), or [] where it
    cannot be read (not Linux, gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``R`` running, ``S`` sleeping, ``T`` stopped, ``Z``
    zombie), or ``""`` where it cannot be read (not Linux, gone)."""
    fields = _stat(pid) if pid > 0 else []
    return fields[0] if fields else ""


def child_pids(pid: int) -> list[int]:
    """The live (not zombie) children of ``pid``, as Linux's /proc shows them: a launch's ranks, for a
    tool or a test that stops or kills one from outside. [] where /proc cannot be read."""
    try:
        entries = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return []
    out = []
    for d in entries:
        fields = _stat(d)
        if len(fields) > 1 and fields[1] == str(pid) and fields[0] != "Z":
            out.append(int(d))
    return sorted(out)


def stop_rank(pid: int, world: int, index: int, after: float, wait: float = 60.0) -> int | None:
    """``kill -STOP`` one rank of a running launch from outside, as a user or a debugger would: once all
    ``world`` ranks of the launcher ``pid`` are up (at most ``wait`` seconds), ``after`` seconds later,
    the rank ``index`` of them in pid order. Its pid, or None when they never all came up (the launcher
    exited, or /proc cannot be read)."""
    deadline = time.monotonic() + wait
    while len(child_pids(pid)) < world and process_state(pid) not in ("", "Z") and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(after)
    ranks = child_pids(pid)
    if len(ranks) < world:
        return None
    os.kill(ranks[index], signal.SIGSTOP)
    return ranks[index]


# process states of a rank whose posted wait is stale: stopped, exited (a zombie, or gone: "gone"), returned
SILENT = ("T", "t", "Z", "X", "gone", "returned")


def why_silent(state: str) -> str:
    """Words for a silent rank from its process state (``"returned"``: its function returned; ``"gone"``:
    no such process any more)."""
    if state == "returned":
        return "it returned from its function without sending what its peers wait for"
    if state == "T" or state == "t":
        return "its process is stopped (SIGSTOP)"
    if state in ("Z", "X", "gone"):
        return "its process has exited"
    return "it is in no communication call: hung, or far slower than its peers"


def walk(
    me: int, mine: Waiting, seconds: float, wait_of, state_of=lambda r: "", settle: float = 0.0, stopped=lambda: ()
) -> FabricError:
    """The error rank ``me`` raises when its wait ``mine`` timed out after ``seconds``.

    ``wait_of(rank)``: that rank's :class:`Waiting`, or None when it is in no communication call (or
    cannot say); ``state_of(rank)``: its process's :func:`process_state` (a stopped rank's posted
    wait is stale: it is the silent one, whatever it last said). A rank the chain reaches between two
    calls (running: on a busy machine it may be slow to get to its next wait) is given up to ``settle``
    seconds, over the whole walk, to post one. ``stopped()``: the ranks whose processes are stopped --
    when the chain ends at a rank that is running, one of those is the cause, not it."""
    chain = [(me, mine)]
    seen = {me}
    peer = mine.peer
    deadline = time.monotonic() + settle

    def silent(r):  # its posted wait (if any) no longer means anything
        return state_of(r) in SILENT

    while peer >= 0:
        theirs = None if silent(peer) else wait_of(peer)
        while theirs is None and not silent(peer) and time.monotonic() < deadline:
            time.sleep(0.01)
            theirs = wait_of(peer)
        if theirs is None:
            break  # the end of the chain: the silent rank
        prev_rank, prev = chain[-1]
        if prev.fp is not None and theirs.fp is not None and conflict(prev.fp, theirs.fp):
            return CollectiveMismatch(prev_rank, peer, prev.fp, theirs.fp, sent=False)
        chain.append((peer, theirs))
        if theirs.peer in seen:  # back on the chain: a cycle
            start = next(i for i, (r, _) in enumerate(chain) if r == theirs.peer)
            first_rank, first = chain[start]
            if theirs.fp is not None and first.fp is not None and conflict(theirs.fp, first.fp):
                return CollectiveMismatch(peer, first_rank, theirs.fp, first.fp, sent=False)
            return Deadlock(chain[start:])
        seen.add(peer)
        peer = theirs.peer
    root = peer if peer >= 0 else mine.peer
    via = ""
    if len(chain) > 1:
        hops = ", ".join(f"rank {r} waits for rank {w.peer} in {_call(w)}" for r, w in chain[1:])
        via = f"; {hops}"
    if root >= 0 and not silent(root):
        frozen = [r for r in stopped() if r != me]
        if frozen:  # the chain ends at a rank still running: a stopped
            via += f"; rank {root} is running, but rank {frozen[0]}'s process is stopped"  # one is the cause
            root = frozen[0]
    return PeerTimeout(
        root,
        seconds,
        WHAT[mine.what],
        waited_for=mine.peer,
        via=via,
        why=why_silent(state_of(root)) if root >= 0 else "none of them sent anything",
    )


__all__ = ["Deadlock", "Waiting", "walk", "process_state", "child_pids", "stop_rank", "why_silent", "WHAT"]
