"""A transformer's shape, the one type every part of netmorph describes a model with -- the trainer's GPT, the
planner, the step simulator, MoE, serving and morph -- and the parameters, FLOPs and KV cache that follow from it.

Stands in for Hugging Face's ``PretrainedConfig`` (``config.json``) and Megatron-LM's ``TransformerConfig``: the
fields are theirs under one set of names, and the presets are the published configurations.

The 2021-era GPT of Narayanan et al. ("Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM") is the default: multi-head attention, a two-matrix GeLU MLP of
width f (4h), learned positions, biases and LayerNorms, the output layer tied to the word
embedding. Today's models differ in ways that change every count, so each is a field:

- ``kv_heads`` (grouped-query / multi-query attention, Ainslie et al. 2023): K and V have
  ``kv_heads`` heads of ``hidden/heads`` each, so their projections are h·h_kv, not h²;
- ``ffn_type`` ``swiglu`` (Shazeer 2020; Llama): three h x f matrices (gate, up, down);
- ``position`` ``rope``/``alibi``: no learned position table (s·h parameters fewer);
- ``tied=False``: a separate V x h output layer (Llama, Mixtral);
- ``bias=False``: no linear biases, RMSNorm with a weight only (Llama) instead of LayerNorm's
  weight and bias;
- ``attention`` ``flash`` (Dao et al. 2022): the s² scores are never stored, the causal mask
  lets the kernel skip half of them, and the backward recomputes them (5 matmuls to the
  forward's 2 -- FlashAttention-2, section 3.1.2);
- ``dropout=False``: the model trains without dropout (Llama, Mistral, MPT, BLOOM), so no
  dropout masks are stored (torch's dropout with p = 0 returns its input);
- ``dense_layers`` (DeepSeek's ``first_k_dense_replace``): the first k layers keep a dense MLP of width
  ``ffn``; ``expert_ffn`` (``moe_intermediate_size``) is each expert's width when it differs from ``ffn``;
  ``shared_experts`` (``n_shared_experts``) run on every token beside the routed ones;
- ``experts``/``top_k`` (mixture of experts, Megatron's expert-parallel MLP; Mixtral): E
  copies of the MLP and a router of h x E per layer, each token through ``top_k`` of them;
  ``capacity_factor`` > 1 pads every expert to that multiple of its even share (GShard,
  Switch): the padding is computed and crosses the all-to-all too.

Parameters, counted exactly:

    per layer   2h² + 2h·h_kv (Q, K, V, O)  +  m·h·f·E (m = 2 GeLU, 3 SwiGLU; E = 1 dense)  + h·E router
                + biases (h + 2h_kv + h, and f + h or 2f + h per expert) + norms (2 x 2h, or 2 x h)
    model       l x per layer + V·h (x 2 untied) + s·h (learned positions) + the final norm

which for the default is Narayanan's eq. 2, l(4h² + 2hf + 9h + f) + (V + s)h, plus the final
LayerNorm's 2h. FLOPs of one layer's forward for b sequences (matmuls only, 2 per multiply-add):

    2bs(2h² + 2h·h_kv + m·h·f·k) + 2bs·h·E (router) + 4bs²h (QKᵀ and attention·V)

Two conventions for the attention term, both reported: Megatron's (and Narayanan's eq. 3)
counts the full s x s product, ``model_flops``; a causal model needs only half of it,
``causal_model_flops`` -- and a FlashAttention kernel executes only that half, which is what the
planner's time uses. The backward is 2x the forward; full recomputation runs the forward
once more, selective (Korthikanti et al. 2022) only the attention core.

Presets: GPT-3 175B, Narayanan et al. 2021 Table 1 (``ptdp-1.7b`` .. ``ptdp-1t``) and
Korthikanti et al. 2022 Table 3 (``mt-22b`` .. ``mt-1t``), s = 2048, V = 51200, as the papers;
open models from their published architectures (Hugging Face ``config.json``): Llama-3 8B,
70B and 405B (Dubey et al. 2024, Table 3), Llama-2 7B and 70B, Mixtral 8x7B, BLOOM-176B, and
MosaicML's MPT benchmark models (llm-foundry ``scripts/train/yamls/pretrain``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from netmorph.errors import UsageError

FFN_TYPES = ("gelu", "relu", "swiglu")
POSITIONS = ("learned", "rope", "alibi")
ATTENTION = ("standard", "flash")


@dataclass(frozen=True)
class ModelShape:
    """One transformer. The defaults are netmorph's own small GPT (the one ``netmorph train`` builds in torch);
    a published model is a preset (:data:`PRESETS`) or read from its config (:mod:`netmorph.mesh.configs`)."""

    name: str = "gpt"
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    seq: int = 32
    vocab: int = 128
    ffn: int = 0                   # 0: 4 x hidden
    params_only: float = 0.0       # a bare parameter count (--params): model-state memory only
    kv_heads: int = 0              # 0: = heads (multi-head attention)
    ffn_type: str = "gelu"         # gelu | swiglu
    position: str = "learned"      # learned | rope | alibi
    tied: bool = True              # output layer shares the word embedding
    bias: bool = True              # linear biases and LayerNorm (False: no biases, RMSNorm)
    attention: str = "standard"    # standard | flash
    dropout: bool = False          # dropout layers (True: their masks are stored for the backward)
    experts: int = 0               # 0: dense MLP
    top_k: int = 1                 # experts per token
    capacity_factor: float = 1.0   # expert capacity / (tokens x top_k / experts): padding computed and sent
    expert_ffn: int = 0            # 0: = ffn (each expert as wide as the dense MLP)
    shared_experts: int = 0        # experts every token passes through (DeepSeek, Qwen2-MoE), each expert_ffn wide
    embedding_norm: bool = False   # a norm right after the word embedding (BLOOM's word_embeddings_layernorm)
    extra_positions: int = 0       # learned position rows beyond seq (OPT keeps 2 for its padding offset)
    dense_layers: int = 0          # the first k layers keep a dense MLP (DeepSeek's first_k_dense_replace)
    seed: int = 0                  # the initial weights' and the synthetic data's seed (netmorph's GPT)
    source: str = field(default="", compare=False)     # where a preset's numbers come from

    @property
    def f(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def bare(self) -> bool:
        return self.params_only > 0

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @cached_property
    def h_kv(self) -> int:
        """Width of K (and of V): kv_heads x head_dim."""
        return self.kv * self.head_dim

    @property
    def mlp_mats(self) -> int:
        return 3 if self.ffn_type == "swiglu" else 2

    @property
    def n_experts(self) -> int:
        return self.experts or 1

    @property
    def active_experts(self) -> int:
        return self.top_k if self.experts else 1

    @property
    def ef(self) -> int:
        """One expert's MLP width (the dense MLP's in a dense model)."""
        return (self.expert_ffn or self.f) if self.experts else self.f

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts (all but the first ``dense_layers``; none in a dense model)."""
        return self.layers - self.dense_layers if self.experts else 0

    # -- parameters -------------------------------------------------------------------------------
    def attn_weights(self) -> int:
        return 2 * self.hidden * self.hidden + 2 * self.hidden * self.h_kv

    def attn_biases(self) -> int:
        return (2 * self.hidden + 2 * self.h_kv) if self.bias else 0

    def mlp_params(self, width: int) -> int:
        """One MLP of ``width``: its matrices and (with biases) theirs."""
        return self.mlp_mats * self.hidden * width + (((self.mlp_mats - 1) * width + self.hidden) if self.bias else 0)

    def expert_weights(self) -> int:
        """One expert's (or the dense MLP's) matrices."""
        return self.mlp_mats * self.hidden * self.ef

    def expert_biases(self) -> int:
        return ((self.mlp_mats - 1) * self.ef + self.hidden) if self.bias else 0

    def norm_params(self) -> int:
        """One norm: LayerNorm's weight and bias, or RMSNorm's weight."""
        return (2 if self.bias else 1) * self.hidden

    def router_params(self) -> int:
        return self.hidden * self.experts

    def layer_params(self) -> int:
        """One layer of the kind most layers are: routed experts (plus shared ones) in a mixture of experts, else
        the dense MLP. (The planner prices every layer as this one.)"""
        mlp = ((self.n_experts + self.shared_experts) * (self.expert_weights() + self.expert_biases())
               + self.router_params()) if self.experts else self.mlp_params(self.f)
        return self.attn_weights() + self.attn_biases() + mlp + 2 * self.norm_params()

    def dense_layer_params(self) -> int:
        return self.attn_weights() + self.attn_biases() + self.mlp_params(self.f) + 2 * self.norm_params()

    def embedding_params(self) -> int:
        """Word embedding (and the untied output layer) and learned positions."""
        return (self.vocab * self.hidden * (1 if self.tied else 2) + ((self.seq + self.extra_positions) * self.hidden
                                                                       if self.position == "learned" else 0)
                + (self.norm_params() if self.embedding_norm else 0))

    def params(self) -> float:
        """Every parameter, each counted once (a tied embedding once): Hugging Face's
        ``sum(p.numel() for p in model.parameters())``."""
        if self.bare:
            return self.params_only
        moe = self.moe_layers
        return (moe * self.layer_params() + (self.layers - moe) * self.dense_layer_params()
                + self.embedding_params() + self.norm_params())

    def active_params(self) -> float:
        """Parameters one token passes through (a mixture of experts uses top_k of E, and every shared expert)."""
        idle = (self.n_experts - self.active_experts) * (self.expert_weights() + self.expert_biases())
        return self.params() - self.moe_layers * idle

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """A KV cache's bytes per token of context: a key and a value per KV head in every layer (vLLM's
        ``get_kv_cache_spec``: 2 · layers · kv_heads · head_dim · bytes)."""
        return 2 * self.layers * self.kv * self.head_dim * dtype_bytes

    # -- FLOPs --------------------------------------------------------------------------------------
    def _core(self, tokens_b: int, causal: bool) -> float:
        return 4 * tokens_b * self.seq * self.seq * self.hidden * (0.5 if causal else 1.0)

    def layer_linear_flops_fwd(self, tokens_b: int) -> float:
        """The layer's matmuls that scale with tokens: projections, the MLP (top_k experts, each padded to its
        capacity), the router."""
        b, s, h = tokens_b, self.seq, self.hidden
        mlp = self.active_experts * self.expert_weights() * (self.capacity_factor if self.experts else 1.0)
        return 2 * b * s * (self.attn_weights() + mlp + h * self.experts)

    # the aten operators one layer of netmorph's GPT dispatches in eager PyTorch, (forward, backward), and the
    # embedding, LM head and loss's -- traced by a TorchDispatchMode (tests/test_calibrate.py holds them): what
    # a profile's op_overhead_s (a kernel launch, eager dispatch and autograd) is paid for, whatever the sizes
    LAYER_KERNELS = (30, 66)
    HEAD_KERNELS = (14, 23)

    def layer_flops_fwd(self, tokens_b: int, causal: bool = False) -> float:
        """Forward FLOPs of one transformer layer for b sequences (b = ``tokens_b``)."""
        return self.layer_linear_flops_fwd(tokens_b) + self._core(tokens_b, causal)

    def logit_flops_fwd(self, b: int) -> float:
        return 2 * b * self.seq * self.hidden * self.vocab

    def flops_per_iteration(self, batch: int, recompute: str = "full") -> float:
        """Eq. 3: FLOPs of one iteration of ``batch`` sequences, counting what the GPUs execute
        (Megatron's convention: the full s x s attention product).

        recompute = "full": 4 x layer forward (fwd, 2 x bwd, recomputed fwd) + 3 x logits
        (96 B s l h² (1 + s/6h + V/16lh) when f = 4h); "none": 3 x both (72 B s l h²
        (1 + s/6h + V/12lh)); "selective": 3 x both + the attention core again.
        """
        self._need_shape()
        layer = self.layer_flops_fwd(batch)
        logit = self.logit_flops_fwd(batch)
        if recompute == "full":
            return self.layers * 4 * layer + 3 * logit
        extra = self._core(batch, False) if recompute == "selective" else 0
        return self.layers * (3 * layer + extra) + 3 * logit

    def model_flops(self, batch: int) -> float:
        """FLOPs of the model itself (no recomputation), Megatron's full-attention convention: MFU's numerator."""
        return self.flops_per_iteration(batch, "none")

    def causal_model_flops(self, batch: int) -> float:
        """The same with the causal half of the attention product only (what a causal model needs)."""
        self._need_shape()
        return 3 * (self.layers * self.layer_flops_fwd(batch, causal=True) + self.logit_flops_fwd(batch))

    def _need_shape(self) -> None:
        if self.bare:
            raise UsageError("{params} gives model-state memory only; FLOPs need {layers}/{hidden}/{heads} or "
                             "{model}", "params")

    def describe(self) -> str:
        """The architecture in one phrase: what differs from the 2021 GPT default."""
        parts = []
        if self.kv != self.heads:
            parts.append(f"GQA {self.heads}/{self.kv}")
        parts.append(f"{self.ffn_type} f {self.f}")
        if self.experts:
            parts.append(f"{self.experts} experts top-{self.top_k}")
        parts.append(self.position)
        if not self.tied:
            parts.append("untied")
        if not self.bias:
            parts.append("no bias")
        parts.append(f"{self.attention} attention")
        if not self.dropout:
            parts.append("no dropout")
        return ", ".join(parts)


