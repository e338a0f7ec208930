"""Checkpoints in torch.distributed.checkpoint's format: saved on one layout, resumed on others with the losses
and weights of the run that never stopped, readable by DCP's own tools, atomic and verified."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from netmorph.checkpoint import Checkpointing, folder
from netmorph.checkpoint.shards import owners, range_boxes, rank_boxes
from netmorph.mesh.layout import Layout
from netmorph.mesh.placement import parameters
from netmorph.mesh.shape import ModelShape
from netmorph.parallel.config import TrainConfig
from netmorph.parallel.run import reference, train

pytestmark = pytest.mark.timeout(300)

MODEL = ModelShape(layers=4, hidden=32, heads=4, seq=16, vocab=64)
# a mixture of experts at capacity factor 1 (its experts drop assignments: each rank's capacity, on every layout)
MOE = ModelShape(layers=4, hidden=32, heads=4, seq=16, vocab=64, experts=4, top_k=2, capacity_factor=1.0)
ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _cfg(steps, start=0, ck=Checkpointing(), model=MODEL, **lay):
    """A global batch of 4 one-sequence microbatches on every layout (the same data step by step)."""
    return TrainConfig.make(
        model,
        microbatches=4 // lay.get("dp", 1),
        micro_batch_size=1,
        steps=steps,
        start_step=start,
        checkpoint=ck,
        **lay,
    )


def _cli(*argv, env=None, timeout=200):
    """``netmorph ARGV``: in this process (its ranks are processes of their own either way; the suite's time), or
    in a fresh one where the run needs an environment of its own; (returncode, stdout, stderr)."""
    if env is not None:
        return subprocess.run(
            [sys.executable, "-m", "netmorph", *argv], capture_output=True, text=True, timeout=timeout, env=env
        )
    import contextlib
    import io
    from types import SimpleNamespace

    from netmorph.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_range_boxes_cover_a_row_major_range_exactly():
    shape = (3, 4, 5)
    for a, b in [(0, 60), (7, 53), (20, 40), (3, 4), (19, 21), (0, 1), (59, 60)]:
        seen = np.zeros(60, dtype=int)
        for off, size in range_boxes(shape, a, b):
            idx = np.arange(60).reshape(shape)[tuple(slice(o, o + s) for o, s in zip(off, size))]
            seen[idx.ravel()] += 1
        assert seen[a:b].tolist() == [1] * (b - a) and seen.sum() == b - a, (a, b)


@pytest.mark.parametrize(
    "tag,world,model",
    [
        ("tp2,pp2,dp2,zero1", 8, MODEL),
        ("dp4,zero3", 4, MODEL),
        ("tp2,dp2,zero2", 4, MODEL),
        ("pp2,v2", 2, MODEL),
        ("pp2,dp2,zero1,zbv", 4, MODEL),
        ("tp2,dp4,ep2,zero1", 8, MOE),
        ("pp2,dp2,ep2,zero1", 4, MOE),
        ("tp2,pp2,dp2", 8, MOE),
    ],
    ids=[
        "tp2-pp2-dp2-zero1",
        "dp4-zero3",
        "tp2-dp2-zero2",
        "pp2-v2",
        "pp2-dp2-zero1-zbv",
        "moe-tp2-dp4-ep2-zero1",
        "moe-pp2-dp2-ep2-zero1",
        "moe-tp2-pp2-dp2",
    ],
)
def test_the_written_boxes_tile_every_tensor_once(tag, world, model):
    """Replicas write nothing twice: each tensor's owned boxes add up to its elements (DCP's global plan
    rejects an overlap, so together they tile it) -- a mixture of experts' expert buffer too, its experts
    split over ep and replicated over the expert data-parallel ranks, and a V's rank 0, which holds the tied
    embedding in both its chunks."""
    tag, v, _ = tag.partition(",zbv")
    lay = Layout.parse(tag, world).replace(global_batch=8, micro_batch_size=1, expert_tp=1, schedule="zbv" if v else "")
    who = owners(model, lay)
    elements = {}
    for r in range(world):
        for b in rank_boxes(model, lay, r, owned=True, who=who):
            elements[b.fqn] = elements.get(b.fqn, 0) + math.prod(b.sizes)
    shapes = {p.name: p.shape for p in parameters(model)}
    assert len(elements) == 3 * len(shapes)
    assert sorted(elements.values()) == sorted(math.prod(s) for s in shapes.values() for _ in range(3))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """6 steps on tp2·pp2·dp2 ZeRO-1 (float64), a checkpoint every 3; and the run that never stops."""
    d = tmp_path_factory.mktemp("ckpt")
    whole = train(_cfg(6, tp=2, pp=2, dp=2, zero=1))
    out = train(_cfg(6, ck=Checkpointing(save=str(d), every=3), tp=2, pp=2, dp=2, zero=1))
    return d, whole, out


def test_a_save_is_dcps_format_and_does_not_change_the_run(saved):
    d, whole, out = saved
    assert out.losses == whole.losses
    assert folder.steps(d) == [3, 6] and (d / "latest").read_text().strip() == "step-6"
    files = sorted(p.name for p in (d / "step-3").iterdir())
    assert files == [".metadata", *[f"__{r}_0.distcp" for r in range(8)], "checksums.json"]
    assert [c["step"] for c in out.checkpoints] == [3, 6] and all(c["bytes"] > 0 for c in out.checkpoints)


def test_dcp_to_torch_save_gives_what_the_1_rank_gpt_loads_strictly(saved, tmp_path):
    """DCP's own converter: one state dict; its "model" loads into the 1-rank GPT with strict=True and holds the
    weights of the 1-rank run after 6 steps; Adam's moments are there in full shapes under optim.state."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from netmorph.checkpoint.shards import model_key
    from netmorph.models.gpt import GPTStage

    d, _, _ = saved
    dcp_to_torch_save(d / "step-6", tmp_path / "out.pt")
    sd = torch.load(tmp_path / "out.pt", weights_only=False)
    gpt = GPTStage(MODEL, dtype=torch.float64)
    gpt.load_state_dict(sd["model"], strict=True)
    _, w_ref, _ = reference(_cfg(6))
    for p in parameters(MODEL):
        key = model_key(p)
        assert torch.allclose(gpt.state_dict()[key], w_ref[p.name], rtol=0, atol=1e-12), key
        moments = sd["optim"]["state"][key]
        assert moments["exp_avg"].shape == p.shape and float(moments["step"]) == 6
    meta = json.loads(sd["train"]["meta"])
    assert sd["train"]["step"] == 6 and meta["layout"] == "tp2·pp2·dp2·zero1" and meta["consumed_samples"] == 24


