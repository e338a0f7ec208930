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

import math
import shlex
from pathlib import Path

from netmorph.errors import UsageError
from netmorph.files import printable, read_json_object

GATED = ("silu", "swish", "swiglu", "silu_and_mul")
DROPOUTS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "emb_pdrop", "attn_pdrop",
            "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "activation_dropout")
ROPE_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "gemma", "gemma2", "phi3", "olmo",
                 "olmo2", "deepseek_v2", "deepseek_v3", "gpt_neox", "gptj", "falcon", "stablelm", "internlm2")


def _whole(value, lo: int, hi: int) -> bool:
    """A whole number in lo..hi (JSON's 4.0 counts; true does not)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == int(value) and lo <= value <= hi


def _int(value, key: str, where: str, argument: str, lo: int = 1, hi: int = 1 << 30) -> int:
    if not _whole(value, lo, hi):
        raise UsageError(f"{{{argument}}} {where}: {key} must be a whole number in {lo}..{hi:,}, got {value!r}",
                         argument)
    return int(value)


class _Reader:
    """A config file's fields read with their types checked: a wrong type or range is one line naming the
    file and the field, never a value silently turned into another (``bool("x")``) or a traceback."""

    def __init__(self, cfg: dict, where: str, argument: str):
        self.cfg, self.where, self.argument = cfg, where, argument
        self.used: set = set()
        self.source: dict = {}                 # ModelShape field -> the key it came from

    def bad(self, key, what, value):
        return UsageError(f"{{{self.argument}}} {self.where}: {printable(key)} must be {what}, got {value!r}",
                          self.argument)

    def key(self, *keys):
        return next((k for k in keys if k in self.cfg and self.cfg[k] is not None), None)

    def _take(self, keys, default, use: bool, ok, what: str):
        """(the first of ``keys`` set, its value) -- refused unless ``ok(value)`` (``what`` it must be),
        marked used with ``use`` -- or (None, ``default``) when none is set."""
        k = self.key(*keys)
        if k is None:
            return None, default
        if use:
            self.used.add(k)
        if not ok(self.cfg[k]):
            raise self.bad(k, what, self.cfg[k])
        return k, self.cfg[k]

    def int(self, field, *keys, lo=1, hi=1 << 30, default=None):
        k, v = self._take(keys, default, True, lambda v: _whole(v, lo, hi), f"a whole number in {lo}..{hi:,}")
        if k is None:
            return v
        if field:
            self.source[field] = k
        return int(v)

    def number(self, *keys, lo=0.0, hi=float("inf"), default=None, open_lo=False, open_hi=False, use=True):
        def ok(v):
            return (not isinstance(v, bool) and isinstance(v, (int, float)) and (lo < v if open_lo else lo <= v)
                    and (v < hi if open_hi else v <= hi))
        span = f"{'(' if open_lo else '['}{lo:g}, {hi:g}{')' if open_hi else ']'}"
        return self._take(keys, default, use, ok, f"a number in {span}")[1]

    def bool(self, *keys, default=None, use=True):
        return self._take(keys, default, use, lambda v: isinstance(v, bool), "true or false")[1]

    def str(self, *keys, default=None, use=True):
        return self._take(keys, default, use, lambda v: isinstance(v, str), "a string")[1]


# transformers' activation names (ACT2FN): anything else in hidden_act is not a Hugging Face config's
ACTIVATIONS = ("gelu", "gelu_10", "gelu_fast", "gelu_new", "gelu_python", "gelu_pytorch_tanh", "gelu_accurate",
               "laplace", "leaky_relu", "linear", "mish", "quick_gelu", "relu", "relu2", "relu6", "sigmoid", "silu",
               "swish", "tanh", "prelu", "xielu", "gegelu", "swiglu", "silu_and_mul")


TORCH_DTYPES = ("float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2", "int8", "auto")


def _check_common(r: "_Reader") -> None:
    """Keys every config.json has that the planner does not model: still of the right type and range (and
    still listed as not modelled)."""
    arch = r.cfg.get("architectures")
    if arch is not None and not (isinstance(arch, list) and all(isinstance(a, str) for a in arch)):
        raise r.bad("architectures", "a list of class names", arch)
    for k in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "initializer_range"):
        r.number(k, lo=0, hi=1, open_lo=True, use=False)
    r.str("transformers_version", use=False)
    dtype = r.str("torch_dtype", use=False)
    if dtype is not None and dtype not in TORCH_DTYPES:
        raise r.bad("torch_dtype", f"a torch dtype's name ({', '.join(TORCH_DTYPES)})", dtype)
    r.bool("use_cache", use=False)
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = r.cfg.get(k)
        ids = v if isinstance(v, list) else [v]
        if v is not None and not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise r.bad(k, "a token id >= 0 (or a list of them)", v)


# fields of today's configs that change the parameter count in ways the planner does not model: an estimate
# would be wrong by 2.5-6.5x (DeepSeek-V2-Lite, Qwen1.5-MoE), so the config is refused, naming them.
# field -> (what it is, the value that changes nothing)
PARAM_FIELDS = {
    "q_lora_rank": ("MLA's low-rank query projection (DeepSeek-V2/V3)", None),
    "kv_lora_rank": ("MLA's compressed key-value projection (DeepSeek-V2/V3)", None),
    "qk_nope_head_dim": ("MLA's query-key head width", None),
    "qk_rope_head_dim": ("MLA's rotary head width", None),
    "v_head_dim": ("MLA's value head width", None),
    "n_shared_experts": ("shared experts beside the routed ones", 0),
    "shared_expert_intermediate_size": ("a shared expert's width (Qwen2-MoE)", 0),
    "first_k_dense_replace": ("dense layers before the MoE layers", 0),
    "moe_layer_freq": ("MoE only every k-th layer", 1),
    "decoder_sparse_step": ("MoE only every k-th layer", 1),
    "mlp_only_layers": ("dense layers among the MoE layers", []),
}


def _unmodelled_params(cfg: dict, hidden: int, heads: int, ffn, experts: int) -> list:
    found = [f"{k} ({what})" for k, (what, neutral) in PARAM_FIELDS.items()
             if k in cfg and cfg[k] is not None and cfg[k] != neutral]
    head_dim = cfg.get("head_dim")
    if head_dim is not None and heads and head_dim != hidden // heads:
        found.append(f"head_dim {head_dim} (heads {head_dim} wide, not hidden/heads = {hidden // heads})")
    moe_ffn = cfg.get("moe_intermediate_size")
    if moe_ffn is not None and experts and moe_ffn != ffn:
        found.append(f"moe_intermediate_size {moe_ffn} (experts narrower than intermediate_size {ffn})")
    return found


def from_hf_config(path) -> tuple[dict, list]:
    """(ModelShape fields, keys not used) from a Hugging Face ``config.json``."""
    from netmorph.mesh.shape import ModelShape, check_shape
    path = Path(path)
    cfg = read_json_object(path, "model_config")
    if isinstance(cfg.get("text_config"), dict):           # multimodal wrappers keep the LM in text_config
        cfg = {**cfg["text_config"], **{k: v for k, v in cfg.items() if k != "text_config"}}
    where = printable(path.name)
    r = _Reader(cfg, where, "model_config")
    used = r.used

    def need(field, *keys, lo=1):
        v = r.int(field, *keys, lo=lo)
        if v is None:
            raise UsageError(f"{{model_config}} {where}: none of {', '.join(keys)} is set; is it a transformer "
                             f"config.json?", "model_config")
        return v

    layers = need("layers", "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = need("hidden", "hidden_size", "n_embd", "d_model")
    heads = need("heads", "num_attention_heads", "n_head", "n_heads")
    vocab = need("vocab", "vocab_size", "padded_vocab_size")
    model_type = r.str("model_type", default="")
    _check_common(r)
    act = r.str("hidden_act", "activation_function", "hidden_activation", default="gelu").lower()
    if act not in ACTIVATIONS:
        raise r.bad(r.key("hidden_act", "activation_function", "hidden_activation"),
                    f"an activation transformers knows ({', '.join(ACTIVATIONS[:6])}, ...)", act)
    swiglu = act in GATED or model_type in ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3")
    ffn = r.int("ffn", "intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim")
    if ffn is None and "expansion_ratio" in cfg:                # MPT
        ffn = int(r.number("expansion_ratio", lo=0, open_lo=True, hi=1 << 10) * hidden)
        r.source["ffn"] = "expansion_ratio"
    kv = r.int("kv_heads", "num_key_value_heads", "n_head_kv", "num_kv_heads")
    if kv is None and r.bool("multi_query", default=False):
        kv = 1
    attn_cfg = cfg.get("attn_config") if isinstance(cfg.get("attn_config"), dict) else {}
    if attn_cfg:
        used.add("attn_config")
    alibi = r.bool("alibi", default=False)
    if alibi or attn_cfg.get("alibi") is True or model_type == "bloom":
        position = "alibi"
    elif (model_type in ROPE_FAMILIES or "rope_theta" in cfg or "rope_scaling" in cfg
          or cfg.get("position_embedding_type") == "rotary" or "rotary_dim" in cfg):
        position = "rope"
    else:
        position = "learned"
    r.number("rope_theta", lo=0, open_lo=True)
    r.str("position_embedding_type")
    r.int(None, "rotary_dim")
    r.number("rotary_pct", lo=0, hi=1, open_lo=True)
    if cfg.get("rope_scaling") is not None and not isinstance(cfg["rope_scaling"], dict):
        raise r.bad("rope_scaling", "an object of fields (or null)", cfg["rope_scaling"])
    used.update(k for k in ("rope_theta", "rope_scaling", "position_embedding_type", "rotary_dim", "rotary_pct")
                if k in cfg)
    seq = r.int("seq", "max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "max_sequence_length", default=2048)
    bias = r.bool("attention_bias", "use_bias", "bias")
    if bias is None:
        bias = not (swiglu or model_type in ROPE_FAMILIES)
    if "no_bias" in cfg:
        bias = not r.bool("no_bias")
    tied = r.bool("tie_word_embeddings", "tie_embeddings", default=True)
    # dropout: any probability above 0 stores masks; a config without one (Llama's first ones) has none
    drops = []
    for src in (cfg, attn_cfg):
        for k in DROPOUTS:
            if k in src and src[k] is not None:
                p = src[k]
                if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
                    raise r.bad(k, "a dropout probability in [0, 1)", p)
                drops.append(p)
                if src is cfg:
                    used.add(k)
    experts = r.int("experts", "num_local_experts", "num_experts", "n_routed_experts", lo=0, default=0)
    top_k = r.int("top_k", "num_experts_per_tok", "moe_top_k", "top_k", default=1 if not experts else 2)
    unmodelled = _unmodelled_params(cfg, hidden, heads, ffn, experts)
    if unmodelled:
        raise UsageError(f"{{model_config}} {where}: fields that change the parameter count are not modelled: "
                         f"{'; '.join(unmodelled)} -- an estimate would be wrong, so none is made (describe a "
                         f"modelled shape with flags instead)", "model_config")
    used.update(k for k in ("head_dim", "moe_intermediate_size") if k in cfg)
    if kv is not None and kv == heads:
        kv = None
    fields = dict(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=seq, ffn=ffn or 0, kv_heads=kv or 0,
                  ffn_type="swiglu" if swiglu else "gelu", position=position, tied=tied, bias=bias,
                  attention="flash", dropout=any(p > 0 for p in drops), experts=experts, top_k=top_k,
                  embedding_norm=model_type == "bloom")
    try:
        check_shape(ModelShape("config", **fields))
    except UsageError as e:                    # the file's own numbers disagree: name its keys, not flags
        raise UsageError(f"{{model_config}} {where}: {e.render(r.source)}", "model_config") from None
    stem = path.stem if path.stem != "config" else path.parent.name     # .../Meta-Llama-3-8B/config.json
    name = r.str("_name_or_path") or stem or model_type
    used.update({"architectures"} & set(cfg))
    return {"name": printable(name), **fields}, sorted(printable(k) for k in set(cfg) - used)


# --- Megatron-LM ------------------------------------------------------------------------------------------
# flag -> (target, field, type): model fields go to the ModelShape, config fields to the split
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
    "--recompute-activations": ("split", "recompute", "selective"),
    "--bf16": ("split", "precision", "bf16"), "--fp16": ("split", "precision", "bf16"),   # 16-bit: fixes the search
}
# the smallest value each numeric Megatron flag takes (dropouts and the capacity factor are checked apart)
_MEGATRON_MIN = {"--num-experts": 2, "--decoder-first-pipeline-num-layers": 1, "--decoder-last-pipeline-num-layers": 1}


def _megatron_value(key: str, value: str, kind):
    """A Megatron flag's value, typed and in range: one line naming the flag for anything else."""
    def bad(what):
        return UsageError(f"{{megatron_args}}: {key} must be {what}, got {printable(value)!s}", "megatron_args")
    if kind is str:
        return value
    try:
        v = kind(value)
    except ValueError:
        raise bad("a number" if kind is float else "a whole number") from None
    if kind is float:
        if not math.isfinite(v):
            raise bad("a finite number")
        if key == "--moe-expert-capacity-factor" and not 1 <= v <= 64:
            raise bad("in 1..64")
        return v
    lo = _MEGATRON_MIN.get(key, 1)
    if not lo <= v <= 1 << 30:
        raise bad(f"a whole number in {lo}..{1 << 30:,}")
    return v
