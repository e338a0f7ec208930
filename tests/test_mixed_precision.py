"""bf16 mixed precision in the trainer (Megatron's --bf16): bf16 weights, activations and matmuls, float32 main
gradients, master weights and Adam state. The bytes every phase sends are the closed forms at 2 bytes an
activation (the loss, the main gradients' own all-reduces and a float32 reduction at 4); model states are the
planner's 2 + 4 + 4 + 4 + 4 bytes a parameter; the losses stay beside the float32 1-rank run's (the 50-step
convergence is benchmarks/mixed_precision.py's)."""

import pytest

from netmorph.cli import main
from netmorph.mesh.shape import ModelShape
from netmorph.parallel.config import TrainConfig
from netmorph.parallel.hybrid import train_rank
from netmorph.parallel.run import reference, summarise
from netmorph.planner.memory import trainer_memory
from netmorph.runtime import launch

pytestmark = pytest.mark.timeout(120)

TINY = ModelShape(layers=4, hidden=32, heads=4, seq=16, vocab=64)


def _run(**kw):
    cfg = TrainConfig.make(model=TINY, steps=3, **kw)
    cfg.check()
    return cfg, summarise(cfg, launch(train_rank, cfg.world, cfg, timeout=60), "local", reference(cfg))


LAYOUTS = [
    dict(dp=2),
    dict(dp=2, grad_reduce_dtype="float32"),
    dict(dp=2, zero=1),
    dict(dp=2, zero=3),
    dict(dp=2, zero=2, grad_reduce_dtype="float32"),
    dict(tp=2, sequence_parallel=True),
    dict(pp=2),
    dict(cp=2),
    dict(tp=2, pp=2, dp=2, zero=1),
    dict(cp=2, tp=2, cp_comm_type="a2a"),
]


@pytest.mark.parametrize("kw", LAYOUTS, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_bf16_sends_its_closed_forms_holds_the_planners_states_and_follows_float32(kw):
    cfg, out = _run(dtype="bfloat16", **kw)
    assert all(out.traffic_exact.values()) and out.traffic_exact, (
        out.bytes_per_rank_by_phase,
        out.predicted_bytes_per_rank_by_phase,
    )
    assert {k: out.memory_bytes[k] for k in ("params", "grads", "optimizer")} == {
        k: v for k, v in trainer_memory(cfg.model, cfg.layout, 2, 4, 12).items() if k != "activations"
    }
    assert out.max_rel_loss_diff < 2e-3, (out.losses, out.reference_losses)  # 3 steps; 2% is the bar at 50


def test_bf16_halves_the_bytes_of_every_tensor_it_makes_16_bit():
    """The same layout in float32 and bf16: activations (tp, pp, cp) and the default bf16 reduction (dp) halve;
    the float32 main gradients' own all-reduces (the tied embedding between stages) do not; the vocab-parallel
    loss stays float32, so tp halves all but its 3 all-reduces of b·s."""
    lay = dict(tp=2, pp=2, cp=2)
    _, f32 = _run(dtype="float32", **lay)
    cfg, bf = _run(dtype="bfloat16", **lay)
    a, b = f32.bytes_per_rank_by_phase, bf.bytes_per_rank_by_phase
    assert b["pp"] * 2 == a["pp"] and b["cp"] * 2 == a["cp"] and b["dp"] * 2 == a["dp"]
    assert b["pp.emb"] == a["pp.emb"]
    mb, s, t = 2, TINY.seq // 2, 2
    loss = cfg.layout.microbatches * 3 * 2 * (t - 1) / t * mb * s * 4  # float32 either way
    assert b["tp"] - loss == (a["tp"] - loss) / 2  # the last stage's, the busiest


def test_bf16_states_are_2_4_and_12_bytes_a_parameter():
    cfg, out = _run(dtype="bfloat16")
    n = TINY.params()
    assert (out.memory_bytes["params"], out.memory_bytes["grads"]) == (2 * n, 4 * n)
    assert out.memory_bytes["optimizer"] == 12 * n


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--precision", "bf16", "--dtype", "float64"], "--dtype"),
        (["--grad-reduce-dtype", "float32"], "--precision bf16"),
    ],
)
def test_mixed_precision_flags_that_contradict_are_one_line(argv, words, capsys):
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_bf16_check_is_held_against_float32(capsys):
    assert main(["train", "--bf16", "--dp", "2", "--steps", "2", "--layers", "2", "--check"]) == 0
    out = capsys.readouterr().out
    assert "bf16 mixed precision" in out and "the float32 1-rank run" in out and "(<= 0.02 ✓)" in out
    assert "2(d-1)/d·Ψ·B = 2·1/2·" in out and "·2\n" in out


def test_a_bf16_checkpoint_resumes_with_its_float32_master(tmp_path, capsys):
    """The checkpoint holds the float32 master (not the bf16 weights): a resumed bf16 run continues the unbroken
    one's losses exactly."""
    ck = str(tmp_path / "ck")
    base = ["train", "--bf16", "--dp", "2", "--zero", "1", "--layers", "2", "--json"]
    assert main([*base, "--steps", "4"]) == 0
    whole = capsys.readouterr().out
    assert main([*base, "--steps", "2", "--save", ck]) == 0
    capsys.readouterr()
    assert main([*base, "--steps", "4", "--load", ck]) == 0
    import json

    assert json.loads(capsys.readouterr().out)["losses"] == json.loads(whole)["losses"][2:]
