"""Every model preset's parameter count, and every ``config.json`` in ``examples/configs``'s total and active
counts, as Hugging Face ``transformers`` counts them: the model built on the meta device (no memory, no weights)
from a config with the preset's numbers (or from the file itself), ``sum(p.numel() for p in
model.parameters())`` (tied weights once); active = total less the routed experts a token does not use
((E - top_k)/E of every fused expert tensor, ``experts.gate_up_proj`` / ``experts.down_proj``).

    python scripts/hf_param_counts.py            # prints the table as JSON (needs transformers)

The printed table is kept in ``tests/hf_param_counts.json``; ``tests/test_vocabulary.py`` holds
:meth:`netmorph.mesh.shape.ModelShape.params` and ``active_params`` to it for every preset and config file,
and rebuilds the models here when ``transformers`` is importable. The 2021-era Megatron GPTs (GPT-3,
Narayanan's and Korthikanti's tables) and llm-foundry's benchmark MPTs (learned positions, biases, LayerNorm,
GeLU 4h, tied) are GPT-2's architecture, so they are built as ``GPT2LMHeadModel``.
"""

import importlib.util
import json
import sys
from pathlib import Path

from netmorph.mesh.presets import PRESETS


def hf_config(m):
    import transformers as tf

    if m.experts:
        return tf.MixtralConfig(
            hidden_size=m.hidden,
            intermediate_size=m.f,
            num_hidden_layers=m.layers,
            num_attention_heads=m.heads,
            num_key_value_heads=m.kv,
            vocab_size=m.vocab,
            max_position_embeddings=m.seq,
            num_local_experts=m.experts,
            num_experts_per_tok=m.top_k,
            tie_word_embeddings=m.tied,
        )
    if m.ffn_type == "swiglu":
        return tf.LlamaConfig(
            hidden_size=m.hidden,
            intermediate_size=m.f,
            num_hidden_layers=m.layers,
            num_attention_heads=m.heads,
            num_key_value_heads=m.kv,
            vocab_size=m.vocab,
            max_position_embeddings=m.seq,
            tie_word_embeddings=m.tied,
            attention_bias=m.bias,
            mlp_bias=m.bias,
        )
    if m.position == "alibi":
        return tf.BloomConfig(hidden_size=m.hidden, n_layer=m.layers, n_head=m.heads, vocab_size=m.vocab)
    if m.ffn_type == "relu":
        return tf.OPTConfig(
            hidden_size=m.hidden,
            num_hidden_layers=m.layers,
            ffn_dim=m.f,
            num_attention_heads=m.heads,
            vocab_size=m.vocab,
            max_position_embeddings=m.seq,
            word_embed_proj_dim=m.hidden,
        )
    return tf.GPT2Config(
        n_embd=m.hidden, n_layer=m.layers, n_head=m.heads, n_inner=m.f, vocab_size=m.vocab, n_positions=m.seq
    )


CONFIGS = Path(__file__).resolve().parent.parent / "examples" / "configs"


def _build(config):
    import torch
    import transformers as tf

    with torch.device("meta"):
        return tf.AutoModelForCausalLM.from_config(config)


def hf_count(m) -> int:
    """A preset's count: from its config.json where examples/configs has one, else from its numbers."""
    if (CONFIGS / f"{m.name}.json").exists():
        return hf_file_counts(CONFIGS / f"{m.name}.json")["total"]
    return sum(p.numel() for p in _build(hf_config(m)).parameters())


def hf_file_counts(path) -> dict:
    """{"total", "active"} of the model transformers builds from a config.json."""
    import transformers as tf

    cfg = json.loads(Path(path).read_text())
    config = tf.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = _build(config)
    total = sum(p.numel() for p in model.parameters())
    k = getattr(config, "num_experts_per_tok", None)
    idle = sum(
        p.numel() // p.shape[0] * (p.shape[0] - k)
        for name, p in model.named_parameters()
        if ".experts." in name and p.dim() == 3
    )
    return {"total": total, "active": total - idle}


def main() -> int:
    if importlib.util.find_spec("transformers") is None:
        print("this script needs transformers (pip install transformers)", file=sys.stderr)
        return 2
    table = {
        "presets": {name: hf_count(m) for name, m in PRESETS.items()},
        "configs": {p.name: hf_file_counts(p) for p in sorted(CONFIGS.glob("*.json"))},
    }
    print(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