# what a Megatron command line that names no --seq-length / vocabulary is taken to train (GPT-3's)
MEGATRON_DEFAULTS = {"seq": 2048, "vocab": 51200}


def _m(name, layers, hidden, heads, seq=2048, vocab=51200, **kw):
    """A 2021-era Megatron GPT, as the papers train it: learned positions, GeLU 4h, tied, biases, dropout."""
    return ModelShape(name, layers, hidden, heads, seq, vocab, dropout=True, **kw)


def _llama(name, layers, hidden, heads, kv, ffn, vocab=128256, seq=8192, **kw):
    return ModelShape(name, layers, hidden, heads, seq, vocab, ffn, kv_heads=kv, ffn_type="swiglu", position="rope",
                      tied=False, bias=False, attention="flash", dropout=False, **kw)


def _mpt(name, layers, hidden, heads):
    # llm-foundry's benchmark MPTs: learned positions, biases, LayerNorm, GeLU 4h, vocab 50368, tied, flash, and
    # attn_pdrop = resid_pdrop = emb_pdrop = 0
    return ModelShape(name, layers, hidden, heads, 2048, 50368, attention="flash", dropout=False,
                      source="llm-foundry scripts/train/yamls/pretrain")


PRESETS = {m.name: m for m in [
    _m("gpt3-175b", 96, 12288, 96, source="Brown et al. 2020, Table 2.1"),
    # Narayanan et al. 2021, Table 1 (weak scaling on Selene)
    _m("ptdp-1.7b", 24, 2304, 24), _m("ptdp-3.6b", 30, 3072, 32), _m("ptdp-7.5b", 36, 4096, 32),
    _m("ptdp-18.4b", 40, 6144, 48), _m("ptdp-39.1b", 48, 8192, 64), _m("ptdp-76.1b", 60, 10240, 80),
    _m("ptdp-145.6b", 80, 12288, 96), _m("ptdp-310.1b", 96, 16384, 128), _m("ptdp-529.6b", 105, 20480, 128),
    _m("ptdp-1t", 128, 25600, 160),
    # Korthikanti et al. 2022, Table 3
    _m("mt-22b", 48, 6144, 64), _m("mt-175b", 96, 12288, 96), _m("mt-530b", 105, 20480, 128),
    _m("mt-1t", 128, 25600, 160),
    # open models, from their published config.json
    _llama("llama-3-8b", 32, 4096, 32, 8, 14336, source="meta-llama/Meta-Llama-3-8B config.json"),
    _llama("llama-3-70b", 80, 8192, 64, 8, 28672, source="meta-llama/Meta-Llama-3-70B config.json"),
    _llama("llama-3-405b", 126, 16384, 128, 8, 53248, source="meta-llama/Llama-3.1-405B config.json"),
    _llama("llama-2-7b", 32, 4096, 32, 32, 11008, vocab=32000, seq=4096, source="meta-llama/Llama-2-7b-hf config.json"),
    _llama("llama-2-70b", 80, 8192, 64, 8, 28672, vocab=32000, seq=4096,
           source="meta-llama/Llama-2-70b-hf config.json"),
    _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, vocab=32000, seq=4096, experts=8, top_k=2,
           source="mistralai/Mixtral-8x7B-v0.1 config.json"),
    ModelShape("bloom-176b", 70, 14336, 112, 2048, 250880, position="alibi", dropout=False, embedding_norm=True,
               source="bigscience/bloom config.json"),
    # OPT: ReLU MLP of ffn_dim, learned positions offset by 2 rows (OPTLearnedPositionalEmbedding), dropout 0.1
    ModelShape("opt-13b", 40, 5120, 40, 2048, 50272, 20480, ffn_type="relu", extra_positions=2, dropout=True,
               source="facebook/opt-13b config.json"),
    _mpt("mpt-1b", 24, 2048, 16), _mpt("mpt-7b", 32, 4096, 32), _mpt("mpt-13b", 40, 5120, 40),
    _mpt("mpt-30b", 48, 7168, 56), _mpt("mpt-70b", 80, 8192, 64),
]}


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
    for k, allowed in (("ffn_type", FFN_TYPES), ("position", POSITIONS), ("attention", ATTENTION)):
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
        raise UsageError(f"{{dense_layers}} must be in 0..{spec.layers - 1} and needs {{experts}}, got "
                         f"{spec.dense_layers}", "dense_layers")
    return spec


