"""The planner for today's models: architectures, config files, context/expert parallelism, uneven stages, FP8."""

import json
from dataclasses import replace

import pytest

from netmorph.cli import main
from netmorph.errors import UsageError
from netmorph.mesh.configs import from_deepspeed_config, from_hf_config, from_megatron_args
from netmorph.mesh.layout import Batch, Knobs, Layout, Precision
from netmorph.mesh.presets import PRESETS
from netmorph.mesh.shape import ModelShape
from netmorph.planner import comm, layers, timing
from netmorph.planner.hardware import PRESETS as HW
from netmorph.planner.memory import activation_bytes_per_layer, memory, params_on_device, stage_activations
from netmorph.planner.search import check, estimate, search

H100, A100 = HW["h100-80g"], HW["a100-80g"]

# Published totals (model cards / papers), to compare with the count computed from each architecture
PUBLISHED = {
    "llama-3-8b": 8.03e9,
    "llama-3-70b": 70.6e9,
    "llama-3-405b": 405.9e9,
    "llama-2-7b": 6.74e9,
    "llama-2-70b": 68.98e9,
    "mixtral-8x7b": 46.7e9,
    "bloom-176b": 176.247e9,
}

LLAMA3_8B_CONFIG = {  # meta-llama/Meta-Llama-3-8B config.json
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
MIXTRAL_CONFIG = {  # mistralai/Mixtral-8x7B-v0.1 config.json (the fields that shape it)
    "architectures": ["MixtralForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1e6,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}
GPT2_CONFIG = {
    "activation_function": "gelu_new",
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
    "layer_norm_epsilon": 1e-5,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_counts_equal_the_published_totals(name):
    """Counted from layers, widths, heads, KV heads, MLP type, experts and embeddings -- never looked up."""
    assert PRESETS[name].params() == pytest.approx(PUBLISHED[name], rel=0.005)


def test_parameter_count_by_hand_llama3_8b_and_mixtral_active():
    m = PRESETS["llama-3-8b"]
    h, f, kv, v, l = 4096, 14336, 1024, 128256, 32
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h  # Q, O, K, V, gate/up/down, two RMSNorms
    assert m.params() == l * per_layer + 2 * v * h + h == 8_030_261_248
    mx = PRESETS["mixtral-8x7b"]
    assert mx.active_params() == pytest.approx(12.9e9, rel=0.005)  # "12.9B active parameters"
    # the 2021 GPT default is Narayanan's eq. 2 plus the final LayerNorm
    g = PRESETS["ptdp-1t"]
    H, L, V, S = 25600, 128, 51200, 2048
    assert g.params() == L * (12 * H * H + 13 * H) + (V + S) * H + 2 * H


def test_mpt_counts_equal_llm_foundry_numparams():
    """llm-foundry's benchmark table prints NumParams for each MPT; the planner's count of the same shape."""
    for name, n in (
        ("mpt-7b", 6658859008),
        ("mpt-13b", 12853954560),
        ("mpt-30b", 29975214080),
        ("mpt-70b", 64862437376),
    ):
        assert PRESETS[name].params() == n


def test_flops_conventions_causal_and_flash():
    m = PRESETS["llama-3-8b"]
    b, s, h, l = 4, m.seq, m.hidden, m.layers
    full, causal = m.model_flops(b), m.causal_model_flops(b)
    assert full - causal == pytest.approx(3 * l * 2 * b * s * s * h)  # half of 4bs²h, forward and backward
    # GQA: K and V projections are h x h_kv; SwiGLU three h x f matrices
    assert m.layer_linear_flops_fwd(1) == 2 * s * (2 * h * h + 2 * h * 1024 + 3 * h * 14336)
    mx = PRESETS["mixtral-8x7b"]
    dense_equiv = 2 * mx.seq * (2 * h * h + 2 * h * 1024 + 2 * 3 * h * 14336 + h * 8)
    assert mx.layer_linear_flops_fwd(1) == dense_equiv  # top-2 experts and the router


def test_activation_terms_for_gqa_swiglu_flash():
    """Korthikanti's table generalised term by term; the s² scores vanish under FlashAttention; Llama trains
    without dropout, so its layers store no masks (2h per token, and the attention core's as)."""
    m = PRESETS["llama-3-8b"]
    assert not m.dropout
    s, h, kv, f, a = m.seq, 4096, 1024, 14336, 32
    c = Layout(tp=4, batch=Batch(micro_batch_size=1))
    want = s * ((4 * h + 2 * h + 2 * h) + (2 * h + 4 * kv + 2 * h + 6 * f + 4 * a) / 4)
    assert activation_bytes_per_layer(m, c) == pytest.approx(want)
    assert activation_bytes_per_layer(replace(m, dropout=True), c) - activation_bytes_per_layer(m, c) == s * 2 * h
    std = ModelShape("x", 1, h, a, s, 1000, f, kv_heads=8, ffn_type="swiglu", attention="standard", dropout=True)
    assert activation_bytes_per_layer(std, c) - activation_bytes_per_layer(
        replace(m, dropout=True), c
    ) == pytest.approx(s * (5 * a * s - 4 * a) / 4)
    assert activation_bytes_per_layer(std, c) - activation_bytes_per_layer(
        replace(std, dropout=False), c
    ) == pytest.approx(s * (2 * h + a * s / 4))
    sp = Layout(tp=4, cp=2, batch=Batch(micro_batch_size=1), knobs=Knobs(sequence_parallel=True))
    assert activation_bytes_per_layer(m, sp) == pytest.approx(
        s / 2 * (8 * h + 2 * h + 4 * kv + 2 * h + 6 * f + 4 * a) / 4
    )
    fp8 = Layout(tp=4, batch=Batch(micro_batch_size=1), precision=Precision(name="fp8"))
    # the four linear inputs (QKV, output projection, fc1: h each; fc2: f) stored in 8 bits
    assert activation_bytes_per_layer(m, c) - activation_bytes_per_layer(m, fp8) == pytest.approx(
        s * (2 * h + (h + f) / 4)
    )


def test_kv_heads_bound_tensor_parallelism_and_fp8_needs_hardware():
    m = PRESETS["llama-3-70b"]  # 64 heads, 8 KV heads
    assert check(m, Layout(tp=8), H100) is None
    why = check(replace_kv(m, 4), Layout(tp=8), H100)
    assert why.key == "heads" and "KV heads" in why.text
    assert check(m, Layout(precision=Precision(name="fp8")), A100).key == "fp8"
    assert check(m, Layout(precision=Precision(name="fp8")), H100) is None


def replace_kv(m, kv):
    from dataclasses import replace

    return replace(m, kv_heads=kv)


def test_fp8_is_faster_and_smaller_than_bf16_on_h100():
    m = PRESETS["llama-3-70b"]
    base = Layout(
        tp=8, pp=4, dp=2, zero=1, batch=Batch(micro_batch_size=1, global_batch=64), knobs=Knobs(sequence_parallel=True)
    )
    bf, f8 = estimate(m, base, H100), estimate(m, base.replace(precision="fp8"), H100)
    assert f8.step.matmul_s < 0.75 * bf.step.matmul_s
    assert f8.memory.activations < bf.memory.activations
    assert f8.memory.params == pytest.approx(1.5 * bf.memory.params)  # + an FP8 copy


def test_uneven_stages_largest_sets_memory_and_time():
    m = PRESETS["llama-3-405b"]
    even = Layout(
        tp=8, pp=16, dp=4, zero=1, batch=Batch(micro_batch_size=1, global_batch=64), knobs=Knobs(recompute="full")
    )
    from dataclasses import replace

    short = even.replace(first_stage_layers=7, last_stage_layers=7)
    assert even.stage_layers(126) == [7] + [8] * 14 + [7]  # the extra layers go to the middle stages
    assert short.stage_layers(126) == [7] + [8] * 14 + [7]
    assert check(m, even, H100) is None
    # with the embedding and output stages one layer short, the pace is a middle stage's 8 layers; 128 layers on
    # 16 even stages put the output layer on top of 8 layers on the last one
    lc = layers.layer_costs(m, short, H100)
    per_layer, head = lc["matmul_fwd"] + lc["matmul_bwd"], 3 * lc["logits_fwd"]
    assert head < per_layer
    assert estimate(m, short, H100).step.matmul_s == pytest.approx(short.microbatches * 8 * per_layer)
    assert estimate(replace(m, layers=128), even, H100).step.matmul_s == pytest.approx(
        even.microbatches * (8 * per_layer + head)
    )
    lop = even.replace(first_stage_layers=2, last_stage_layers=2)  # the middle stages take 122/14 -> 9
    assert max(lop.stage_layers(126)) == 9
    assert estimate(m, lop, H100).step.step_time_s > estimate(m, short, H100).step.step_time_s


def test_context_parallel_splits_activations_and_exchanges_kv():
    m = PRESETS["llama-3-8b"]
    from dataclasses import replace

    long = replace(m, seq=131072)
    c1 = Layout(
        tp=8,
        dp=1,
        batch=Batch(micro_batch_size=1, global_batch=1),
        knobs=Knobs(recompute="full", sequence_parallel=True),
    )
    c8 = replace(c1, cp=8)
    assert memory(long, c8).activations < memory(long, c1).activations / 7
    e = estimate(long, c8.replace(global_batch=1), H100)
    assert e.step.parts.context_parallel >= 0 and e.step.step_time_s < estimate(long, c1, H100).step.step_time_s
    # across nodes the ring's KV exchange is exposed where the attention block does not cover it
    short = replace(m, seq=8192)
    inter = estimate(short, Layout(tp=8, cp=4, batch=Batch(micro_batch_size=1, global_batch=1)), H100)
    assert inter.step.parts.context_parallel > 0


def test_expert_parallel_shards_experts_and_prices_all_to_all():
    m = PRESETS["mixtral-8x7b"]
    c1 = Layout(tp=1, pp=4, dp=8, zero=1, batch=Batch(micro_batch_size=1, global_batch=64))
    from dataclasses import replace

    c8 = replace(c1, ep=8)
    assert check(m, c8, H100) is None and check(m, replace(c1, ep=3), H100).key == "ep"
    assert params_on_device(m, c8) < params_on_device(m, c1) / 4
    e = estimate(m, c8, H100)
    assert e.step.parts.expert_parallel > 0 and e.model.active_params() < e.model.params() / 3


def test_large_groups_extrapolate_to_what_the_simulation_gives():
    """Groups over 64 are extrapolated from 32 and 64; at 128 and 256 that is within 0.5% of the simulation."""
    hw = H100
    for op, algo in (("allreduce", "ring"), ("allreduce", "double_binary_tree"), ("reduce_scatter", "ring")):
        for stride in (1, 8):
            for p in (128, 256):
                a, b = comm._fit(hw, op, algo, p, stride)
                saved = comm.SIMULATED
                comm.SIMULATED = 512
                try:
                    a2, b2 = comm._fit.__wrapped__(hw, op, algo, p, stride)
                finally:
                    comm.SIMULATED = saved
                for n in (1 << 20, 1 << 32):
                    assert a + b * n == pytest.approx(a2 + b2 * n, rel=0.005)


def test_nccl_rails_make_intra_node_groups_leave_the_node_wider():
    """A DP group of consecutive GPUs (tp 1) leaves each node over all 8 NICs; one GPU per node over one."""
    hw = A100
    wide = timing.collective_time(hw, "allgather", 64, 1, 1e10)
    narrow = timing.collective_time(hw, "allgather", 64, 8, 1e10)
    assert narrow > 4 * wide
    assert narrow == pytest.approx(1e10 * 63 / 64 / hw.nic_bandwidth, rel=0.05)


def test_hf_config_llama3_and_mixtral_and_gpt2(tmp_path):
    for cfg, name, want in (
        (LLAMA3_8B_CONFIG, "llama", PRESETS["llama-3-8b"]),
        (MIXTRAL_CONFIG, "mixtral", PRESETS["mixtral-8x7b"]),
    ):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(cfg))
        fields, unknown = from_hf_config(path)
        spec = ModelShape(**fields)
        assert spec.params() == want.params()
        assert (spec.kv, spec.ffn_type, spec.position, spec.tied, spec.bias) == (8, "swiglu", "rope", False, False)
        assert "rms_norm_eps" in unknown and "num_hidden_layers" not in unknown
    path = tmp_path / "gpt2.json"
    path.write_text(json.dumps(GPT2_CONFIG))
    fields, _ = from_hf_config(path)
    spec = ModelShape(**fields)
    assert spec.params() == pytest.approx(124.4e6, rel=0.005)  # GPT-2 small: 124M
    assert (spec.position, spec.tied, spec.ffn_type) == ("learned", True, "gelu")
    # GPT-2 trains with dropout 0.1 (resid_pdrop, ...), Llama 3 with attention_dropout 0, Mixtral names none
    path.write_text(json.dumps({**GPT2_CONFIG, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}))
    fields, unknown = from_hf_config(path)
    assert fields["dropout"] is True and "resid_pdrop" not in unknown
    assert from_hf_config(tmp_path / "llama.json")[0]["dropout"] is False
    assert from_hf_config(tmp_path / "mixtral.json")[0]["dropout"] is False
    path.write_text(json.dumps({**GPT2_CONFIG, "resid_pdrop": 1.5}))
    with pytest.raises(UsageError, match="dropout probability"):
        from_hf_config(path)


def test_megatron_args_and_deepspeed_config(tmp_path):
    line = (
        "torchrun pretrain_gpt.py --num-layers 80 --hidden-size 8192 --num-attention-heads 64 "
        "--group-query-attention --num-query-groups 8 --ffn-hidden-size 28672 --swiglu --seq-length 8192 "
        "--padded-vocab-size 128256 --untie-embeddings-and-output-weights --disable-bias-linear "
        "--position-embedding-type rope --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 "
        "--context-parallel-size 2 --num-layers-per-virtual-pipeline-stage 5 --micro-batch-size 1 "
        "--global-batch-size 128 --sequence-parallel --use-distributed-optimizer --fp8-format hybrid "
        "--lr 3e-4 --train-iters 1000 --bf16"
    )
    model, split, unknown = from_megatron_args(line)
    assert ModelShape("m", **model).params() == PRESETS["llama-3-70b"].params()
    assert split == {
        "tp": 4,
        "pp": 4,
        "cp": 2,
        "interleave": 4,
        "microbatch": 1,
        "global_batch": 128,
        "sequence_parallel": True,
        "zero": 1,
        "precision": "fp8",
    }
    assert unknown == ["--lr", "--train-iters"]
    assert model["dropout"] is True  # Megatron's dropouts default to 0.1
    assert from_megatron_args(line + " --hidden-dropout 0 --attention-dropout 0.0")[0]["dropout"] is False
    assert from_megatron_args(line + " --hidden-dropout 0")[0]["dropout"] is True
    with pytest.raises(UsageError, match="needs a value"):
        from_megatron_args("--num-layers")
    ds = tmp_path / "ds.json"
    ds.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 2,
                "gradient_accumulation_steps": 8,
                "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True},
                "bf16": {"enabled": True},
                "gradient_clipping": 1.0,
            }
        )
    )
    split, unknown = from_deepspeed_config(ds)
    assert split == {"microbatch": 2, "grad_accum": 8, "zero": 3, "dp_overlap": True, "precision": "bf16"}
    assert unknown == ["zero_optimization.contiguous_gradients", "gradient_clipping"]


