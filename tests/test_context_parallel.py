"""Context parallelism in the one trainer: ring attention (p2p), all_gather and Ulysses (a2a) each equal the
1-rank run in float64, composed with tp, sp, pp, dp and ZeRO; each variant's bytes equal its closed form on
every rank and step; the causal load balance is measured, not assumed."""

import pytest
import torch

from netmorph.cli import main
from netmorph.mesh.kernels import cp_kernels
from netmorph.mesh.shape import ModelShape
from netmorph.parallel import limits
from netmorph.parallel.config import TrainConfig
from netmorph.parallel.context_parallel import COMM_TYPES, ContextParallel
from netmorph.parallel.hybrid import train_rank
from netmorph.parallel.run import reference, summarise
from netmorph.parallel.traffic import cp_bytes
from netmorph.planner.memory import trainer_memory
from netmorph.runtime import launch

pytestmark = pytest.mark.timeout(120)

TINY = ModelShape(layers=4, hidden=32, heads=4, seq=16, vocab=64)


def _attention_rank(comm, comm_type, balanced):
    """One attention layer's queries, keys and values drawn whole on every rank; this rank's positions attended
    over the cp group against the whole causal attention, forward and backward."""
    torch.manual_seed(0)
    B, nh, T, hd = 2, 4, 16, 8
    q, k, v = (torch.randn(B, nh, T, hd, dtype=torch.float64, requires_grad=True) for _ in range(3))
    dy = torch.randn(B, nh, T, hd, dtype=torch.float64)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    (y * dy).sum().backward()
    cp = ContextParallel(comm, comm.new_group(list(range(comm.world))), comm_type, balanced)
    pos = cp.positions(T)
    mine = [z.detach()[:, :, pos].clone().requires_grad_() for z in (q, k, v)]
    out = cp.attend(*mine)
    (out * dy[:, :, pos]).sum().backward()
    err = max(
        float((out - y[:, :, pos]).abs().max().detach()),
        *(float((a.grad - b.grad[:, :, pos]).abs().max()) for a, b in zip(mine, (q, k, v))),
    )
    return err, cp.blocks, sum(r.bytes for r in comm.ledger.records if r.phase == "cp"), pos.tolist()


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("comm_type", COMM_TYPES)
def test_each_comm_type_attends_as_the_whole_sequence_does_and_sends_its_closed_form(comm_type, cp):
    res = launch(_attention_rank, cp, comm_type, True, timeout=60)
    n = 2 * 4 * (16 // cp) * 8  # one rank's queries: B · nh · T/cp · hd
    assert all(err < 1e-12 for err, *_ in res), [r[0] for r in res]
    assert {b for *_, b, _ in res} == {cp_bytes(comm_type, cp, 1, n, 8)[0]}
    assert sorted(p for *_, pos in res for p in pos) == list(range(16))  # every position on exactly one rank
    if comm_type != "a2a":  # each rank attends 2·cp + 1 chunk pairs: equal, not merely close
        assert [blocks for _, blocks, *_ in res] == [2 * cp + 1] * cp


def test_a_contiguous_split_would_load_rank_r_with_4r_plus_3_chunk_pairs():
    """The control for the load balance above: without head-and-tail chunks the last rank attends five times
    the first's pairs under the causal mask."""
    res = launch(_attention_rank, 4, "p2p", False, timeout=60)
    assert all(err < 1e-12 for err, *_ in res)
    assert [blocks for _, blocks, *_ in res] == [3, 7, 11, 15]


LAYOUTS = [
    dict(cp=2),
    dict(cp=2, cp_comm_type="all_gather"),
    dict(cp=2, cp_comm_type="a2a"),
    dict(cp=4),
    dict(cp=4, cp_comm_type="all_gather"),
    dict(cp=4, cp_comm_type="a2a"),
    dict(cp=2, tp=2),
    dict(cp=2, tp=2, sequence_parallel=True, cp_comm_type="all_gather"),
    dict(cp=2, tp=2, cp_comm_type="a2a"),
    dict(cp=2, pp=2),
    dict(cp=2, pp=2, cp_comm_type="a2a"),
    dict(cp=2, dp=2, zero=1),
    dict(cp=2, dp=2, zero=3, microbatches=1),
    dict(cp=2, tp=2, pp=2, schedule="interleaved", interleave=2),
]


@pytest.mark.parametrize("kw", LAYOUTS, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_cp_layouts_equal_the_one_rank_run_and_send_their_closed_forms(kw):
    cfg = TrainConfig.make(model=TINY, steps=2, **kw)
    cfg.check()
    out = summarise(cfg, launch(train_rank, cfg.world, cfg, timeout=60), "local", reference(cfg))
    assert out.max_rel_loss_diff < 1e-9 and out.max_abs_weight_diff < 1e-9, out.losses
    want = {"cp", "zero" if cfg.layout.zero else "dp"} | {k for k in ("tp", "pp") if cfg.layout.get(k) > 1}
    assert want <= set(out.traffic_exact) and all(out.traffic_exact.values()), (
        out.bytes_per_rank_by_phase,
        out.predicted_bytes_per_rank_by_phase,
    )
    # ZeRO shards and the gradients' reduction span dp x cp: the planner's count of the same buffers
    assert {k: out.memory_bytes[k] for k in ("params", "grads", "optimizer")} == {
        k: v for k, v in trainer_memory(cfg.model, cfg.layout, 8).items() if k != "activations"
    }


def test_ring_attention_over_gloo_trains_the_local_fabrics_losses():
    """The ring's hops over torch.distributed: a gloo send completes only once its peer posts the receive, so a
    hop that waited its send first deadlocked every rank (found running --backend torch)."""
    cfg = TrainConfig.make(model=TINY, cp=4, steps=2)
    local = summarise(cfg, launch(train_rank, 4, cfg, timeout=60), "local")
    over = summarise(cfg, launch(train_rank, 4, cfg, backend="torch", timeout=60), "torch")
    assert over.losses == local.losses and over.traffic_exact == {"cp": True, "dp": True}


def test_the_trainer_refuses_only_the_cp_layouts_its_model_cannot_split():
    def rejected(**kw):
        cfg = TrainConfig.make(model=kw.pop("model", TINY), **kw)
        return [r.field for r in limits.check(cfg.layout, cfg.model)]

    assert rejected(cp=2) == [] and rejected(cp=8, cp_comm_type="p2p") == []  # 16 positions, 16 chunks
    assert "cp" in rejected(cp=3)  # 16 is not 6 chunks
    assert "cp" in rejected(cp=2, tp=4, cp_comm_type="a2a")  # 1 head per tp rank over cp 2
    assert rejected(cp=4, cp_comm_type="a2a") == []
    assert (
        rejected(cp=2, dp=2, ep=2, model=ModelShape(layers=4, hidden=16, heads=4, seq=8, vocab=32, experts=4, top_k=2))
        == []
    )  # experts: tests/test_context_parallel_moe.py


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--cp", "3"], "2 x cp chunks"),
        (["--cp", "2", "--tp", "4", "--cp-comm-type", "a2a"], "heads 4"),
        (["--cp", "2", "--cp-comm-type", "ring"], "--cp-comm-type"),
    ],
)
def test_a_cp_the_model_cannot_split_is_one_line(argv, words, capsys):
    try:
        code = main(["train", *argv])
    except SystemExit as e:  # argparse's own refusal of a choice
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2, err


