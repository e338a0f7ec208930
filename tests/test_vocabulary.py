"""One vocabulary: one Layout, one ModelShape, one placement table -- and every part of netmorph reads them.

A second layout or shape type appearing anywhere in the package fails here, as does a model whose parameter
count leaves Hugging Face's, a placement that leaves what the torch GPT really holds, or a rule the planner
and the trainer tell differently.
"""

import ast
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from netmorph.errors import UsageError
from netmorph.mesh import PRESETS, Batch, Layout, Mesh, ModelShape
from netmorph.mesh.placement import Replicate, Shard, parameters, rank_parameters, table

ROOT = Path(__file__).resolve().parent.parent / "netmorph"
LAYOUT_WORDS = {"tp", "pp", "dp", "cp", "ep", "zero", "interleave", "microbatches", "micro_batch_size"}
SHAPE_WORDS = {"layers", "hidden", "heads", "vocab", "ffn", "kv_heads", "seq"}


def _typed_classes():
    """(module path, class name, its field names) of every class in the package that declares fields (a dataclass,
    a NamedTuple, or annotated class attributes)."""
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                fields = {
                    s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                }
                if fields:
                    yield path.relative_to(ROOT.parent).as_posix(), node.name, fields


def test_one_layout_type_and_one_shape_type_in_the_whole_package():
    layouts = sorted(f"{p}:{c}" for p, c, f in _typed_classes() if len(f & LAYOUT_WORDS) >= 3)
    shapes = sorted(f"{p}:{c}" for p, c, f in _typed_classes() if len(f & SHAPE_WORDS) >= 3)
    assert layouts == ["netmorph/mesh/layout.py:Layout"], f"a second layout type: {layouts}"
    assert shapes == ["netmorph/mesh/shape.py:ModelShape"], f"a second model-shape type: {shapes}"


def test_the_checker_finds_a_planted_second_layout(tmp_path, monkeypatch):
    """The scan above is not vacuous: a dataclass with tp, pp and dp is found."""
    planted = tmp_path / "netmorph" / "x.py"
    planted.parent.mkdir()
    planted.write_text(
        "from dataclasses import dataclass\n@dataclass\nclass L:\n    tp: int\n    pp: int\n    dp: int\n"
    )
    monkeypatch.setattr(__import__(__name__), "ROOT", planted.parent)
    assert [c for _, c, f in _typed_classes() if len(f & LAYOUT_WORDS) >= 3] == ["L"]


DEGREES = {"tp", "pp", "dp", "cp", "ep"}
VOCABULARY = {"errors", "units", "version", "files", "schedule", "collectives", "cost", "runtime", "mesh"}


