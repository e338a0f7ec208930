"""What a failed launch reports: each rank's failure as fields, and the root cause first.

torchrun's ``ChildFailedError`` and its per-rank ``ProcessFailure`` (rank, pid, exit code, the error file's
message and traceback) with what a torchrun user has to read off the log by hand as fields: which peer a
rank's error named (``blames``), whether the launcher ended it for going silent (``hung``) and whose timeout
found it (``detected_by``).
"""

from __future__ import annotations

import errno
import resource
import signal
from dataclasses import dataclass

from netmorph.errors import UsageError


@dataclass
class RankFailure:
    rank: int
    pid: int
    exitcode: int | None
    exc_type: str = ""
    message: str = ""
    traceback: str = ""
    when: float = 0.0
    blames: int | None = None  # the peer a PeerLost / PeerTimeout named (-1: unknown)
    hung: bool = False  # it stopped answering (alive, silent, or stopped) and the launcher ended it
    detected_by: int | None = None  # the rank whose timeout found it silent (None: the launcher's own grace)

    @property
    def consequence(self) -> bool:
        """True when this rank failed only because a peer did (PeerLost / PeerTimeout)."""
        return self.exc_type in ("PeerLost", "PeerTimeout")

    def describe(self) -> str:
        if self.hung:
            return f"rank {self.rank} (pid {self.pid}): {self.message}"
        if self.exc_type:
            return f"rank {self.rank} (pid {self.pid}): {self.exc_type}: {self.message}"
        if self.exitcode is not None and self.exitcode < 0:
            try:
                sig = signal.Signals(-self.exitcode).name
            except ValueError:
                sig = f"signal {-self.exitcode}"
            return f"rank {self.rank} (pid {self.pid}): killed by {sig} (exit code {self.exitcode})"
        return f"rank {self.rank} (pid {self.pid}): exited with code {self.exitcode} {self.message}".rstrip()


class LaunchError(RuntimeError):
    """One or more ranks failed; ``root`` is the first real failure, ``failures`` all of them."""

    def __init__(self, failures: list[RankFailure], world: int):
        self.failures = failures
        self.root = failures[0]
        self.rank = self.root.rank
        lines = [f"{len(failures)} of {world} ranks failed; root cause: {self.root.describe()}"]
        for f in failures[1:]:
            lines.append(f"  then {f.describe()}")
        if self.root.traceback:
            lines.append(f"traceback of rank {self.root.rank}:\n{self.root.traceback.rstrip()}")
        super().__init__("\n".join(lines))


def root_cause_first(failures: list[RankFailure]) -> list[RankFailure]:
    """Root cause first: real failures and silent ranks by the time they were found (a rank its peers found
    silent before another diagnosis came in is that diagnosis' cause; one the launcher terminated after a
    real failure is found later), then those that only lost a peer."""

    def key(f):
        # a rank that only read a mismatch another rank published: after the one that detected it
        echo = f.exc_type == "CollectiveMismatch" and f"rank {f.rank} is in" not in f.message
        return (f.consequence, echo, f.when, f.rank)

    fs = sorted(failures, key=key)
    if fs and fs[0].consequence:
        # everyone only saw a lost peer: the most-blamed rank is the root cause
        blamed = {}
        for f in fs:
            if f.blames is not None and f.blames >= 0:
                blamed[f.blames] = blamed.get(f.blames, 0) + 1
        if blamed:
            culprit = max(blamed, key=blamed.get)
            fs.sort(key=lambda f: (f.rank != culprit, f.when))
    return fs


def limit_error(e: OSError | MemoryError, world: int) -> UsageError | OSError:
    """A limit of this process that starting ``world`` ranks ran into, as one line naming it (the limit,
    its value, the shell command that raises it); any other OSError as it is."""

    def limit(which):
        soft = resource.getrlimit(which)[0]
        return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft:,}"

    code = getattr(e, "errno", None)
    if isinstance(e, MemoryError) or code == errno.ENOMEM:
        return UsageError(
            f"starting {world} ranks: the local fabric's shared mapping needs more address space than "
            f"this process may have (RLIMIT_AS {limit(resource.RLIMIT_AS)} B: raise ulimit -v, or run "
            f"fewer ranks)"
        )
    if code in (errno.EMFILE, errno.ENFILE):
        return UsageError(
            f"starting {world} ranks: out of file descriptors (RLIMIT_NOFILE "
            f"{limit(resource.RLIMIT_NOFILE)}: raise ulimit -n, or run fewer ranks)"
        )
    if code == errno.EAGAIN:
        return UsageError(
            f"starting {world} ranks: the system refused another process (RLIMIT_NPROC "
            f"{limit(resource.RLIMIT_NPROC)}: raise ulimit -u, or run fewer ranks)"
        )
    return e
