"""KV-cache sizes of real models, from their architecture.

Every layer keeps a key and a value vector per KV head for every token in context, so

    KV bytes per token = 2 · layers · kv_heads · head_dim · bytes per element

(grouped-query attention, Ainslie et al. 2023, shares one KV head among
heads / kv_heads query heads: Llama-3-8B keeps 8 KV heads for 32 query heads, a
quarter of Llama-2-7B's cache per token). A block of ``block_size`` tokens is vLLM's
unit of allocation. The presets are the models' published configurations (Hugging
Face ``config.json``: num_hidden_layers, num_key_value_heads, hidden_size /
num_attention_heads, intermediate_size, vocab_size); nothing derived is stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from netmorph.errors import UsageError


@dataclass(frozen=True)
class ServeModel:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    gated: bool = False              # SwiGLU: three FFN matrices (Llama), else two (OPT, GPT)
    dtype_bytes: int = 2             # fp16 / bf16 weights and KV cache
    source: str = ""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def params(self) -> int:
        """Weights: attention (Q, O full; K, V per KV head), the FFN, and the embedding (and LM head if untied:
        counted once here; Llama's untied head adds vocab x hidden, included for the gated models)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = 2 * h * h + 2 * h * kv
        ffn = (3 if self.gated else 2) * h * self.ffn
        emb = self.vocab * h * (2 if self.gated else 1)
        return self.layers * (attn + ffn) + emb


PRESETS = {m.name: m for m in [
    ServeModel("opt-13b", 40, 5120, 40, 40, 20480, 50272, source="facebook/opt-13b config.json"),
    ServeModel("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, gated=True, source="meta-llama/Llama-2-7b-hf config.json"),
    ServeModel("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, gated=True, source="meta-llama/Meta-Llama-3-8B config.json"),
    ServeModel("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, gated=True,
               source="meta-llama/Meta-Llama-3-70B config.json"),
]}


def get_model(name: str) -> ServeModel:
    key = name.lower()
    if key not in PRESETS:
        raise UsageError(f"{{model}}: unknown model {name!r}; choose one of {', '.join(PRESETS)}", "model")
    return PRESETS[key]


def kv_table(m: ServeModel, tokens: int, block_size: int) -> dict:
    per_token = m.kv_bytes_per_token()
    blocks = -(-tokens // block_size)
    return {"model": m.name, "layers": m.layers, "kv_heads": m.kv_heads, "head_dim": m.head_dim,
            "dtype_bytes": m.dtype_bytes, "bytes_per_token": per_token, "bytes_per_block": per_token * block_size,
            "tokens": tokens, "blocks": blocks, "bytes_total": per_token * tokens,
            "bytes_reserved": per_token * block_size * blocks}