def from_args(model=None, layers=None, hidden=None, heads=None, seq=None, vocab=None, ffn=None,
              params=None, base: ModelShape | None = None, **arch) -> ModelShape:
    """A preset, a ``base`` (read from a config file) or a model from flags, with any field overridden by a flag
    (``arch``: kv_heads, ffn_type, position, tied, bias, attention, experts, top_k); errors name the flag."""
    if params is not None:
        if not 0 < params <= 1e15:
            raise UsageError(f"{{params}} must be in (0, 1e15] (a quadrillion parameters), got {params:g}", "params")
        return ModelShape(f"{params:.3g} params", 0, 0, 0, params_only=float(params))
    over = {k: v for k, v in dict(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, ffn=ffn,
                                  **arch).items() if v is not None}
    if model is not None:
        spec = replace(preset(model), **over)
    elif base is not None:
        spec = replace(base, **over)
    else:
        missing = ["{" + k + "}" for k, v in (("layers", layers), ("hidden", hidden), ("heads", heads)) if v is None]
        if missing:
            raise UsageError("describe the model with {model} NAME, {model_config} FILE, {megatron_args} ARGS, "
                             "{params} N, or " + " ".join(missing), missing[0][1:-1])
        spec = replace(ModelShape("custom", layers, hidden, heads, 2048, 51200, attention="flash", dropout=True),
                       **over)
    if ffn is not None and not 1 <= ffn <= 1 << 26:
        raise UsageError(f"{{ffn}} must be in 1..{1 << 26:,} (omit it for 4 x hidden), got {ffn}", "ffn")
    return check_shape(spec)
