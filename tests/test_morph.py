"""Resharding the live training state between layouts: plans as data, run over the fabric, exact."""

import numpy as np
import pytest

from netmorph.mesh.elements import element_map, global_ids
from netmorph.mesh.layout import Layout
from netmorph.mesh.shape import ModelShape
from netmorph.morph.layouts import train_config
from netmorph.morph.reshard import KINDS, execute, gather_reference, matches, plan
from netmorph.parallel.hybrid import train_rank
from netmorph.runtime.launch import launch

MODEL = ModelShape(layers=4, hidden=16, heads=4, seq=8, vocab=32)
GLOBAL_BATCH = 8


def run(layout: Layout, steps: int, start: int = 0, inits=None, model=MODEL):
    cfg = train_config(model, layout, steps, GLOBAL_BATCH, start)
    return launch(train_rank, cfg.world, cfg, None, inits, timeout=60)


def test_element_maps_are_the_trainers_layout():
    """The map of global ids equals what the trainer's own chunks hold: every rank's named pieces (its real
    weights after 1 step) are the 1-rank model's weights at the map's ids, and the buffer's real index (each
    parameter's offset and length, the padding, the optimizer's range) is the map's."""
    full = run(Layout(), 1)[0].state.pieces
    gids = global_ids(MODEL)
    values = np.zeros(sum(g.size for g in gids.values()))
    for name, (t, _) in full.items():
        values[gids[name].ravel()] = t.numpy().ravel()
    for layout in (Layout(tp=2, pp=2), Layout(dp=2, pp=2, interleave=2), Layout(tp=4), Layout(dp=4, zero=1)):
        maps = element_map(MODEL, layout)
        res = run(layout, 1)
        for r, (m, out) in enumerate(zip(maps, res)):
            assert (out.tp, out.pp, out.dp) == tuple(layout.coords(r)[k] for k in ("tp", "pp", "dp"))
            index = out.state.index
            for name, (off, n) in index["params"].items():
                piece = m.flat[off : off + n]
                assert np.isin(piece, gids[name]).all() and len(np.unique(piece)) == n, name
            assert index["padding"] == (m.flat < 0).sum() and index["optimizer_range"] == m.optimizer
            flat = out.state.flat["params"]
            real = m.flat >= 0
            # one step from the same start on every layout: equal to the 1-rank model to float64 rounding
            np.testing.assert_allclose(flat[real], values[m.flat[real]], rtol=0, atol=1e-12)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "before,after",
    [
        (Layout(dp=4, zero=3), Layout(tp=2, pp=2)),
        (Layout(tp=2, pp=2), Layout(dp=4, zero=3)),
        (Layout(pp=2, dp=2), Layout(dp=4)),
        (Layout(dp=4, zero=1), Layout(pp=2, dp=2)),
        (Layout(tp=2, dp=2, zero=1), Layout(pp=4)),
        (Layout(tp=2, pp=2, dp=2), Layout(dp=8, zero=3)),
        (Layout(dp=8, zero=2), Layout(tp=4, pp=2)),
    ],
)
def test_reshard_equals_an_unmorphed_run(before, after):
    """Train 2 steps on ``before``, reshard parameters and Adam state over the fabric, train 2 more on ``after``:
    every state element equals the gathered reference, the ledger's bytes equal the plan's, and the losses and
    the final model equal 4 steps on ``before`` (float64, 1e-9)."""
    a = run(before, 2)
    p = plan(MODEL, before, after)
    states, ledger = execute(p, [r.state.flat for r in a])
    ref = gather_reference(p, [r.state.flat for r in a])
    for m, st in zip(p.maps_after, states):
        for kind in KINDS:
            lo, hi = m.params if kind == "params" else m.optimizer
            g = m.flat[lo:hi]
            have = st["params"][lo:hi] if kind == "params" else st[kind]
            assert np.array_equal(have[g >= 0], ref[kind][g[g >= 0]])  # copies: bit for bit
        assert st["t"] == 2
    assert ledger.by_phase()["morph"] == {"messages": p.messages, "bytes": p.bytes} and p.bytes > 0
    b = run(after, 2, start=2, inits=states)
    whole = run(before, 4)
    losses = next(r.losses for r in whole if r.losses)
    morphed = next(r.losses for r in a if r.losses) + next(r.losses for r in b if r.losses)
    np.testing.assert_allclose(morphed, losses, rtol=1e-9, atol=0)
    from netmorph.parallel.state import assemble

    final_b, final_whole = assemble(b), assemble(whole)
    for name, t in final_whole.items():
        np.testing.assert_allclose(final_b[name].numpy(), t.numpy(), rtol=0, atol=1e-9)


def test_plan_counts_and_keeps_what_a_rank_has():
    p = plan(MODEL, Layout(dp=4), Layout(dp=4))
    assert p.bytes == 0 and p.messages == 0 and p.rounds == 0 and p.kept_bytes() > 0
    p = plan(MODEL, Layout(pp=2, dp=2), Layout(dp=4))
    m = p.bytes_matrix()
    assert m.sum() == p.bytes and np.all(np.diag(m) == 0)
    # replicas of a stage hold the same elements: each rank of dp=4 receives only the stage it lacks
    n_params = sum(g.size for g in global_ids(MODEL).values())
    assert p.bytes <= 4 * 3 * n_params * 8
    with pytest.raises(ValueError, match="surviving ranks"):
        plan(MODEL, Layout(dp=4), Layout(dp=2))