def test_cli_model_config_megatron_args_and_notes(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B_CONFIG))
    assert (
        main(
            [
                "plan",
                "estimate",
                "--model-config",
                str(path),
                "--hardware",
                "h100-80g",
                "--tp",
                "2",
                "--dp",
                "4",
                "--global-batch",
                "32",
                "--microbatch",
                "1",
                "--json",
            ]
        )
        == 0
    )
    cap = capsys.readouterr()
    e = json.loads(cap.out)
    assert e["params_count"] == PRESETS["llama-3-8b"].params() and e["gpus"] == 8
    assert {k: e[k] for k in ("kv_heads", "ffn_type", "attention", "dropout", "experts", "cp", "ep", "precision")} == {
        "kv_heads": 8,
        "ffn_type": "swiglu",
        "attention": "flash",
        "dropout": False,
        "experts": 0,
        "cp": 1,
        "ep": 1,
        "precision": "bf16",
    }
    # the causal model's FLOPs and Megatron's (the full s x s product) differ by half the attention product
    m, b = PRESETS["llama-3-8b"], 32
    assert e["megatron_flops_per_iteration"] - e["model_flops_per_iteration"] == pytest.approx(
        3 * m.layers * 2 * b * m.seq**2 * m.hidden
    )
    assert "not modelled" in cap.err and "rms_norm_eps" in cap.err
    assert (
        main(
            [
                "plan",
                "--megatron-args",
                "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
                "--seq-length 4096 --tensor-model-parallel-size 2 --global-batch-size 64 --micro-batch-size 1",
                "--gpus",
                "16",
                "--json",
                "--top",
                "1",
            ]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)["plans"][0]
    assert plan["tp"] == 2 and plan["microbatch"] == 1 and plan["global_batch"] == 64


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--model-config", "/nonexistent/config.json", "--gpus", "8", "--global-batch", "8"], "--model-config"),
        (
            ["--model", "llama-3-8b", "--megatron-args", "--num-layers 2", "--gpus", "8", "--global-batch", "8"],
            "one of",
        ),
        (
            ["--megatron-args", "--num-layers 2 --hidden-size 64", "--gpus", "8", "--global-batch", "8"],
            "--num-attention",
        ),
        (["--model", "llama-3-8b", "--kv-heads", "5", "--gpus", "8", "--global-batch", "8"], "--kv-heads"),
        (["--model", "llama-3-8b", "--experts", "1", "--gpus", "8", "--global-batch", "8"], "--experts"),
        (["estimate", "--model", "llama-3-8b", "--tp", "2", "--precision", "fp8"], "FP8"),
        (["estimate", "--model", "llama-3-8b", "--pp", "4", "--first-stage-layers", "40"], "--first-stage-layers"),
    ],
)
def test_bad_planner_input_is_one_line(argv, words, capsys):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