@pytest.mark.parametrize(
    "layout",
    [
        dict(dp=4, zero=3),
        dict(tp=4),
        dict(pp=2, interleave=2, schedule="interleaved"),
        dict(tp=2, dp=2, zero=2, sequence_parallel=True),
        dict(pp=2, schedule="zbv"),
    ],
    ids=["dp4-zero3", "tp4", "pp2-interleaved", "tp2-dp2-zero2-sp", "pp2-zbv"],
)
def test_resumed_on_another_layout_the_run_goes_on_as_if_it_never_stopped(saved, layout):
    """Written on tp2·pp2·dp2 ZeRO-1 after step 3, read under another layout by DCP's resharding: steps 4-6
    lose exactly what the run that never stopped lost, and end on the 1-rank run's weights."""
    d, whole, _ = saved
    out = train(_cfg(3, start=3, ck=Checkpointing(load=str(d / "step-3")), **layout), check=True)
    assert max(abs(a - b) / abs(b) for a, b in zip(out.losses, whole.losses[3:])) <= 1e-12
    assert out.max_abs_weight_diff <= 1e-12


@pytest.fixture(scope="module")
def saved_moe(tmp_path_factory):
    """A mixture of experts, 6 steps (float64), a checkpoint every 3, on tp2·pp2·dp2 ZeRO-1 (every expert on
    every rank) and on tp2·dp2·ep2 (two experts a rank); and the run that never stops."""
    out = {}
    for name, lay in (("tp2-pp2-dp2-zero1", dict(tp=2, pp=2, dp=2, zero=1)), ("tp2-dp2-ep2", dict(tp=2, dp=2, ep=2))):
        d = tmp_path_factory.mktemp(f"moe-{name}")
        train(_cfg(6, ck=Checkpointing(save=str(d), every=3), model=MOE, **lay))
        out[name] = d
    return out, train(_cfg(6, model=MOE))