def _loose_degrees(root):
    """(path:line name) of every public module-level function or method, in a package above the vocabulary's
    floor, that takes two or more of tp/pp/dp/cp/ep as loose parameters."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0].removesuffix(".py") in VOCABULARY:
            continue
        tree = ast.parse(path.read_text())
        defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        defs += [m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body if isinstance(m, ast.FunctionDef)]
        for f in defs:
            names = {a.arg for a in f.args.args + f.args.kwonlyargs + f.args.posonlyargs}
            if not f.name.startswith("_") and len(names & DEGREES) >= 2:
                yield f"{rel}:{f.lineno} {f.name}"


def test_signatures_above_the_vocabulary_take_a_layout_not_loose_degrees():
    """Across package boundaries a split travels as a Layout: a function above mesh/ that took tp, pp and dp
    as ints would be a second, unchecked layout. (Below it -- the grid, the runtime's budget -- the ints are the
    vocabulary itself.)"""
    assert list(_loose_degrees(ROOT)) == []


def test_the_signature_check_finds_a_planted_loose_split(tmp_path):
    planted = tmp_path / "planner" / "x.py"
    planted.parent.mkdir()
    planted.write_text("def price(model, tp, pp, dp):\n    pass\n\ndef _inner(tp, pp):\n    pass\n")
    assert list(_loose_degrees(tmp_path)) == ["planner/x.py:1 price"]


def test_one_layout_flows_from_the_planner_to_the_trainer_to_morph():
    """The same Layout value is priced by the planner, played by the step simulator, trained by the trainer
    and mapped by morph; its mesh is Megatron's."""
    from netmorph.mesh.elements import element_map
    from netmorph.parallel.config import TrainConfig
    from netmorph.planner.hardware import PRESETS as HARDWARE
    from netmorph.planner.search import check, estimate
    from netmorph.simulate import simulate_config

    model = ModelShape(layers=4, hidden=32, heads=4, seq=16, vocab=64)
    lay = Layout(tp=2, pp=2, dp=2, batch=Batch(global_batch=8, micro_batch_size=1))
    assert check(model, lay, HARDWARE["a100-80g"]) is None
    e = estimate(model, lay, HARDWARE["a100-80g"])
    assert (e.layout.tp, e.layout.pp, e.layout.dp, e.layout.batch.micro_batch_size, e.layout.batch.global_batch) == (
        2,
        2,
        2,
        1,
        8,
    )
    assert simulate_config(model, lay, HARDWARE["a100-80g"])["step_time_s"] > 0
    cfg = TrainConfig(model=model, layout=lay, steps=1)
    cfg.check()
    assert cfg.layout is lay and cfg.world == 8
    maps = element_map(model, lay)
    assert len(maps) == 8 and all(m.params == (0, m.flat.size) for m in maps)
    mesh = lay.mesh()
    assert mesh.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]] and mesh.groups("pp")[0] == [0, 4]
    assert [lay.coords(r)["pp"] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_one_rule_told_the_same_way_to_the_planner_and_the_trainer():
    from netmorph.parallel.config import TrainConfig
    from netmorph.planner.hardware import PRESETS as HARDWARE
    from netmorph.planner.search import check

    model = ModelShape(layers=4, hidden=48, heads=6, seq=16, vocab=48)
    bad = Layout(tp=4, batch=Batch(global_batch=2))
    (why,) = [r for r in bad.check(model) if r.key == "heads"]
    assert (why.field, why.value) == ("tp", 4) and "6 heads" in why.text
    assert check(model, bad, HARDWARE["a100-80g"]).text == why.text
    with pytest.raises(UsageError, match="tp 4 does not divide the 6 heads"):
        TrainConfig(model=model, layout=bad).check()
    # the trainer's own limits are the trainer's (parallel/limits.py), not the vocabulary's: the planner prices
    # a SwiGLU model, the GPT cannot
    from netmorph.parallel import limits

    llama = ModelShape(layers=4, hidden=32, heads=4, ffn=96, ffn_type="swiglu", tied=False, bias=False)
    assert not Layout().check(llama)
    assert [r.field for r in limits.check(Layout(), llama)] == ["ffn_type", "tied", "bias", "ffn"]
    assert Layout.parse("tp2,pp2", 8) == Layout(tp=2, pp=2, dp=2)


COUNTS = json.loads((Path(__file__).parent / "hf_param_counts.json").read_text())
CONFIGS = Path(__file__).resolve().parent.parent / "examples" / "configs"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_counts_what_hugging_face_counts(name):
    """ModelShape.params() against ``sum(p.numel())`` of the model built by transformers on the meta device
    (recorded by scripts/hf_param_counts.py; rebuilt below when transformers is installed)."""
    assert PRESETS[name].params() == COUNTS["presets"][name]


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.json")))
def test_every_config_file_counts_what_hugging_face_counts(name):
    """A published config.json read by the loader -- MLA, shared and gated experts, dense first layers, QKV bias,
    Q/K norms, 256-wide heads, four norms a layer -- counts what transformers builds from the same file, total
    and active (a token's top_k routed experts, every shared one), and a preset of that name is the file."""
    from netmorph.mesh.configs import from_hf_config

    fields, _ = from_hf_config(CONFIGS / name)
    model = ModelShape(**fields)
    assert (model.params(), model.active_params()) == (
        COUNTS["configs"][name]["total"],
        COUNTS["configs"][name]["active"],
    )
    stem = name.removesuffix(".json")
    if stem in PRESETS:
        assert PRESETS[stem] == model.__class__(**{**fields, "name": stem}), stem


def test_the_recorded_counts_are_transformers_own():
    pytest.importorskip("transformers")
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf", Path(__file__).parent.parent / "scripts" / "hf_param_counts.py")
    hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hf)
    for name in ("llama-3-8b", "mixtral-8x7b", "bloom-176b", "opt-13b", "mpt-7b"):
        assert hf.hf_count(PRESETS[name]) == COUNTS["presets"][name], name
    for name in ("deepseek-v2-lite.json", "qwen1.5-moe-a2.7b.json", "gemma-2-9b.json"):
        assert hf.hf_file_counts(CONFIGS / name) == COUNTS["configs"][name], name


def test_latent_attention_caches_the_latent_and_the_rotary_key():
    """DeepSeek-V2 (section 2.1.2): MLA caches (d_c + d_h^R) elements per token per layer -- 576 for
    d_c = 512, d_h^R = 64 -- where multi-head attention of the same heads caches 2·n_h·d_h."""
    lite = PRESETS["deepseek-v2-lite"]
    assert lite.kv_bytes_per_token(2) == 27 * (512 + 64) * 2
    mha = ModelShape(layers=27, hidden=2048, heads=16, seq=4096, vocab=102400)
    assert mha.kv_bytes_per_token(2) / lite.kv_bytes_per_token(2) == pytest.approx(2 * 16 * 128 / 576)
    # the attention product reads Q·K over nope + rope (192) and V over v_head_dim (128) per head
    assert lite._core(1, False) == 2 * lite.seq**2 * 16 * (192 + 128)


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b", "mixtral-8x7b"])
def test_the_planners_gemms_sum_to_the_layers_flops(name):
    """The GEMMs the planner times (QKV or MLA's projections, output, each routed expert, shared experts,
    router) add up to the layer's linear FLOPs, whatever the architecture."""
    from netmorph.planner.layers import linear_gemms

    m = PRESETS[name]
    assert sum(f * n for f, n in linear_gemms(m, m.seq, 1)) == pytest.approx(m.layer_linear_flops_fwd(1))


