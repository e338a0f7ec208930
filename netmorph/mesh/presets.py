"""The published models as :class:`~netmorph.mesh.shape.ModelShape` presets, and a model from what a user gives
(a preset's name, flags, a config file's fields) with every field checked (:func:`check_shape`).

Presets: GPT-3 175B, Narayanan et al. 2021 Table 1 (``ptdp-1.7b`` .. ``ptdp-1t``) and
Korthikanti et al. 2022 Table 3 (``mt-22b`` .. ``mt-1t``), s = 2048, V = 51200, as the papers;
open models from their published architectures (Hugging Face ``config.json``): Llama-3 8B,
70B and 405B (Dubey et al. 2024, Table 3), Llama-2 7B and 70B, Mixtral 8x7B, BLOOM-176B, and
MosaicML's MPT benchmark models (llm-foundry ``scripts/train/yamls/pretrain``).
"""

from __future__ import annotations

from dataclasses import replace

from netmorph.errors import UsageError
from netmorph.mesh.shape import ATTENTION, ATTENTION_BIAS, FFN_TYPES, POSITIONS, ModelShape

# what a Megatron command line that names no --seq-length / vocabulary is taken to train (GPT-3's)
MEGATRON_DEFAULTS = {"seq": 2048, "vocab": 51200}


def _m(name, layers, hidden, heads, seq=2048, vocab=51200, **kw):
    """A 2021-era Megatron GPT, as the papers train it: learned positions, GeLU 4h, tied, biases, dropout."""
    return ModelShape(name, layers, hidden, heads, seq, vocab, dropout=True, **kw)


def _llama(name, layers, hidden, heads, kv, ffn, vocab=128256, seq=8192, **kw):
    return ModelShape(
        name,
        layers,
        hidden,
        heads,
        seq,
        vocab,
        ffn,
        kv_heads=kv,
        ffn_type="swiglu",
        position="rope",
        tied=False,
        bias=False,
        attention="flash",
        dropout=False,
        **kw,
    )


def _mpt(name, layers, hidden, heads):
    # llm-foundry's benchmark MPTs: learned positions, biases, LayerNorm, GeLU 4h, vocab 50368, tied, flash, and
    # attn_pdrop = resid_pdrop = emb_pdrop = 0
    return ModelShape(
        name,
        layers,
        hidden,
        heads,
        2048,
        50368,
        attention="flash",
        dropout=False,
        source="llm-foundry scripts/train/yamls/pretrain",
    )


