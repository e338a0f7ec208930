"""Zero-bubble pipelines: each backward split into B (the input gradient) and a later W (the weight gradient)
equals the joint backward; ZB-H1, ZB-V and DualPipeV are schedules as data that their check plays for deadlock
(and rejects broken orders), buy back most of 1F1B's bubble at (about) 1F1B's activations, train to the 1-rank
run, hold the weight-gradient stash the memory model counts, and are priced alike by the planner and the step
simulator."""

import pytest
import torch

from netmorph.mesh.shape import ModelShape
from netmorph.models.gpt import GPTStage, synthetic_batch
from netmorph.models.weight_grad import WeightGradStore
from netmorph.parallel.config import TrainConfig
from netmorph.parallel.hybrid import train_rank
from netmorph.parallel.pipeline import Slot, bubble, check, peaks, schedule
from netmorph.parallel.run import reference, summarise
from netmorph.parallel.tensor_parallel import TensorParallel
from netmorph.runtime import launch
from netmorph.runtime.base import Group

pytestmark = pytest.mark.timeout(120)

TINY = ModelShape(layers=4, hidden=32, heads=4, seq=16, vocab=64)
TINY8 = ModelShape(layers=8, hidden=32, heads=4, seq=16, vocab=64)  # pp 4 in a V: 8 chunks


def _split_rank(comm):
    """Every parameter's gradient of one GPT microbatch: joint backward, and B then W through a store."""
    x, y = synthetic_batch(TINY, range(2))
    joint = GPTStage(TINY, layers=TensorParallel(comm, Group([0])), dtype=torch.float64)
    joint(x, y).backward()
    store = WeightGradStore()
    split = GPTStage(TINY, layers=TensorParallel(comm, Group([0]), weight_store=store), dtype=torch.float64)
    loss = split(x, y)
    with store.deferring("mb0"):
        loss.backward()
    held = {n for n, p in split.named_parameters() if p.grad is None}  # what B left for W
    queued = len(store)
    store.run("mb0")
    diff = max(float((p.grad - q.grad).abs().max()) for p, q in zip(joint.parameters(), split.parameters()))
    return held, queued, diff


def test_b_then_w_equals_the_joint_backward_and_w_holds_exactly_the_linear_weights():
    held, queued, diff = launch(_split_rank, 1, timeout=60)[0]
    linears = {f"blocks.{i}.{m}.weight" for i in range(TINY.layers) for m in ("qkv", "proj", "fc", "fc2")}
    assert held == linears and queued == len(linears)
    assert diff < 1e-12


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_zb_h1_is_a_valid_schedule_with_1f1b_activations_and_a_third_of_its_bubble(p, m):
    zb, ofob = schedule("zb-h1", p, m), schedule("1f1b", p, m)
    for row in zb:
        assert sorted((s.kind, s.microbatch) for s in row) == sorted((k, i) for k in "FBW" for i in range(m))
        assert all(row.index(Slot("W", i)) > row.index(Slot("B", i)) for i in range(m))
    assert check(zb) == check(ofob) == min(p, m)  # microbatches between F and B: 1F1B's peak
    ratio = bubble(zb) / bubble(ofob)  # the paper's unit F, B, W; 1F1B's B runs both
    assert ratio <= 0.45, ratio
    theory = (p - 1) / (3 * m + p - 1)  # (p-1)(F+B-W) over the makespan
    assert bubble(zb) == pytest.approx(theory, abs=0.02)


def test_a_broken_zero_bubble_order_is_refused_before_it_runs():
    good = schedule("zb-h1", 2, 2)
    w_first = [list(row) for row in good]
    i, j = w_first[1].index(Slot("W", 0)), w_first[1].index(Slot("B", 0))
    w_first[1][i], w_first[1][j] = w_first[1][j], w_first[1][i]  # W0 before its B0 on the last stage
    with pytest.raises(RuntimeError, match="deadlocks"):
        check(w_first)
    with pytest.raises(RuntimeError, match="deadlocks"):
        bubble(w_first)


LAYOUTS = [
    dict(pp=2),
    dict(pp=4, microbatches=8),
    dict(pp=2, tp=2, sequence_parallel=True),
    dict(pp=2, dp=2, zero=1),
    dict(pp=2, cp=2),
    dict(pp=2, tp=2, dp=2),
]


