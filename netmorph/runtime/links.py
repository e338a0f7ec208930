"""Per-link α and β for emulating a modelled machine on the local fabric.

Turns a :class:`~netmorph.cost.topology.Topology` (intra-node vs inter-node
links) and single slowed links into the ``fn(src, dst) -> (alpha_s,
beta_s_per_byte)`` that the fabric's link clock
(:mod:`netmorph.runtime.transport.shm.linkclock`) stamps pieces with -- the
same α and β the event simulator charges, so measured time can be set against
the prediction.
"""

from __future__ import annotations

from netmorph.cost.topology import node_of


def link_cost(topology=None, slow_links=None):
    """``fn(src, dst) -> (alpha_s, beta_s_per_byte)``, or None when no link is emulated.

    ``slow_links``: ``{(src, dst): (alpha_s, bytes_per_s)}`` overrides single directed links.
    """
    if topology is None and not slow_links:
        return None
    slow = {tuple(k): v for k, v in (slow_links or {}).items()}

    def cost(s, d):
        if (s, d) in slow:
            alpha, bw = slow[(s, d)]
            return alpha, (1.0 / bw if bw else 0.0)
        if topology is None:
            return 0.0, 0.0
        if topology.flat or node_of(s, topology.gpus_per_node) == node_of(d, topology.gpus_per_node):
            return topology.alpha, topology.beta
        return topology.alpha_inter, topology.beta_inter

    return cost