PRESETS = {
    m.name: m
    for m in [
        _m("gpt3-175b", 96, 12288, 96, source="Brown et al. 2020, Table 2.1"),
        # Narayanan et al. 2021, Table 1 (weak scaling on Selene)
        _m("ptdp-1.7b", 24, 2304, 24),
        _m("ptdp-3.6b", 30, 3072, 32),
        _m("ptdp-7.5b", 36, 4096, 32),
        _m("ptdp-18.4b", 40, 6144, 48),
        _m("ptdp-39.1b", 48, 8192, 64),
        _m("ptdp-76.1b", 60, 10240, 80),
        _m("ptdp-145.6b", 80, 12288, 96),
        _m("ptdp-310.1b", 96, 16384, 128),
        _m("ptdp-529.6b", 105, 20480, 128),
        _m("ptdp-1t", 128, 25600, 160),
        # Korthikanti et al. 2022, Table 3
        _m("mt-22b", 48, 6144, 64),
        _m("mt-175b", 96, 12288, 96),
        _m("mt-530b", 105, 20480, 128),
        _m("mt-1t", 128, 25600, 160),
        # open models, from their published config.json
        _llama("llama-3-8b", 32, 4096, 32, 8, 14336, source="meta-llama/Meta-Llama-3-8B config.json"),
        _llama("llama-3-70b", 80, 8192, 64, 8, 28672, source="meta-llama/Meta-Llama-3-70B config.json"),
        _llama("llama-3-405b", 126, 16384, 128, 8, 53248, source="meta-llama/Llama-3.1-405B config.json"),
        _llama(
            "llama-2-7b", 32, 4096, 32, 32, 11008, vocab=32000, seq=4096, source="meta-llama/Llama-2-7b-hf config.json"
        ),
        _llama(
            "llama-2-70b", 80, 8192, 64, 8, 28672, vocab=32000, seq=4096, source="meta-llama/Llama-2-70b-hf config.json"
        ),
        _llama(
            "mixtral-8x7b",
            32,
            4096,
            32,
            8,
            14336,
            vocab=32000,
            seq=4096,
            experts=8,
            top_k=2,
            source="mistralai/Mixtral-8x7B-v0.1 config.json",
        ),
        ModelShape(
            "bloom-176b",
            70,
            14336,
            112,
            2048,
            250880,
            position="alibi",
            dropout=False,
            embedding_norm=True,
            source="bigscience/bloom config.json",
        ),
        # OPT: ReLU MLP of ffn_dim, learned positions offset by 2 rows (OPTLearnedPositionalEmbedding), dropout 0.1
        ModelShape(
            "opt-13b",
            40,
            5120,
            40,
            2048,
            50272,
            20480,
            ffn_type="relu",
            extra_positions=2,
            dropout=True,
            source="facebook/opt-13b config.json",
        ),
        # today's architectures (their config.json is in examples/configs): multi-head latent attention and shared
        # experts (DeepSeek), a gated shared expert (Qwen2-MoE), per-head Q/K norms and 128-wide heads (Qwen3-MoE)
        ModelShape(
            "deepseek-v2-lite",
            27,
            2048,
            16,
            163840,
            102400,
            10944,
            ffn_type="swiglu",
            position="rope",
            tied=False,
            bias=False,
            attention="flash",
            experts=64,
            top_k=6,
            expert_ffn=1408,
            shared_experts=2,
            dense_layers=1,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            source="deepseek-ai/DeepSeek-V2-Lite config.json",
        ),
        ModelShape(
            "deepseek-v3",
            61,
            7168,
            128,
            163840,
            129280,
            18432,
            ffn_type="swiglu",
            position="rope",
            tied=False,
            bias=False,
            attention="flash",
            experts=256,
            top_k=8,
            expert_ffn=2048,
            shared_experts=1,
            dense_layers=3,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            source="deepseek-ai/DeepSeek-V3 config.json (without its multi-token prediction "
            "layer, as transformers builds it)",
        ),
        ModelShape(
            "qwen1.5-moe-a2.7b",
            24,
            2048,
            16,
            8192,
            151936,
            5632,
            ffn_type="swiglu",
            position="rope",
            tied=False,
            bias=False,
            attention="flash",
            experts=60,
            top_k=4,
            expert_ffn=1408,
            shared_experts=1,
            shared_ffn=5632,
            shared_gate=True,
            attention_bias="qkv",
            source="Qwen/Qwen1.5-MoE-A2.7B config.json",
        ),
        ModelShape(
            "qwen3-30b-a3b",
            48,
            2048,
            32,
            40960,
            151936,
            6144,
            kv_heads=4,
            ffn_type="swiglu",
            position="rope",
            tied=False,
            bias=False,
            attention="flash",
            experts=128,
            top_k=8,
            expert_ffn=768,
            head_width=128,
            qk_norm=True,
            source="Qwen/Qwen3-30B-A3B config.json",
        ),
        _mpt("mpt-1b", 24, 2048, 16),
        _mpt("mpt-7b", 32, 4096, 32),
        _mpt("mpt-13b", 40, 5120, 40),
        _mpt("mpt-30b", 48, 7168, 56),
        _mpt("mpt-70b", 80, 8192, 64),
    ]
}


def preset(name: str) -> ModelShape:
    """The preset called ``name`` (any case), or the one line that lists them."""
    key = name.lower()
    if key not in PRESETS:
        raise UsageError(f"{{model}}: unknown preset {name!r}; choose one of {', '.join(PRESETS)}", "model")
    return PRESETS[key]