@pytest.mark.parametrize("kw", LAYOUTS, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_zb_h1_equals_the_one_rank_run(kw):
    kw.setdefault("microbatches", 4)
    cfg = TrainConfig.make(model=TINY, steps=2, schedule="zb-h1", **kw)
    cfg.check()
    out = summarise(cfg, launch(train_rank, cfg.world, cfg, timeout=60), "local", reference(cfg))
    assert out.max_rel_loss_diff < 1e-9 and out.max_abs_weight_diff < 1e-9, out.losses
    assert all(out.traffic_exact.values()) and out.in_flight_peak[0] == cfg.layout.pp
    kinds = {k for rank in out.timeline.values() for k, *_ in rank}
    assert kinds == {"F", "B", "W"}


def test_the_planner_and_the_simulator_price_zb_h1_by_the_same_weight_gradients():
    """GPT-3 175B on 1,024 A100s, tp8 pp8: ZB-H1 moves the slowest stage's weight-gradient GEMMs (the planner's
    matmul_wgrad per layer) into the drain -- the bubble (p-1)(1 - 2W/per_mb)/m instead of (p-1)/m -- and the
    step simulator, playing the same schedule slot by slot, saves what the planner says within 2%."""
    from netmorph.mesh.layout import Batch, Layout
    from netmorph.mesh.presets import PRESETS
    from netmorph.planner.hardware import PRESETS as HW
    from netmorph.planner.layers import layer_costs
    from netmorph.planner.search import estimate
    from netmorph.simulate import simulate_config

    m, hw = PRESETS["gpt3-175b"], HW["a100-80g"]
    lay = {
        s: Layout(tp=8, pp=8, dp=16, batch=Batch(global_batch=1536, micro_batch_size=1, schedule=s))
        for s in ("1f1b", "zb-h1")
    }
    plan = {s: estimate(m, c, hw) for s, c in lay.items()}
    w = 12 * layer_costs(m, lay["zb-h1"], hw)["matmul_wgrad"]  # 96 layers over 8 stages
    per_mb = plan["1f1b"].step.bubble_s / 7  # the bubble is (p - 1) slots of it
    assert plan["zb-h1"].step.bubble_s == pytest.approx(7 * (per_mb - 2 * w), rel=1e-9)
    assert plan["zb-h1"].step.bubble_fraction < plan["1f1b"].step.bubble_fraction / 1.5
    sim = {s: simulate_config(m, c, hw) for s, c in lay.items()}
    saved = sim["1f1b"]["step_time_s"] - sim["zb-h1"]["step_time_s"]
    assert saved == pytest.approx(plan["1f1b"].step.step_time_s - plan["zb-h1"].step.step_time_s, rel=0.02)


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 12), (8, 16)])
def test_v_schedules_run_every_chunk_once_with_1f1b_memory_and_a_fifth_of_its_bubble(name, p, m):
    """Both chunks of every microbatch on every rank; W after its B; the played peaks equal the closed forms
    (Layout.in_flight, Layout.w_stash: ZB-V 2p chunks and 2r + 1 owed, DualPipeV 2p + 1 and r + 1); the unit-cost
    bubble (p-1)/(6m+p-1), at most 0.4x 1F1B's."""
    from netmorph.mesh.layout import Batch, Layout
    from netmorph.parallel.pipeline import theory

    slots = schedule(name, p, m, 2)
    for row in slots:
        assert sorted(row, key=str) == sorted((Slot(k, i, c) for k in "FBW" for i in range(m) for c in (0, 1)), key=str)
        assert all(row.index(Slot("W", i, c)) > row.index(Slot("B", i, c)) for i in range(m) for c in (0, 1))
    lay = Layout(pp=p, batch=Batch(global_batch=m, schedule=name))
    assert (
        lay.interleave == 2
        and lay.v_shaped
        and [lay.virtual_stage(r, 1) for r in range(p)] == list(range(2 * p - 1, p - 1, -1))
    )
    held, owed = peaks(slots, 2, True)
    assert held == [2 * lay.in_flight(r) for r in range(p)]
    assert owed == [2 * lay.w_stash(r) for r in range(p)]
    unit = bubble(slots, 2, True)
    assert unit == pytest.approx(theory(name, p, m)[0], abs=1e-12)
    assert unit <= 0.4 * bubble(schedule("1f1b", p, m))


def test_a_broken_v_order_is_refused_before_it_runs():
    """The V's bottom: rank p-1 runs chunk 1 of a microbatch only after its own chunk 0 -- swapped, it waits on
    itself."""
    good = schedule("zbv", 2, 4, 2)
    bad = [list(row) for row in good]
    i, j = bad[1].index(Slot("F", 0, 0)), bad[1].index(Slot("F", 0, 1))
    bad[1][i], bad[1][j] = bad[1][j], bad[1][i]
    check(good, 2, True)
    with pytest.raises(RuntimeError, match="deadlocks"):
        check(bad, 2, True)
    with pytest.raises(RuntimeError, match="deadlocks"):
        bubble(bad, 2, True)


