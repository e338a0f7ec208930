"""Failure detection: φ accrual against the normal model it claims, a fixed timeout's window, and
heartbeats over a real torch store from a process that is killed, SIGSTOPped, or only slow."""

import math
import multiprocessing as mp
import os
import random
import signal
import time
from statistics import NormalDist

import pytest

from netmorph.elastic import FixedTimeout, Heartbeat, Monitor, PhiAccrual, View


def _regular(det, mean, spread, n, t0=0.0):
    """n beats whose intervals alternate mean - spread, mean + spread: mean and (population) σ exact."""
    t = t0
    det.heartbeat(t)
    for i in range(n):
        t += mean - spread if i % 2 else mean + spread
        det.heartbeat(t)
    return t


@pytest.mark.parametrize("mean,spread", [(1.0, 0.2), (0.1, 0.03), (2.0, 0.5)])
@pytest.mark.parametrize("k", [0.0, 1.0, 2.0, 3.5])
def test_phi_is_the_normal_models_tail_on_a_log_scale(mean, spread, k):
    det = PhiAccrual(max_sample_size=200, min_std_deviation=1e-6)
    last = _regular(det, mean, spread, 400)  # the prior's two samples are long evicted
    mu, sigma = det.mean_std()
    assert mu == pytest.approx(mean, rel=1e-9) and sigma == pytest.approx(spread, rel=1e-9)
    delta = mean + k * spread
    want = -math.log10(1 - NormalDist(mean, spread).cdf(delta))
    assert det.phi(last + delta) == pytest.approx(want, rel=1e-9, abs=1e-12)
    if k == 0.0:
        assert det.phi(last + delta) == pytest.approx(math.log10(2))  # half the beats come later than the mean


def test_phi_floors_sigma_and_adds_the_acceptable_pause():
    det = PhiAccrual(max_sample_size=50, min_std_deviation=0.1, acceptable_heartbeat_pause=0.5)
    last = _regular(det, 1.0, 0.0, 100)  # perfectly regular: σ = 0, floored to 0.1
    want = -math.log10(1 - NormalDist(1.5, 0.1).cdf(1.7))
    assert det.phi(last + 1.7) == pytest.approx(want, rel=1e-9)
    assert det.phi(last + 60.0) > 1e4 and math.isfinite(det.phi(last + 1e6))  # beyond the double-precision tail


def test_fixed_timeout_fires_between_timeout_and_one_interval_later():
    timeout, interval = 1.0, 0.3
    for phase in (0.0, 0.05, 0.17, 0.29):
        det = FixedTimeout(timeout)
        det.heartbeat(10.0)
        t = 10.0 + phase
        while not det.suspect(t):  # a monitor checking every interval
            t += interval
        assert timeout < t - 10.0 <= timeout + interval


def _beater(path, rank, interval, jitter, seed):
    import torch.distributed as dist

    store = dist.FileStore(path, -1)
    rng = random.Random(seed)
    hb = Heartbeat(store, rank, interval)
    hb._beat()
    while True:
        time.sleep(interval + rng.uniform(0, jitter))
        hb._beat()


