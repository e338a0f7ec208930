"""The models the parallel layouts train: a small GPT (nanoGPT's shape, Megatron's parameter layout), built from a
:class:`~netmorph.mesh.shape.ModelShape` and the placements of :mod:`netmorph.mesh.placement`."""

from netmorph.models.gpt import GPTStage, PlainLayers, full_weights, synthetic_batch

__all__ = ["GPTStage", "PlainLayers", "full_weights", "synthetic_batch"]