def test_search_covers_cp_precision_and_interleave_16():
    m = PRESETS["llama-3-70b"]
    res = search(m, 64, H100, 128, top=0)
    got = {(e.layout.cp, e.layout.precision.name) for e in res.ranked}
    assert {(1, "bf16"), (2, "bf16"), (1, "fp8")} <= got
    assert max(e.layout.interleave for e in res.ranked) > 8
    assert res.searched == res.fits + sum(r.count for r in res.rejected.values())


def test_capacity_factor_pads_experts_and_overlap_options_hide_comm():
    from dataclasses import replace

    m = PRESETS["mixtral-8x7b"]
    padded = replace(m, capacity_factor=1.25)
    mlp = 2 * m.seq * 2 * m.expert_weights()  # top-2 experts, one sequence
    assert padded.layer_linear_flops_fwd(1) - m.layer_linear_flops_fwd(1) == pytest.approx(0.25 * mlp)
    c = Layout(tp=1, pp=4, dp=8, ep=8, zero=1, batch=Batch(micro_batch_size=1, global_batch=64))
    assert estimate(padded, c, H100).step.parts.expert_parallel > 1.2 * estimate(m, c, H100).step.parts.expert_parallel
    with pytest.raises(UsageError, match="capacity_factor"):
        from netmorph.mesh.presets import check_shape

        check_shape(replace(m, capacity_factor=0.5))
    g = PRESETS["gpt3-175b"]
    base = Layout(tp=8, pp=8, dp=16, batch=Batch(micro_batch_size=1, global_batch=1536), knobs=Knobs(recompute="full"))
    plain, over = estimate(g, base, A100), estimate(g, base.replace(tp_overlap=True, pp_overlap=True), A100)
    assert plain.step.parts.tensor_parallel > 0 and over.step.parts.tensor_parallel == 0
    assert over.step.step_time_s < plain.step.step_time_s
    model, split, _ = from_megatron_args(
        "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --num-experts 4 "
        "--moe-expert-capacity-factor 1.5 --tp-comm-overlap"
    )
    assert model["capacity_factor"] == 1.5 and split["tp_overlap"] is True


