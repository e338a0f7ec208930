"""Mixture of experts on real ranks: a learned router makes the all-to-all a function of the input.

The layer, its router and its capacity rules live with the model (:mod:`netmorph.models.moe`,
:mod:`netmorph.models.router`, :mod:`netmorph.models.capacity`) and train in the one GPT trainer
(``netmorph train --experts``); this package is ``netmorph moe``'s view of such a run (``train``: per step the
routing, the drops, the traffic matrix and the all-to-all bytes against it).
"""

from netmorph.models.capacity import capacity, exact_drop_fraction, keep_mask, simulated_drop_fraction
from netmorph.models.moe import MoELayer, Router
from netmorph.models.router import TopKRouter, load_balancing_loss, z_loss
from netmorph.moe.train import MoEConfig, moe_shape, train, view

__all__ = [
    "MoEConfig",
    "moe_shape",
    "MoELayer",
    "Router",
    "TopKRouter",
    "capacity",
    "exact_drop_fraction",
    "keep_mask",
    "load_balancing_loss",
    "simulated_drop_fraction",
    "train",
    "view",
    "z_loss",
]
