"""One forked rank of a local launch: the guards a fork after torch needs, its communicator, its report back.

What ``torch.multiprocessing.spawn``'s child does for each process it starts, for :func:`netmorph.runtime.launch.
launch`: :func:`child` builds the rank's :class:`~netmorph.runtime.comm.Comm` on the chosen transport (the
local shared-memory fabric, or torch.distributed over a private FileStore), runs ``fn(comm)`` and pipes back
its result, ledger and wait trail -- or, whatever it raised, the exception, its traceback and whom it blames --
to the launcher, which root-causes the failure.

Forking after torch is safe: every rank starts with one intra-op thread (torchrun's ``OMP_NUM_THREADS=1``), so
it never enters the OpenMP pool a parent that ran torch ops leaves behind in the fork -- a pool whose threads do
not exist in the child. A rank dies with its launcher (``PR_SET_PDEATHSIG``) and ignores Ctrl-C, which the
launcher turns into a clean shutdown.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import pickle
import signal
import sys
import time
import traceback

from netmorph.runtime.heap import freeze_heap
from netmorph.runtime.transport import FabricError


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _one_thread_per_rank() -> None:
    """The at-fork guard that makes forking after torch safe. A parent that ran any torch op has started
    OpenMP's thread pool; a forked child inherits its bookkeeping but not its threads, and its first
    parallel region then waits forever on threads that do not exist (libgomp is not fork-safe). One
    intra-op thread runs no parallel region, so the child never touches the dead pool. It is also what
    torchrun sets (``OMP_NUM_THREADS=1``) when it starts several ranks on one host: one process per core."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(1)


def child(
    rank,
    world,
    fn,
    args,
    kwargs,
    conn,
    fabric,
    backend,
    timeout,
    faults,
    link_cost,
    store,
    want_ledger,
    fingerprints,
    elastic,
    joined=False,
    torch_group=False,
):
    freeze_heap()
    _one_thread_per_rank()
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher handles Ctrl-C for everyone
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the launcher's terminate() ends a rank at once
    comm = None
    try:
        if backend == "local":
            from netmorph.runtime.comm import Comm
            from netmorph.runtime.transport.shm import ShmTransport

            comm = Comm(ShmTransport(fabric, rank, timeout, link_cost), rank, world, faults, fingerprints=fingerprints)
            if elastic:
                import torch.distributed as dist

                comm.store = dist.FileStore(store, -1)
                # a rank may ask the launcher to start new processes in dead ranks' slots (a node back); a rank so
                # started is ``joined``: it holds nothing and must re-form before it communicates
                comm.joined = joined
                comm.respawn = lambda ranks: conn.send_bytes(pickle.dumps(("respawn", rank, list(ranks))))
            if torch_group:
                from netmorph.runtime.torchrun import join_gloo

                join_gloo(rank, world, f"file://{store}", timeout)
        else:
            from netmorph.runtime.torchrun import gloo_on_loopback, init_torch

            gloo_on_loopback()
            comm = init_torch(
                rank,
                world,
                f"file://{store}",
                timeout,
                native=(backend == "torch-native"),
                faults=faults,
                fingerprints=fingerprints,
            )
        result = fn(comm, *args, **kwargs)
        finish = getattr(comm.transport, "finish", None)
        if finish is not None:  # on the wait board: returned, not hung
            finish()
        # plain pickle: multiprocessing's would hand torch tensors over as shared-memory handles
        conn.send_bytes(
            pickle.dumps(
                ("ok", rank, result, comm.ledger if want_ledger else None, getattr(comm.transport, "trail", None))
            )
        )
        if backend != "local":
            comm.transport.close()
        elif torch_group:
            from netmorph.runtime.transport.tensors import dist_module

            dist_module().destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the launcher
        try:
            culprit = e.rank if isinstance(e, FabricError) else None  # whom this rank blames
            conn.send_bytes(
                pickle.dumps(("err", rank, type(e).__name__, str(e), traceback.format_exc(), time.monotonic(), culprit))
            )
        except Exception:  # the pipe itself is gone: the exit code will tell
            pass
        os._exit(1)
    finally:
        conn.close()


def warm_imports() -> None:
    """Import once, before the fork, what torch imports lazily inside every rank: autograd's first backward
    from a given gradient (a pipeline stage's ``out.backward(g)``) imports its symbolic-shape machinery and
    sympy, 0.6 s of one core in each rank that would otherwise pay it (forkserver's ``preload``, by hand)."""
    if sys.modules.get("torch") is not None:  # imported, and not blocked (None)
        importlib.import_module("torch.fx.experimental.symbolic_shapes")