V_LAYOUTS = [
    ("zbv", dict(pp=2)),
    ("zbv", dict(pp=4, microbatches=8)),
    ("zbv", dict(pp=2, tp=2)),
    ("zbv", dict(pp=2, dp=2, zero=1)),
    ("dualpipev", dict(pp=2)),
    ("dualpipev", dict(pp=4, microbatches=8)),
    ("dualpipev", dict(pp=2, tp=2, sequence_parallel=True)),
    ("dualpipev", dict(pp=2, dp=2)),
    ("zb-h1", dict(pp=2, tp=2, sequence_parallel=True)),
]


@pytest.mark.parametrize(
    "name, kw", V_LAYOUTS, ids=lambda x: x if isinstance(x, str) else "-".join(f"{k}{v}" for k, v in x.items())
)
def test_v_schedules_equal_the_one_rank_run_and_hold_the_stash_the_planner_counts(name, kw):
    """float64 losses and weights equal the 1-rank run's; the bytes equal their closed forms (a V's bottom
    sends nothing, the tied embedding's two copies are both rank 0's); every rank's WeightGradStore held at most
    exactly what the memory model says: Layout.w_stash stage-layers' worth of wgrad_stash_elements."""
    from netmorph.planner.memory import wgrad_stash_elements

    kw.setdefault("microbatches", 4)
    model = TINY8 if kw["pp"] == 4 else TINY
    cfg = TrainConfig.make(model=model, steps=2, schedule=name, **kw)
    cfg.check()
    ranks = launch(train_rank, cfg.world, cfg, timeout=60)
    out = summarise(cfg, ranks, "local", reference(cfg))
    assert out.max_rel_loss_diff < 1e-9 and out.max_abs_weight_diff < 1e-9, out.losses
    assert all(out.traffic_exact.values()), out.traffic_exact
    lay = cfg.layout
    assert "pp.emb" not in out.bytes_per_rank_by_phase or not lay.v_shaped
    ins, grads = wgrad_stash_elements(model, lay)
    for r in ranks:
        i = lay.coords(r.rank)["pp"]
        assert r.memory_bytes["wgrad_stash_peak"] == lay.w_stash(i) * model.layers / lay.pp * (ins + grads) * 8
        assert r.in_flight_peak == lay.in_flight(i) * lay.interleave


def test_the_planner_and_the_simulator_price_the_v_schedules_alike():
    """GPT-3 175B, tp8 pp8 on 1,024 A100s: ZB-V and DualPipeV played by the planner (its idle share of the
    schedule) and by the step simulator (slot by slot, the V's bottom local) agree on the step within 2.5%; both
    say each zero-bubble schedule beats 1F1B. ZB-V holds 1F1B's activations (its stash grows as its
    microbatches in flight drain); the search, given the schedules, picks one."""
    from netmorph.mesh.layout import Batch, Layout
    from netmorph.mesh.presets import PRESETS
    from netmorph.planner.hardware import PRESETS as HW
    from netmorph.planner.search import estimate, search
    from netmorph.simulate import simulate_config

    m, hw = PRESETS["gpt3-175b"], HW["a100-80g"]
    out = {}
    for s in ("1f1b", "zb-h1", "zbv", "dualpipev"):
        c = Layout(tp=8, pp=8, dp=16, batch=Batch(global_batch=1536, micro_batch_size=1, schedule=s))
        out[s] = estimate(m, c, hw), simulate_config(m, c, hw)
        assert out[s][1]["step_time_s"] == pytest.approx(out[s][0].step.step_time_s, rel=0.025), s
    for s in ("zb-h1", "zbv", "dualpipev"):
        assert out[s][0].step.step_time_s < out["1f1b"][0].step.step_time_s
        assert out[s][1]["step_time_s"] < out["1f1b"][1]["step_time_s"]
    assert out["zbv"][0].memory.activations == pytest.approx(  # rank 0 holds both ends' extras
        out["1f1b"][0].memory.activations, rel=0.002
    )
    assert out["zb-h1"][0].memory.activations > out["1f1b"][0].memory.activations
    plain = search(m, 1024, hw, 1536, top=3)
    every = search(m, 1024, hw, 1536, top=3, schedules=("", "zb-h1", "zbv", "dualpipev"))
    assert {e.layout.pipeline_schedule for e in plain.ranked} <= {"1f1b", "interleaved"}
    assert every.ranked[0].layout.pipeline_schedule in ("zb-h1", "zbv", "dualpipev")
    assert every.ranked[0].step.step_time_s < plain.ranked[0].step.step_time_s
