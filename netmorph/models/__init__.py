"""The models the parallel layouts train: a small GPT (nanoGPT's shape, Megatron's parameter layout)."""

from netmorph.models.gpt import GPTConfig, GPTStage, PlainLayers, synthetic_batch

__all__ = ["GPTConfig", "GPTStage", "PlainLayers", "synthetic_batch"]
