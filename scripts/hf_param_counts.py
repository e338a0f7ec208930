"""Every model preset's parameter count as Hugging Face ``transformers`` counts it: the model built on the meta
device (no memory, no weights) from a config with the preset's numbers, ``sum(p.numel() for p in
model.parameters())`` (tied weights once).

    python scripts/hf_param_counts.py            # prints {preset: count} as JSON (needs transformers)

The printed table is kept in ``tests/hf_param_counts.json``; ``tests/test_vocabulary.py`` holds
:meth:`netmorph.mesh.shape.ModelShape.params` to it for every preset, and rebuilds the models here when
``transformers`` is importable. The 2021-era Megatron GPTs (GPT-3, Narayanan's and Korthikanti's tables) and
llm-foundry's benchmark MPTs (learned positions, biases, LayerNorm, GeLU 4h, tied) are GPT-2's architecture, so
they are built as ``GPT2LMHeadModel``.
"""

import importlib.util
import json
import sys

from netmorph.mesh.shape import PRESETS


def hf_config(m):
    import transformers as tf
    if m.experts:
        return tf.MixtralConfig(hidden_size=m.hidden, intermediate_size=m.f, num_hidden_layers=m.layers,
                                num_attention_heads=m.heads, num_key_value_heads=m.kv, vocab_size=m.vocab,
                                max_position_embeddings=m.seq, num_local_experts=m.experts,
                                num_experts_per_tok=m.top_k, tie_word_embeddings=m.tied)
    if m.ffn_type == "swiglu":
        return tf.LlamaConfig(hidden_size=m.hidden, intermediate_size=m.f, num_hidden_layers=m.layers,
                              num_attention_heads=m.heads, num_key_value_heads=m.kv, vocab_size=m.vocab,
                              max_position_embeddings=m.seq, tie_word_embeddings=m.tied, attention_bias=m.bias,
                              mlp_bias=m.bias)
    if m.position == "alibi":
        return tf.BloomConfig(hidden_size=m.hidden, n_layer=m.layers, n_head=m.heads, vocab_size=m.vocab)
    if m.ffn_type == "relu":
        return tf.OPTConfig(hidden_size=m.hidden, num_hidden_layers=m.layers, ffn_dim=m.f, num_attention_heads=m.heads,
                            vocab_size=m.vocab, max_position_embeddings=m.seq, word_embed_proj_dim=m.hidden)
    return tf.GPT2Config(n_embd=m.hidden, n_layer=m.layers, n_head=m.heads, n_inner=m.f, vocab_size=m.vocab,
                         n_positions=m.seq)


def hf_count(m) -> int:
    import torch
    import transformers as tf
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(hf_config(m))
    return sum(p.numel() for p in model.parameters())


def main() -> int:
    if importlib.util.find_spec("transformers") is None:
        print("this script needs transformers (pip install transformers)", file=sys.stderr)
        return 2
    print(json.dumps({name: hf_count(m) for name, m in PRESETS.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