def test_measured_gemm_table_prices_small_gemms_slower(tmp_path):
    """A hardware file's gemm_table (as benchmarks/gemm_efficiency.py prints it) bins each GEMM by its size; one
    bin at the default efficiency reproduces the constant; a slower small-GEMM bin slows the small model only."""
    small, big = PRESETS["llama-3-8b"], PRESETS["llama-3-405b"]
    c = Layout(tp=8, batch=Batch(micro_batch_size=1, global_batch=1))
    flat = replace(H100, gemm_table=((1e9, H100.gemm_efficiency),))
    for m in (small, big):
        assert layers.layer_costs(m, c, flat)["matmul_fwd"] == pytest.approx(
            layers.layer_costs(m, c, H100)["matmul_fwd"]
        )
    # the 8B model's per-rank GEMMs are under 400 GFLOP; the 405B's over it
    assert (
        max(f for f, _ in layers.linear_gemms(small, small.seq, 8))
        < 4e11
        < min(f for f, _ in layers.linear_gemms(big, big.seq, 8))
    )
    binned = replace(H100, gemm_table=((400.0, 0.35), (1e9, H100.gemm_efficiency)))
    assert layers.layer_costs(small, c, binned)["matmul_fwd"] > 1.5 * layers.layer_costs(small, c, H100)["matmul_fwd"]
    assert layers.layer_costs(big, c, binned)["matmul_fwd"] == pytest.approx(
        layers.layer_costs(big, c, H100)["matmul_fwd"]
    )
    path = tmp_path / "gpu.json"
    path.write_text(
        json.dumps(
            {
                "peak_flops": 989e12,
                "memory_bytes": 8.5e10,
                "hbm_bandwidth": 3.35e12,
                "gpus_per_node": 8,
                "nvlink_bandwidth": 4.5e11,
                "nic_bandwidth": 5e10,
                "gemm_table": [[1000, 0.35], [1e9, 0.7]],
            }
        )
    )
    from netmorph.planner.hardware import load_hardware

    assert load_hardware(str(path)).gemm_table == ((1000.0, 0.35), (1e9, 0.7))
    path.write_text(json.dumps({"peak_flops": 1e15, "gemm_table": [[10, 1.5]]}))
    with pytest.raises(UsageError, match="gemm_table"):
        load_hardware(str(path))


