"""netmorph calibrate: a small profile of 2 and 4 local ranks in seconds, read back by plan and simulate as the
hardware; the fitted links are the emulated ones; a slower link prices the dp step by its bytes."""

import dataclasses
import json
import math
import statistics

import pytest

from netmorph.calibrate.links import fit
from netmorph.calibrate.relay import hop_seconds
from netmorph.calibrate.run import calibrate
from netmorph.cli import main
from netmorph.mesh.kernels import HEAD_KERNELS, LAYER_KERNELS, layer_kernels
from netmorph.mesh.layout import Batch, Knobs, Layout, Precision
from netmorph.mesh.shape import ModelShape
from netmorph.planner.hardware import PRESETS as HW
from netmorph.planner.hardware import PROFILE_FORMAT, load_hardware
from netmorph.planner.timing import step_time

pytestmark = pytest.mark.timeout(120)
FAST = 0.004  # seconds per compute measurement: a rough profile in a second or two


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Profiles of 2 ranks on two emulated nodes joined at 20 and at 80 MB/s (one hidden size: seconds)."""
    out = {}
    for mbps in (20.0, 80.0):
        path = tmp_path_factory.mktemp("profiles") / f"two-node-{mbps:g}.json"
        path.write_text(json.dumps(calibrate(2, inter_mbps=mbps, hidden=(32,), window=FAST)))
        out[mbps] = path
    return out


@pytest.fixture(scope="module")
def four():
    """A rough profile of one node of 4 ranks (two hidden sizes)."""
    return calibrate(4, hidden=(32, 64), window=FAST)


def test_a_profile_holds_the_planners_fields_the_raw_measurements_and_the_fit(four):
    prof = four
    assert prof["format"] == PROFILE_FORMAT and prof["machine"]["ranks"] == 4
    hw = prof["hardware"]
    assert hw["gpus_per_node"] == 4 and hw["peak_flops"] == max(r for *_, r in prof["compute"]["busy"]["gemm"])
    assert all(0 < e <= 1 for _, e in hw["gemm_table"]) and hw["op_overhead_s"] > 0
    # every GEMM a transformer layer runs, at every token count and hidden size asked for
    assert len(prof["compute"]["busy"]["gemm"]) == len(prof["compute"]["alone"]["gemm"]) == 2 * 3 * 4
    # the reference GPTs timed alone and busy, and what they made of the rates: scales, and how much slower
    # a rank computes with all four busy
    c = prof["compute"]
    assert len(c["references"]) == len(c["alone"]["reference_s"]) == len(c["busy"]["reference_s"]) == 2
    assert hw["compute_scale"] > 0 and c["operator_scale"] > 0 and hw["core_sharing"] >= 1
    side = c["busy"]["sharing"]  # alone and busy side by side in one launch: the ratio the planner reads
    assert side["repeats"] == 5 and hw["core_sharing"] == pytest.approx(max(1.0, side["busy_s"] / side["alone_s"]))
    assert hw["op_overhead_s"] == pytest.approx(c["op_s_measured"] * c["operator_scale"])
    assert hw["allreduce_algorithms"] == ["ring"] and hw["optimizer_bandwidth"] == c["busy"]["optimizer_bytes_per_s"]
    link = prof["links"]["intra"]
    assert link["same_node"] and len(link["one_way_s"]) == len(link["sizes"]) == len(link["pingpong_residuals"])
    assert hw["alpha_intra"] == link["alpha"] and hw["nvlink_bandwidth"] == 1 / link["beta"]
    assert "inter" not in prof["links"] and hw["nic_bandwidth"] == hw["nvlink_bandwidth"]  # one node
    # the pipeline relays: chains of 2 and of 4 ranks, each with and without its messages, and the hop from them
    relays = c["busy"]["relay"]
    assert [r["p"] for r in relays] == [2, 4] and all(r["step_s"] > 0 and r["compute_s"] > 0 for r in relays)
    assert hw["pipeline_hop_s"] == pytest.approx(
        hop_seconds(relays, hw["alpha_intra"] + relays[0]["nbytes"] / hw["nvlink_bandwidth"], hw["core_sharing"])
    )


def test_the_hop_is_what_makes_the_planners_pipeline_formula_give_the_relays_step():
    """Relays built from the planner's own formula with a known hop give that hop back; the planner's pipeline
    pays it on every send (2 v per microbatch, in every one of its shared_slots), the simulator on every
    stage-to-stage send, and a layout with one stage not at all."""
    from netmorph.planner.timing import shared_slots

    link, hop, cs, m = 1e-3, 2.5e-3, 3.0, 4
    relays = [
        {"p": p, "m": m, "compute_s": 0.04, "step_s": shared_slots(m, p, 1, cs) * (0.01 + 2 * (link + hop))}
        for p in (2, 4)
    ]
    assert hop_seconds(relays, link, cs) == pytest.approx(hop)
    assert hop_seconds([{**r, "step_s": r["compute_s"]} for r in relays], link, cs) == 0.0  # never below 0
    model = ModelShape(layers=4, hidden=64, heads=4, seq=32, vocab=128)
    hw = dataclasses.replace(HW["a100-40g"], core_sharing=cs)
    for lay, per_mb in (
        (Layout(pp=2, batch=Batch(global_batch=8, micro_batch_size=2)), 2),
        (Layout(pp=2, interleave=2, batch=Batch(global_batch=8, micro_batch_size=2)), 4),
        (Layout(dp=2, batch=Batch(global_batch=8, micro_batch_size=2)), 0),
    ):
        assert not lay.check(model)
        plain, hopped = (step_time(model, lay, dataclasses.replace(hw, pipeline_hop_s=h)) for h in (0.0, hop))
        slots = shared_slots(lay.microbatches, lay.pp, lay.interleave, cs)
        assert hopped.step_time_s - plain.step_time_s == pytest.approx(slots * per_mb * hop, rel=1e-9)
    from netmorph.simulate import simulate_config

    lay = Layout(pp=2, batch=Batch(global_batch=8, micro_batch_size=2))
    plain, hopped = (
        simulate_config(model, lay, dataclasses.replace(HW["a100-40g"], pipeline_hop_s=h)) for h in (0.0, hop)
    )
    assert hopped["step_time_s"] > plain["step_time_s"] + hop


def test_the_fit_is_alpha_plus_beta_n_and_its_residuals_are_relative():
    sizes = [8, 1 << 10, 1 << 16, 1 << 20]
    alpha, beta, res = fit(sizes, [20e-6 + n / 2e9 for n in sizes])
    assert math.isclose(alpha, 20e-6, rel_tol=1e-9) and math.isclose(beta, 1 / 2e9, rel_tol=1e-9)
    assert max(abs(r) for r in res) < 1e-9


def test_a_ring_all_reduce_sweep_gives_the_per_step_alpha_and_beta(four):
    """A ring all-reduce on p ranks is a cost per call (NCCL's baseLat) and 2(p-1) steps of n/p bytes: the fit
    recovers α and β from one group size, and the base beside them from several at once."""
    from netmorph.calibrate.links import RING_SIZES, fit_ring

    alpha, beta = 300e-6, 1 / 2e9

    def ring(p, base=0.0):
        return [base + 2 * (p - 1) * (alpha + n / p * beta) for n in RING_SIZES]

    for args, base in (
        ((4, RING_SIZES, ring(4)), 0.0),
        (([2, 4], [RING_SIZES] * 2, [ring(2), ring(4)]), 0.0),
        (([2, 4, 8], [RING_SIZES] * 3, [ring(2, 1e-3), ring(4, 1e-3), ring(8, 1e-3)]), 1e-3),
    ):
        base_fit, alpha_fit, beta_fit, res = fit_ring(*args)
        assert math.isclose(alpha_fit, alpha, rel_tol=1e-6) and math.isclose(beta_fit, beta, rel_tol=1e-6)
        assert math.isclose(base_fit, base, abs_tol=1e-12, rel_tol=1e-6)
        assert max(abs(r) for r in res) < 1e-6
    # one group size cannot tell a cost per call from the steps': all of it is α
    base_fit, alpha_fit, _, _ = fit_ring(4, RING_SIZES, ring(4, 1e-3))
    assert base_fit == 0 and math.isclose(alpha_fit, alpha + 1e-3 / 6, rel_tol=1e-6)
    prof = four  # one node of 4: the intra link is the rings'
    intra = prof["links"]["intra"]
    assert intra["fitted_from"].startswith("ring all-reduces on groups of 2, 4 ranks")
    assert [len(intra["ring_s"][g]) for g in ("2", "4")] == [len(RING_SIZES)] * 2
    assert len(intra["residuals"]) == 2 * len(RING_SIZES)
    assert prof["hardware"]["alpha_intra"] == intra["alpha"] and "pingpong_alpha" in intra
    assert prof["hardware"]["collective_base_s"] == intra["base"] >= 0
    assert [len(intra["ring_launches_s"][g]) for g in ("2", "4")] == [1, 1]  # a quick profile: one launch


def test_the_rings_are_the_median_of_their_launches():
    """Each group size's rings measured in several launches (how the scheduler lays a launch's processes on
    shared cores holds for the launch): the fitted rings are the per-size median of the launches."""
    import numpy as np

    from netmorph.calibrate.run import measure_links

    intra = measure_links(2, launches=3)["intra"]
    runs = intra["ring_launches_s"]["2"]
    assert len(runs) == 3 and all(len(r) == len(intra["ring_sizes"]) for r in runs)
    assert intra["ring_s"]["2"] == np.median(runs, axis=0).tolist()


def test_the_emulated_link_is_what_the_fit_finds(two_nodes):
    for mbps, path in two_nodes.items():
        prof = json.loads(path.read_text())
        inter = prof["links"]["inter"]
        assert not inter["same_node"] and inter["peer"] == 1 and prof["hardware"]["gpus_per_node"] == 1
        # the fabric imposes 50 us and mbps per byte; the fit adds the transport's own software and copies
        assert 0.6 < 1 / inter["beta"] / (mbps * 1e6) < 1.1, 1 / inter["beta"]
        assert inter["alpha"] >= 50e-6


def test_a_slower_link_prices_the_dp_step_by_the_bytes_over_it(two_nodes):
    """dp 2 across the two nodes: the gradient ring all-reduce is two steps of half the bytes, so the profile
    with the slower link predicts 2·Δα + n·Δβ more, n the gradient bytes -- through the planner's own model."""
    fast, slow = load_hardware(str(two_nodes[80.0])), load_hardware(str(two_nodes[20.0]))
    slow = dataclasses.replace(fast, alpha_inter=slow.alpha_inter, nic_bandwidth=slow.nic_bandwidth)
    model = ModelShape(layers=4, hidden=256, heads=4, seq=32, vocab=128)
    lay = Layout(
        dp=2,
        batch=Batch(global_batch=8, micro_batch_size=2),
        precision=Precision(param_bytes=4, grad_bytes=4, optimizer_bytes=8),
    )
    dp = {k: step_time(model, lay, hw).parts.data_parallel for k, hw in (("fast", fast), ("slow", slow))}
    n = model.params() * lay.precision.grad_bytes
    closed = 2 * (slow.alpha_inter - fast.alpha_inter) + n * (1 / slow.nic_bandwidth - 1 / fast.nic_bandwidth)
    assert dp["slow"] > dp["fast"] and math.isclose(dp["slow"] - dp["fast"], closed, rel_tol=1e-6)


