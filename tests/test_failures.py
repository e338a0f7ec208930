"""Failure semantics on real processes: a dead or silent rank is named, fast; nothing leaks."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import fuzz
import numpy as np
import pytest

from netmorph.runtime import Fault
from netmorph.runtime.launch import LaunchError, launch
from netmorph.runtime.transport.blame import child_pids

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def no_leaks(tmp_path, monkeypatch):
    shm_before = fuzz.shm_names()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's launches keep their stores here
    yield
    stores = [d for d in os.listdir(tmp_path) if d.startswith("netmorph-store-")]
    assert stores == [], "the torch backend's rendezvous directory was left behind"
    deadline = time.time() + 5
    while child_pids(os.getpid()) and time.time() < deadline:
        time.sleep(0.05)
    assert child_pids(os.getpid()) == [], "child processes outlived launch()"
    # a name another test worker holds (multiprocessing's semaphores, under pytest -n) is that worker's; a name
    # nobody holds is a leak
    deadline = time.time() + 2
    while fuzz.orphaned_shm(shm_before) and time.time() < deadline:
        time.sleep(0.05)
    assert fuzz.orphaned_shm(shm_before) == set(), "shared memory segment left behind"


def _loop(comm, n_ops):
    x = np.ones(1000, np.float32)
    for _ in range(n_ops):
        comm.all_reduce(x, algo="ring")
    return float(x[0])


def test_killed_rank_is_named_and_peers_fail_fast(no_leaks):
    """The peers learn of the death from the abort word (PeerLost), not from their 30 s timeout (PeerTimeout);
    how fast that is in seconds is benchmarks/blame.py's and elastic_faults.py's to measure."""
    with pytest.raises(LaunchError) as e:
        launch(_loop, 4, 50, faults=[Fault("kill", rank=1, at_op=3)], timeout=30)
    err = e.value
    assert err.rank == 1 and "SIGKILL" in str(err).splitlines()[0]
    assert {f.rank for f in err.failures} == {0, 1, 2, 3}
    assert all(f.exc_type == "PeerLost" and "rank 1" in f.message for f in err.failures[1:])
    assert all(f.blames == 1 for f in err.failures[1:])  # the culprit travels as a field


def test_silent_rank_times_out_naming_it(no_leaks):
    with pytest.raises(LaunchError) as e:
        launch(_loop, 3, 50, faults=[Fault("hang", rank=2, at_op=2)], timeout=1.0)
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
    assert msg.splitlines()[0].endswith(f"rank 2 (pid {e.value.root.pid}): KeyError: 'missing'")
    assert "traceback of rank 2" in msg and "_bad" in msg


def test_injected_exception_and_delay(no_leaks):
    with pytest.raises(LaunchError, match="injected fault on rank 0 at op 2"):
        launch(_loop, 2, 5, faults=[Fault("raise", rank=0, at_op=2)], timeout=10)
    t0 = time.time()
    assert launch(_loop, 2, 3, faults=[Fault("delay", rank=1, at_op=2, seconds=0.5)], timeout=10) == [8.0, 8.0]
    assert time.time() - t0 >= 0.5


def test_torch_backend_dead_peer(no_leaks):
    with pytest.raises(LaunchError) as e:
        launch(_loop, 3, 50, backend="torch", faults=[Fault("kill", rank=0, at_op=4)], timeout=20)
    assert e.value.rank == 0 and "SIGKILL" in str(e.value)


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
    # a shell that starts a job in the background (``make test &``) hands it SIGINT ignored, and an ignored
    # signal survives exec: give the launcher Ctrl-C as a terminal would
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
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
        alive = [
            p
            for p in ranks
            if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        ]
        time.sleep(0.05)
    assert alive == [], f"ranks {alive} survived Ctrl-C"


def test_root_cause_comes_from_the_blamed_field_not_the_message():
    """When every rank only timed out, the rank most of them blame is the root cause -- read from the
    PeerTimeout's rank, not from digits in its text (a 1 s timeout once blamed rank 1)."""
    from netmorph.runtime.failure import RankFailure
    from netmorph.runtime.failure import root_cause_first as _order

    def timeout(rank, peer):
        return RankFailure(
            rank,
            100 + rank,
            1,
            "PeerTimeout",
            f"timed out after 1 s waiting for rank {peer} (no data arrived)",
            when=float(rank),
            blames=peer,
        )

    fs = [timeout(0, 2), timeout(1, 2), timeout(2, 3), timeout(3, 2)]
    assert [f.rank for f in _order(fs)] == [2, 0, 1, 3]


@pytest.mark.timeout(60)
def test_torch_hung_peer_is_a_timeout_naming_it(no_leaks):
    """gloo's timeout is PeerTimeout (not PeerLost naming a healthy neighbour); the hung rank is the root."""
    with pytest.raises(LaunchError) as e:
        launch(_loop, 3, 50, faults=[Fault("hang", rank=2, at_op=2)], timeout=2.0, backend="torch")
    err = e.value
    assert err.rank == 2 and err.root.hung and "stopped answering" in err.root.message
    waited = [f for f in err.failures if f.rank != 2]
    assert waited and all(f.exc_type == "PeerTimeout" for f in waited), str(err)


