"""The model and the split, read from the files a user already has.

- :func:`from_hf_config`: a Hugging Face ``config.json`` (``num_hidden_layers``,
  ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``,
  ``vocab_size``, ``tie_word_embeddings``, ``hidden_act``, ``num_local_experts`` /
  ``num_experts_per_tok``, the dropout probabilities (``attention_dropout``, ``resid_pdrop``, ...: all
  0 or absent, no masks stored), and the GPT-2 / MPT spellings ``n_layer``, ``n_embd``, ``d_model``, ...).
- :func:`from_megatron_args`: a Megatron-LM ``pretrain_gpt.py`` command line: the model
  (``--num-layers``, ``--hidden-size``, ``--num-query-groups``, ``--swiglu``, ...) and the split
  (``--tensor-model-parallel-size``, ``--context-parallel-size``, ``--micro-batch-size``,
  ``--recompute-granularity``, ``--use-distributed-optimizer``, ``--fp8-format``, ...).
- :func:`from_deepspeed_config`: a DeepSpeed ``ds_config.json``
  (``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``, ``train_batch_size``,
  ``zero_optimization.stage``, ``bf16`` / ``fp16``).

Every reader returns what it understood and the keys it did not: the CLI prints those on
one line, so a setting the planner does not model is seen, never silently dropped.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from netmorph.errors import UsageError
from netmorph.files import printable, read_json_object

GATED = ("silu", "swish", "swiglu", "silu_and_mul")
DROPOUTS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "emb_pdrop", "attn_pdrop",
            "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "activation_dropout")
ROPE_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "gemma", "gemma2", "phi3", "olmo",
                 "olmo2", "deepseek_v2", "deepseek_v3", "gpt_neox", "gptj", "falcon", "stablelm", "internlm2")


def _first(cfg: dict, used: set, *keys, default=None):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            used.add(k)
            return cfg[k]
    return default


def _int(value, key: str, where: str, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise UsageError(f"{{{argument}}} {where}: {key} must be a whole number, got {value!r}", argument)
    return int(value)


def from_hf_config(path) -> tuple[dict, list]:
    """(ModelSpec fields, keys not used) from a Hugging Face ``config.json``."""
    path = Path(path)
    cfg = read_json_object(path, "model_config")
    if isinstance(cfg.get("text_config"), dict):           # multimodal wrappers keep the LM in text_config
        cfg = {**cfg["text_config"], **{k: v for k, v in cfg.items() if k != "text_config"}}
    used: set = set()
    where = printable(path.name)

    def need(*keys):
        v = _first(cfg, used, *keys)
        if v is None:
            raise UsageError(f"{{model_config}} {where}: none of {', '.join(keys)} is set; is it a transformer "
                             f"config.json?", "model_config")
        return _int(v, keys[0], where, "model_config")

    layers = need("num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = need("hidden_size", "n_embd", "d_model")
    heads = need("num_attention_heads", "n_head", "n_heads")
    vocab = need("vocab_size", "padded_vocab_size")
    model_type = str(_first(cfg, used, "model_type", default="") or "")
    act = str(_first(cfg, used, "hidden_act", "activation_function", "hidden_activation", default="gelu")).lower()
    swiglu = act in GATED or model_type in ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3")
    ffn = _first(cfg, used, "intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim")
    if ffn is None and "expansion_ratio" in cfg:                # MPT
        ffn = cfg["expansion_ratio"] * hidden
        used.add("expansion_ratio")
    kv = _first(cfg, used, "num_key_value_heads", "n_head_kv", "num_kv_heads")
    if kv is None and cfg.get("multi_query"):
        kv = 1
        used.add("multi_query")
    attn_cfg = cfg.get("attn_config") if isinstance(cfg.get("attn_config"), dict) else {}
    if attn_cfg:
        used.add("attn_config")
    if "alibi" in cfg:
        used.add("alibi")
    if cfg.get("alibi") or attn_cfg.get("alibi") or model_type == "bloom":
        position = "alibi"
    elif (model_type in ROPE_FAMILIES or "rope_theta" in cfg or "rope_scaling" in cfg
          or cfg.get("position_embedding_type") == "rotary" or "rotary_dim" in cfg):
        position = "rope"
    else:
        position = "learned"
    for k in ("rope_theta", "rope_scaling", "position_embedding_type", "rotary_dim", "rotary_pct"):
        if k in cfg:
            used.add(k)
    seq = _first(cfg, used, "max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                 "max_sequence_length", default=2048)
    bias = _first(cfg, used, "attention_bias", "use_bias", "bias")
    if bias is None:
        bias = not (swiglu or model_type in ROPE_FAMILIES)
    if "no_bias" in cfg:
        bias = not cfg["no_bias"]
        used.add("no_bias")
    tied = _first(cfg, used, "tie_word_embeddings", "tie_embeddings", default=True)
    # dropout: any probability above 0 stores masks; a config without one (Llama's first ones) has none
    drops = [cfg[k] for k in DROPOUTS if k in cfg] + [attn_cfg[k] for k in DROPOUTS if k in attn_cfg]
    used.update(k for k in DROPOUTS if k in cfg)
    if any(isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1 for p in drops):
        raise UsageError(f"{{model_config}} {where}: a dropout probability must be a number in [0, 1), got "
                         f"{', '.join(map(repr, drops))}", "model_config")
    experts = _first(cfg, used, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0
    top_k = _first(cfg, used, "num_experts_per_tok", "moe_top_k", "top_k", default=1 if not experts else 2)
    fields = dict(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=_int(seq, "max_position_embeddings",
                                                                                 where, "model_config"),
                  ffn=0 if ffn is None else _int(ffn, "intermediate_size", where, "model_config"),
                  kv_heads=0 if kv is None or kv == heads else _int(kv, "num_key_value_heads", where, "model_config"),
                  ffn_type="swiglu" if swiglu else "gelu", position=position, tied=bool(tied), bias=bool(bias),
                  attention="flash", dropout=any(p > 0 for p in drops),
                  experts=_int(experts, "num_local_experts", where, "model_config"),
                  top_k=_int(top_k, "num_experts_per_tok", where, "model_config"))
    stem = path.stem if path.stem != "config" else path.parent.name     # .../Meta-Llama-3-8B/config.json
    name = str(cfg.get("_name_or_path") or stem or model_type)
    used.update({"_name_or_path", "architectures"} & set(cfg))
    return {"name": printable(name), **fields}, sorted(printable(k) for k in set(cfg) - used)


# --- Megatron-LM ------------------------------------------------------------------------------------------
# flag -> (target, field, type): model fields go to the ModelSpec, config fields to the split
_MEGATRON = {
    "--num-layers": ("model", "layers", int), "--hidden-size": ("model", "hidden", int),
    "--num-attention-heads": ("model", "heads", int), "--num-query-groups": ("model", "kv_heads", int),
    "--ffn-hidden-size": ("model", "ffn", int), "--seq-length": ("model", "seq", int),
    "--padded-vocab-size": ("model", "vocab", int), "--vocab-size": ("model", "vocab", int),
    "--num-experts": ("model", "experts", int), "--moe-router-topk": ("model", "top_k", int),
    "--moe-expert-capacity-factor": ("model", "capacity_factor", float),
    "--tensor-model-parallel-size": ("split", "tp", int), "--pipeline-model-parallel-size": ("split", "pp", int),
    "--context-parallel-size": ("split", "cp", int), "--expert-model-parallel-size": ("split", "ep", int),
    "--micro-batch-size": ("split", "microbatch", int), "--global-batch-size": ("split", "global_batch", int),
    "--decoder-first-pipeline-num-layers": ("split", "first_stage_layers", int),
    "--decoder-last-pipeline-num-layers": ("split", "last_stage_layers", int),
    "--num-layers-per-virtual-pipeline-stage": ("split", "layers_per_virtual_stage", int),
    "--recompute-granularity": ("split", "recompute", str),
    "--hidden-dropout": ("model", "hidden_dropout", float), "--attention-dropout": ("model", "attention_dropout", float),
}
_MEGATRON_FLAGS = {   # flags without a value
    "--swiglu": ("model", "ffn_type", "swiglu"), "--untie-embeddings-and-output-weights": ("model", "tied", False),
    "--disable-bias-linear": ("model", "bias", False), "--use-flash-attn": ("model", "attention", "flash"),
    "--use-rotary-position-embeddings": ("model", "position", "rope"),
    "--group-query-attention": ("model", None, None), "--sequence-parallel": ("split", "sequence_parallel", True),
    "--use-distributed-optimizer": ("split", "zero", 1), "--overlap-grad-reduce": ("split", "dp_overlap", True),
    "--tp-comm-overlap": ("split", "tp_overlap", True), "--overlap-p2p-communication": ("split", "pp_overlap", True),
    "--recompute-activations": ("split", "recompute", "selective"), "--bf16": ("split", None, None),
    "--fp16": ("split", None, None),
}
_MEGATRON_VALUED_OTHER = {"--position-embedding-type", "--fp8-format", "--transformer-impl", "--attention-backend"}


def from_megatron_args(text: str) -> tuple[dict, dict, list]:
    """(ModelSpec fields, split fields, flags not modelled) from a Megatron-LM command line."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise UsageError(f"{{megatron_args}}: cannot split it into words ({e})", "megatron_args") from None
    model, split, unknown = {"attention": "flash"}, {}, []      # Megatron-Core's default: Transformer Engine
    i = 0
    while i < len(words) and not words[i].startswith("--"):     # the launcher and script: torchrun pretrain_gpt.py
        i += 1
    while i < len(words):
        w = words[i]
        if not w.startswith("--"):
            unknown.append(printable(w))
            i += 1
            continue
        key, eq, inline = w.partition("=")
        takes_value = key in _MEGATRON or key in _MEGATRON_VALUED_OTHER
        value = inline if eq else None
        if takes_value and value is None:
            if i + 1 >= len(words) or words[i + 1].startswith("--"):
                raise UsageError(f"{{megatron_args}}: {printable(key)} needs a value", "megatron_args")
            value = words[i + 1]
            i += 1
        i += 1
        if key in _MEGATRON:
            target, field, kind = _MEGATRON[key]
            try:
                v = kind(value)
            except ValueError:
                raise UsageError(f"{{megatron_args}}: {key} must be {'a number' if kind is float else 'a whole number'}"
                                 f", got {value!r}", "megatron_args") from None
            (model if target == "model" else split)[field] = v
        elif key in _MEGATRON_FLAGS:
            target, field, v = _MEGATRON_FLAGS[key]
            if field:
                (model if target == "model" else split)[field] = v
        elif key == "--position-embedding-type":
            model["position"] = {"rope": "rope", "learned_absolute": "learned", "none": "alibi"}.get(value, value)
        elif key == "--fp8-format":
            split["precision"] = "fp8"
        elif key in ("--transformer-impl", "--attention-backend"):
            model["attention"] = "standard" if value in ("local", "unfused") else "flash"
        else:
            # a flag the planner does not model; skip its value if it has one
            if not eq and i < len(words) and not words[i].startswith("--"):
                i += 1
            unknown.append(printable(key))
    rc = split.get("recompute")
    if rc is not None and rc not in ("full", "selective"):
        raise UsageError(f"{{megatron_args}}: --recompute-granularity must be full or selective, got {rc!r}",
                         "megatron_args")
    lpv = split.pop("layers_per_virtual_stage", None)
    if lpv:
        layers, pp = model.get("layers"), split.get("pp", 1)
        if not layers or layers % (pp * lpv):
            raise UsageError(f"{{megatron_args}}: --num-layers-per-virtual-pipeline-stage {lpv} does not divide "
                             f"--num-layers {layers} over {pp} stages", "megatron_args")
        split["interleave"] = layers // (pp * lpv)
    # Megatron's dropouts default to 0.1; with both at 0 no masks are stored
    probs = [model.pop(k, 0.1) for k in ("hidden_dropout", "attention_dropout")]
    if any(not 0 <= p < 1 for p in probs):
        raise UsageError(f"{{megatron_args}}: --hidden-dropout/--attention-dropout must be in [0, 1), got "
                         f"{', '.join(map(str, probs))}", "megatron_args")
    model["dropout"] = any(probs)
    if model.get("ffn_type") == "swiglu" and "ffn" not in model and model.get("hidden"):
        model["ffn"] = int(4 * model["hidden"] * 2 / 3 / 64) * 64          # Megatron's SwiGLU default width
    return model, split, unknown


