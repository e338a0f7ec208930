"""Emulated nodes on one box: the lighthouse and one torchrun job per node on 127.0.0.1 (``netmorph launch``).

What a cluster runs -- ``netmorph lighthouse --port P`` on one host and on each node ``torchrun --nproc-per-node K
--max-restarts R -m netmorph SUBCOMMAND ... --lighthouse HOST:P --node-index I --nodes N`` -- started here: the
lighthouse's store served by the launch itself (the same TCPStore server ``netmorph lighthouse`` runs, one
interpreter fewer on a small box), and each torchrun job a process in its own session (its workers with it),
its temporary files (torchrun's
``torchelastic_*`` logs) in a folder of the launch's, removed on every exit path. A node given a join step
starts once the job has done that many steps (the members' progress in the lighthouse). SIGINT and SIGTERM reach
every job; whatever is still running at the end is stopped. Every node's output is the launch's, as mpirun
forwards every rank's: only the job's rank 0 prints (node 0's local rank 0, unless the run lost node 0), and
the job's exit code is the one that rank reports through the lighthouse (:data:`EXIT`) once it has printed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from netmorph.elastic.lighthouse import EXIT, listen
from netmorph.errors import UsageError

NO_RESULT = 1  # the job's code when every node ended and no worker reported one


def free_port(port: int = 0, host: str = "127.0.0.1") -> int:
    """``port`` if it can be listened on (0: any free one); UsageError naming ``port`` otherwise."""
    s = socket.socket()
    try:
        s.bind((host, port))
        return s.getsockname()[1]
    except OSError as e:
        raise UsageError(
            f"{{port}} {port} is in use on {host} ({e.strerror}); pick another or leave it out", "port"
        ) from None
    finally:
        s.close()


def descendants(pid: int) -> list:
    """Every process below ``pid`` (children's children too), from /proc."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
                out += kids
                todo += kids
        except OSError:
            continue
    return out


def kill_tree(pid: int, sig) -> None:
    """``sig`` to ``pid`` and every process below it (the tree read first, so none escapes as an orphan)."""
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


@dataclass
class Plan:
    """What to start: ``nodes`` torchrun jobs of ``nproc`` workers, each running ``netmorph argv``."""

    nodes: int
    nproc: int
    argv: list
    max_restarts: int = 0
    joins: dict = field(default_factory=dict)  # node -> the step it starts at
    port: int = 0
    host: str = "127.0.0.1"

    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def node_argv(self, node: int) -> list:
        late = [a for n in sorted(self.joins) for a in ("--late-node", str(n))]
        return [
            *self.argv,
            "--lighthouse",
            self.address(),
            "--node-index",
            str(node),
            "--nodes",
            str(self.nodes),
            *late,
        ]

    def torchrun(self, node: int) -> list:
        return [
            "torchrun",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(self.nproc),
            "--max-restarts",
            str(self.max_restarts),
            "-m",
            "netmorph",
            *self.node_argv(node),
        ]

    def commands(self) -> list:
        """The per-node command lines a cluster would run (the lighthouse's first)."""
        out = [f"netmorph lighthouse --port {self.port}"]
        for n in range(self.nodes):
            when = f"  # once the job has done {self.joins[n]} steps" if n in self.joins else ""
            out.append(f"node {n}: " + " ".join(self.torchrun(n)) + when)
        return out


class Cluster:
    """The running processes of a :class:`Plan`; a context manager that stops them all on the way out."""

    def __init__(self, plan: Plan, stdout=None):
        self.plan, self.stdout = plan, stdout
        self.tmp = tempfile.mkdtemp(prefix="netmorph-launch-")
        self.lighthouse = None  # the lighthouse's TCPStore server, in this process (lighthouse.listen)
        self.jobs: dict[int, subprocess.Popen] = {}
        self.logs: dict[int, str] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.env = {
            **os.environ,
            "TMPDIR": self.tmp,
            "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),
            # the printer may move to a survivor mid-run: each line out as it is printed, so that the lines of a
            # rank 0 SIGKILLed with its node are not lost in its buffer and the next rank 0's follow them in order
            "PYTHONUNBUFFERED": "1",
        }
        self.reported: str | None = None  # why wait() ended without a code reported, for the caller's line

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        p = self.plan
        self.lighthouse = listen(p.port, p.host)  # listening once it returns
        for n in range(p.nodes):
            if n not in p.joins:
                self.start_node(n)
        if p.joins:
            threading.Thread(target=self._late_nodes, daemon=True, name="netmorph-late-nodes").start()

    def start_node(self, node: int) -> None:
        with self.lock:
            if self.stopping.is_set() or node in self.jobs:
                return
            log = os.path.join(self.tmp, f"node{node}.err")
            self.logs[node] = log
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                *self.plan.torchrun(node)[3:],
            ]  # torchrun's own flags and the command, without "torchrun --nnodes 1"
            with open(log, "w") as err:
                self.jobs[node] = subprocess.Popen(
                    cmd,
                    stdout=self.stdout,  # only the job's rank 0 prints, wherever it runs
                    stderr=err,
                    env=self.env,
                    start_new_session=True,
                )

    def _late_nodes(self) -> None:
        """Start each late node once the job has done its join step (or at once if the job is already past it)."""
        from netmorph.elastic.gpt import PROGRESS
        from netmorph.elastic.lighthouse import LighthouseStore

        store = LighthouseStore(self.plan.host, self.plan.port, 30.0)
        waiting = dict(self.plan.joins)
        while waiting and not self.stopping.is_set():
            done = int(store.get(PROGRESS)) if store.check([PROGRESS]) else 0
            for node, step in list(waiting.items()):
                if done >= step:
                    self.start_node(node)
                    del waiting[node]
            time.sleep(0.02)

    def signal_all(self, sig) -> None:
        """``sig`` to every job's whole process tree (torchrun starts its workers in sessions of their own, so a
        signal to its group would miss them)."""
        for proc in self.jobs.values():
            kill_tree(proc.pid, sig)

    def kill_node(self, node: int) -> None:
        """SIGKILL node ``node``'s torchrun and all its workers at once: the node is gone, no agent restarts it."""
        kill_tree(self.jobs[node].pid, signal.SIGKILL)

    def wait(self, timeout: float) -> int:
        """The job's exit code once it is done: the code its rank 0 reported through the lighthouse (:data:`EXIT`)
        after printing the result -- node 0's local rank 0, or a survivor's where the run lost node 0 -- the other
        nodes then given 30 s more to finish. A job that ends with no code reported (every node exited, or the
        lighthouse is gone) is node 0's exit code if it failed, else the first failed node's, else
        :data:`NO_RESULT`; :attr:`reported` then says which."""
        from netmorph.elastic.lighthouse import LighthouseStore

        deadline = time.monotonic() + timeout
        store = LighthouseStore(self.plan.host, self.plan.port, 30.0)
        code = None
        while code is None:
            try:
                if store.check([EXIT]):
                    code = int(store.get(EXIT))
                    break
            except (ConnectionError, RuntimeError):
                pass  # the lighthouse went away: the nodes' exits say how the job ended
            with self.lock:
                jobs = dict(self.jobs)
            if all(p.poll() is not None for p in jobs.values()):  # a late node not started yet: never, now
                self.stopping.set()
                code = self._fallback()
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the job did not finish within {timeout:g} s")
            time.sleep(0.05)
        rest = time.monotonic() + 30.0
        while any(p.poll() is None for p in self.jobs.values()) and time.monotonic() < rest:
            time.sleep(0.05)
        return code

    def failed(self) -> list:
        """(node, exit code) of every node that exited non-zero, node 0's first."""
        with self.lock:
            jobs = sorted(self.jobs.items())
        return [(n, p.returncode) for n, p in jobs if p.returncode]

    def _fallback(self) -> int:
        """The job's code when every node ended without one reported: the first failure, node 0's first."""
        failed = self.failed()
        if failed:
            self.reported = f"node {failed[0][0]} exited with {failed[0][1]}"
            return failed[0][1]
        self.reported = "every node exited and no worker reported the job's result"
        return NO_RESULT

    def tail(self, node: int, lines: int = 20) -> str:
        """The last lines a node's job wrote -- its workers', before torchrun's own traceback (ChildFailedError
        says only that a worker failed; the worker's exception is above it)."""
        try:
            with open(self.logs[node]) as fh:
                text = [ln for ln in fh.read().splitlines() if ln.strip() and not ln.startswith(("W1", "I1"))]
        except (KeyError, OSError):
            return ""
        agent = [i for i in range(len(text) - 1) if text[i].startswith("Traceback") and "torchrun" in text[i + 1]]
        if agent and agent[-1] > 0:
            text = text[: agent[-1]]
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        """Every job stopped (SIGTERM, then SIGKILL), then the lighthouse, the temporary folder removed."""
        self.stopping.set()
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        procs = list(self.jobs.values())
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.signal_all(signal.SIGKILL)
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self.lighthouse = None  # the server's last reference: it stops listening
        shutil.rmtree(self.tmp, ignore_errors=True)
