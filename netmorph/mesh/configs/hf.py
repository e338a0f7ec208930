"""A Hugging Face ``config.json`` read into a :class:`~netmorph.mesh.shape.ModelShape`'s fields
(``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``,
``intermediate_size``, ``vocab_size``, ``tie_word_embeddings``, ``hidden_act``, ``num_local_experts`` /
``num_experts_per_tok``, the dropout probabilities, and the GPT-2 / MPT spellings ``n_layer``, ``n_embd``,
``d_model``, ...), with the typed, ranged reader the other loaders share.
"""

from __future__ import annotations

from pathlib import Path

from netmorph.errors import UsageError
from netmorph.files import printable, read_json_object
from netmorph.mesh.presets import check_shape
from netmorph.mesh.shape import ModelShape

GATED = ("silu", "swish", "swiglu", "silu_and_mul")
DROPOUTS = (
    "attention_dropout",
    "hidden_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "emb_pdrop",
    "attn_pdrop",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "dropout",
    "activation_dropout",
)
ROPE_FAMILIES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "gemma",
    "gemma2",
    "phi3",
    "olmo",
    "olmo2",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_neox",
    "gptj",
    "falcon",
    "stablelm",
    "internlm2",
)


def _whole(value, lo: int, hi: int) -> bool:
    """A whole number in lo..hi (JSON's 4.0 counts; true does not)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == int(value) and lo <= value <= hi


def _int(value, key: str, where: str, argument: str, lo: int = 1, hi: int = 1 << 30) -> int:
    if not _whole(value, lo, hi):
        raise UsageError(
            f"{{{argument}}} {where}: {key} must be a whole number in {lo}..{hi:,}, got {value!r}", argument
        )
    return int(value)


class _Reader:
    """A config file's fields read with their types checked: a wrong type or range is one line naming the
    file and the field, never a value silently turned into another (``bool("x")``) or a traceback."""

    def __init__(self, cfg: dict, where: str, argument: str):
        self.cfg, self.where, self.argument = cfg, where, argument
        self.used: set = set()
        self.source: dict = {}  # ModelShape field -> the key it came from

    def bad(self, key, what, value):
        return UsageError(
            f"{{{self.argument}}} {self.where}: {printable(key)} must be {what}, got {value!r}", self.argument
        )

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
            return (
                not isinstance(v, bool)
                and isinstance(v, (int, float))
                and (lo < v if open_lo else lo <= v)
                and (v < hi if open_hi else v <= hi)
            )

        span = f"{'(' if open_lo else '['}{lo:g}, {hi:g}{')' if open_hi else ']'}"
        return self._take(keys, default, use, ok, f"a number in {span}")[1]

    def bool(self, *keys, default=None, use=True):
        return self._take(keys, default, use, lambda v: isinstance(v, bool), "true or false")[1]

    def str(self, *keys, default=None, use=True):
        return self._take(keys, default, use, lambda v: isinstance(v, str), "a string")[1]


# transformers' activation names (ACT2FN): anything else in hidden_act is not a Hugging Face config's
ACTIVATIONS = (
    "gelu",
    "gelu_10",
    "gelu_fast",
    "gelu_new",
    "gelu_python",
    "gelu_pytorch_tanh",
    "gelu_accurate",
    "laplace",
    "leaky_relu",
    "linear",
    "mish",
    "quick_gelu",
    "relu",
    "relu2",
    "relu6",
    "sigmoid",
    "silu",
    "swish",
    "tanh",
    "prelu",
    "xielu",
    "gegelu",
    "swiglu",
    "silu_and_mul",
)


TORCH_DTYPES = ("float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2", "int8", "auto")


def _check_common(r: _Reader) -> None:
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


# model types whose MLP is gated (gate, up and down projections: SwiGLU, or Gemma's GeGLU -- the same three
# matrices, counted and priced alike) whatever their hidden_act says
GATED_FAMILIES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "deepseek_v2",
    "deepseek_v3",
    "olmo",
    "olmo2",
    "phi3",
    "internlm2",
)


def _layer_indices(r: _Reader, key: str, layers: int) -> list:
    v = r.cfg.get(key)
    if v is None:
        return []
    if not (isinstance(v, list) and all(_whole(i, 0, layers - 1) for i in v)):
        raise r.bad(key, f"a list of layer indices in 0..{layers - 1}", v)
    r.used.add(key)
    return [int(i) for i in v]


def _architecture(r: _Reader, model_type: str, layers: int, hidden: int, heads: int, experts: int) -> dict:
    """The fields of today's configs that change a count, as ModelShape's: multi-head latent attention and
    DeepSeek's shared experts and dense layers (transformers' ``DeepseekV2Attention`` / ``DeepseekV3MoE``),
    Qwen2-MoE's shared expert, gate and sparse step, Qwen3's and Gemma 3's Q/K norms,
    Gemma 2's four norms per layer, head_dim where it is not hidden/heads, OPT's two extra position rows."""
    out: dict = {}
    if "q_lora_rank" in r.cfg:  # null: Q projected directly
        r.used.add("q_lora_rank")
    latent = r.int("kv_lora_rank", "kv_lora_rank", lo=0, default=0)
    if latent:
        out.update(
            kv_lora_rank=latent,
            q_lora_rank=r.int(None, "q_lora_rank", lo=0, default=0),
            **{k: r.int(k, k) or 0 for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")},
        )
    head_dim = r.int("head_width", "head_dim")
    if head_dim is not None and head_dim != hidden // heads and "kv_lora_rank" not in out:
        out["head_width"] = head_dim
    moe_ffn = r.int("expert_ffn", "moe_intermediate_size")
    if experts:
        if moe_ffn is not None:
            out["expert_ffn"] = moe_ffn
        shared = r.int("shared_experts", "n_shared_experts", lo=0, default=0)
        shared_ffn = r.int("shared_ffn", "shared_expert_intermediate_size", lo=0, default=0)
        if shared:
            out["shared_experts"] = shared
        elif shared_ffn:  # Qwen2-MoE: one shared expert of its own width, behind a gate
            out.update(shared_experts=1, shared_ffn=shared_ffn, shared_gate=True)
        first = r.int("dense_layers", "first_k_dense_replace", lo=0, default=0)
        freq = r.int(None, "moe_layer_freq", default=1)  # DeepSeek: MoE where i >= k and i % freq == 0
        step = r.int(None, "decoder_sparse_step", default=1)  # Qwen2/3-MoE: MoE where (i + 1) % step == 0
        dense = {i for i in range(layers) if i >= first and (i % freq or (i + 1) % step)}
        dense |= set(_layer_indices(r, "mlp_only_layers", layers))
        out.update(dense_layers=first, dense_at=tuple(sorted(i for i in dense if i >= first)))
    else:
        for k in ("n_shared_experts", "shared_expert_intermediate_size", "first_k_dense_replace"):
            if r.int(None, k, lo=0, default=0):
                raise r.bad(k, "0 in a model without routed experts", r.cfg[k])
    if model_type in ("qwen3", "qwen3_moe", "gemma3_text"):
        out["qk_norm"] = True
    if model_type in ("gemma2", "gemma3_text"):
        out["layer_norms"] = 4
    if model_type == "opt":  # OPTLearnedPositionalEmbedding keeps 2 rows for its offset
        out["extra_positions"] = 2
        proj = r.int(None, "word_embed_proj_dim")
        if proj is not None and proj != hidden or r.bool("do_layer_norm_before", default=True) is False:
            raise UsageError(
                f"{{model_config}} {r.where}: OPT with word_embed_proj_dim {proj} (project_in/out) or "
                f"without do_layer_norm_before is not modelled -- an estimate would be wrong, so none "
                f"is made",
                "model_config",
            )
    return out


def from_hf_config(path) -> tuple[dict, list]:
    """(ModelShape fields, keys not used) from a Hugging Face ``config.json``."""
    path = Path(path)
    cfg = read_json_object(path, "model_config")
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the LM in text_config
        cfg = {**cfg["text_config"], **{k: v for k, v in cfg.items() if k != "text_config"}}
    where = printable(path.name)
    r = _Reader(cfg, where, "model_config")
    used = r.used

    def need(field, *keys, lo=1):
        v = r.int(field, *keys, lo=lo)
        if v is None:
            raise UsageError(
                f"{{model_config}} {where}: none of {', '.join(keys)} is set; is it a transformer config.json?",
                "model_config",
            )
        return v

    layers = need("layers", "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = need("hidden", "hidden_size", "n_embd", "d_model")
    heads = need("heads", "num_attention_heads", "n_head", "n_heads")
    vocab = need("vocab", "vocab_size", "padded_vocab_size")
    model_type = r.str("model_type", default="")
    _check_common(r)
    act = r.str("hidden_act", "activation_function", "hidden_activation", default="gelu").lower()
    if act not in ACTIVATIONS:
        raise r.bad(
            r.key("hidden_act", "activation_function", "hidden_activation"),
            f"an activation transformers knows ({', '.join(ACTIVATIONS[:6])}, ...)",
            act,
        )
    swiglu = act in GATED or model_type in GATED_FAMILIES
    ffn = r.int("ffn", "intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim")
    if ffn is None and "expansion_ratio" in cfg:  # MPT
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
    elif (
        model_type in ROPE_FAMILIES
        or "rope_theta" in cfg
        or "rope_scaling" in cfg
        or cfg.get("position_embedding_type") == "rotary"
        or "rotary_dim" in cfg
    ):
        position = "rope"
    else:
        position = "learned"
    r.number("rope_theta", lo=0, open_lo=True)
    r.str("position_embedding_type")
    r.int(None, "rotary_dim")
    r.number("rotary_pct", lo=0, hi=1, open_lo=True)
    if cfg.get("rope_scaling") is not None and not isinstance(cfg["rope_scaling"], dict):
        raise r.bad("rope_scaling", "an object of fields (or null)", cfg["rope_scaling"])
    used.update(
        k for k in ("rope_theta", "rope_scaling", "position_embedding_type", "rotary_dim", "rotary_pct") if k in cfg
    )
    seq = r.int(
        "seq",
        "max_position_embeddings",
        "n_positions",
        "max_seq_len",
        "seq_length",
        "max_sequence_length",
        default=2048,
    )
    if model_type in GATED_FAMILIES:  # RMSNorm, bias-free MLP: attention_bias biases attention only
        bias = False
        attention_bias = "all" if r.bool("attention_bias", default=False) else ""
        if model_type in ("qwen2", "qwen2_moe") and r.bool("qkv_bias", default=True):
            attention_bias = attention_bias or "qkv"
        if r.bool("mlp_bias", default=False):
            raise r.bad("mlp_bias", "false (biases on a gated MLP are not modelled)", True)
    else:
        attention_bias = ""
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
    arch = _architecture(r, model_type, layers, hidden, heads, experts)
    if kv is not None and kv == heads:
        kv = None
    fields = dict(
        layers=layers,
        hidden=hidden,
        heads=heads,
        vocab=vocab,
        seq=seq,
        ffn=ffn or 0,
        kv_heads=kv or 0,
        ffn_type="swiglu" if swiglu else "relu" if act == "relu" else "gelu",
        position=position,
        tied=tied,
        bias=bias,
        attention="flash",
        dropout=any(p > 0 for p in drops),
        experts=experts,
        top_k=top_k,
        embedding_norm=model_type == "bloom",
        attention_bias=attention_bias,
        **arch,
    )
    try:
        check_shape(ModelShape("config", **fields))
    except UsageError as e:  # the file's own numbers disagree: name its keys, not flags
        raise UsageError(f"{{model_config}} {where}: {e.render(r.source)}", "model_config") from None
    stem = path.stem if path.stem != "config" else path.parent.name  # .../Meta-Llama-3-8B/config.json
    name = r.str("_name_or_path") or stem or model_type
    used.update({"architectures"} & set(cfg))
    return {"name": printable(name), **fields}, sorted(printable(k) for k in set(cfg) - used)