def _store(tmp_path):
    import torch.distributed as dist

    return dist.FileStore(str(tmp_path / "store"), -1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_dead_or_hung_peer_is_suspected(tmp_path, how):
    """A killed or stopped beater is suspected by the monitor and a live one is not. How soon, in seconds, is
    the detector's arithmetic (tested on explicit times above) and benchmarks/elastic_faults.py's measurement."""
    store = _store(tmp_path)
    p = mp.get_context("fork").Process(target=_beater, args=(str(tmp_path / "store"), 1, 0.05, 0.0, 0), daemon=True)
    p.start()
    try:
        mon = Monitor(
            store, [1], lambda: PhiAccrual(min_std_deviation=0.02, first_heartbeat_estimate=0.05), interval=0.02
        )
        assert mon.watch(1.0)[1] is None  # beating: not suspected
        os.kill(p.pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        t0 = time.monotonic()
        while not mon.suspects():
            mon.poll()
            time.sleep(0.02)
            assert time.monotonic() - t0 < 30, "never suspected"
    finally:
        if p.is_alive():
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.join(5)


@pytest.mark.timeout(60)
def test_a_slow_but_alive_peer_is_not_ejected_at_the_default_threshold(tmp_path):
    store = _store(tmp_path)
    # beats every 50-150 ms (a busy peer); the default threshold must not fire on it
    p = mp.get_context("fork").Process(target=_beater, args=(str(tmp_path / "store"), 1, 0.05, 0.1, 7), daemon=True)
    p.start()
    try:
        mon = Monitor(
            store, [1], lambda: PhiAccrual(min_std_deviation=0.05, first_heartbeat_estimate=0.1), interval=0.02
        )
        assert mon.watch(3.0)[1] is None
    finally:
        p.kill()
        p.join(5)


def test_heartbeat_thread_publishes_and_stops(tmp_path):
    store = _store(tmp_path)
    hb = Heartbeat(store, 3, interval=0.02).start()
    time.sleep(0.2)
    assert int(store.get("netmorph/hb/3")) >= 3
    hb.stop()
    assert store.get("netmorph/hb/3") == b"done"  # its last word: finished, not silent
    n = hb.count
    time.sleep(0.1)
    assert hb.count == n and store.get("netmorph/hb/3") == b"done"  # stopped: no more beats


def _suspect_each_other(path, me, other, go, out):
    import torch.distributed as dist

    from netmorph.elastic import Rendezvous, View

    rdzv = Rendezvous(dist.FileStore(path, -1), min_workers=1)
    go.wait()
    view = rdzv.propose(View(0, (0, 1, 2), 5), suspects={other})
    out.put((me, view.to_json()))


@pytest.mark.timeout(120)
def test_two_peers_suspecting_each_other_adopt_one_view(tmp_path):
    """No split brain: both propose at once (each drops the other); both adopt the same stored view."""
    ctx = mp.get_context("fork")
    for trial in range(8):
        path = str(tmp_path / f"store{trial}")
        go, out = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_suspect_each_other, args=(path, a, b, go, out)) for a, b in ((0, 1), (1, 0))]
        for p in procs:
            p.start()
        go.set()
        views = dict(out.get(timeout=30) for _ in procs)
        for p in procs:
            p.join(10)
        assert views[0] == views[1]
        members = View.from_json(views[0]).members
        assert members in ((0, 2), (1, 2))  # exactly one proposal landed


def test_views_advance_joiners_enter_and_too_few_members_is_an_error(tmp_path):
    from netmorph.elastic import MembershipError, Rendezvous, View

    rdzv = Rendezvous(_store(tmp_path), min_workers=2)
    v0 = rdzv.start([0, 1, 2, 3])
    assert v0 == View(0, (0, 1, 2, 3), 0) and rdzv.start([0, 1]) == v0  # first write wins
    v1 = rdzv.propose(v0, suspects={2}, first_step=60)
    assert v1 == View(1, (0, 1, 3), 60) and rdzv.current() == v1
    rdzv.announce(4, v1.epoch)
    v2 = rdzv.propose(v1, candidates=[4, 5], first_step=120)
    assert v2 == View(2, (0, 1, 3, 4), 120)
    assert rdzv.propose(v1, suspects={0}) == v2  # epoch 2 is agreed already
    with pytest.raises(MembershipError, match="fewer than min_workers 2"):
        rdzv.propose(v2, suspects={0, 1, 3})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [1, 2])
def test_chaos_kills_and_joins_change_nothing_but_the_members(seed):
    """Seeded random kills mid-step and a join: the survivors' losses and final parameters equal the failure-free run
    on the same global batches (float64), each death costs at most the one step in flight, and nothing is
    left running."""
    from netmorph.elastic.train import ElasticConfig, train

    rng = random.Random(seed)
    workers = 5
    victims = rng.sample(range(workers), rng.randint(1, 3))
    kills = tuple((r, s) for r, s in zip(victims, sorted(rng.sample(range(1, 40), len(victims)))))
    joins = ((1, rng.randrange(1, 40)),)
    out = train(
        ElasticConfig(workers=workers, min_workers=workers - len(kills), steps=40, kills=kills, joins=joins, seed=seed),
        check=True,
    )
    assert out["max_rel_loss_diff"] <= 1e-9 and out["max_rel_param_diff"] <= 1e-9
    assert out["dead"] == sorted(r for r, _ in kills)
    assert out["epochs"][-1]["members"] == sorted(set(range(workers + 1)) - set(victims))
    assert all(e["steps_redone"] <= 1 for e in out["events"])
    assert sum(e["kind"] == "join" for e in out["events"]) == 1
    assert mp.active_children() == []


