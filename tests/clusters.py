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
