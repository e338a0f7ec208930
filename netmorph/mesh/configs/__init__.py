"""The model and the split, read from the files a user already has: the loaders of
:class:`~netmorph.mesh.shape.ModelShape` and of a layout's fields, in one place.

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

from netmorph.mesh.configs.deepspeed import from_deepspeed_config
from netmorph.mesh.configs.hf import from_hf_config
from netmorph.mesh.configs.megatron import from_megatron_args

__all__ = ["from_deepspeed_config", "from_hf_config", "from_megatron_args"]
