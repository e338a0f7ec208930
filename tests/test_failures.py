"""Failure semantics on real processes: a dead or silent rank is named, fast; nothing leaks."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from netmorph.runtime import Fault
from netmorph.runtime.launch import LaunchError, launch

pytestmark = pytest.mark.timeout(90)


def _children_of(pid):
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid and fields[0] != "Z":
                    kids.append(int(d))
            except (OSError, IndexError):
                pass
    return kids


@pytest.fixture
def no_leaks():
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    yield
    deadline = time.time() + 5
    while _children_of(os.getpid()) and time.time() < deadline:
        time.sleep(0.05)
    assert _children_of(os.getpid()) == [], "child processes outlived launch()"
    if os.path.isdir("/dev/shm"):
        assert set(os.listdir("/dev/shm")) - shm_before == set(), "shared memory segment left behind"


def _loop(comm, n_ops):
    x = np.ones(1000, np.float32)
    for _ in range(n_ops):
        comm.all_reduce(x, algo="ring")
    return float(x[0])


def test_killed_rank_is_named_and_peers_fail_fast(no_leaks):
    t0 = time.time()
    with pytest.raises(LaunchError) as e:
        launch(_loop, 4, 50, faults=[Fault("kill", rank=1, at_op=3)], timeout=30)
    elapsed = time.time() - t0
    err = e.value
    assert err.rank == 1 and "SIGKILL" in str(err).splitlines()[0]
    assert {f.rank for f in err.failures} == {0, 1, 2, 3}
    assert all(f.exc_type == "PeerLost" and "rank 1" in f.message for f in err.failures[1:])
    assert all(f.blames == 1 for f in err.failures[1:])           # the culprit travels as a field
    assert elapsed < 10, f"peers took {elapsed:.1f} s to notice (timeout was 30 s: the abort word must beat it)"


def test_silent_rank_times_out_naming_it(no_leaks):
    t0 = time.time()
    with pytest.raises(LaunchError) as e:
        launch(_loop, 3, 50, faults=[Fault("hang", rank=2, at_op=2)], timeout=1.0)
    assert time.time() - t0 < 8
    assert e.value.rank == 2
    assert any(f.exc_type == "PeerTimeout" and "rank 2" in f.message for f in e.value.failures)


def _bad(comm):
    if comm.rank == 2:
        return {}["missing"]
    return _loop(comm, 5)


def test_exception_traceback_reaches_the_caller(no_leaks):
    with pytest.raises(LaunchError) as e:
        launch(_bad, 3, timeout=10)
    msg = str(e.value)
    assert msg.splitlines()[0].endswith("rank 2 (pid %d): KeyError: 'missing'" % e.value.root.pid)
    assert "traceback of rank 2" in msg and "_bad" in msg


def test_injected_exception_and_delay(no_leaks):
    with pytest.raises(LaunchError, match="injected fault on rank 0 at op 2"):
        launch(_loop, 2, 5, faults=[Fault("raise", rank=0, at_op=2)], timeout=10)
    t0 = time.time()
    assert launch(_loop, 2, 3, faults=[Fault("delay", rank=1, at_op=2, seconds=0.5)], timeout=10) == [8.0, 8.0]
    assert time.time() - t0 >= 0.5


def test_torch_backend_dead_peer(no_leaks):
    t0 = time.time()
    with pytest.raises(LaunchError) as e:
        launch(_loop, 3, 50, backend="torch", faults=[Fault("kill", rank=0, at_op=4)], timeout=20)
    assert e.value.rank == 0 and "SIGKILL" in str(e.value)
    assert time.time() - t0 < 30


def test_bad_arguments():
    from netmorph.errors import UsageError
    with pytest.raises(UsageError, match="world"):
        launch(_loop, 0, 1)
    with pytest.raises(UsageError, match="backend"):
        launch(_loop, 2, 1, backend="mpi")
    with pytest.raises(UsageError, match="fault kind"):
        Fault("explode", rank=0)


def test_ctrl_c_releases_every_rank(tmp_path):
    pids = tmp_path / "pids"
    script = textwrap.dedent(f"""
        import os, time
        from netmorph.runtime.launch import launch
        def fn(comm):
            with open({str(pids)!r}, "a") as fh:
                fh.write(f"{{os.getpid()}}\\n")
            while True:
                comm.barrier()
                time.sleep(0.01)
        launch(fn, 3, timeout=60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while time.time() < deadline and (not pids.exists() or len(pids.read_text().split()) < 3):
        time.sleep(0.05)
    ranks = [int(x) for x in pids.read_text().split()]
    assert len(ranks) == 3
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    deadline = time.time() + 5
    alive = ranks
    while alive and time.time() < deadline:
        alive = [p for p in ranks if os.path.exists(f"/proc/{p}") and
                 open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
        time.sleep(0.05)
    assert alive == [], f"ranks {alive} survived Ctrl-C"


def test_root_cause_comes_from_the_blamed_field_not_the_message():
    """When every rank only timed out, the rank most of them blame is the root cause -- read from the
    PeerTimeout's rank, not from digits in its text (a 1 s timeout once blamed rank 1)."""
    from netmorph.runtime.launch import RankFailure, _order
    def timeout(rank, peer):
        return RankFailure(rank, 100 + rank, 1, "PeerTimeout", f"timed out after 1 s waiting for rank {peer} "
                           "(no data arrived)", when=float(rank), blames=peer)
    fs = [timeout(0, 2), timeout(1, 2), timeout(2, 3), timeout(3, 2)]
    assert [f.rank for f in _order(fs)] == [2, 0, 1, 3]