def _retry_after_loss(comm):
    kinds = []
    for _ in range(3):
        try:
            comm.all_reduce(np.ones(1000, np.float32), algo="ring")
            kinds.append("ok")
        except Exception as e:  # noqa: BLE001 - the kind is the assertion
            kinds.append(type(e).__name__)
    raise RuntimeError(f"kinds={kinds}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["local", "torch"])
def test_a_survivor_that_retries_gets_the_same_error(no_leaks, backend):
    """After PeerLost the communicator stays failed: the same error again, never IndexError from
    half-moved queue state."""
    with pytest.raises(LaunchError) as e:
        launch(_retry_after_loss, 3, faults=[Fault("kill", rank=2, at_op=2)], timeout=10, backend=backend)
    survivors = [f for f in e.value.failures if f.rank != 2]
    assert len(survivors) == 2
    for f in survivors:
        assert f.message.startswith("kinds=['ok', 'PeerLost', 'PeerLost']") or f.message.startswith(
            "kinds=['PeerLost', 'PeerLost', 'PeerLost']"
        ), f.message


def _listening_addresses(comm):
    """This rank's listening TCP sockets, as (address hex, port) from /proc/net/tcp{,6}."""
    comm.barrier()
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    found.append(cols[1].split(":")[0])
    comm.barrier()
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads Linux's /proc")
def test_torch_backend_listens_on_loopback_only(no_leaks):
    """No TCPStore (it binds every interface); gloo bound to loopback: nothing reachable off this host."""
    loopback = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
    for found in launch(_listening_addresses, 2, backend="torch"):
        assert found, "gloo's listening socket was not found"
        assert set(found) <= loopback, found


def _server_waits(comm):
    if comm.rank == 0:
        comm.recv_any(np.zeros(4), [1, 2])
    else:
        time.sleep(4)


@pytest.mark.timeout(60)
def test_recv_any_timeout_names_the_ranks_it_waited_for(no_leaks):
    with pytest.raises(LaunchError) as e:
        launch(_server_waits, 3, timeout=1.0)
    server = next(f for f in e.value.failures if f.rank == 0)
    assert server.exc_type == "PeerTimeout"
    assert "no message from any of ranks 1, 2" in server.message and "rank -1" not in server.message


def _matmul_and_backward(comm):
    import torch

    x = torch.randn(128, 128, dtype=torch.float64, requires_grad=True)
    (x @ x).sum().backward()
    return float(x.grad.sum())


@pytest.mark.timeout(60)
def test_launch_after_the_parent_ran_torch_does_not_hang(no_leaks):
    """OpenMP's pool is not fork-safe: a parent's matmul used to leave every forked rank waiting forever
    in its first parallel region, and timeout= could not help (the ranks were computing, not waiting)."""
    import torch

    torch.set_num_threads(2)
    a = torch.randn(256, 256, requires_grad=True)
    (a @ a).sum().backward()  # the parent's pool is running now
    out = launch(_matmul_and_backward, 2, timeout=5)  # a hang would be a LaunchError at 5 s
    assert len(out) == 2 and all(np.isfinite(out))


def _heap_and_collection(comm):
    import gc

    return gc.get_freeze_count(), len(gc.get_objects())  # frozen; what a full collection walks


@pytest.mark.timeout(60)
def test_a_forked_rank_never_walks_the_heap_it_inherited(no_leaks):
    """A rank's inherited heap (torch and every module the launcher imported) sits in the collector's permanent
    generation, so a full collection in the rank walks a small part of it, where in this process it walks it
    all."""
    import gc

    __import__("torch")  # the heap of a launcher that trains
    here = len(gc.get_objects())
    ((frozen, walked),) = launch(_heap_and_collection, 1, timeout=30)
    assert frozen > here // 2, (frozen, here)
    assert walked < here // 10, (walked, here)


@pytest.mark.timeout(60)
def test_sigterm_stops_every_rank_removes_the_store_and_exits_143(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "netmorph",
            "train",
            "--backend",
            "torch",
            "--dp",
            "2",
            "--steps",
            "500",
            "--compute-ms",
            "20",
            "--layers",
            "1",
            "--hidden",
            "16",
            "--heads",
            "2",
            "--seq",
            "8",
            "--vocab",
            "32",
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 30
    while time.time() < deadline and not (
        any(n.startswith("netmorph-store-") for n in os.listdir(tmp_path)) and len(child_pids(proc.pid)) == 2
    ):
        time.sleep(0.05)
    ranks = child_pids(proc.pid)
    assert len(ranks) == 2
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == [err.strip()] and "terminated" in err and "Traceback" not in err
    assert os.listdir(tmp_path) == [], "the store directory (or a temporary file) outlived SIGTERM"
    deadline = time.time() + 5
    while time.time() < deadline and any(os.path.exists(f"/proc/{p}") for p in ranks):
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{p}") for p in ranks)