def test_plan_and_simulate_read_a_profile_as_their_hardware(two_nodes, capsys):
    path = str(two_nodes[80.0])
    gpt = ["--layers", "4", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "128"]
    assert (
        main(
            [
                "plan",
                "estimate",
                "--hardware",
                path,
                *gpt,
                "--dp",
                "2",
                "--global-batch",
                "8",
                "--microbatch",
                "2",
                "--json",
            ]
        )
        == 0
    )
    est = json.loads(capsys.readouterr().out)
    assert est["step_time_s"] > 0
    assert (
        main(["simulate", "step", "--hardware", path, *gpt, "--dp", "2", "--global-batch", "8", "--microbatch", "2"])
        == 0
    )
    assert "local-2x-float32" in capsys.readouterr().out


def test_calibrate_command_writes_the_profile_and_bad_input_is_one_line(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["calibrate", "--world", "2", "--quick", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "intra (0 <-> 1)" in text and f"wrote {out}" in text
    assert json.loads(out.read_text())["hardware"]["gpus_per_node"] == 2
    for argv, flag in (
        (["--world", "1"], "--world"),
        (["--world", "3", "--inter-node-mbps", "10"], "--inter-node-mbps"),
        (["--inter-node-mbps", "0"], "--inter-node-mbps"),
        (["--backend", "torch", "--inter-node-mbps", "10"], "--inter-node-mbps"),
        (["--out", str(tmp_path / "p.txt")], "--out"),
    ):
        assert main(["calibrate", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and flag in err[0], err


@pytest.mark.parametrize(
    "field,value",
    [
        ("peak_flops", None),
        ("peak_flops", -1),
        ("alpha_intra", float("nan")),
        ("op_overhead_s", "fast"),
        ("gpus_per_node", 1.5),
    ],
)
def test_a_broken_profile_is_exit_2_naming_the_field(two_nodes, tmp_path, field, value, capsys):
    prof = json.loads(two_nodes[80.0].read_text())
    if value is None:
        del prof["hardware"][field]
    else:
        prof["hardware"][field] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(prof))
    assert (
        main(
            [
                "plan",
                "estimate",
                "--hardware",
                str(bad),
                "--layers",
                "4",
                "--hidden",
                "64",
                "--heads",
                "4",
                "--dp",
                "2",
                "--global-batch",
                "8",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--hardware" in err[0] and field in err[0], err


def test_a_layers_operator_cost_is_never_below_one_dispatch():
    """The operators' fixed cost is the tiny GPT at DEEP layers minus at one, a difference of two timings: on a
    busy machine the deeper model once timed faster and the profile carried op_overhead_s = -5e-6, which its own
    reader refused (CI: test_a_slower_link_prices_the_dp_step_by_the_bytes_over_it). The floor is the bare
    dispatch measured beside it; above the floor the difference is kept as measured."""
    from netmorph.calibrate.compute import DEEP, layer_seconds

    kernels = sum(LAYER_KERNELS)
    layer, op = layer_seconds(shallow_s=0.010, deep_s=0.009, dispatch_s=2e-6)
    assert layer == pytest.approx(kernels * 2e-6) and op == pytest.approx(2e-6)
    layer, op = layer_seconds(shallow_s=0.010, deep_s=0.010 + (DEEP - 1) * 0.004, dispatch_s=2e-6)
    assert layer == pytest.approx(0.004) and op == pytest.approx(0.004 / kernels)


def test_the_kernel_counts_the_planner_charges_are_the_gpts_own():
    """LAYER_KERNELS and HEAD_KERNELS (netmorph.mesh.kernels) -- what a profile's op_overhead_s is paid for -- are
    the aten operators netmorph's GPT dispatches, forward and backward, counted by a TorchDispatchMode; and an MoE
    layer's, layer_kernels(), for 2, 4 and 8 experts."""
    import torch

    from netmorph.calibrate.compute import _Count
    from netmorph.models.gpt import GPTStage, synthetic_batch

    def count(cfg):
        """(forward, backward) aten operators of one microbatch of ``cfg``'s GPT."""
        model = GPTStage(cfg, dtype=torch.float32)
        x, y = synthetic_batch(cfg, range(2))
        with _Count() as fwd:
            loss = model(x, y)
        with _Count() as bwd:
            loss.backward()
        return fwd.n, bwd.n

    counts = {layers: count(ModelShape(layers=layers, hidden=16, heads=2, seq=8, vocab=32)) for layers in (1, 3)}
    per_layer = tuple((counts[3][i] - counts[1][i]) // 2 for i in (0, 1))
    assert per_layer == LAYER_KERNELS
    assert tuple(counts[1][i] - per_layer[i] for i in (0, 1)) == HEAD_KERNELS
    # a mixture of experts' layer: a fixed part and a part per local expert (its loop runs every expert)
    for experts, top_k in ((2, 1), (4, 2), (8, 2)):
        cfg = ModelShape(layers=2, hidden=16, heads=2, seq=8, vocab=32, experts=experts, top_k=top_k)
        assert layer_kernels(cfg) == tuple((n - h) / 2 for n, h in zip(count(cfg), HEAD_KERNELS))


def test_validation_trains_layouts_and_predicts_them_from_the_profile():
    """Three layouts of 2 ranks trained for real beside the planner's prediction from a profile of those ranks;
    the summary's statistics are computed from the rows."""
    from netmorph.calibrate.validate import _spearman, layouts, summary, validate

    small = ModelShape(layers=4, hidden=64, heads=4, seq=32, vocab=128)
    names = {lay.tag() for lay in layouts(small, 2)}
    assert {"tp1·pp1·dp2", "tp1·pp1·dp2·zero3", "tp1·pp2·dp1", "tp2·pp1·dp1"} <= names
    out = validate(2, ("small",), steps=3, only=3, profile=calibrate(2, hidden=(32,), window=FAST), repeats=2)
    rows = out["rows"]
    assert len(rows) == 3 and all(r.measured_s > 0 and r.predicted_s > 0 for r in rows)
    from netmorph.cli import json_text
    from netmorph.cli.validate import document

    assert len(json.loads(json_text(document(out)))["rows"]) == 3  # what validate local --json prints
    # each layout trained twice, in rounds; the median counts and the spread is how far apart they fell
    assert all(len(r.repeats_s) == 2 and r.measured_s == pytest.approx(sum(r.repeats_s) / 2) for r in rows)
    assert all(math.isclose(r.spread, max(r.repeats_s) / min(r.repeats_s) - 1) for r in rows)
    assert all(math.isclose(r.error, r.predicted_s / r.measured_s - 1) for r in rows)
    # each run bracketed by the speed probe: the prediction is the profile's times the median drift
    assert out["probe_s"] > 0 and all(len(r.drift) == 2 and min(r.drift) > 0 for r in rows)
    assert all(math.isclose(r.predicted_s, r.predicted_raw_s * statistics.median(r.drift)) for r in rows)
    # each step split as the trainer's clock splits it, beside the prediction in the same parts (which add up to it)
    from netmorph.parallel.phases import PHASES

    assert all(tuple(r.measured_split) == PHASES == tuple(r.predicted_split) for r in rows)
    assert all(math.isclose(sum(r.predicted_split.values()), r.predicted_s) for r in rows)
    assert all(r.measured_split["compute"] > 0 and min(r.measured_split.values()) >= 0 for r in rows)
    s = summary(rows)
    assert s["phases"]["compute"] == pytest.approx(
        (sum(r.measured_split["compute"] for r in rows), sum(r.predicted_split["compute"] for r in rows))
    )
    assert math.isclose(s["raw_mean_abs_error"], sum(abs(r.predicted_raw_s / r.measured_s - 1) for r in rows) / 3)
    assert s["drift_range"] == (min(min(r.drift) for r in rows), max(max(r.drift) for r in rows))
    assert math.isclose(s["mean_abs_error"], sum(abs(r.error) for r in rows) / 3)
    assert math.isclose(s["mean_spread"], sum(r.spread for r in rows) / 3)
    assert s["by_model"]["small"]["layouts"] == 3
    assert _spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert _spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert _spearman([1, 2, 3], [5, 5, 9]) == pytest.approx(0.8660254, rel=1e-6)  # a tie shares its rank


def test_measured_overlap_decides_how_much_of_the_dp_reduction_is_exposed(two_nodes):
    """The profile's overlap (a ring all-reduce on a thread beside GEMMs, measured) enters the planner where the
    presets assume a GPU's: at 0 the whole gradient reduction is exposed, bucket by bucket; at 1 each layer's
    backward hides a bucket (Megatron's overlap_grad_reduce) and only the last ones are exposed."""
    prof = json.loads(two_nodes[80.0].read_text())
    ov = prof["compute"]["busy"]["overlap"]
    assert 0 <= ov["overlap"] <= 1 and ov["both_s"] > 0 and prof["hardware"]["overlap"] == ov["overlap"]
    hw = load_hardware(str(two_nodes[80.0]))
    model = ModelShape(layers=4, hidden=256, heads=4, seq=32, vocab=128)
    lay = Layout(
        dp=2,
        batch=Batch(global_batch=8, micro_batch_size=2),
        precision=Precision(param_bytes=4, grad_bytes=4, optimizer_bytes=8),
        knobs=Knobs(dp_overlap=True),
    )
    none = step_time(model, lay, dataclasses.replace(hw, overlap=0.0))
    full = step_time(model, lay, dataclasses.replace(hw, overlap=1.0))
    plain = step_time(model, lay.replace(dp_overlap=False), hw)
    assert none.comm_hidden_s == 0 and plain.comm_hidden_s == 0  # nothing hidden
    assert none.parts.data_parallel >= plain.parts.data_parallel  # a bucket a layer: more α
    assert full.parts.data_parallel < none.parts.data_parallel
    assert hw.comm_slowdown == 0 and full.overlap_slowdown_s == 0  # the local fabric's collectives: threads


def test_the_planner_prices_the_tp_collectives_the_trainer_sends():
    """Per microbatch the trainer's TP ranks all-reduce four activations per layer, the embedding's output, the
    logits' input gradient and the vocabulary-parallel loss's three token vectors (its closed form,
    netmorph.parallel.traffic); over a link of 1 GB/s with no latency the planner's TP seconds are those bytes."""
    from netmorph.parallel.config import TrainConfig
    from netmorph.parallel.traffic import predicted
    from netmorph.planner.hardware import Hardware

    small = ModelShape(layers=4, hidden=64, heads=4, seq=32, vocab=128)
    hw = Hardware(
        "wire", 1e15, 1e12, 1e15, 8, 1e9, 1e9, alpha_intra=0.0, alpha_inter=0.0, allreduce_algorithms=("ring",)
    )
    for t in (2, 4):
        cfg = TrainConfig.make(model=small, tp=t, microbatches=4, micro_batch_size=2)
        lay = cfg.layout.replace(param_bytes=8, grad_bytes=8, optimizer_bytes=16, activation_bytes=8)
        seconds = step_time(small, lay, hw).parts.tensor_parallel
        sent = predicted(cfg, 0, 0, 8, True, True, small.layers)["tp"][0]
        assert seconds * 1e9 == pytest.approx(sent, rel=1e-3)


def test_a_profile_says_its_allreduce_algorithm_and_its_optimizers_rate(tmp_path, capsys):
    """A profile's ring-only all-reduce is priced as a ring (NCCL's choice of tree would be cheaper for small
    messages); its measured optimizer rate prices the optimizer step; an unknown algorithm is one line."""
    from netmorph.planner.hardware import PRESETS, hardware_from
    from netmorph.planner.timing import collective_time, optimizer_time

    a100 = PRESETS["a100-80g"]
    ring = dataclasses.replace(a100, allreduce_algorithms=("ring",))
    assert collective_time(ring, "allreduce", 8, 1, 1 << 10) > collective_time(a100, "allreduce", 8, 1, 1 << 10)
    assert collective_time(ring, "allreduce", 8, 1, 1 << 30) == collective_time(a100, "allreduce", 8, 1, 1 << 30)
    lay = Layout(dp=8, batch=Batch(global_batch=8, micro_batch_size=1))
    slow = dataclasses.replace(a100, optimizer_bandwidth=a100.hbm_bandwidth / 5)
    assert optimizer_time(1e9, lay, slow) == pytest.approx(5 * optimizer_time(1e9, lay, a100))
    data = {k: v for k, v in dataclasses.asdict(a100).items() if not k.endswith("_table")}
    data["allreduce_algorithms"] = ["ring"]
    assert hardware_from(data, "here").allreduce_algorithms == ("ring",)
    path = tmp_path / "hw.json"
    path.write_text(json.dumps({**data, "allreduce_algorithms": ["nvls"]}))
    assert (
        main(
            [
                "plan",
                "estimate",
                "--hardware",
                str(path),
                "--model",
                "llama-2-7b",
                "--tp",
                "1",
                "--pp",
                "1",
                "--dp",
                "8",
                "--global-batch",
                "8",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert "allreduce_algorithms" in err and len(err.splitlines()) == 1


def test_where_ranks_share_cores_the_pipelines_bubble_is_lent_to_the_others():
    """On a device per rank (core_sharing 1) the bubble is (p-1)/v slots; where a rank computes s times slower
    while all do than alone, the ranks of the fill and drain run faster: the wave of m + p - 1 steps, A stages
    active at each (1, 2, 3, 4, 3, 2, 1 here), each step at a rank's own speed times max(1, s·A/p) -- over s, in
    slots of every rank busy. It lies between the critical path alone, 7/s, and the m slots of the ranks' work."""
    from netmorph.planner.hardware import PRESETS

    a100 = PRESETS["a100-80g"]
    model = ModelShape(layers=8, hidden=1024, heads=16, seq=512, vocab=1024)
    lay = Layout(pp=4, batch=Batch(global_batch=4, micro_batch_size=1))  # m = 4, 7 slots
    base = step_time(model, lay, a100)
    per_mb = base.bubble_s / 3
    for s, slots in (
        (1.0, 7),
        (1.4, (1 + 1 + 1.05 + 1.4 + 1.05 + 1 + 1) / 1.4),
        (2.0, (1 + 1 + 1.5 + 2 + 1.5 + 1 + 1) / 2),
        (8.0, (2 + 4 + 6 + 8 + 6 + 4 + 2) / 8),
    ):
        got = step_time(model, lay, dataclasses.replace(a100, core_sharing=s))
        assert got.bubble_s == pytest.approx((slots - 4) * per_mb, abs=1e-12)
        assert got.step_time_s == pytest.approx(base.step_time_s - (7 - slots) * per_mb)


def test_the_reference_gpts_scale_the_operators_and_the_flops_apart():
    """Two reference GPTs, one heavy in operators and one in FLOPs, measured at k_ops times the planner's
    operator part plus k_flops times its FLOP part: the two scales come back."""
    from netmorph.calibrate.compute import REFERENCES
    from netmorph.calibrate.profile import reference_compute, scales
    from netmorph.planner.hardware import Hardware

    hw = Hardware("cpu", 50e9, 8e9, 10e9, 4, 3e9, 3e9, gemm_efficiency=0.5, op_overhead_s=10e-6)
    bare = dataclasses.replace(hw, op_overhead_s=0.0)
    for k_ops, k_flops in ((1.0, 1.0), (0.5, 2.0), (3.0, 1.2)):
        measured = [
            k_ops * (reference_compute(hw, "float32", s) - reference_compute(bare, "float32", s))
            + k_flops * reference_compute(bare, "float32", s)
            for s in REFERENCES
        ]
        assert scales(hw, "float32", measured) == pytest.approx((k_ops, k_flops), rel=1e-6)


def test_the_validation_table_shows_each_part_measured_over_predicted():
    from netmorph.calibrate.validate import Row, summary
    from netmorph.cli.validate import parts_shown, phase_totals, split_cells

    ms = dict(compute=0.08, tp=0.0, ep=0.0, dp=0.01, optimizer=0.002, rest=0.008)
    ps = dict(compute=0.07, tp=0.0, ep=0.0, dp=0.02, optimizer=0.002, rest=0.0)
    r = Row(
        "small", Layout(dp=2), 0.1, 0.092, {}, repeats_s=(0.1,), drift=(1.0,), measured_split=ms, predicted_split=ps
    )
    assert parts_shown([r]) == ["compute", "dp", "optimizer", "rest"]  # no TP, no experts: not shown
    assert split_cells(r, ["compute", "dp"]).split() == ["80.0/70.0", "10.0/20.0"]
    assert "compute 0.08/0.07 s (-12%), dp 0.01/0.02 s (+100%)" in phase_totals(summary([r]), parts_shown([r]))