def test_zero3_moves_three_model_copies_per_microbatch():
    """ZeRO-3 / FSDP gathers the weights for every forward and backward and reduce-scatters the gradients after
    every backward (ZeRO's 3Ψ per microbatch, nothing after the step); ZeRO-1 reduce-scatters once per step and
    all-gathers the updated weights once."""
    hw, m = HW["a100-80g"], PRESETS["mpt-7b"]
    c = Layout(
        dp=8, zero=3, batch=Batch(micro_batch_size=2, global_batch=64), knobs=Knobs(dp_overlap=False)
    )  # 4 microbatches
    n = params_on_device(m, c)
    ag = timing.collective_time(hw, "allgather", 8, 1, c.precision.param_bytes * n)
    rs = timing.collective_time(hw, "reduce_scatter", 8, 1, c.precision.grad_bytes * n)
    st = timing.step_time(m, c, hw)
    assert st.parts.zero3_gather == pytest.approx(4 * 2 * ag)
    assert st.parts.data_parallel == pytest.approx(4 * rs)
    st1 = timing.step_time(m, replace(c, zero=1), hw)
    assert (st1.parts.zero3_gather, st1.parts.data_parallel) == (0.0, pytest.approx(rs + ag))
    # overlapped, layer by layer: per microbatch the first gather and the last reduce-scatter are exposed, and
    # a layer whose gather (and, in the backward, gather + reduce-scatter) outlasts its compute the difference
    over = timing.step_time(m, c.replace(dp_overlap=True), hw)
    lc = layers.layer_costs(m, c, hw)
    f, b = lc["matmul_fwd"] + lc["elementwise_fwd"], lc["matmul_bwd"] + lc["elementwise_bwd"]
    g, r, L = ag / m.layers, rs / m.layers, m.layers
    per_mb = g + r + (L - 1) * (max(0.0, g - f) + max(0.0, g + r - b))
    assert over.parts.zero3_gather + over.parts.data_parallel == pytest.approx(4 * per_mb)
    assert over.comm_hidden_s == pytest.approx(4 * (2 * ag + rs) - 4 * per_mb)
    assert over.overlap_slowdown_s == pytest.approx(hw.comm_slowdown * over.comm_hidden_s)
    assert hw.comm_slowdown == 0.189  # Lee et al. 2025's mean GEMM slowdown beside NCCL