def check_shape(spec: ModelShape) -> ModelShape:
    """Every field in range and consistent; errors name the flag that changes it."""
    for k in ("layers", "hidden", "heads", "seq", "vocab"):
        if not 1 <= getattr(spec, k) <= 1 << 24:
            raise UsageError(f"{{{k}}} must be in 1..{1 << 24:,}, got {getattr(spec, k)}", k)
    if not 0 <= spec.ffn <= 1 << 26:
        raise UsageError(f"{{ffn}} must be in 1..{1 << 26:,} (omit it for 4 x hidden), got {spec.ffn}", "ffn")
    if spec.hidden % spec.heads:
        raise UsageError(f"{{hidden}} {spec.hidden} is not divisible by {{heads}} {spec.heads}", "hidden")
    if not 0 <= spec.kv_heads <= spec.heads or spec.kv_heads and spec.heads % spec.kv_heads:
        raise UsageError(f"{{kv_heads}} must divide the {spec.heads} heads, got {spec.kv_heads}", "kv_heads")
    for k, allowed in (
        ("ffn_type", FFN_TYPES),
        ("position", POSITIONS),
        ("attention", ATTENTION),
        ("attention_bias", ATTENTION_BIAS),
    ):
        if getattr(spec, k) not in allowed:
            raise UsageError(f"{{{k}}} must be one of {', '.join(allowed)}, got {getattr(spec, k)!r}", k)
    if not 0 <= spec.experts <= 1 << 14 or spec.experts == 1:
        raise UsageError(f"{{experts}} must be 0 (dense) or 2..{1 << 14}, got {spec.experts}", "experts")
    if not 1 <= spec.top_k <= max(spec.experts, 1):
        raise UsageError(f"{{top_k}} must be in 1..experts ({spec.experts}), got {spec.top_k}", "top_k")
    if not 1.0 <= spec.capacity_factor <= 64:
        raise UsageError(f"{{capacity_factor}} must be in 1..64, got {spec.capacity_factor}", "capacity_factor")
    for k, hi in (("expert_ffn", 1 << 26), ("shared_experts", 1 << 10), ("extra_positions", 1 << 10)):
        if not 0 <= getattr(spec, k) <= hi:
            raise UsageError(f"{{{k}}} must be in 0..{hi:,}, got {getattr(spec, k)}", k)
    if not 0 <= spec.dense_layers < spec.layers or spec.dense_layers and not spec.experts:
        raise UsageError(
            f"{{dense_layers}} must be in 0..{spec.layers - 1} and needs {{experts}}, got {spec.dense_layers}",
            "dense_layers",
        )
    if spec.dense_at and (
        not spec.experts or not all(0 <= i < spec.layers for i in spec.dense_at) or spec.moe_layers == 0
    ):
        raise UsageError(
            f"{{dense_at}} must name layers in 0..{spec.layers - 1} of a mixture of experts and "
            f"leave one MoE layer, got {list(spec.dense_at)}",
            "dense_at",
        )
    for k, hi in (
        ("shared_ffn", 1 << 26),
        ("head_width", 1 << 14),
        ("q_lora_rank", 1 << 16),
        ("kv_lora_rank", 1 << 16),
        ("qk_nope_head_dim", 1 << 12),
        ("qk_rope_head_dim", 1 << 12),
        ("v_head_dim", 1 << 12),
    ):
        if not 0 <= getattr(spec, k) <= hi:
            raise UsageError(f"{{{k}}} must be in 0..{hi:,}, got {getattr(spec, k)}", k)
    if not 1 <= spec.layer_norms <= 4:
        raise UsageError(f"{{layer_norms}} must be in 1..4, got {spec.layer_norms}", "layer_norms")
    mla = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    if spec.mla and (not all(getattr(spec, k) for k in mla) or spec.head_width or spec.kv_heads not in (0, spec.heads)):
        raise UsageError(
            "{kv_lora_rank} (multi-head latent attention) needs qk_nope_head_dim, qk_rope_head_dim and "
            "v_head_dim, one K and V head per Q head and no head_dim",
            "kv_lora_rank",
        )
    if not spec.mla and (spec.q_lora_rank or any(getattr(spec, k) for k in mla)):
        raise UsageError(
            "{q_lora_rank}, qk_nope_head_dim, qk_rope_head_dim and v_head_dim are multi-head latent "
            "attention's: they need {kv_lora_rank}",
            "kv_lora_rank",
        )
    return spec


def from_args(
    model=None,
    layers=None,
    hidden=None,
    heads=None,
    seq=None,
    vocab=None,
    ffn=None,
    params=None,
    base: ModelShape | None = None,
    **arch,
) -> ModelShape:
    """A preset, a ``base`` (read from a config file) or a model from flags, with any field overridden by a flag
    (``arch``: kv_heads, ffn_type, position, tied, bias, attention, experts, top_k); errors name the flag."""
    if params is not None:
        if not 0 < params <= 1e15:
            raise UsageError(f"{{params}} must be in (0, 1e15] (a quadrillion parameters), got {params:g}", "params")
        return ModelShape(f"{params:.3g} params", 0, 0, 0, params_only=float(params))
    over = {
        k: v
        for k, v in dict(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, ffn=ffn, **arch).items()
        if v is not None
    }
    if model is not None:
        spec = replace(preset(model), **over)
    elif base is not None:
        spec = replace(base, **over)
    else:
        missing = ["{" + k + "}" for k, v in (("layers", layers), ("hidden", hidden), ("heads", heads)) if v is None]
        if missing:
            raise UsageError(
                "describe the model with {model} NAME, {model_config} FILE, {megatron_args} ARGS, "
                "{params} N, or " + " ".join(missing),
                missing[0][1:-1],
            )
        spec = replace(
            ModelShape("custom", layers, hidden, heads, 2048, 51200, attention="flash", dropout=True), **over
        )
    if ffn is not None and not 1 <= ffn <= 1 << 26:
        raise UsageError(f"{{ffn}} must be in 1..{1 << 26:,} (omit it for 4 x hidden), got {ffn}", "ffn")
    return check_shape(spec)