def from_deepspeed_config(path) -> tuple[dict, list]:
    """(split fields, keys not modelled) from a DeepSpeed config: the batch sizes, the ZeRO stage, the precision."""
    path = Path(path)
    cfg = read_json_object(path, "deepspeed_config")
    split, unknown = {}, []
    where = printable(path.name)
    for key, value in cfg.items():
        if key == "train_micro_batch_size_per_gpu":
            split["microbatch"] = _int(value, key, where, "deepspeed_config")
        elif key == "gradient_accumulation_steps":
            split["grad_accum"] = _int(value, key, where, "deepspeed_config")
        elif key == "train_batch_size":
            split["global_batch"] = _int(value, key, where, "deepspeed_config")
        elif key == "zero_optimization" and isinstance(value, dict):
            stage = value.get("stage", 0)
            if stage not in (0, 1, 2, 3):
                raise UsageError(f"{{deepspeed_config}} {where}: zero_optimization.stage must be 0-3, got {stage!r}",
                                 "deepspeed_config")
            split["zero"] = stage
            unknown += [f"zero_optimization.{printable(k)}" for k in value if k not in ("stage", "overlap_comm")]
            if value.get("overlap_comm"):
                split["dp_overlap"] = True
        elif key in ("bf16", "fp16") and isinstance(value, dict):
            if value.get("enabled"):
                split["precision"] = "bf16"
        else:
            unknown.append(printable(key))
    return split, unknown