@pytest.mark.timeout(60)
def test_falling_below_min_workers_ends_the_run_naming_why():
    from netmorph.elastic.train import ElasticConfig, train
    from netmorph.runtime import LaunchError

    with pytest.raises(LaunchError) as e:
        train(ElasticConfig(workers=3, min_workers=2, steps=20, kills=((2, 3), (1, 8))))
    assert e.value.root.exc_type == "MembershipError" and "fewer than min_workers 2" in e.value.root.message


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["elastic", "--steps", "10", "--kill", "2@10"], "--kill"),
        (["elastic", "--workers", "4", "--kill", "7@3"], "--kill"),
        (["elastic", "--workers", "4", "--min-workers", "5"], "--min-workers"),
        (["elastic", "--kill", "two@3"], "--kill"),
        (["elastic", "--kill", "1@3", "--kill", "1@5"], "--kill"),
        (["elastic", "--seed", "-1"], "--seed"),
        (["elastic", "--steps", "10", "--join", "1@10"], "--join"),
        (["elastic", "--join", "one@3"], "--join"),
        (["elastic", "--job", "gpt", "--kill", "1@5", "--global-batch", "10"], "--global-batch"),
    ],
)
def test_bad_elastic_flags_are_one_line_exit_2(argv, flag, capsys):
    from netmorph.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert flag in err and len(err.strip().splitlines()) == 1


@pytest.mark.timeout(120)
def test_the_baselines_recover_the_same_job_redoing_every_step_since_the_checkpoint():
    """torchrun-style restart-all (processes torn down, state reloaded from disk) and Horovod-style rollback
    to the last in-memory commit reach the failure-free parameters too, redoing steps since the checkpoint."""
    from dataclasses import replace

    import numpy as np

    from netmorph.elastic.restart import restart_all
    from netmorph.elastic.train import ElasticConfig, reference, train

    cfg = ElasticConfig(workers=4, steps=60, kills=((2, 25), (1, 47)), commit_every=10)
    _, w_ref = reference(cfg)
    restart = restart_all(cfg)
    assert [e["steps_redone"] for e in restart["events"]] == [25 - 20 + 1, 47 - 40 + 1]
    assert np.max(np.abs(restart["w"] - w_ref)) <= 1e-9 * np.max(np.abs(w_ref))
    rollback = train(cfg, check=True)
    assert [e["steps_redone"] for e in rollback["events"]] == [6, 8] and rollback["max_rel_param_diff"] <= 1e-9
    inplace = train(replace(cfg, commit_every=1))
    assert [e["steps_redone"] for e in inplace["events"]] == [1, 1]
    # the timelines the figure draws: the restart's progress falls back to the checkpoint, nobody trains
    # between a death and the restart; in place it never falls back by more than the step in flight
    from netmorph.elastic.recovery import caught_up

    done = [s for _, s, n in restart["timeline"] if n > 0]
    falls = [(a, b) for a, b in zip(done, done[1:]) if b <= a]
    assert falls == [(25, 21), (47, 41)]
    assert [(s, n) for _, s, n in restart["timeline"] if n == 0] == [(25, 0), (47, 0)]
    done = [s for _, s, _ in inplace["timeline"]]
    assert all(b >= a for a, b in zip(done, done[1:])) and done[-1] == 60
    assert [n for _, s, n in inplace["timeline"] if s in (25, 26, 47, 48)] == [4, 3, 3, 2]
    for run, key in ((restart, "recovery_s"), (inplace, "resumed_after_s")):
        assert caught_up(run) >= sum(e[key] for e in run["events"]) * 0.99 > 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("detector", ["phi", "fixed"])