_MEGATRON_VALUED_OTHER = {"--position-embedding-type", "--fp8-format", "--transformer-impl", "--attention-backend"}


def from_megatron_args(text: str) -> tuple[dict, dict, list]:
    """(ModelShape fields, split fields, flags not modelled) from a Megatron-LM command line."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise UsageError(f"{{megatron_args}}: cannot split it into words ({e})", "megatron_args") from None
    model, split, unknown = {"attention": "flash"}, {}, []      # Megatron-Core's default: Transformer Engine
    source = {}                                                 # field -> the flag that set it
    fp8 = False
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
            v = _megatron_value(key, value, kind)
            (model if target == "model" else split)[field] = v
            source[field] = key
        elif key in _MEGATRON_FLAGS:
            target, field, v = _MEGATRON_FLAGS[key]
            if field:
                (model if target == "model" else split)[field] = v
                source[field] = key
        elif key == "--position-embedding-type":
            model["position"] = {"rope": "rope", "learned_absolute": "learned", "none": "alibi"}.get(value, value)
        elif key == "--fp8-format":
            fp8 = True
        elif key in ("--transformer-impl", "--attention-backend"):
            model["attention"] = "standard" if value in ("local", "unfused") else "flash"
        else:
            # a flag the planner does not model; skip its value if it has one
            if not eq and i < len(words) and not words[i].startswith("--"):
                i += 1
            unknown.append(printable(key))
    if fp8:                                                     # --bf16 --fp8-format hybrid: FP8 matmuls
        split["precision"] = "fp8"
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
    if all(k in model for k in ("layers", "hidden", "heads")):
        from netmorph.mesh.shape import MEGATRON_DEFAULTS, ModelShape, check_shape
        try:
            check_shape(ModelShape("megatron-args", **{**MEGATRON_DEFAULTS, **model}))
        except UsageError as e:                # the command line's own numbers disagree: name its flags
            raise UsageError(f"{{megatron_args}}: {e.render(source)}", "megatron_args") from None
    return model, split, unknown


# keys only a Hugging Face config.json has: such a file given as --deepspeed-config is a mistake
_HF_KEYS = ("model_type", "architectures", "num_hidden_layers", "hidden_size", "vocab_size")
AUTO = "auto"           # what Hugging Face's Trainer writes for a value it fills in from its own arguments


def from_deepspeed_config(path) -> tuple[dict, list]:
    """(split fields, keys not modelled) from a DeepSpeed config: the batch sizes, the ZeRO stage, the precision.

    ``"auto"`` (as Hugging Face's Trainer writes a ds_config for ``--deepspeed``) leaves that value to the
    other flags or to the search, as the Trainer fills it from its own arguments."""
    path = Path(path)
    cfg = read_json_object(path, "deepspeed_config")
    where = printable(path.name)
    hf = [k for k in _HF_KEYS if k in cfg]
    if hf:
        raise UsageError(f"{{deepspeed_config}} {where} is a Hugging Face model config ({', '.join(hf)}), not a "
                         f"DeepSpeed config: pass it as --model-config", "deepspeed_config")
    split, unknown = {}, []

    def count(key, value, lo=1):
        return None if value == AUTO else _int(value, key, where, "deepspeed_config", lo)

    for key, value in cfg.items():
        if key == "train_micro_batch_size_per_gpu":
            split["microbatch"] = count(key, value)
        elif key == "gradient_accumulation_steps":
            split["grad_accum"] = count(key, value)
        elif key == "train_batch_size":
            split["global_batch"] = count(key, value)
        elif key == "zero_optimization":
            if not isinstance(value, dict):
                raise UsageError(f"{{deepspeed_config}} {where}: zero_optimization must be an object of fields, got "
                                 f"{value!r}", "deepspeed_config")
            stage = value.get("stage", 0)
            if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
                raise UsageError(f"{{deepspeed_config}} {where}: zero_optimization.stage must be 0-3, got {stage!r}",
                                 "deepspeed_config")
            split["zero"] = stage
            unknown += [f"zero_optimization.{printable(k)}" for k in value if k not in ("stage", "overlap_comm")]
            overlap = value.get("overlap_comm", False)
            if overlap not in (True, False, AUTO):
                raise UsageError(f"{{deepspeed_config}} {where}: zero_optimization.overlap_comm must be true, false "
                                 f"or \"auto\", got {overlap!r}", "deepspeed_config")
            if overlap is True:
                split["dp_overlap"] = True
        elif key in ("bf16", "fp16"):
            enabled = value.get("enabled", False) if isinstance(value, dict) else None
            if enabled not in (True, False, AUTO):
                raise UsageError(f"{{deepspeed_config}} {where}: {key} must be an object with \"enabled\": true, "
                                 f"false or \"auto\", got {value!r}", "deepspeed_config")
            if enabled is True:
                split["precision"] = "bf16"        # 16-bit matmuls; "auto": the search decides
        else:
            unknown.append(printable(key))
    return {k: v for k, v in split.items() if v is not None}, unknown
