"""Morph's control loop: the twin that prices every layout, the decisions on a simulated clock, and the loop on
real ranks keeping the model identical through every move."""

import math
import os
import time
from dataclasses import replace

import numpy as np
import pytest

from netmorph.mesh.layout import Layout
from netmorph.mesh.shape import ModelShape
from netmorph.morph.scenario import parse_scenario

MORPH_GPT = ModelShape(layers=4, hidden=32, heads=4, seq=16, vocab=64)
# links as netmorph calibrate measures them on this machine's 8 ranks (calibrate's link phase): a message costs
# about a millisecond inside a node under load -- what makes tensor parallelism dear here
LINKS = {"intra": {"alpha": 1e-3, "beta": 1 / 1e9}, "inter": {"alpha": 3e-4, "beta": 1 / 47e6}}


def _twin(world=8, inter_mbps=50.0, links=LINKS, compute_ms=40.0):
    from netmorph.morph.controller import Trainer, twin_of

    trainer = Trainer(MORPH_GPT, 8, world, 60.0, compute_ms, inter_mbps)
    return trainer, twin_of(trainer, links and {**links, "inter": {**links["inter"], "beta": 1 / (inter_mbps * 1e6)}})


def test_the_twin_prices_the_emulated_accelerator_exactly():
    """What the trainer sleeps a microbatch (device_ms: its stage's layer and LM-head FLOPs at the emulated rate)
    is what the planner's compute gives on the twin, for every layout: the stage with the head is the slowest."""
    from netmorph.morph.layouts import train_config
    from netmorph.parallel.slots import device_ms

    trainer, twin = _twin()
    for seq in (16, 64):
        model = replace(MORPH_GPT, seq=seq)
        for lay in twin.layouts(8, seq):
            cfg = train_config(model, lay, 1, 8, device_flops=trainer.device_flops)
            per = max(device_ms(cfg, model.layers // lay.pp, s == lay.pp - 1) for s in range(lay.pp))
            assert twin.compute_s(lay, seq) == pytest.approx(3 * cfg.layout.microbatches * per / 1e3, rel=1e-12)
    # the base model's forward of one sequence takes compute_ms on one rank
    assert device_ms(
        train_config(MORPH_GPT, Layout(dp=1), 1, 1, device_flops=trainer.device_flops), 4, True
    ) == pytest.approx(40.0, rel=1e-12)


def test_the_twin_writes_what_a_run_measured_into_its_profile():
    """A measured busy stage of compute + x is x of real work per operator; the link's β is the one measured."""
    _, twin = _twin()
    lay = Layout(tp=2, dp=4)
    t = twin.step(lay)
    slots = t.compute_s + t.parts.tensor_parallel
    after = twin.measured(lay, slots + 0.030, 1 / 5e6)
    assert after.beta0 == 1 / 5e6 and after.hardware.op_overhead_s > 0
    t2 = after.step(lay)
    assert t2.compute_s + t2.parts.tensor_parallel == pytest.approx(slots + 0.030, rel=1e-9)
    assert twin.measured(lay, slots, None).hardware.op_overhead_s == pytest.approx(0.0, abs=1e-12)


def _rehearse(scenario, start=None, steps=120, segment=10, **kw):
    from netmorph.morph.decide import rehearse

    _, twin = _twin(**kw)
    sc = parse_scenario(scenario)
    start = start or twin.best(None, 8)
    lines = []
    return (
        twin,
        start,
        rehearse(twin, sc, start, steps, segment, log=lines.append),
        rehearse(twin, sc, start, steps, segment, hysteresis=math.inf),
        lines,
    )


def test_the_loop_moves_off_a_degraded_link_on_the_twin():
    """On a simulated clock: data parallelism across the nodes is the best split until the link is 10x slower at
    step 40; the first look after (step 50) wants the twin's best at the new price, the second confirms it and
    moves (step 60); the run beats staying, and every look printed its line."""
    twin, start, adaptive, static, lines = _rehearse("link-degrades@40")
    assert (start.tp, start.pp, start.dp) == (1, 1, 8)  # data parallelism (with or without ZeRO-1)
    best = twin.best(twin.beta0 * 10, 8)
    assert best != start and adaptive.layout_path == [(0, start.tag()), (60, best.tag())]
    (d,) = adaptive.decisions
    assert (d.step, d.after, d.top[0][0]) == (60, best.tag(), best.tag())
    assert adaptive.total_s < 0.9 * static.total_s and not static.decisions
    assert len(lines) == 12 and "wait (1 of 2 looks)" in lines[4] and f"move to {best.tag()}" in lines[5]


def test_the_loop_holds_still_when_nothing_changes_or_no_time_is_left():
    """No event, no move; a degradation whose second look falls on the last step moves nothing (nothing left to
    gain); a best that saves under the hysteresis is not taken."""
    _, _, quiet, _, _ = _rehearse("none")
    assert not quiet.decisions and len(quiet.layout_path) == 1
    _, _, late, _, lines = _rehearse("link-degrades@40", steps=60)
    assert not late.decisions and "wait (1 of 2 looks)" in lines[4]
    from netmorph.morph.decide import Controller, Look

    _, twin = _twin()
    worse = twin.layouts(8)[1]
    gain = twin.predict(worse) - twin.predict(twin.layouts(8)[0])
    ctl = Controller(twin, 100, hysteresis=gain / twin.predict(worse) + 0.01, confirm=1)
    assert ctl.look(Look(10, worse, 16, twin.predict(worse), None, None))[1] is None


def test_a_move_is_made_only_when_its_gain_pays_for_its_cost():
    """Nodes joined at 0.5 MB/s, 100 MB/s inside: from cp2·pp4 the twin prefers cp2·pp2·dp2 by a few ms a step
    (ring attention's hops stay inside a node, the gradients cross it between 2 replicas), and the move costs a few
    steps of that (half of each stage's state changes hands inside the nodes). With one look
    to confirm and no hysteresis, it moves exactly when the steps left times the gain exceed the reshard's predicted
    seconds."""
    from netmorph.morph.decide import Controller, Look, move_cost

    _, twin = _twin(inter_mbps=0.5, links={"intra": {"alpha": 1e-3, "beta": 1e-8}, "inter": LINKS["inter"]})
    start = Layout(cp=2, pp=4, dp=1)
    best = twin.best(None, 8)
    gain = twin.predict(start) - twin.predict(best)
    p, cost = move_cost(twin, start, best)
    assert (best.tp, best.cp, best.pp, best.dp) == (1, 2, 2, 2) and p.bytes > 0 and cost > gain > 0
    need = math.floor(cost / gain) + 1  # the fewest steps left that pay for it
    for left in (need - 1, need):
        ctl = Controller(twin, 100 + left, hysteresis=0.0, confirm=1)
        line, d = ctl.look(Look(100, start, 16, twin.predict(start), None, None))
        assert (d is not None) == (left == need), line
    assert d.after == best.tag() and d.reshard_s == pytest.approx(cost)


def test_the_loop_replans_for_the_survivors_and_the_longer_context():
    """A node lost: the twin's best layout of the 4 survivors from that step; the context 4x longer: the twin's
    best for the longer sequences (4x the tokens a step from there)."""
    twin, start, lost, _, _ = _rehearse("node-lost@50", inter_mbps=5.0)
    assert lost.layout_path[-1] == (50, twin.best(None, 4).tag())
    twin, start, grown, _, _ = _rehearse("seq-grows@40x4", inter_mbps=5.0)
    assert grown.layout_path[1] == (40, twin.best(None, 8, 64).tag())
    assert grown.tokens == [8 * 16] * 40 + [8 * 64] * 80


def test_scenarios_compose_as_events():
    """Events in step order, each from its step on: the link's factor, the ranks, the sequence and the memory."""
    sc = parse_scenario(
        "link-degrades@10x4,node-lost@20,link-recovers@30,node-joins@40,seq-grows@50x2,memory-shrinks@60x4"
    )
    assert [sc.link_factor(s) for s in (9, 10, 29, 30)] == [1, 4, 4, 1]
    assert [sc.world(8, s) for s in (19, 20, 39, 40)] == [8, 4, 4, 8]
    assert [sc.model(MORPH_GPT, s).seq for s in (49, 50)] == [16, 32]
    assert [sc.memory(s) for s in (59, 60)] == [math.inf, 0.25] and sc.at == 10
    assert sc.label().startswith("link-degrades@10x4,node-lost@20,link-recovers@30")
    from netmorph.errors import UsageError

    assert [parse_scenario("node-hangs@20,node-joins@40").world(8, s) for s in (19, 20, 40)] == [8, 4, 8]
    for bad, words in (
        ("node-joins@5", "needs a node-lost"),
        ("node-lost@5,node-hangs@9", "already lost"),
        ("link-degrades@9,link-recovers@5", "step order"),
        ("link-recovers@5x2", "no FACTOR"),
        ("seq-grows@5x3", "2, 4 or 8"),
        ("shrinks@3", "KIND@STEP"),
    ):
        with pytest.raises(UsageError, match=words):
            parse_scenario(bad)


def test_the_loop_follows_a_link_that_degrades_and_recovers_and_a_node_that_comes_back():
    """The link 10x slower from 30 to 70: the loop leaves data parallelism and comes back to it, each move after
    two looks; a node lost at 40 and back at 80: the survivors' best, then the whole cluster's again."""
    twin, start, adaptive, _, _ = _rehearse("link-degrades@30,link-recovers@70")
    slow = twin.best(twin.beta0 * 10, 8)
    assert adaptive.layout_path == [(0, start.tag()), (50, slow.tag()), (90, start.tag())]
    twin, start, adaptive, _, _ = _rehearse("node-lost@40,node-joins@80", inter_mbps=5.0)
    assert adaptive.layout_path == [(0, start.tag()), (40, twin.best(None, 4).tag()), (80, start.tag())]


def test_memory_pressure_moves_to_a_layout_that_fits():
    """Each rank left with a third of what a whole replica needs: the loop moves at once to the fastest layout
    that fits -- one that shards the training state -- and the split it ran on does not fit."""
    twin, start, adaptive, _, _ = _rehearse("memory-shrinks@40x3")
    (d,) = adaptive.decisions
    small = replace(twin, memory_share=1 / 3)
    after = next(lay for lay in small.layouts(8) if lay.tag() == d.after)
    assert d.step == 40 and after == small.layouts(8)[0] and not small.fits(start)
    assert small.memory_bytes(after) <= small.memory_bytes(Layout()) / 3
    assert after.zero >= 2 or after.tp * after.pp > 1


def _controller(world, steps, segment, scenario, inter_mbps=50.0, checkpoint_every=20, start=None):
    """The adaptive and the static run from ``start`` for real, the loop deciding on the twin (nominal links)."""
    from netmorph.morph.controller import Trainer, run_adaptive, run_static, twin_of

    trainer = Trainer(MORPH_GPT, 8, world, 60.0, 10.0, inter_mbps, checkpoint_every)
    sc = parse_scenario(scenario)
    twin = twin_of(trainer, LINKS)
    adaptive = run_adaptive(trainer, twin, start, steps, segment, sc, log=lambda *a, **k: None)
    return twin, adaptive, run_static(trainer, start, steps, segment, sc)


@pytest.mark.timeout(300)
def test_controller_moves_off_a_degraded_link_and_keeps_the_model(monkeypatch):
    """For real: the inter-node link 20x slower from step 4 under data parallelism across the nodes; the loop
    moves (to the twin's best at the link it measured) in one launch -- the ranks stay alive, the move runs
    between them -- and its losses are the ones the start split gives: the same data, resharded state. Whether
    the move wins in wall time is a measurement on a shared machine, not a unit test: benchmarks/morph.py holds
    it."""
    import sys

    launcher = sys.modules["netmorph.runtime.launch"]  # the module (the package exports its function)
    launches = []
    real = launcher.launch
    monkeypatch.setattr(launcher, "launch", lambda fn, *a, **k: launches.append(fn.__name__) or real(fn, *a, **k))
    start = Layout(dp=4)
    from netmorph.morph.controller import Trainer, run_adaptive, run_static, twin_of

    trainer = Trainer(MORPH_GPT, 8, 4, 60.0, 10.0, 50.0, 20)
    sc = parse_scenario("link-degrades@4x20")
    adaptive = run_adaptive(trainer, twin_of(trainer, LINKS), start, 16, 4, sc, log=lambda *a, **k: None)
    assert launches == ["live_rank"]
    monkeypatch.setattr(launcher, "launch", real)
    static = run_static(trainer, start, 16, 4, sc)
    (d,) = adaptive.decisions
    assert d.after != start.tag() and d.after == d.top[0][0] and adaptive.decide_s and max(adaptive.decide_s) < 5
    np.testing.assert_allclose(adaptive.losses, static.losses, rtol=1e-9, atol=0)


@pytest.mark.timeout(300)
def test_a_node_killed_mid_step_is_detected_and_the_survivors_go_on():
    """4 ranks on two nodes joined by a 5 MB/s link, a pipeline with a stage per node (pp2·dp2), checkpoints every
    8 steps. At step 12 of the cluster's clock node 1's ranks SIGKILL themselves in the middle of the next step:
    the fabric marks them dead, the survivors agree on a view without them and on the step to resume at (12, the
    most they all completed), stage 1 went with the node, so they read the checkpoint of step 8 into the twin's
    best 2-rank layout and redo the 4 steps since and the one in flight -- in the same processes. The static split
    meets the same loss the same way and goes on as torchelastic would restart it, pp2 with fewer replicas, from
    the same checkpoint. Same losses either way, and the same as the run no node left; a split whose
    model-parallel group needs 4 ranks stops there."""
    from netmorph.morph.controller import Trainer, run_static

    twin, adaptive, static = _controller(
        4, 16, 4, "node-lost@12", inter_mbps=5.0, checkpoint_every=8, start=Layout(pp=2, dp=2)
    )
    (d,) = adaptive.decisions
    assert d.step == 8 and d.reason.startswith("node lost (2 ranks left, ranks [2, 3] killed mid-step")
    assert d.after == d.top[0][0] and adaptive.layout_path == [(0, "tp1·pp2·dp2"), (8, d.after)]
    assert adaptive.redone == static.redone == 5 and len(adaptive.step_s) == len(static.step_s) == 20
    assert static.layout_path == [(0, "tp1·pp2·dp2"), (8, "tp1·pp2·dp1")] and not static.failed
    assert len(adaptive.losses) == len(static.losses) == 16
    np.testing.assert_allclose(adaptive.losses, static.losses, rtol=1e-9, atol=0)
    calm = run_static(
        Trainer(MORPH_GPT, 8, 4, 60.0, 10.0, 5.0, 8), Layout(pp=2, dp=2), 16, 16, parse_scenario("none")
    )  # one segment: one launch
    np.testing.assert_allclose(adaptive.losses, calm.losses, rtol=1e-9, atol=0)
    trainer = Trainer(MORPH_GPT, 8, 4, 60.0, 30.0, 5.0, 4)
    stopped = run_static(trainer, Layout(pp=4), 12, 4, parse_scenario("node-lost@4"))
    assert "does not fit the 2 surviving ranks" in stopped.failed and len(stopped.step_s) == 4
    assert stopped.total_s == float("inf")


@pytest.mark.timeout(300)
def test_a_node_that_hangs_is_found_by_its_heartbeats_and_fenced():
    """The same ranks stopped (SIGSTOP) mid-step instead of killed: nothing exits, no call fails; their heartbeats
    stop, every survivor's watchdog suspects them (φ accrual) and SIGKILLs them, and from there it is a loss: the
    survivors hold every data-parallel replica, so only the step in flight is redone, in the same processes, and
    the losses are the ones no node left gives. No stopped process outlives the run."""
    from netmorph.runtime.transport.blame import child_pids

    before = set(child_pids(os.getpid()))  # under pytest -n a worker may hold children of its own
    twin, adaptive, static = _controller(4, 12, 4, "node-hangs@6", inter_mbps=5.0, start=Layout(dp=4))
    (d,) = adaptive.decisions
    assert d.reason.startswith("node hung (2 ranks left, ranks [2, 3] stopped mid-step: ")
    assert "without a heartbeat when φ accrual suspected them, fenced with SIGKILL" in d.reason
    assert adaptive.redone == 1 and adaptive.layout_path[-1] == (d.step, d.after) and not static.failed
    # the static split loses the node by script, on fewer replicas of the same global batch: the run no node left
    np.testing.assert_allclose(adaptive.losses, static.losses, rtol=1e-9, atol=0)
    deadline = time.time() + 5  # a process SIGKILLed a moment ago may still be tearing down
    while set(child_pids(os.getpid())) - before and time.time() < deadline:
        time.sleep(0.05)
    assert sorted(set(child_pids(os.getpid())) - before) == [], "a rank outlived the run"


@pytest.mark.timeout(300)
def test_a_node_back_joins_the_same_launch_and_receives_its_state(monkeypatch):
    """Node 0 -- launch rank 0 and the controller with it -- killed at step 4 and back at step 8: the survivors
    renumber 0..1 (ncclCommShrink) and the standby controller on the second node's first rank carries on as rank 0;
    at step 8 it asks the launcher for processes in the dead slots, they announce themselves, the members agree on
    the grown view (the joiners numbered after them: ncclCommGrow), the new standby receives the controller, the
    twin picks the 4-rank layout and the plan sends the joiners everything they hold -- one launch from start to
    end, and the losses are the ones no node left gives."""
    import sys

    launcher = sys.modules["netmorph.runtime.launch"]
    launches = []
    real = launcher.launch
    monkeypatch.setattr(launcher, "launch", lambda fn, *a, **k: launches.append(fn.__name__) or real(fn, *a, **k))
    from netmorph.morph.controller import Trainer, run_adaptive, run_static, twin_of

    trainer = Trainer(MORPH_GPT, 8, 4, 60.0, 10.0, 5.0, 20)
    twin = twin_of(trainer, LINKS)
    adaptive = run_adaptive(
        trainer, twin, Layout(dp=4), 12, 4, parse_scenario("node-lost@4:0,node-joins@8"), log=lambda *a, **k: None
    )
    assert launches == ["live_rank"]
    lost, back = adaptive.decisions
    assert lost.reason.startswith("node lost (2 ranks left, ranks [0, 1] killed mid-step") and back.step == 8
    assert back.reason.startswith("a node joined (4 ranks: [0, 1] started in the lost ranks' slots")
    assert back.before == lost.after and back.after == twin.best(None, 4).tag() and back.reshard_bytes > 0
    assert adaptive.layout_path[-1] == (8, back.after) and len(adaptive.losses) == 12
    calm = run_static(trainer, Layout(dp=4), 12, 12, parse_scenario("none"))  # one segment: one launch
    np.testing.assert_allclose(adaptive.losses, calm.losses, rtol=1e-9, atol=0)


@pytest.mark.timeout(300)
def test_controller_replans_when_the_context_grows():
    """Sequences 4x longer from step 4: every run trains the longer sequences from there (4x the tokens a step,
    the same losses whichever split), the loop on the best layout its twin gives the longer sequences."""
    twin, adaptive, static = _controller(4, 8, 4, "seq-grows@4x4", inter_mbps=5.0, start=Layout(dp=4))
    assert adaptive.tokens == static.tokens == [8 * 16] * 4 + [8 * 64] * 4
    np.testing.assert_allclose(adaptive.losses, static.losses, rtol=1e-9, atol=0)
    moved = [d for d in adaptive.decisions if d.reason == "sequence grew to 64"]
    assert adaptive.layout_path[-1][1] == (moved[0].after if moved else "tp1·pp1·dp4")


def test_a_longer_context_moves_to_ring_attention_on_a_slow_cluster():
    """Nodes joined at 1 MB/s: on 16 positions data parallelism over pp2 is the twin's best; at 4x the context the
    attention's share grows and ring attention (its hops inside a node) splits each sequence instead of the batch,
    so the re-plan at the growth moves to a cp layout, predicted faster there than the split it leaves."""
    twin, start, grown, static, _ = _rehearse("seq-grows@20x4", start=Layout(pp=2, dp=4), steps=60, inter_mbps=1.0)
    after = Layout.parse(grown.layout_path[-1][1], 8)
    assert grown.layout_path[-1][0] == 20 and after.cp > 1, grown.layout_path
    assert after == twin.best(None, 8, 64) and twin.predict(after, seq=64) < twin.predict(start, seq=64)