def test_dense_layers_by_index_and_model_flops():
    """Qwen2-MoE's decoder_sparse_step 2 and mlp_only_layers make layers dense by index; the FLOPs add the
    dense layers' MLP, not the MoE one."""
    from netmorph.mesh.configs import from_hf_config

    cfg = json.loads((CONFIGS / "qwen1.5-moe-a2.7b.json").read_text())
    path = Path(__file__).parent / "_step.json"
    try:
        path.write_text(json.dumps({**cfg, "num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [3]}))
        m = ModelShape(**from_hf_config(path)[0])
    finally:
        path.unlink()
    assert [m.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]
    assert m.moe_layers == 2
    dense, moe = m.layer_linear_flops_fwd(1, moe=False), m.layer_linear_flops_fwd(1)
    assert m.flops_per_iteration(1, "none") == pytest.approx(
        3 * (2 * moe + 4 * dense + 6 * m._core(1, False)) + 3 * m.logit_flops_fwd(1)
    )


@pytest.mark.parametrize(
    "base,change,words",
    [
        ("llama-3-70b", {"mlp_bias": True}, "mlp_bias"),
        ("llama-3-70b", {"n_shared_experts": 2}, "n_shared_experts"),
        ("qwen1.5-moe-a2.7b", {"mlp_only_layers": [40]}, "mlp_only_layers"),
        ("qwen1.5-moe-a2.7b", {"decoder_sparse_step": 0}, "decoder_sparse_step"),
        ("deepseek-v2-lite", {"first_k_dense_replace": 27}, "first_k_dense_replace"),
        ("deepseek-v2-lite", {"v_head_dim": None}, "v_head_dim"),
        ("llama-3-70b", {"model_type": "opt", "word_embed_proj_dim": 512}, "word_embed_proj_dim"),
    ],
)
def test_config_fields_that_are_not_modelled_are_refused(base, change, words, tmp_path):
    """A field that changes the count and is not modelled, or a value out of range, is one line naming it."""
    from netmorph.mesh.configs import from_hf_config

    cfg = {**json.loads((CONFIGS / f"{base}.json").read_text()), **change}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match=words):
        from_hf_config(tmp_path / "config.json")


def test_the_placement_table_is_what_the_torch_gpt_holds():
    """Every parameter of the table exists in the torch GPT with its shape, in registration order, and the count
    is ModelShape.params(); under tp each rank's pieces have the table's local shapes."""
    from netmorph.models.gpt import GPTStage
    from netmorph.parallel.tensor_parallel import TensorParallel
    from netmorph.runtime.base import Group

    model = ModelShape(layers=2, hidden=16, heads=4, seq=8, vocab=32)
    rows = parameters(model)
    assert (
        sum(int(np.prod(p.shape)) for p in rows)
        == model.params()
        == sum(p.numel() for p in GPTStage(model).parameters())
    )
    stage = GPTStage(model)
    for row, (name, p) in zip(rank_parameters(model, Layout(), 0), stage.named_parameters()):
        assert name.endswith(row.module) and tuple(p.shape) == row.shape, (row.name, name)

    class _Comm:  # one rank of a tp group of 2: only the shapes are read here
        rank = 1

    tp = TensorParallel(_Comm(), Group([0, 1]))
    sharded = GPTStage(model, 0, 1, tp)
    for row, (name, p) in zip(rank_parameters(model, Layout(tp=2, pp=2), 0), sharded.named_parameters()):
        assert tuple(p.shape) == row.local_shape(2), (row.name, name)
    full = dict((r.name, r) for r in rows)
    assert full["0.qkv.w"].placement == Shard(0) and full["0.proj.w"].placement == Shard(1)
    assert full["0.proj.b"].placement == Replicate() and full["wte"].placement == Shard(0)
    w = torch.arange(256.0).reshape(16, 16)
    assert torch.equal(full["0.proj.w"].piece(w, 2, 1), w[:, 8:]) and torch.equal(
        full["0.fc.w"].piece(torch.arange(1024.0).reshape(64, 16), 2, 0), torch.arange(1024.0).reshape(64, 16)[:32]
    )
    plan = {r[0]: r for r in table(model, Layout(tp=2, pp=2))}
    assert plan["wte"][2] == [0, 1] and plan["1.fc.w"][2] == [1] and plan["1.fc.w"][4] == (32, 16)


def test_node_membership_and_rank_order_have_one_source():
    from netmorph.cost.topology import node_of

    assert node_of(np.arange(8), 4).tolist() == [0, 0, 0, 0, 1, 1, 1, 1] and node_of(5, 0) == 0
    m = Mesh(16, tp=2, pp=4)
    assert m.groups("dp")[:2] == [[0, 2], [1, 3]] and m.coords(13) == {"tp": 1, "cp": 0, "ep": 0, "dp": 0, "pp": 3}
    lay = Layout(tp=2, pp=4, dp=2)
    assert lay.coords(13)["dp"] == 0 and lay.mesh().groups("pp") == m.groups("pp")