def test_plan_onto_the_survivors_of_a_lost_node():
    """Ranks 2 and 3 gone: replicas on 0 and 1 still hold everything (nothing to send for dp, one tp shard each way
    for tp2·dp2 -> pp2); a stage, a ZeRO shard or a tensor shard held only on the lost ranks is state lost."""
    from netmorph.morph.reshard import StateLost

    assert plan(MODEL, Layout(dp=4), Layout(dp=2), alive=[0, 1]).bytes == 0
    p = plan(MODEL, Layout(tp=2, dp=2), Layout(pp=2), alive=[0, 1])
    assert p.world == 2 and p.messages == 2 and p.bytes > 0
    for before in (Layout(pp=2, dp=2), Layout(dp=4, zero=1), Layout(dp=4, zero=3)):
        with pytest.raises(StateLost, match="no surviving rank"):
            plan(MODEL, before, Layout(dp=2), alive=[0, 1])
    with pytest.raises(ValueError, match="surviving ranks"):
        plan(MODEL, Layout(dp=4), Layout(dp=2), alive=[0, 1, 2])


@pytest.mark.timeout(300)
@pytest.mark.timeout(120)
def test_reshard_over_torch_distributed_equals_the_fabric_bit_for_bit():
    """The plan that morph runs between live ranks of torchrun jobs, on the torch transport (gloo): every rank ends
    with the fabric's state bit for bit, the ledger counts the plan's messages and bytes."""
    a = run(Layout(pp=2, dp=2), 2)
    p = plan(MODEL, Layout(pp=2, dp=2), Layout(dp=4))
    states = [r.state.flat for r in a]
    local, _ = execute(p, states)
    over_torch, ledger = execute(p, states, backend="torch")
    assert ledger.by_phase()["morph"] == {"messages": p.messages, "bytes": p.bytes} and p.bytes > 0
    for x, y in zip(local, over_torch):
        for kind in KINDS:
            assert np.array_equal(x[kind], y[kind])
        assert x["t"] == y["t"] == 2


def test_survivors_and_checkpoints_continue_the_unmorphed_run():
    """Two steps on 4 ranks, ranks 2 and 3 lost: tp2·dp2 reshards onto the survivors over the fabric; pp2·dp2 lost
    stage 1, so it reads the checkpoint of step 1 into the new layout and redoes step 1. Either way two (three) more
    steps on 2 ranks give the losses and weights of 4 steps on 4 ranks (float64, 1e-9)."""
    from netmorph.morph.reshard import restore
    from netmorph.parallel.state import assemble

    whole = run(Layout(dp=4), 4)
    losses = next(r.losses for r in whole if r.losses)
    final = assemble(whole)
    before, after = Layout(tp=2, dp=2), Layout(pp=2)
    a = run(before, 2)
    p = plan(MODEL, before, after, alive=[0, 1])
    states, ledger = execute(p, [r.state.flat for r in a[:2]])
    assert ledger.by_phase()["morph"]["bytes"] == p.bytes > 0
    b = run(after, 2, start=2, inits=states)
    got = next(r.losses for r in a if r.losses) + next(r.losses for r in b if r.losses)
    np.testing.assert_allclose(got, losses, rtol=1e-9, atol=0)
    for name, t in assemble(b).items():
        np.testing.assert_allclose(t.numpy(), final[name].numpy(), rtol=0, atol=1e-9)
    checkpoint = run(Layout(pp=2, dp=2), 1)
    c = run(
        Layout(dp=2),
        3,
        start=1,
        inits=restore(MODEL, Layout(pp=2, dp=2), [r.state.flat for r in checkpoint], Layout(dp=2)),
    )
    got = next(r.losses for r in checkpoint if r.losses) + next(r.losses for r in c if r.losses)
    np.testing.assert_allclose(got, losses, rtol=1e-9, atol=0)
    for name, t in assemble(c).items():
        np.testing.assert_allclose(t.numpy(), final[name].numpy(), rtol=0, atol=1e-9)


@pytest.mark.timeout(300)
def test_a_joining_node_is_sent_what_it_needs_and_the_run_continues():
    """Two steps on 2 ranks (pp2), then 2 ranks join holding nothing: the plan sends them their half of each stage
    (pp2·dp2, ZeRO-1), every element equals the gathered reference, the ledger's bytes are the plan's, and two
    more steps give the losses and weights of 4 steps on the 2 ranks (float64, 1e-9)."""
    from netmorph.parallel.state import assemble

    before, after = Layout(pp=2), Layout(pp=2, dp=2, zero=1)
    a = run(before, 2)
    p = plan(MODEL, before, after)
    assert p.world == 4 and all(t.src < 2 for t in p.transfers) and {t.dst for t in p.transfers} >= {2, 3}
    states, ledger = execute(p, [r.state.flat for r in a])
    assert ledger.by_phase()["morph"] == {"messages": p.messages, "bytes": p.bytes}
    assert matches(p, states, gather_reference(p, [r.state.flat for r in a])) and all(st["t"] == 2 for st in states)
    b = run(after, 2, start=2, inits=states)
    whole = run(before, 4)
    got = next(r.losses for r in a if r.losses) + next(r.losses for r in b if r.losses)
    np.testing.assert_allclose(got, next(r.losses for r in whole if r.losses), rtol=1e-9, atol=0)
    final = assemble(whole)
    for name, t in assemble(b).items():
        np.testing.assert_allclose(t.numpy(), final[name].numpy(), rtol=0, atol=1e-9)