def test_bucketed_overlap_exposes_the_last_bucket_and_what_outlasts_a_layer():
    """DDP's / Megatron's overlap_grad_reduce: n buckets launched one per layer of compute c, run in order --
    the stream ends one bucket after the compute when a bucket is shorter, (n - 1)(bucket - c) later when not;
    with one microbatch per step there is one backward to hide behind, with many the same last backward."""
    assert timing.bucketed(1.0, 10, 2.0) == 1.0
    assert timing.bucketed(3.0, 10, 2.0) == 3.0 + 9 * 1.0
    assert timing.bucketed(1.0, 10, 2.0, overlap=0.25) == 1.0 + 9 * 0.5
    assert timing.bucketed(1.0, 0, 2.0) == 0.0
    hw, m = HW["h100-80g"], PRESETS["llama-3-8b"]
    c = Layout(dp=64, zero=1, batch=Batch(micro_batch_size=1, global_batch=64), knobs=Knobs(dp_overlap=True))
    one = timing.step_time(m, c, hw)
    gathered = timing.step_time(m, c.replace(param_gather_overlap=True), hw)
    # the distributed optimizer's all-gather follows the step unless --overlap-param-gather hides it
    assert gathered.parts.data_parallel < one.parts.data_parallel
    assert one.parts.data_parallel > timing.collective_time(hw, "allgather", 64, 1, 2 * params_on_device(m, c))


def test_matmul_efficiency_is_carried_by_the_measured_ceiling():
    """The calibration set's A100 efficiency (CALIBRATED_EFFICIENCY) moves to another part by the ratio of the
    maximum achievable matmul FLOP/s measured on each (Bekman's MAMF table: A100 SXM 271.2 of 312, H100 SXM 794.5
    of 989 TFLOP/s; FP8 H100 1402.6 of 1979), so the calibration is untouched and an H100 is not a faster A100."""
    from netmorph.planner.hardware import CALIBRATED_EFFICIENCY as e

    a100, h100 = HW["a100-80g"], HW["h100-80g"]
    assert a100.gemm_efficiency == HW["a100-40g"].gemm_efficiency == e
    assert h100.gemm_efficiency == pytest.approx(e * (794.5 / 989) / (271.2 / 312), abs=1e-4)
    assert h100.fp8_efficiency == pytest.approx(e * (1402.6 / 1979) / (271.2 / 312), abs=1e-4)
    assert HW["h200"].gemm_efficiency == h100.gemm_efficiency and HW["h200"].fp8_efficiency > h100.fp8_efficiency
    m = PRESETS["llama-3-8b"]
    c = Layout(batch=Batch(micro_batch_size=1), precision=Precision(name="fp8"))
    lin = m.layer_linear_flops_fwd(1)
    saved = (
        layers.layer_costs(m, c.replace(precision="bf16"), h100)["matmul_fwd"]
        - layers.layer_costs(m, c, h100)["matmul_fwd"]
    )
    assert saved == pytest.approx(lin / (989e12 * h100.gemm_efficiency) - lin / (1979e12 * h100.fp8_efficiency))
    from netmorph.planner.hardware import load_hardware

    half = load_hardware("h100-80g", 0.5)  # --efficiency keeps FP8's measured ratio
    assert half.fp8_efficiency / 0.5 == pytest.approx(h100.fp8_efficiency / h100.gemm_efficiency)


