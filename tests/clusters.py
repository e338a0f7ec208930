"""Helpers of the cluster tests: ``netmorph launch`` run as a user runs it, and what a run may leave behind."""

import os
import signal
import subprocess
import sys
import tempfile

import pytest


def leftovers(before_tmp):
    tmp = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(("netmorph-launch-", "torchelastic_"))}
    return sorted(tmp - before_tmp)


def temporaries():
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(("netmorph-launch-", "torchelastic_"))}


def netmorph_processes():
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "netmorph" in cmd and ("--lighthouse" in cmd or "lighthouse --port" in cmd):
                out.append((int(pid), cmd[:120]))
    return out


def launch_cli(argv, timeout=200):
    """``netmorph launch ARGV`` as a user runs it; past ``timeout`` it gets SIGTERM (which stops every job it
    started) before the test fails, so a hung run leaves nothing behind."""
    p = subprocess.Popen([sys.executable, "-m", "netmorph", "launch", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        pytest.fail(f"launch {' '.join(argv)} ran past {timeout} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)
