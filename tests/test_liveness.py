"""A cluster's liveness verdicts: a closed connection from a peer whose heartbeat stopped is a loss, now.

φ accrual waits out a loaded host's jitter before it fences anyone; a connection gloo says closed *and* a
heartbeat counter that stopped moving are two signals, enough to call the peer gone sooner
(:func:`netmorph.elastic.cluster.confirm_lost`), and enough for the failure diagnosis to stop waiting for the
peer to post what it waited for (a dead peer never does).
"""

from __future__ import annotations

import datetime
import json
import multiprocessing as mp
import os
import signal
import time

import pytest

from netmorph.elastic import Heartbeat, Monitor, PhiAccrual
from netmorph.elastic.cluster import Liveness, confirm_lost, stopped_after
from netmorph.elastic.heartbeat import KEY, Watchdog
from netmorph.runtime.transport import PeerLost, PeerTimeout
from netmorph.runtime.transport.torchdiagnose import Diagnosis


def _server():
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10), False)


def _client(port: int):
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=10))


def _beat(port: int, rank: int, interval: float) -> None:
    Heartbeat(_client(port), rank, interval).start()
    while True:
        time.sleep(1)


def test_running_statistics_are_the_direct_ones_through_evictions():
    """The watchdog asks μ and σ at every poll for every peer: they come from running sums, which must equal the
    two-pass figures over the kept window, before and after the window starts dropping its oldest."""
    det = PhiAccrual(max_sample_size=7)
    t = 0.0
    for i in range(40):
        t += 0.05 + 0.013 * ((i * 7) % 5)
        det.heartbeat(t)
        xs = list(det.intervals)
        mean = sum(xs) / len(xs)
        std = (sum((x - mean) ** 2 for x in xs) / len(xs)) ** 0.5
        assert det.mean_std() == pytest.approx((mean, std), rel=1e-9, abs=1e-12)


@pytest.mark.timeout(30)
def test_one_round_trip_reads_every_counter_and_a_missing_one_does_not_block():
    """A peer not up yet has no key: ``multi_get`` would wait for it, so the poll reads key by key until every
    peer has beaten, then all at once; either way each changed counter is one arrival."""
    server = _server()
    store = _client(server.port)
    mon = Monitor(store, [1, 2], lambda: PhiAccrual(first_heartbeat_estimate=0.05))
    store.set(KEY.format(1), "1")
    t0 = time.monotonic()
    mon.poll()  # peer 2 has never beaten
    assert time.monotonic() - t0 < 5 and mon.detectors[1].last is not None and mon.detectors[2].last is None
    store.set(KEY.format(2), "1")
    store.set(KEY.format(1), "2")
    mon.poll()
    assert mon.seen == {1: b"2", 2: b"1"} and len(mon.detectors[1].intervals) == 3  # the prior's two, one more
    store.set(KEY.format(2), "done")
    mon.poll()
    assert list(mon.detectors) == [1]  # finished: no longer watched


@pytest.mark.timeout(60)
def test_a_killed_peer_is_confirmed_lost_and_a_beating_one_is_left_to_the_agreement():
    server = _server()
    store = _client(server.port)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_beat, args=(server.port, r, 0.05), daemon=True) for r in (1, 2)]
    for p in procs:
        p.start()
    dog = Watchdog(store, [1, 2], lambda: PhiAccrual(first_heartbeat_estimate=0.05), interval=0.02).start()

    class Worker:  # what a cluster's communicator carries: its liveness, its transport
        liveness, transport = Liveness(), Diagnosis()

    comm = Worker()
    stopped_after(comm, dog, 0.05)
    try:
        deadline = time.monotonic() + 20
        while dog.silent_for(1) is None or dog.silent_for(2) is None:
            assert time.monotonic() < deadline, "no beats seen"
            time.sleep(0.02)
        assert not comm.liveness.stopped(1) and not confirm_lost(comm, PeerLost(1))  # beating: not gone
        os.kill(procs[0].pid, signal.SIGKILL)
        while not comm.transport.stopped(1):  # the diagnosis reads the same verdict
            assert time.monotonic() < deadline, "a killed peer never stopped beating"
            time.sleep(0.02)
        assert comm.liveness.stale == pytest.approx(0.05 * 5) and dog.silent_for(1) > comm.liveness.stale
        assert not confirm_lost(comm, PeerTimeout(1, 1.0, "timed out")) and not comm.liveness.dead(
            1
        )  # a timeout is no loss
        assert confirm_lost(comm, PeerLost(1)) and comm.liveness.dead(1)
        assert not confirm_lost(comm, PeerLost(2)) and not comm.liveness.dead(2)
    finally:
        dog.stop()
        for p in procs:
            p.kill()
            p.join(5)


class _Waiting(Diagnosis):
    """A transport's diagnosis over a real store, waiting in a call on rank 1."""

    def __init__(self, store, stopped):
        self.rank, self.timeout, self.current, self.current_what = 0, 60.0, None, 0
        self.stopped, self.group, self._s = stopped, self, store

    def store(self):
        return self._s


@pytest.mark.timeout(60)
def test_the_wait_for_walk_stops_waiting_for_a_peer_that_stopped_beating():
    """After a closed connection the diagnosis gives the closing peer a window to post what it waited for (a
    mismatch it timed out on). A dead peer never posts: once its heartbeat has stopped the walk ends, whatever
    the window; without the verdict it waits the window out."""
    server = _server()
    window = 3.0

    def walk(stopped):
        d = _Waiting(_client(server.port), stopped)
        t0 = time.monotonic()
        err = d._walk(1, window, only_mismatch=True)
        return err, time.monotonic() - t0, json.loads(d._s.get("netmorph/wait/0"))

    err, took, posted = walk(lambda r: r == 1)
    assert err is None and took < window / 3 and posted[0] == 1  # it said whom it waited for, and did not wait
    err, took, _ = walk(lambda r: False)
    assert err is None and took >= window