def test_a_longer_context_copies_the_position_rows_and_starts_their_moments_at_zero():
    from dataclasses import replace

    from netmorph.morph.layouts import grow_sources

    long = replace(MODEL, seq=3 * MODEL.seq)
    src, a, b = grow_sources(MODEL, long), global_ids(MODEL), global_ids(long)
    assert np.array_equal(src["params"][b["wpe"]], a["wpe"][np.arange(long.seq) % MODEL.seq])
    assert np.all(src["m"][b["wpe"][MODEL.seq :]] == -1) and np.array_equal(src["m"][b["wpe"][: MODEL.seq]], a["wpe"])
    for name in ("wte", "0.qkv.w", "3.fc2.b", "ln_f.b"):
        assert np.array_equal(src["params"][b[name]], a[name]) and np.array_equal(src["v"][b[name]], a[name])
    with pytest.raises(ValueError, match="only the sequence"):
        grow_sources(MODEL, replace(MODEL, hidden=32))


@pytest.mark.timeout(300)
def test_reshard_into_a_longer_context_equals_the_one_rank_run():
    """Two steps on tp2·pp2 with 8 positions, then the context doubles while the state moves to dp4: the plan's
    bytes are the ledger's, every element is the gathered state's (copied rows, zero moments), and two more steps
    give the losses and weights of one rank doing the same (float64, 1e-9)."""
    from dataclasses import replace

    from netmorph.morph.reshard import matches, restore
    from netmorph.parallel.state import assemble

    long = replace(MODEL, seq=2 * MODEL.seq)
    a = run(Layout(tp=2, pp=2), 2)
    p = plan(MODEL, Layout(tp=2, pp=2), Layout(dp=4), grown=long)
    states, ledger = execute(p, [r.state.flat for r in a])
    assert matches(p, states, gather_reference(p, [r.state.flat for r in a]))
    assert ledger.by_phase()["morph"] == {"messages": p.messages, "bytes": p.bytes} and p.bytes > 0
    b = run(Layout(dp=4), 2, start=2, inits=states, model=long)
    one = run(Layout(), 2)
    one_b = run(Layout(), 2, start=2, inits=restore(MODEL, Layout(), [one[0].state.flat], Layout(), long), model=long)
    got = next(r.losses for r in a if r.losses) + next(r.losses for r in b if r.losses)
    np.testing.assert_allclose(got, one[0].losses + one_b[0].losses, rtol=1e-9, atol=0)
    final = assemble(one_b)
    assert final["wpe"].shape == (long.seq, MODEL.hidden)
    for name, t in assemble(b).items():
        np.testing.assert_allclose(t.numpy(), final[name].numpy(), rtol=0, atol=1e-9)


@pytest.mark.timeout(120)
def test_cli_morph_reshard_json_and_bad_input(capsys):
    import json

    from netmorph.cli import main

    assert (
        main(
            ["morph", "reshard", "--world", "4", "--from", "pp2,dp2", "--to", "tp2,dp2,zero1", "--steps", "1", "--json"]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["exact"] and out["ledger"] == {"messages": out["messages"], "bytes": out["bytes"]}
    assert sum(map(sum, out["matrix"])) == out["bytes"] > 0 and out["max_loss_diff"] <= 1e-9
    for argv, words in (
        (["--from", "tp3"], "--from"),
        (["--to", "pp2,zero3"], "--to"),
        (["--world", "0"], "--world"),
        (["--global-batch", "3"], "--global-batch"),
    ):
        assert main(["morph", "reshard", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0]


def test_bad_morph_run_input_is_one_line(capsys):
    from netmorph.cli import main

    for argv, words in (
        (["--scenario", "seq-grows@3x3"], "--scenario"),
        (["--scenario", "shrinks@3"], "--scenario"),
        (["--scenario", "node-lost@3x2"], "--scenario"),
        (["--scenario", "node-lost@3", "--world", "2"], "--world"),
        (["--inter-node-mbps", "0"], "--inter-node-mbps"),
        (["--checkpoint-every", "0"], "--checkpoint-every"),
        (["--scenario", "link-degrades@x"], "--scenario"),
        (["--world", "6"], "--world"),
        (["--segment", "1"], "--segment"),
        (["--steps", "5", "--segment", "9"], "--segment"),
        (["--static", "0", "--compare"], "--static 1 or more"),
        (["--static", "-1"], "--static"),
    ):
        assert main(["morph", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0]