def test_cli_trains_cp_and_prints_its_closed_form(capsys):
    assert (
        main(["train", "--cp", "2", "--tp", "2", "--steps", "2", "--layers", "2", "--check", "--dtype", "float64"]) == 0
    )
    out = capsys.readouterr().out
    assert "tp2 cp2 p2p pp1 dp1" in out
    line = next(s for s in out.splitlines() if s.startswith("#   cp "))
    assert "✓" in line and "6(cp-1)" in line and "<= 1e-09 ✓" in out


def test_a_checkpoint_of_a_cp_layout_resumes_under_another_layout_as_the_one_rank_run(tmp_path, capsys):
    """torch.distributed.checkpoint's reshard across cp: ZeRO-1 shards over dp x cp saved, loaded into tp x dp and
    into ZeRO-3 over another cp exchange, both continuing the 1-rank run's losses."""
    ck = str(tmp_path / "ck")
    common = ["--layers", "2", "--dtype", "float64", "--check"]
    assert main(["train", "--cp", "2", "--dp", "2", "--zero", "1", "--steps", "2", "--save", ck, *common]) == 0
    for argv in (["--tp", "2", "--dp", "2"], ["--cp", "2", "--dp", "2", "--zero", "3", "--cp-comm-type", "a2a"]):
        capsys.readouterr()
        assert main(["train", *argv, "--steps", "4", "--load", ck, *common]) == 0
        out = capsys.readouterr().out
        assert "resumed from" in out and "<= 1e-09 ✓" in out, out


def _kernels_rank(comm, comm_type):
    """(forward, backward) aten operators of one layer of the GPT on this rank: a 3-layer model's less a 1-layer's,
    halved (as tests/test_calibrate.py counts LAYER_KERNELS)."""
    from netmorph.calibrate.compute import _Count
    from netmorph.models.gpt import GPTStage, synthetic_batch
    from netmorph.parallel.tensor_parallel import TensorParallel
    from netmorph.runtime.base import Group

    cp = ContextParallel(comm, comm.new_group(list(range(comm.world))), comm_type) if comm.world > 1 else None
    counts = []
    for layers in (1, 1, 3):  # the first pass warms what dispatches only once in a process
        cfg = ModelShape(layers=layers, hidden=16, heads=4, seq=16, vocab=32)
        model = GPTStage(cfg, layers=TensorParallel(comm, Group([comm.rank]), cp=cp), dtype=torch.float32)
        x, y = synthetic_batch(cfg, range(2))
        if cp is not None:
            x, y = x[cp.positions(16)], y[cp.positions(16)]
        with _Count() as fwd:
            loss = model(x, y)
        with _Count() as bwd:
            loss.backward()
        counts.append((fwd.n, bwd.n))
    return tuple((b - a) // 2 for a, b in zip(*counts[1:]))


def test_the_operators_the_planner_charges_for_cp_are_the_attentions_own():
    """cp_kernels (netmorph.mesh.kernels) -- what a calibrated profile's op_overhead_s is paid for under cp, so that the twin and
    validate price the chunk-pair loop the trainer really dispatches -- are the aten operators one layer adds over
    cp 1's, counted by a TorchDispatchMode on every rank."""
    base = launch(_kernels_rank, 1, "p2p", timeout=60)[0]
    for comm_type in COMM_TYPES:
        for cp in (2, 4):
            got = launch(_kernels_rank, cp, comm_type, timeout=60)
            busiest = max(got)  # the load balance: within cp - 1 operators (all_gather's slices read)
            assert all(b - g <= cp - 1 for r in got for g, b in zip(r, busiest)), got
            extra = tuple(g - b for g, b in zip(busiest, base))
            assert extra == cp_kernels(cp, comm_type), (comm_type, cp, extra)
