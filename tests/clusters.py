"""Helpers of the cluster tests: ``netmorph launch`` run as a user runs it, and what a run may leave behind."""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

# the temporary folder of every launch these tests start (TMPDIR), this test process's own: what one test leaves
# is not confused with what a test running beside it (pytest -n) has in flight
ROOT = tempfile.mkdtemp(prefix="netmorph-cluster-tests-")
ENV = {**os.environ, "TMPDIR": ROOT}
atexit.register(shutil.rmtree, ROOT, True)


def temporaries():
    return {n for n in os.listdir(ROOT) if n.startswith(("netmorph-launch-", "torchelastic_", ".netmorph-"))}


def leftovers(before_tmp):
    return sorted(temporaries() - before_tmp)


def netmorph_processes():
    """The lighthouses and cluster workers still running that this test process's launches started (their TMPDIR
    is under ROOT: a launch beside it in another test process is not ours)."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    env = dict(kv.split(b"=", 1) for kv in fh.read().split(b"\0") if b"=" in kv)
            except OSError:
                continue
            ours = env.get(b"TMPDIR", b"").decode(errors="replace").startswith(ROOT)
            if ours and "netmorph" in cmd and ("--lighthouse" in cmd or "lighthouse --port" in cmd):
                out.append((int(pid), cmd[:120]))
    return out


def launch_cli(argv, timeout=200):
    """``netmorph launch ARGV`` as a user runs it; past ``timeout`` it gets SIGTERM (which stops every job it
    started) before the test fails, so a hung run leaves nothing behind."""
    p = subprocess.Popen(
        [sys.executable, "-m", "netmorph", "launch", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        pytest.fail(f"launch {' '.join(argv)} ran past {timeout} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def spawn_ranks(target, world: int, results: int, timeout: float = 60) -> list:
    """``target(rank, world, store_path, queue)`` in ``world`` spawned processes meeting at a FileStore in a
    temporary folder: the first ``results`` items they put on the queue. Every process is reaped on any exit."""
    import multiprocessing as mp
    from multiprocessing import resource_tracker

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = []
    try:
        with tempfile.TemporaryDirectory() as d:
            procs = [ctx.Process(target=target, args=(r, world, os.path.join(d, "store"), q)) for r in range(world)]
            for p in procs:
                p.start()
            got = [q.get(timeout=timeout) for _ in range(results)]
            for p in procs:
                p.join(30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        q.close()
        q.join_thread()
        del q
        # the spawn Queue's semaphore started multiprocessing's resource tracker, a child of this test process
        # for the rest of its life: stopped here (as CPython's own tests do), so a later test's leak check that
        # counts this process's children sees only its own
        resource_tracker._resource_tracker._stop()
    return got
