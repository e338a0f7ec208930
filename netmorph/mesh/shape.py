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
- ``kv_lora_rank`` > 0: multi-head latent attention (DeepSeek-V2/V3): Q through an optional rank-``q_lora_rank``
  bottleneck, K and V decompressed per head from one latent of ``kv_lora_rank`` (the KV cache holds that latent
  and the shared rotary key, ``qk_rope_head_dim``), heads of ``qk_nope_head_dim + qk_rope_head_dim`` for QKᵀ and
  ``v_head_dim`` for V; ``head_width`` (config.json's ``head_dim``), ``attention_bias`` (Qwen2's on Q, K and
  V), ``qk_norm`` (Qwen3),
  ``layer_norms`` (Gemma 2's four per layer) and ``dense_at``/``shared_ffn``/``shared_gate`` (Qwen2-MoE) are
  the other fields of today's configs that change a count;
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
once more, selective (Korthikanti et al. 2022) only the attention core. The presets are in
:mod:`netmorph.mesh.presets`, the config-file loaders in :mod:`netmorph.mesh.configs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from netmorph.errors import UsageError

FFN_TYPES = ("gelu", "relu", "swiglu")
POSITIONS = ("learned", "rope", "alibi")
ATTENTION = ("standard", "flash")
ATTENTION_BIAS = ("", "qkv", "all")


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
    ffn: int = 0  # 0: 4 x hidden
    params_only: float = 0.0  # a bare parameter count (--params): model-state memory only
    kv_heads: int = 0  # 0: = heads (multi-head attention)
    ffn_type: str = "gelu"  # gelu | swiglu
    position: str = "learned"  # learned | rope | alibi
    tied: bool = True  # output layer shares the word embedding
    bias: bool = True  # linear biases and LayerNorm (False: no biases, RMSNorm)
    attention: str = "standard"  # standard | flash
    dropout: bool = False  # dropout layers (True: their masks are stored for the backward)
    experts: int = 0  # 0: dense MLP
    top_k: int = 1  # experts per token
    capacity_factor: float = 1.0  # expert capacity / (tokens x top_k / experts): padding computed and sent
    expert_ffn: int = 0  # 0: = ffn (each expert as wide as the dense MLP)
    shared_experts: int = 0  # experts every token passes through (DeepSeek, Qwen2-MoE), each expert_ffn wide
    embedding_norm: bool = False  # a norm right after the word embedding (BLOOM's word_embeddings_layernorm)
    extra_positions: int = 0  # learned position rows beyond seq (OPT keeps 2 for its padding offset)
    dense_layers: int = 0  # the first k layers keep a dense MLP (DeepSeek's first_k_dense_replace)
    dense_at: tuple = ()  # further dense layers by index (moe_layer_freq, decoder_sparse_step,
    # mlp_only_layers)
    shared_ffn: int = 0  # 0: each shared expert is expert_ffn wide (Qwen2-MoE's
    # shared_expert_intermediate_size)
    shared_gate: bool = False  # a sigmoid gate of h x 1 on the shared expert's output (Qwen2-MoE)
    head_width: int = 0  # 0: hidden / heads (config.json's head_dim where it differs: Gemma, Qwen3, Mistral)
    attention_bias: str = ""  # with bias=False: "qkv" (Qwen2) or "all" of attention's projections (config.json's
    # attention_bias in Llama, Qwen3, DeepSeek), RMSNorm and a bias-free MLP kept
    qk_norm: bool = False  # an RMSNorm of head_dim on each Q and K head (Qwen3, Gemma 3)
    layer_norms: int = 2  # norms per layer (Gemma 2/3: 4, before and after attention and MLP)
    # multi-head latent attention (DeepSeek-V2/V3; kv_lora_rank > 0): K and V come from one compressed latent
    q_lora_rank: int = 0  # 0: Q projected directly from h
    kv_lora_rank: int = 0  # the latent's width (what the KV cache stores, with the rotary key)
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0  # the decoupled rotary part of each Q and K head (K's shared by all heads)
    v_head_dim: int = 0
    seed: int = 0  # the initial weights' and the synthetic data's seed (netmorph's GPT)
    source: str = field(default="", compare=False)  # where a preset's numbers come from

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
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def head_dim(self) -> int:
        return self.head_width or self.hidden // self.heads

    @cached_property
    def h_kv(self) -> int:
        """Width of K (and of V): kv_heads x head_dim."""
        return self.kv * self.head_dim

    @property
    def q_width(self) -> int:
        """Width of Q (and of the attention output in multi-head attention): heads x each Q head's width."""
        return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim if self.mla else self.head_dim)

    @property
    def o_width(self) -> int:
        """Width of the attention's output (heads x each V head's width), the output projection's input."""
        return self.heads * (self.v_head_dim if self.mla else self.head_dim)

    @property
    def kv_widths(self) -> tuple:
        """(K's width, V's width) as attention reads them: kv_heads x head_dim each, or MLA's per-head K and V
        decompressed from the latent (heads x (nope + rope), heads x v_head_dim)."""
        if self.mla:
            return self.q_width, self.heads * self.v_head_dim
        return self.h_kv, self.h_kv

    def is_moe_layer(self, i: int) -> bool:
        """Layer ``i`` routes to experts: every layer of a mixture of experts but the first ``dense_layers`` and
        those in ``dense_at`` (transformers' DeepSeek ``first_k_dense_replace``; Qwen2-MoE's
        ``decoder_sparse_step`` and ``mlp_only_layers``)."""
        return bool(self.experts) and i >= self.dense_layers and i not in self.dense_at

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
    def shared_width(self) -> int:
        """One shared expert's MLP width (Qwen2-MoE's shared_expert_intermediate_size, else an expert's)."""
        return self.shared_ffn or self.ef

    @cached_property
    def moe_layers(self) -> int:
        """Layers with routed experts (none in a dense model)."""
        return sum(map(self.is_moe_layer, range(self.layers))) if self.experts else 0

    # -- parameters -------------------------------------------------------------------------------
    def qkv_weights(self) -> int:
        """The matrices that make Q, K and V from the layer's input: h x (q + 2 h_kv), or MLA's down- and
        up-projections (h x q_lora, q_lora x q; h x (kv_lora + rope); kv_lora x heads (nope + v))."""
        h = self.hidden
        if not self.mla:
            return h * (self.q_width + 2 * self.h_kv)
        q = (h * self.q_lora_rank + self.q_lora_rank * self.q_width) if self.q_lora_rank else h * self.q_width
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * self.heads * (
            self.qk_nope_head_dim + self.v_head_dim
        )
        return q + kv

    def out_weights(self) -> int:
        """The attention output projection: (heads x v width) x h."""
        return self.o_width * self.hidden

    def attn_weights(self) -> int:
        return self.qkv_weights() + self.out_weights()

    def attn_biases(self) -> int:
        """Linear biases of attention: every projection's with ``bias`` or ``attention_bias`` "all" (MLA's biased
        ones are its down-projections and the output: transformers' ``DeepseekV2Attention``), Q's, K's and V's
        with "qkv"."""
        on = "all" if self.bias else self.attention_bias
        if not on:
            return 0
        if self.mla:
            return self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim + self.hidden
        return self.q_width + 2 * self.h_kv + (self.hidden if on == "all" else 0)

    def attn_norms(self) -> int:
        """Norms inside attention: MLA's on its latents, Qwen3's per-head Q and K norms."""
        return ((self.q_lora_rank + self.kv_lora_rank) if self.mla else 0) + (2 * self.head_dim if self.qk_norm else 0)

    def mlp_params(self, width: int) -> int:
        """One MLP of ``width``: its matrices and (with biases) theirs."""
        return self.mlp_mats * self.hidden * width + (((self.mlp_mats - 1) * width + self.hidden) if self.bias else 0)

    def expert_weights(self) -> int:
        """One expert's (or the dense MLP's) matrices."""
        return self.mlp_mats * self.hidden * self.ef

    def expert_biases(self) -> int:
        return ((self.mlp_mats - 1) * self.ef + self.hidden) if self.bias else 0

    def shared_params(self) -> int:
        """The shared experts every token passes through (DeepSeek: n_shared of moe_intermediate_size, which
        transformers builds as one MLP n_shared times as wide -- the same count; Qwen2-MoE: one of
        shared_expert_intermediate_size)."""
        return self.shared_experts * self.mlp_params(self.shared_width) if self.experts else 0

    def norm_params(self) -> int:
        """One norm: LayerNorm's weight and bias, or RMSNorm's weight."""
        return (2 if self.bias else 1) * self.hidden

    def router_params(self) -> int:
        """The router (h x E) and Qwen2-MoE's shared-expert gate (h x 1)."""
        return self.hidden * (self.experts + self.shared_gate)

    def _layer_common(self) -> int:
        return self.attn_weights() + self.attn_biases() + self.attn_norms() + self.layer_norms * self.norm_params()

    def layer_params(self) -> int:
        """One layer of the kind most layers are: routed experts (plus shared ones) in a mixture of experts, else
        the dense MLP. (The planner prices every layer as this one.)"""
        if not self.experts:
            return self.dense_layer_params()
        return (
            self._layer_common()
            + self.n_experts * (self.expert_weights() + self.expert_biases())
            + self.shared_params()
            + self.router_params()
        )

    def dense_layer_params(self) -> int:
        return self._layer_common() + self.mlp_params(self.f)

    def embedding_params(self) -> int:
        """Word embedding (and the untied output layer) and learned positions."""
        return (
            self.vocab * self.hidden * (1 if self.tied else 2)
            + ((self.seq + self.extra_positions) * self.hidden if self.position == "learned" else 0)
            + (self.norm_params() if self.embedding_norm else 0)
        )

    def params(self) -> float:
        """Every parameter, each counted once (a tied embedding once): Hugging Face's
        ``sum(p.numel() for p in model.parameters())``."""
        if self.bare:
            return self.params_only
        moe = self.moe_layers
        return (
            moe * self.layer_params()
            + (self.layers - moe) * self.dense_layer_params()
            + self.embedding_params()
            + self.norm_params()
        )

    def active_params(self) -> float:
        """Parameters one token passes through (a mixture of experts uses top_k of E, and every shared expert)."""
        idle = (self.n_experts - self.active_experts) * (self.expert_weights() + self.expert_biases())
        return self.params() - self.moe_layers * idle

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """A KV cache's bytes per token of context: a key and a value per KV head in every layer (vLLM's
        ``get_kv_cache_spec``: 2 · layers · kv_heads · head_dim · bytes), or with multi-head latent attention
        the compressed latent and the shared rotary key, layers · (kv_lora_rank + qk_rope_head_dim) · bytes
        (vLLM's ``MLAAttentionSpec``: one head of that width; DeepSeek-V2 section 2.1.2)."""
        if self.mla:
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes
        return 2 * self.layers * self.kv * self.head_dim * dtype_bytes

    # -- FLOPs --------------------------------------------------------------------------------------
    def _core(self, tokens_b: int, causal: bool) -> float:
        """QKᵀ (Q's width) and attention·V (V's width) over s x s: 4bs²h for multi-head attention."""
        return 2 * tokens_b * self.seq * self.seq * (self.q_width + self.o_width) * (0.5 if causal else 1.0)

    def layer_linear_flops_fwd(self, tokens_b: int, moe: bool = True) -> float:
        """The layer's matmuls that scale with tokens: projections, the MLP (top_k experts, each padded to its
        capacity, and the shared ones), the router -- or with ``moe=False`` (or a dense model) the dense MLP."""
        b, s = tokens_b, self.seq
        if self.experts and moe:
            mlp = (
                self.active_experts * self.expert_weights() * self.capacity_factor
                + self.shared_experts * self.mlp_mats * self.hidden * self.shared_width
                + self.router_params()
            )
        else:
            mlp = self.mlp_mats * self.hidden * self.f
        return 2 * b * s * (self.attn_weights() + mlp)

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
        layer = self._layers_flops_fwd(batch, False)
        logit = self.logit_flops_fwd(batch)
        if recompute == "full":
            return 4 * layer + 3 * logit
        extra = self.layers * self._core(batch, False) if recompute == "selective" else 0
        return 3 * layer + extra + 3 * logit

    def _layers_flops_fwd(self, batch: int, causal: bool) -> float:
        """Every layer's forward: the MoE layers' and the dense ones' (the first k of DeepSeek, ...)."""
        dense = self.layers - self.moe_layers
        return self.moe_layers * self.layer_flops_fwd(batch, causal) + dense * (
            self.layer_linear_flops_fwd(batch, moe=False) + self._core(batch, causal)
        )

    def model_flops(self, batch: int) -> float:
        """FLOPs of the model itself (no recomputation), Megatron's full-attention convention: MFU's numerator."""
        return self.flops_per_iteration(batch, "none")

    def causal_model_flops(self, batch: int) -> float:
        """The same with the causal half of the attention product only (what a causal model needs)."""
        self._need_shape()
        return 3 * (self._layers_flops_fwd(batch, True) + self.logit_flops_fwd(batch))

    def _need_shape(self) -> None:
        if self.bare:
            raise UsageError(
                "{params} gives model-state memory only; FLOPs need {layers}/{hidden}/{heads} or {model}", "params"
            )

    def describe(self) -> str:
        """The architecture in one phrase: what differs from the 2021 GPT default."""
        parts = []
        if self.mla:
            parts.append(f"MLA latent {self.kv_lora_rank} + rope {self.qk_rope_head_dim}")
        elif self.kv != self.heads:
            parts.append(f"GQA {self.heads}/{self.kv}")
        if self.head_width:
            parts.append(f"head dim {self.head_width}")
        parts.append(f"{self.ffn_type} f {self.f}")
        if self.experts:
            parts.append(
                f"{self.experts} experts top-{self.top_k}"
                + (f" f {self.ef}" if self.ef != self.f else "")
                + (f" + {self.shared_experts} shared" if self.shared_experts else "")
                + (f" ({self.layers - self.moe_layers} dense)" if self.moe_layers < self.layers else "")
            )
        parts.append(self.position)
        if not self.tied:
            parts.append("untied")
        if not self.bias:
            parts.append("no bias")
        parts.append(f"{self.attention} attention")
        if not self.dropout:
            parts.append("no dropout")
        return ", ".join(parts)
