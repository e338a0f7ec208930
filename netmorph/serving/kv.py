"""KV-cache sizes of real models, from their architecture.

Every layer keeps a key and a value vector per KV head for every token in context, so

    KV bytes per token = 2 · layers · kv_heads · head_dim · bytes per element

(grouped-query attention, Ainslie et al. 2023, shares one KV head among heads / kv_heads query
heads: Llama-3-8B keeps 8 KV heads for 32 query heads, a quarter of Llama-2-7B's cache per token).
Multi-head latent attention (DeepSeek-V2/V3) caches one compressed latent and the shared rotary key
instead, layers · (kv_lora_rank + qk_rope_head_dim) · bytes: 576 elements a layer where the same
heads would keep 4,096. A block of ``block_size`` tokens is vLLM's unit of allocation. The presets
are the models' published configurations (Hugging Face ``config.json``: num_hidden_layers,
num_key_value_heads, hidden_size / num_attention_heads, intermediate_size, vocab_size); nothing
derived is stored.
"""

from __future__ import annotations

from netmorph.mesh.presets import preset
from netmorph.mesh.shape import ModelShape

DTYPE_BYTES = 2  # fp16 / bf16 weights and KV cache, as vLLM serves by default


def get_model(name: str, config: str | None = None) -> ModelShape:
    """A model by its preset name (:data:`netmorph.mesh.presets.PRESETS`: the published config.json), or read
    from a Hugging Face ``config.json``."""
    if config is None:
        return preset(name)
    from netmorph.mesh.configs import from_hf_config

    return ModelShape(**from_hf_config(config)[0])


def kv_table(m: ModelShape, tokens: int, block_size: int, dtype_bytes: int = DTYPE_BYTES) -> dict:
    per_token = m.kv_bytes_per_token(dtype_bytes)
    blocks = -(-tokens // block_size)
    mla = {"kv_lora_rank": m.kv_lora_rank, "qk_rope_head_dim": m.qk_rope_head_dim} if m.mla else {}
    return {
        "model": m.name,
        "attention": "mla" if m.mla else "gqa" if m.kv < m.heads else "mha",
        **mla,
        "layers": m.layers,
        "kv_heads": m.kv,
        "head_dim": m.head_dim,
        "dtype_bytes": dtype_bytes,
        "bytes_per_token": per_token,
        "bytes_per_block": per_token * block_size,
        "tokens": tokens,
        "blocks": blocks,
        "bytes_total": per_token * tokens,
        "bytes_reserved": per_token * block_size * blocks,
    }
