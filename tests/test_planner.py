"""The planner: the papers' formulas, the search, and the CLI."""

import json
from dataclasses import asdict, replace

import pytest

from netmorph.cli import main
from netmorph.errors import UsageError
from netmorph.mesh.layout import Batch, Knobs, Layout, Precision
from netmorph.mesh.presets import PRESETS, from_args
from netmorph.mesh.shape import ModelShape
from netmorph.planner.hardware import PRESETS as HW
from netmorph.planner.memory import activation_bytes_per_layer, memory
from netmorph.planner.search import check, estimate, search
from netmorph.planner.timing import step_time

A100 = HW["a100-80g"]
H100 = HW["h100-80g"]


@pytest.mark.parametrize("zero,want_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_zero_paper_table1_row(zero, want_gb):
    m = ModelShape("7.5B", 0, 0, 0, params_only=7.5e9)
    got = memory(m, Layout(dp=64, zero=zero, precision=Precision(grad_bytes=2)))
    assert got.activations == 0
    assert round(got.total / 1e9, 2 if zero == 3 else 1) == want_gb


def test_narayanan_1t_params_and_flops():
    m = PRESETS["ptdp-1t"]
    assert round(m.params() / 1e9, 1) == 1008.0
    assert round(m.flops_per_iteration(3072, "full") / 1e19, 3) == 5.139
    # eq. 3 literally: 96 B s l h^2 (1 + s/6h + V/16lh), and 72 (...V/12lh) without recomputation
    B, s, l, h, V = 3072, 2048, 128, 25600, 51200
    assert m.flops_per_iteration(B, "full") == pytest.approx(
        96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    )
    assert m.flops_per_iteration(B, "none") == pytest.approx(
        72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    )


def test_params_eq2_for_every_table1_model():
    for name, billions in (("ptdp-1.7b", 1.7), ("ptdp-18.4b", 18.4), ("ptdp-145.6b", 145.6), ("ptdp-529.6b", 529.6)):
        assert round(PRESETS[name].params() / 1e9, 1) == pytest.approx(billions, abs=0.06)


def test_bubble_p8_m8():
    m = PRESETS["gpt3-175b"]
    e = estimate(
        m,
        Layout(tp=8, pp=8, dp=1, batch=Batch(micro_batch_size=1, global_batch=8), knobs=Knobs(recompute="full")),
        A100,
    )
    assert e.step.bubble_fraction == pytest.approx(0.875)
    e2 = estimate(
        m,
        Layout(
            tp=8,
            pp=8,
            dp=1,
            interleave=2,
            batch=Batch(micro_batch_size=1, global_batch=8),
            knobs=Knobs(recompute="full"),
        ),
        A100,
    )
    assert e2.step.bubble_fraction == pytest.approx(7 / 16)
    assert e2.step.step_time_s < e.step.step_time_s


def test_korthikanti_activation_table():
    m = ModelShape("x", 1, 12288, 96, 2048, 51200, dropout=True)
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    c = Layout(tp=t, batch=Batch(micro_batch_size=b))
    assert activation_bytes_per_layer(m, Layout(batch=Batch(micro_batch_size=b))) == pytest.approx(
        sbh * (34 + 5 * a * s / h)
    )
    assert activation_bytes_per_layer(m, c) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    sp = Layout(tp=t, batch=Batch(micro_batch_size=b), knobs=Knobs(sequence_parallel=True))
    assert activation_bytes_per_layer(m, sp) == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    assert activation_bytes_per_layer(m, sp, "selective") == pytest.approx(34 * sbh / t)
    assert activation_bytes_per_layer(m, c, "full") == pytest.approx(2 * sbh)


def test_memory_shrinks_the_way_the_splits_say():
    m = PRESETS["gpt3-175b"]
    base = memory(m, Layout(tp=1, pp=1, dp=8, batch=Batch(global_batch=8)))
    tp8 = memory(m, Layout(tp=8, pp=1, dp=1, batch=Batch(global_batch=8)))
    assert tp8.params < base.params / 7 and tp8.activations < base.activations
    full = memory(m, Layout(tp=8, pp=1, dp=1, batch=Batch(global_batch=8), knobs=Knobs(recompute="full")))
    assert full.activations < tp8.activations / 10


def test_search_1t_on_3072_gpus_is_ranked():
    """(Its speed is a benchmark: benchmarks/planner.py, not a timed test.)"""
    res = search(PRESETS["ptdp-1t"], 3072, A100, 3072)
    top = res.ranked
    assert res.fits > 0 and top
    times = [e.step.step_time_s for e in top]
    assert times == sorted(times)
    assert all(e.fits and e.layout.tp <= 8 for e in top)
    assert res.rejected["memory"].count > 0 and "inter-node-tp" in res.rejected
    assert res.searched == res.fits + sum(r.count for r in res.rejected.values())
    assert all(e.layout.gpus == 3072 for e in top)


def test_rules_reject_with_reasons():
    m = PRESETS["gpt3-175b"]
    from netmorph.cli.plan import FLAGS
    from netmorph.errors import spell

    cases = [
        (Layout(tp=5), "heads", "--tp or --heads", "heads"),
        (Layout(pp=97), "layers", "--pp or --first-stage-layers/--last-stage-layers", "layers"),
        (Layout(pp=4, interleave=25, batch=Batch(global_batch=4)), "layers", "--pp or --interleave", "interleave"),
        (Layout(cp=3), "cp-flash", "--cp or --attention", "flash"),
        (Layout(tp=16), "inter-node-tp", "--tp", "inter-node"),
        (Layout(dp=3, batch=Batch(global_batch=8)), "batch", "--global-batch or --microbatch", "does not split"),
        (
            Layout(tp=1, knobs=Knobs(sequence_parallel=True)),
            "sp-needs-tp",
            "--sequence-parallel or --tp",
            "sequence parallelism",
        ),
    ]
    for cfg, key, flag, words in cases:
        why = check(m, cfg, A100)
        assert (why.key, spell(why.flag, FLAGS)) == (key, flag) and words in why.text
        assert "--" not in why.flag  # the library names parameters; the CLI spells them
        assert why.soft == (key == "inter-node-tp")
    assert check(m, Layout(tp=8, pp=8, dp=16, batch=Batch(global_batch=1536)), A100) is None
    # since Megatron-Core and DeepSpeed run them: uneven stages, ZeRO-3 (FSDP) with pp, interleave to 16
    assert check(m, Layout(pp=5), A100) is None and Layout(pp=5).stage_layers(96) == [19, 20, 19, 19, 19]
    assert check(m, Layout(pp=2, zero=3, batch=Batch(global_batch=8)), A100) is None
    assert check(m, Layout(pp=2, zero=2, batch=Batch(global_batch=8)), A100) is None


def test_fsdp_with_a_pipeline_is_zero1s_memory_and_traffic(capsys):
    """ZeRO-2/3 with pp: FSDP2 under torch.distributed.pipelining (torchtitan) keeps a stage's weights gathered
    (reshard_after_forward=False) and accumulates gradients unsharded until the last microbatch -- priced as
    ZeRO-1, said so; netmorph's trainer (as DeepSpeed's pipeline engine) refuses it."""
    m = PRESETS["llama-3-70b"]
    c = Layout(tp=8, pp=4, dp=4, zero=3, batch=Batch(global_batch=64), knobs=Knobs(dp_overlap=True))
    one = estimate(m, replace(c, zero=1), H100)
    three = estimate(m, c, H100)
    assert three.memory == one.memory and three.step.step_time_s == one.step.step_time_s
    assert c.sharding == 1 and replace(c, pp=1).sharding == 3
    from netmorph.parallel import limits

    assert not c.check() and [r.key for r in limits.check(c)] == ["zero-pp"]
    assert (
        main(
            [
                "plan",
                "estimate",
                "--model",
                "llama-3-70b",
                "--hardware",
                "h100-80g",
                "--tp",
                "8",
                "--pp",
                "4",
                "--dp",
                "4",
                "--global-batch",
                "64",
                "--zero",
                "3",
            ]
        )
        == 0
    )
    assert "runs as FSDP2 under torch.distributed.pipelining" in capsys.readouterr().err


def test_llama3s_fsdp_with_a_pipeline_shards_the_gradients_every_microbatch():
    """ZeRO-2 with pp is Llama 3's FSDP (section 3.3.2): weights whole, gradients and optimizer sharded -- ZeRO-2's
    memory -- and a reduce-scatter after every microbatch's backward (m of them where ZeRO-1 has one)."""
    from netmorph.planner import timing
    from netmorph.planner.memory import params_on_device

    m = PRESETS["llama-3-70b"]
    c = Layout(tp=8, pp=4, dp=4, zero=2, batch=Batch(global_batch=64))  # 16 microbatches
    two, one = estimate(m, c, H100), estimate(m, replace(c, zero=1), H100)
    n = params_on_device(m, c)
    assert one.memory.grads - two.memory.grads == pytest.approx(4 * n * (1 - 1 / 4), rel=1e-4)
    assert two.memory.params == one.memory.params
    rs = timing.collective_time(H100, "reduce_scatter", 4, 8, 4 * n)
    assert two.step.parts.data_parallel - one.step.parts.data_parallel == pytest.approx(15 * rs)
    assert check(m, Layout(pp=2, interleave=16, batch=Batch(global_batch=8)), A100) is None


def test_model_that_fits_nowhere():
    res = search(PRESETS["gpt3-175b"], 8, A100, 8)
    assert res.fits == 0 and not res.ranked and res.rejected["memory"].count > 0


def test_bad_model_flags():
    for kw, arg, flag_text in (
        (dict(layers=2, hidden=100, heads=3), "hidden", "--hidden 100 is not divisible by --heads 3"),
        (dict(model="gpt5"), "model", "--model: unknown preset 'gpt5'"),
        (dict(hidden=100, heads=4), "layers", "or --layers"),
    ):
        with pytest.raises(UsageError) as e:
            from_args(**kw)
        assert e.value.argument == arg and "--" not in str(e.value) and flag_text in e.value.render({})


def test_cli_plan_json_keys(capsys):
    code = main(
        [
            "plan",
            "--model",
            "gpt3-175b",
            "--gpus",
            "1024",
            "--hardware",
            "a100-80g",
            "--global-batch",
            "1536",
            "--top",
            "3",
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    rows = doc["plans"]
    assert code == 0 and len(rows) == 3
    assert doc["searched"] > doc["fits"] > 0
    assert sum(r["count"] for r in doc["rejected"]) == doc["searched"] - doc["fits"]
    mem = next(r for r in doc["rejected"] if r["key"] == "memory")
    assert mem["flag"] and mem["example"].endswith("GB)") and "out of memory" in mem["example"]
    for k in (
        "tp",
        "pp",
        "dp",
        "microbatch",
        "zero",
        "recompute",
        "memory_bytes",
        "step_time_s",
        "tflops_per_gpu",
        "mfu",
        "bubble_fraction",
        "params_count",
        "flops_per_iteration",
        "fits",
    ):
        assert k in rows[0]
    assert set(rows[0]["memory_bytes"]) == {"params", "grads", "optimizer", "activations", "total"}


def test_cli_estimate_and_fixed_search(capsys):
    assert (
        main(
            [
                "plan",
                "estimate",
                "--model",
                "gpt3-175b",
                "--tp",
                "8",
                "--pp",
                "8",
                "--dp",
                "16",
                "--global-batch",
                "1536",
                "--recompute",
                "full",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "TFLOP/s per GPU" in out and "fits" in out and "GiB" in out
    assert main(["plan", "--model", "gpt3-175b", "--gpus", "1024", "--global-batch", "1536"]) == 0
    out = capsys.readouterr().out
    assert "what costs them most" in out and "mostly" in out and "out of memory" in out
    assert main(["plan", "--model", "gpt3-175b", "--gpus", "1024", "--global-batch", "1536", "--tp", "8"]) == 0
    rows = [l for l in capsys.readouterr().out.splitlines() if l[:2].strip().isdigit()]
    assert rows and all(l.split()[1] == "8" for l in rows)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["plan", "estimate", "--model", "gpt3-175b", "--tp", "7"], "--tp"),
        (["plan", "estimate", "--model", "gpt3-175b", "--gpus", "100", "--tp", "8"], "--gpus"),
        (["plan", "--model", "gpt3-175b", "--global-batch", "8"], "--gpus"),
        (["plan", "--layers", "4", "--hidden", "100", "--heads", "3", "--gpus", "8", "--global-batch", "8"], "--heads"),
        (["plan", "--model", "nope", "--gpus", "8", "--global-batch", "8"], "--model"),
        (["plan", "estimate", "--model", "gpt3-175b", "--hardware", "tpu-v9"], "--hardware"),
    ],
)
def test_cli_bad_input(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_cli_nothing_fits_says_why(capsys):
    assert main(["plan", "--model", "gpt3-175b", "--gpus", "8", "--global-batch", "8"]) == 1
    out = capsys.readouterr().out
    assert "nothing fits" in out and "out of memory" in out


@pytest.mark.timeout(120)
def test_validation_script_meets_the_goals(tmp_path):
    """scripts/validate_planner.py reruns against the papers: the calibration errors no worse than before and no
    published run reported as not fitting (its --check); the validation set is in the document."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    doc = (root / "docs" / "validation.md").read_text()
    assert "Narayanan et al. 2021" in doc and "Korthikanti" in doc and "ZeRO" in doc
    assert "Validation set" in doc and "Llama 3" in doc and "llm-foundry" in doc and "| does not fit |" not in doc
    r = subprocess.run(
        [
            sys.executable,
            str(root / "scripts" / "validate_planner.py"),
            "--check",
            "--out",
            str(tmp_path / "validation.md"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _grid():
    """Layouts of GPT-3 175B and Mixtral over 1024 A100s: every overlap on and off, ZeRO 0-3, recomputation,
    sequence and context parallelism, interleaving, experts."""
    base = dict(micro_batch_size=1, global_batch=1536)
    for zero in (0, 1, 2, 3):
        for dp_overlap in (False, True):
            for recompute in ("none", "selective", "full"):
                yield (
                    "gpt3-175b",
                    Layout.of(tp=8, pp=8, dp=16, zero=zero, dp_overlap=dp_overlap, recompute=recompute, **base),
                )
                yield (
                    "gpt3-175b",
                    Layout.of(
                        tp=8,
                        pp=8,
                        dp=16,
                        zero=min(zero, 1),
                        dp_overlap=dp_overlap,
                        interleave=2,
                        sequence_parallel=True,
                        tp_overlap=True,
                        pp_overlap=True,
                        param_gather_overlap=True,
                        recompute=recompute,
                        **base,
                    ),
                )
                yield (
                    "gpt3-175b",
                    Layout.of(tp=8, cp=2, pp=4, dp=16, zero=zero, dp_overlap=dp_overlap, recompute=recompute, **base),
                )
                yield (
                    "gpt3-175b",
                    Layout(
                        tp=1,
                        pp=1,
                        dp=1024,
                        zero=zero,
                        knobs=Knobs(dp_overlap=dp_overlap, recompute=recompute),
                        batch=Batch(micro_batch_size=1, global_batch=2048),
                    ),
                )
        yield "mixtral-8x7b", Layout.of(tp=2, pp=4, dp=128, ep=8, zero=zero, dp_overlap=True, **base)


def test_step_parts_sum_to_the_step_on_every_layout_overlap_on_or_off():
    """``step_parts_s`` (plan estimate --json, the search's rows): every second of the step in exactly one part,
    the slowdown of compute beside overlapped communication included."""
    n = 0
    for name, lay in _grid():
        e = estimate(PRESETS[name], lay, A100)
        t = e.step
        assert min(asdict(t.parts).values()) >= 0, (name, lay)
        assert t.parts.total() == pytest.approx(t.step_time_s, rel=1e-12), (name, lay)
        # the JSON is printed from the typed result: the step's keys and values, in the estimate's
        assert t == step_time(PRESETS[name], lay, A100) and t.as_dict().items() <= e.as_dict().items()
        n += 1
    assert n == 100
    # a layout whose overlap slows compute has a non-zero part for it
    e = estimate(
        PRESETS["gpt3-175b"],
        Layout(tp=8, pp=8, dp=16, batch=Batch(global_batch=1536), knobs=Knobs(recompute="full", dp_overlap=True)),
        A100,
    )
    assert e.step.parts.overlap_slowdown > 0


def test_plan_json_carries_the_parts_of_the_step(capsys):
    assert (
        main(
            [
                "plan",
                "estimate",
                "--model",
                "gpt3-175b",
                "--tp",
                "8",
                "--pp",
                "8",
                "--dp",
                "16",
                "--global-batch",
                "1536",
                "--recompute",
                "full",
                "--dp-overlap",
                "--json",
            ]
        )
        == 0
    )
    e = json.loads(capsys.readouterr().out)
    assert sum(e["step_parts_s"].values()) == pytest.approx(e["step_time_s"], rel=1e-9)
    assert e["step_parts_s"]["overlap_slowdown"] > 0
    assert (
        main(
            [
                "plan",
                "search",
                "--model",
                "gpt3-175b",
                "--gpus",
                "1024",
                "--global-batch",
                "1536",
                "--top",
                "3",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)["plans"]
    assert rows and all(sum(r["step_parts_s"].values()) == pytest.approx(r["step_time_s"], rel=1e-9) for r in rows)