@pytest.mark.parametrize(
    "name,p,v,m",
    [
        ("afab", 4, 1, 8),
        ("1f1b", 4, 1, 8),
        ("1f1b", 8, 1, 3),
        ("interleaved", 4, 2, 8),
        ("interleaved", 4, 3, 4),
        ("interleaved", 2, 4, 6),
    ],
)
def test_activations_in_flight_are_what_the_schedule_holds(name, p, v, m):
    """Layout.in_flight(i) x v is the most chunk-microbatches pipeline rank i holds (forwarded, not yet
    backwarded) when it runs the trainer's own slot order for that schedule -- GPipe all m, 1F1B p - i, the
    interleaved schedule Megatron's warmup + 1 -- and the planner's activation memory scales with it."""
    from netmorph.parallel.pipeline import schedule

    c = Layout(pp=p, interleave=v, batch=Batch(schedule=name, global_batch=m))
    for i, slots in enumerate(schedule(name, p, m, v)):
        held = peak = 0
        for s in slots:
            held += 1 if s.kind == "F" else -1
            peak = max(peak, held)
        assert c.in_flight(i) * v == peak, (i, c.in_flight(i), peak)
    model = ModelShape(layers=4 * p * v, hidden=64, heads=4, seq=32, vocab=128, dropout=False)
    acts = stage_activations(model, c)
    assert acts[0] == pytest.approx(activation_bytes_per_layer(model, c) * 4 * v * c.in_flight(0))


def test_a_larger_microbatch_group_holds_more_in_flight():
    """Llama 3's tunable N (Megatron's --microbatch-group-size-per-virtual-pipeline-stage): a group of N > p
    microbatches per chunk lets m be any multiple of N, and every rank holds (v - 1)(N - p) more chunks."""
    base = Layout(pp=4, interleave=2, batch=Batch(global_batch=10 * 1))
    assert base.check() and "multiple of pp" in base.check()[0].text
    grouped = base.replace(microbatch_group=5)
    assert not grouped.check()
    assert [grouped.in_flight(i) * 2 for i in range(4)] == [2 * (4 - i - 1) + 5 + 1 for i in range(4)]
    assert "at least pp" in base.replace(microbatch_group=2, global_batch=8).check()[0].text