def test_a_hung_worker_is_found_by_its_heartbeats_fenced_and_left_behind(detector):
    """SIGSTOPped, not dead: the survivors time out, the phi-accrual detector over the store heartbeats names
    it (the slow-but-beating members are not), it is SIGKILLed and the run equals the failure-free one."""
    from netmorph.elastic.train import ElasticConfig, train

    out = train(ElasticConfig(workers=4, steps=30, hangs=((2, 10),), timeout=1.5, detector=detector), check=True)
    assert out["max_rel_loss_diff"] <= 1e-9 and out["max_rel_param_diff"] <= 1e-9
    assert out["dead"] == [2] and out["epochs"][-1]["members"] == [0, 1, 3]
    (hang,) = out["events"]
    assert hang["kind"] == "hang" and hang["steps_redone"] == 1 and 1.5 <= hang["detected_after_s"] < 5
    assert mp.active_children() == []


@pytest.mark.timeout(120)
def test_compare_plots_the_three_recoveries_and_reports_them_in_json(tmp_path, capsys):
    import json

    from netmorph.cli import main

    png = tmp_path / "rec.png"
    assert (
        main(
            [
                "elastic",
                "--job",
                "lsq",
                "--steps",
                "30",
                "--kill",
                "2@12",
                "--compare",
                "--checkpoint-every",
                "5",
                "--plot",
                str(png),
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    c = out["compare"]
    assert [c[k]["steps_redone"] for k in ("inplace", "rollback", "restart")] == [1, 12 - 10 + 1, 12 - 10 + 1]
    assert all(c[k]["caught_up_s"] >= c[k]["recovery_s"] > 0 for k in c)
    assert main(["elastic", "--plot", str(png)]) == 2
    assert "add --compare" in capsys.readouterr().err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("killed, min_workers", [((1, 2), 2), ((1, 2, 3), 1)])
def test_workers_killed_in_the_same_step_leave_the_survivors_training(killed, min_workers):
    """They die milliseconds apart; the survivors' agreement used to wait for the second one's progress
    and end in a TimeoutError naming it."""
    from netmorph.elastic.train import ElasticConfig, train

    out = train(
        ElasticConfig(workers=4, min_workers=min_workers, steps=20, kills=tuple((r, 7) for r in killed), timeout=2),
        check=True,
    )
    assert out["max_rel_loss_diff"] <= 1e-9 and out["dead"] == list(killed)
    assert out["epochs"][-1]["members"] == sorted(set(range(4)) - set(killed))
    assert sorted(r for e in out["events"] for r in e["ranks"]) == list(killed)


@pytest.mark.timeout(60)
def test_two_killed_in_one_step_below_the_minimum_is_a_membership_error():
    from netmorph.elastic.train import ElasticConfig, train
    from netmorph.runtime import LaunchError

    with pytest.raises(LaunchError) as e:
        train(ElasticConfig(workers=4, min_workers=3, steps=20, kills=((1, 7), (2, 7)), timeout=2))
    assert e.value.root.exc_type == "MembershipError", str(e.value)
    assert "TimeoutError" not in str(e.value)


@pytest.mark.timeout(90)
def test_a_worker_stopped_from_outside_is_ejected_and_the_run_finishes():
    import subprocess
    import sys

    from netmorph.runtime.transport.blame import stop_rank

    # --timeout 3, not 1: on two cores shared with another test worker a survivor can go a second without progress
    # and every such stall is a round of fencing and agreement (2 of 7 CI runs once failed under load with every
    # survivor waiting in one all-reduce; never reproduced alone)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "netmorph",
            "elastic",
            "--job",
            "lsq",
            "--workers",
            "4",
            "--steps",
            "1500",
            "--timeout",
            "3",
            "--check",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # frozen wherever it is: not the --hang flag's own SIGSTOP
    assert stop_rank(proc.pid, 4, 2, after=0.3) is not None, "the four workers never came up"
    out, err = proc.communicate(timeout=80)
    assert proc.returncode == 0, err[-2000:]
    assert "hang rank 2" in out and "✓" in out, out


def _beat_as(path, rank, interval, stop_after):
    """A worker: say which process it is, beat every ``interval``, and after ``stop_after`` seconds either stop
    itself (SIGSTOP: hung) or, with a negative value, say it is done and idle on."""
    import torch.distributed as dist

    from netmorph.elastic import publish_pid

    store = dist.FileStore(path, -1)
    publish_pid(store, rank)
    hb = Heartbeat(store, rank, interval).start()
    time.sleep(abs(stop_after))
    if stop_after > 0:
        os.kill(os.getpid(), signal.SIGSTOP)
    hb.stop()
    time.sleep(60)


@pytest.mark.timeout(60)
def test_the_watchdog_fences_a_hung_worker_and_leaves_a_finished_one(tmp_path):
    """Morph's live loop: a worker that stops (SIGSTOP) mid-run falls silent; the watchdog's φ accrual suspects it
    and SIGKILLs it (the fabric then sees it exit); a worker that said it is done stays alive, however long it is
    silent. A survivor whose own watchdog did not fence it learns the silence from the store (morph's reason)."""
    from netmorph.elastic import Watchdog

    store, path = _store(tmp_path), str(tmp_path / "store")
    ctx = mp.get_context("fork")
    hung = ctx.Process(target=_beat_as, args=(path, 1, 0.05, 0.3), daemon=True)
    done = ctx.Process(target=_beat_as, args=(path, 2, 0.05, -0.3), daemon=True)
    hung.start(), done.start()
    dog = Watchdog(
        store,
        [1, 2],
        lambda: PhiAccrual(first_heartbeat_estimate=0.05, min_std_deviation=0.025, acceptable_heartbeat_pause=0.3),
        interval=0.02,
    ).start()
    try:
        hung.join(20)
        assert hung.exitcode == -signal.SIGKILL, "the hung worker was never fenced"
        time.sleep(0.6)  # twice the pause: a silent beater would be fenced by now
        assert done.is_alive() and list(dog.fenced) == [1] and 0.3 < dog.fenced[1] < 10
        other = Watchdog(store, [1, 2], lambda: PhiAccrual())  # never started: fenced nothing
        assert other.fenced == {} and other.silence([1, 2]) == {1: dog.fenced[1]}
    finally:
        dog.stop()
        for p in (hung, done):
            if p.is_alive():
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            p.join(5)


def _lose(comm, victim: int) -> None:
    """Slot ``victim`` SIGKILLs itself; the others' next all-reduce fails with PeerLost (the fabric marks it dead)."""
    import numpy as np

    from netmorph.runtime.transport import PeerLost

    if comm.slot == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        comm.all_reduce(np.zeros(1))
    except PeerLost:
        pass


def _respawned(comm):
    """Rank 1 dies; rank 0 re-forms alone, asks for rank 1 back; the new rank 1 (it holds nothing) re-forms with
    it on the next epoch and the two all-reduce: the revived slot carries messages as the first one did."""
    import numpy as np

    if comm.joined:
        comm.reform([0, 1], 2)
        x = np.array([10.0])
        comm.all_reduce(x)
        return float(x[0])
    x = np.array([1.0 + comm.rank])
    comm.all_reduce(x)  # epoch 0: both
    _lose(comm, 1)
    comm.reform([0], 1)
    comm.respawn([1])
    x = np.array([5.0])
    comm.reform([0, 1], 2)
    comm.all_reduce(x)
    return float(x[0])


@pytest.mark.timeout(60)
def test_a_dead_ranks_slot_takes_a_new_process_that_joins_on_a_later_epoch():
    from netmorph.runtime.launch import launch

    got = launch(_respawned, 2, timeout=20.0, elastic=True)
    results, deaths = list(got), got.deaths
    assert results == [15.0, 15.0] and [r for r, _ in deaths] == [1]


def _shrunk(comm):
    """Slot 0 dies; slots 1 and 2 shrink to a communicator of 2 numbered 0 and 1 (ncclCommShrink) and talk by
    the new numbers -- a collective, a send and a receive from any -- then slot 0's new process grows it back."""
    import numpy as np

    if comm.joined:
        comm.reform([0, 1, 2], 2, renumber=True)
        x = np.array([100.0])
        comm.all_reduce(x)
        return comm.rank, comm.world, float(x[0]), None
    comm.all_reduce(np.zeros(1))  # epoch 0: all three
    _lose(comm, 0)
    comm.reform([1, 2], 1, renumber=True)
    shrunk = (comm.rank, comm.world, comm.slot)
    x = np.array([float(comm.slot)])
    comm.all_reduce(x)  # 1 + 2
    got = np.zeros(1)
    if comm.rank == 0:
        comm.send(np.array([7.0]), 1)
    else:
        assert comm.recv_any(got) == 0  # the sender by its new number
    peers = sorted({(r.src, r.dst) for r in comm.ledger.records if r.op == "send"})
    if comm.rank == 0:
        comm.respawn([0])
    comm.reform([0, 1, 2], 2, renumber=True)
    y = np.array([1.0])
    comm.all_reduce(y)
    return shrunk, float(x[0]), float(got[0]), peers, comm.rank, float(y[0])


@pytest.mark.timeout(60)
def test_survivors_renumber_from_zero_and_a_new_process_grows_the_communicator_back():
    from netmorph.runtime.launch import launch

    got = launch(_shrunk, 3, timeout=20.0, elastic=True)
    results, deaths = list(got), got.deaths
    assert [r for r, _ in deaths] == [0]
    assert results[0] == (0, 3, 102.0, None)
    (s1, x1, _, p1, r1, y1), (s2, x2, got2, p2, r2, y2) = results[1], results[2]
    assert s1 == (0, 2, 1) and s2 == (1, 2, 2)  # (rank, world, slot) after the shrink
    assert x1 == x2 == 3.0 and got2 == 7.0
    assert p1 == [(0, 1)] and p2 == []  # the ledger speaks the new numbers
    assert (r1, r2) == (1, 2) and y1 == y2 == 102.0


@pytest.mark.timeout(120)
def test_the_gpt_trainer_goes_on_when_rank_0_dies_and_a_joiner_grows_it_equal_to_one_rank():
    """netmorph elastic --job gpt: the trainer of netmorph train (DDP buckets, Adam) under a kill of launch rank 0
    mid-backward and a join -- the survivors renumber 0..2 to build the trainer's mesh, the joiner receives the
    state by broadcast -- and every loss and the final parameters equal the failure-free run on one process; so
    do the rollback and restart baselines of the same job."""
    from netmorph.elastic.train import ElasticConfig, train

    cfg = ElasticConfig(
        workers=4, steps=10, global_batch=12, lr=3e-3, job="gpt", kills=((0, 3),), joins=((1, 6),), timeout=10.0
    )
    out = train(cfg, check=True)
    assert [e["members"] for e in out["epochs"]] == [[0, 1, 2, 3], [1, 2, 3], [1, 2, 3, 4]]
    assert [(e["kind"], e["step"], e["steps_redone"]) for e in out["events"]] == [("kill", 3, 1), ("join", 6, 0)]
    assert out["dead"] == [0]
    assert out["max_rel_loss_diff"] < 1e-12 and out["max_rel_param_diff"] < 1e-11
    # the same kill recovered as Horovod Elastic (back to the commit of step 0, every 4) and as torchrun (every
    # worker restarted from the checkpoint of step 0 on disk): 4 steps redone each, the same model at the end
    import numpy as np

    from netmorph.elastic import gpt
    from netmorph.elastic.recovery import compare

    runs = compare(cfg, 4, inplace=out)
    assert runs["rollback"]["steps_redone"] == runs["restart"]["steps_redone"] == 4
    np.testing.assert_allclose(runs["rollback"]["losses"], out["reference_losses"], rtol=1e-12, atol=0)
    ref_w = gpt.reference(cfg)[1]
    assert np.max(np.abs(runs["restart"]["w"] - ref_w)) / np.max(np.abs(ref_w)) < 1e-11
