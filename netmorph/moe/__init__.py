"""Mixture of experts on real ranks: a learned router makes the all-to-all a function of the input.

Rooms: ``router`` (Megatron's TopKRouter: top-1/top-k, softmax before/after top-k,
jitter, load-balancing and z-losses), ``capacity`` (C = ceil(k·T/E·CF), drop
policies, uniform routing's expected drops exact and simulated), ``layer`` (the
all-to-all dispatcher and experts, autograd through both exchanges), ``train``
(the EP × DP model, its 1-rank reference, the traffic check).
"""

from netmorph.models.capacity import capacity, exact_drop_fraction, keep_mask, simulated_drop_fraction
from netmorph.models.moe import MoELayer
from netmorph.models.router import TopKRouter, load_balancing_loss, z_loss
from netmorph.moe.train import MoEConfig, reference, train

__all__ = ["MoEConfig", "MoELayer", "TopKRouter", "capacity", "exact_drop_fraction", "keep_mask",
           "load_balancing_loss", "reference", "simulated_drop_fraction", "train", "z_loss"]