@pytest.mark.parametrize(
    "written,layout",
    [
        ("tp2-pp2-dp2-zero1", dict(tp=2, dp=2, ep=2)),
        ("tp2-dp2-ep2", dict(tp=2, pp=2, dp=2, zero=1)),
        ("tp2-dp2-ep2", dict(dp=4, ep=4, zero=2)),
    ],
    ids=["to-tp2-dp2-ep2", "and-back", "to-dp4-ep4-zero2"],
)
def test_a_mixture_of_experts_resumes_on_another_expert_split_as_if_it_never_stopped(saved_moe, written, layout):
    """The experts' own buffer (Megatron's expert data-parallel replica) is written and resharded as the dense
    one is: written on tp2·pp2·dp2 ZeRO-1 and read as tp2·dp2·ep2, and back; steps 4-6 lose what the run that
    never stopped lost and end on the 1-rank run's weights, with its routing."""
    folders, whole = saved_moe
    out = train(
        _cfg(3, start=3, ck=Checkpointing(load=str(folders[written] / "step-3")), model=MOE, **layout), check=True
    )
    assert max(abs(a - b) / abs(b) for a, b in zip(out.losses, whole.losses[3:])) <= 1e-12
    assert out.max_abs_weight_diff <= 1e-12


def test_a_mixture_of_experts_checkpoint_is_what_the_1_rank_moe_gpt_loads_strictly(saved_moe, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from netmorph.checkpoint.shards import model_key
    from netmorph.models.gpt import GPTStage

    folders, _ = saved_moe
    dcp_to_torch_save(folders["tp2-dp2-ep2"] / "step-6", tmp_path / "out.pt")
    sd = torch.load(tmp_path / "out.pt", weights_only=False)
    gpt = GPTStage(MOE, dtype=torch.float64)
    gpt.load_state_dict(sd["model"], strict=True)
    _, w_ref, _ = reference(_cfg(6, model=MOE, dp=2, ep=2, tp=2))
    experts = [p for p in parameters(MOE) if p.is_expert]
    assert experts and all(sd["optim"]["state"][model_key(p)]["exp_avg"].shape == p.shape for p in experts)
    for p in parameters(MOE):
        assert torch.allclose(gpt.state_dict()[model_key(p)], w_ref[p.name], rtol=0, atol=1e-12), p.name


def test_moe_saves_and_resumes_on_another_expert_split(tmp_path):
    """``netmorph moe --save`` then ``--load`` with ep 4 -> ep 2 x dp 2: the resumed steps number on from the
    checkpoint and lose what the run that never stopped lost."""
    d = tmp_path / "ck"
    whole = _cli("moe", "--steps", "4", "--dtype", "float64", "--save", str(d), "--save-every", "2", "--json")
    assert whole.returncode == 0, whole.stderr
    r = _cli(
        "moe", "--steps", "4", "--dtype", "float64", "--ep", "2", "--dp", "2", "--load", str(d / "step-2"), "--json"
    )
    assert r.returncode == 0, r.stderr
    a, b = json.loads(whole.stdout), json.loads(r.stdout)
    assert len(b["losses"]) == 2
    assert max(abs(x - y) / abs(y) for x, y in zip(b["losses"], a["losses"][2:])) <= 1e-12
    r = _cli("moe", "--steps", "4", "--ffn", "32", "--load", str(d))
    assert r.returncode == 2 and "its model has expert_ffn 64, this run 32: pass --ffn 64" in r.stderr, r.stderr


def test_a_corrupt_or_truncated_shard_is_refused_naming_the_file(saved, tmp_path):
    import shutil

    d, _, _ = saved
    copy = tmp_path / "ck"
    shutil.copytree(d, copy)
    shard = copy / "step-6" / "__5_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    r = _cli("train", "--steps", "8", "--load", str(copy))
    assert r.returncode == 2 and "__5_0.distcp is corrupt" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    with open(shard, "r+b") as fh:
        fh.truncate(100)
    r = _cli("train", "--steps", "8", "--load", str(copy / "step-6"))
    assert r.returncode == 2 and "__5_0.distcp is corrupt" in r.stderr


def test_a_checkpoint_of_another_model_or_batch_is_one_line(tmp_path):
    d = tmp_path / "ck"
    assert _cli("train", "--steps", "2", "--save", str(d)).returncode == 0
    for argv, words in (
        (["--hidden", "32"], "its model has hidden 64, this run 32: pass --hidden 64"),
        (["--microbatches", "4"], "--global-batch-size 4"),
        (["--steps", "2"], "raise --steps past 2"),
    ):
        r = _cli("train", "--load", str(d), *(["--steps", "4"] if "--steps" not in argv else []), *argv)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (argv, r.stderr)
    r = _cli("train", "--keep", "2")
    assert r.returncode == 2 and "give --save DIR" in r.stderr
    r = _cli("train", "--load", str(tmp_path / "nothing-here"))
    assert r.returncode == 2 and "no such folder" in r.stderr


def test_a_rank_killed_mid_save_leaves_the_last_checkpoint_and_the_next_run_goes_on(tmp_path):
    """Rank 1 SIGKILLs itself in the save after step 4, its shard written, before the checkpoint is complete:
    the job fails, step-2 stays the latest and loads; the next run sweeps the partial folder, resumes from step
    2 and ends on the losses of the run that was never killed."""
    d = tmp_path / "ck"
    common = ["train", "--dp", "2", "--steps", "6", "--dtype", "float64", "--json"]
    r = _cli(*common, "--save", str(d), "--save-every", "2", env={**ENV, "NETMORPH_CHECKPOINT_KILL": "1@4"})
    assert r.returncode != 0
    assert folder.steps(d) == [2] and (d / "latest").read_text().strip() == "step-2"
    assert (d / ".step-4.partial").is_dir()
    r = _cli(*common, "--load", str(d), "--save", str(d), "--save-every", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert not any(p.name.endswith(".partial") for p in d.iterdir()) and folder.steps(d) == [2, 4, 6]
    whole = json.loads(_cli(*common).stdout)
    assert json.loads(r.stdout)["losses"] == pytest.approx(whole["losses"][2:], rel=1e-12)
    again = _cli(*common, "--load", str(d), "--save", str(d), "--save-every", "2")  # a job restarted at its end
    assert again.returncode == 0 and "trained already" in again.stderr and folder.steps(d) == [2, 4, 6]


def _torchrun(flags: list, argv: list, env: dict, timeout: float = 150):
    """``torchrun --standalone --nproc-per-node 2 FLAGS -m netmorph ARGV``, bounded; (process, stdout, stderr)."""
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            *flags,
            "-m",
            "netmorph",
            *argv,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"torchrun did not finish in {timeout:.0f} s")
    return p, out, err


def test_torchrun_max_restarts_resumes_a_job_killed_mid_save_from_its_own_checkpoints(tmp_path):
    """The job the logbook describes: rank 1 dies in the save after step 4; torchrun (--max-restarts) restarts
    every worker, which read step 2 (--load where they --save) and finish on the uninterrupted run's losses. The
    restarted workers rendezvous under a prefix of their attempt: torchrun's store still holds the dead
    attempt's gloo addresses."""
    d = tmp_path / "ck"
    common = ["train", "--dp", "2", "--steps", "6", "--dtype", "float64", "--json"]
    p, out, err = _torchrun(
        ["--max-restarts", "2", "--monitor-interval", "0.1"],
        [*common, "--save", str(d), "--save-every", "2", "--load", str(d)],
        {**ENV, "NETMORPH_CHECKPOINT_KILL": "1@4"},
    )
    assert p.returncode == 0, err[-3000:]
    assert "exitcode: -9" in err  # rank 1 did die, and torchrun restarted
    assert folder.steps(d) == [2, 4, 6] and not any(q.name.endswith(".partial") for q in d.iterdir())
    whole = json.loads(_cli(*common).stdout)
    assert json.loads(out[out.index("{") :])["losses"] == pytest.approx(whole["losses"][2:], rel=1e-12)


def test_async_save_keeps_the_newest_and_the_run_unchanged(tmp_path):
    d = tmp_path / "ck"
    common = ["train", "--tp", "2", "--steps", "5", "--dtype", "float64", "--json"]
    r = _cli(*common, "--save", str(d), "--save-every", "1", "--keep", "2", "--async-save")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert folder.steps(d) == [4, 5] and [c["step"] for c in out["checkpoints"]] == [1, 2, 3, 4, 5]
    assert out["losses"] == json.loads(_cli(*common).stdout)["losses"]


def test_a_checkpoint_saved_under_torchrun_resumes_on_the_local_fabric(tmp_path):
    """torchrun's two workers (netmorph's schedules over gloo) write it; a local tp2 run reads it."""
    d = tmp_path / "ck"
    p, _, err = _torchrun([], ["train", "--dp", "2", "--steps", "3", "--dtype", "float64", "--save", str(d)], ENV)
    assert p.returncode == 0, err[-2000:]
    assert folder.steps(d) == [3]
    r = _cli(
        "train",
        "--tp",
        "2",
        "--microbatches",
        "4",
        "--steps",
        "5",
        "--dtype",
        "float64",
        "--load",
        str(d),
        "--check",
        "--json",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["max_rel_loss_diff"] <= 1e-12 and out["max_abs_weight_diff"] <= 1e-12
    time.sleep(0.1)