def test_buckets_of_a_size_and_the_trainers_overlap_rule():
    """DDP's bucket_cap_mb (netmorph train's --bucket-mb): the gradients fill ceil(bytes / size) buckets, each
    hiding behind its share of the backward; the twin prices the trainer's layout with the trainer's buckets and
    overlaps them only where the trainer does (no tp, no pp)."""
    from netmorph.calibrate.validate import planner_layout

    hw, m = HW["a100-80g"], PRESETS["mpt-7b"]
    c = Layout(
        dp=16, zero=0, batch=Batch(micro_batch_size=2, global_batch=64), knobs=Knobs(dp_overlap=True, dp_bucket_mb=25.0)
    )
    total = c.precision.grad_bytes * params_on_device(m, c)
    n = -(-int(total) // (25 * 2**20))
    bucket = timing.collective_time(hw, "allreduce", 16, 1, total / n)
    lc = layers.layer_costs(m, c, hw)
    per = (lc["matmul_bwd"] + lc["elementwise_bwd"]) * m.layers / n
    assert timing.step_time(m, c, hw).parts.data_parallel == pytest.approx(timing.bucketed(bucket, n, per))
    small = ModelShape(layers=2, hidden=96, heads=4, seq=48, vocab=128)
    assert planner_layout(
        Layout(dp=4, batch=Batch(global_batch=8), knobs=Knobs(dp_overlap=True)), "float32", small
    ).knobs.dp_overlap
    assert planner_layout(Layout(dp=4, batch=Batch(global_batch=8)), "float32", small).knobs.dp_bucket_mb == 1.0
    assert not planner_layout(
        Layout(tp=2, dp=2, batch=Batch(global_batch=8), knobs=Knobs(dp_overlap=True)), "float32", small
    ).knobs.dp_overlap
    # a run that does not overlap (morph's trainer) is priced as one that does not
    assert not planner_layout(Layout(dp=4, batch=Batch(global_batch=8)), "float32", small).knobs.dp_overlap


def test_deepspeed_memory_term_by_term():
    """--zero-memory deepspeed counts what DeepSpeed allocates, as its estimators do: stages 1-2 4Ψ + 16Ψ/N
    (estimate_zero2_model_states_mem_needs without offload), stage 3 4·largest layer + 18Ψ/N
    (estimate_zero3_model_states_mem_needs), the largest layer being the biggest module (here the embedding);
    the paper's Table 1 stays the default."""
    psi, n = 7.5e9, 64
    bare = ModelShape("7.5B", 0, 0, 0, params_only=psi)
    for zero in (1, 2):
        ds = memory(
            bare, Layout(dp=n, zero=zero, precision=Precision(grad_bytes=4), knobs=Knobs(zero_memory="deepspeed"))
        )
        assert ds.params + ds.grads + ds.optimizer == pytest.approx(4 * psi + 16 * psi / n)
    assert memory(bare, Layout(dp=n, zero=2, precision=Precision(grad_bytes=2))).total == pytest.approx(
        2 * psi + 14 * psi / n
    )
    m = PRESETS["llama-3-8b"]
    c = Layout(
        dp=n,
        zero=3,
        batch=Batch(global_batch=n),
        precision=Precision(grad_bytes=4),
        knobs=Knobs(zero_memory="deepspeed"),
    )
    ds, paper = memory(m, c), memory(m, c.replace(zero_memory="paper"))
    largest = m.vocab * m.hidden
    assert ds.total - paper.total == pytest.approx(4 * largest)
    assert ds.params + ds.grads + ds.optimizer == pytest.approx(4 * largest + 18 * m.params() / n)


def test_sequence_parallel_gathers_again_in_the_backward_where_megatron_does():
    """Megatron's SP keeps each rank's sequence shard of the QKV and fc1 inputs and all-gathers it again for the
    weight gradients: one all-reduce's bytes more per layer backward than without SP, unless the gathered input is
    kept (netmorph's trainer) or the whole forward is recomputed; the simulator plays the same count."""
    from netmorph.simulate import costs_for

    m = PRESETS["mt-22b"]
    base = Layout(tp=8, batch=Batch(micro_batch_size=4, global_batch=4), knobs=Knobs(recompute="selective"))
    sp = base.replace(sequence_parallel=True)
    assert layers.layer_costs(m, base, A100)["tp_per_bwd"] == 2
    assert layers.layer_costs(m, sp, A100)["tp_per_bwd"] == 3
    assert layers.layer_costs(m, sp.replace(sp_regather=False), A100)["tp_per_bwd"] == 2
    assert layers.layer_costs(m, sp.replace(recompute="full"), A100)["tp_per_bwd"] == 4
    ar = timing.collective_time(A100, "allreduce", 8, 1, layers.layer_costs(m, sp, A100)["activation_bytes"])
    extra = (
        estimate(m, sp, A100).step.parts.tensor_parallel
        - estimate(m, sp.replace(sp_regather=False), A100).step.parts.tensor_parallel
    )
    assert extra == pytest.approx(m.layers * ar, rel=1e-9)
    assert costs_for(m, sp, A100).tp_per_bwd == 3


def test_llama3_all_gather_context_parallelism_is_exposed():
    """--cp-comm-type all_gather (Llama 3 sec. 3.3.2): K and V of the whole sequence all-gathered before the
    attention core and their gradients reduce-scattered after it, nothing hidden; a ring (p2p) hides its blocks
    behind the core. A value Megatron does not take is a typed rejection."""
    m = replace(PRESETS["llama-3-70b"], seq=65536)
    ring = Layout(tp=8, cp=8, batch=Batch(micro_batch_size=1, global_batch=1), knobs=Knobs(sequence_parallel=True))
    ag = ring.replace(cp_comm_type="all_gather")
    kv = 2 * m.seq * m.h_kv / 8 * 2
    lc = layers.layer_costs(m, ag, H100)
    assert lc["cp_fwd"] == pytest.approx(timing.collective_time(H100, "allgather", 8, 8, kv), rel=1e-12)
    assert lc["cp_bwd"] == pytest.approx(timing.collective_time(H100, "reduce_scatter", 8, 8, kv), rel=1e-12)
    full = layers.layer_costs(m, ag.replace(recompute="full"), H100)
    assert full["cp_bwd"] == pytest.approx(lc["cp_bwd"] + lc["cp_fwd"], rel=1e-12)
    assert layers.layer_costs(m, ring, H100)["cp_fwd"] < lc["cp_fwd"]
    assert estimate(m, ag, H100).step.parts.context_parallel > estimate(m, ring, H100).step.parts.context_parallel
    (r,) = [r for r in ring.replace(cp_comm_type="ring").check(m, 64) if r.field == "cp_comm_type"]
    assert "p2p, all_gather, a2a" in r.text


def test_ulysses_a2a_prices_four_all_to_alls_each_way_on_the_critical_path():
    """--cp-comm-type a2a (DeepSpeed-Ulysses): q and the output (h wide), k and v (h_kv wide) each an all-to-all
    of s/cp tokens over the cp group, forward and again backward, and the forward's again under full
    recomputation -- the same four tensors whose bytes the trainer's ledger holds to 8(cp-1)/cp·n·B."""
    m = replace(PRESETS["llama-3-70b"], seq=65536)
    a2a = Layout(
        tp=8,
        cp=8,
        batch=Batch(micro_batch_size=1, global_batch=1),
        knobs=Knobs(sequence_parallel=True, cp_comm_type="a2a"),
    )
    one = [timing.collective_time(H100, "alltoall", 8, 8, m.seq / 8 * w / 8 * 2) for w in (m.hidden, m.h_kv)]
    lc = layers.layer_costs(m, a2a, H100)
    assert lc["cp_fwd"] == pytest.approx(2 * one[0] + 2 * one[1], rel=1e-12)
    assert lc["cp_bwd"] == pytest.approx(lc["cp_fwd"], rel=1e-12)
    full = layers.layer_costs(m, a2a.replace(recompute="full"), H100)
    assert full["cp_bwd"] == pytest.approx(2 * lc["cp_fwd"], rel=1e-12)
    assert estimate(m, a2a, H100).step.parts.context_parallel > 0
