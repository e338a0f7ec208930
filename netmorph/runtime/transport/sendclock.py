"""Link emulation on torch.distributed: a message leaves its sender when the modelled link would deliver it.

The local fabric stamps every piece with the time its link would deliver it and the receiver leaves it unread
until then (:mod:`netmorph.runtime.transport.shm.linkclock`). Over gloo the receiver cannot see a stamp, so the
sender waits instead: a message of ``n`` bytes to ``peer`` is posted at ``start + α + n·β``, ``start`` the later
of now and when this rank's send port is free (one port per rank, as on the fabric: a message starts when the
previous one has left). The α and β are the same ``fn(src, dst)`` the fabric's clock reads
(:func:`netmorph.runtime.links.link_cost`), set by :meth:`Comm.emulate
<netmorph.runtime.base.CommBase.emulate>`: so a cross-node link that degrades mid-run can be emulated on torchrun
jobs of one machine, and what the real transport adds beneath (gloo over loopback) is measured, not assumed.
"""

from __future__ import annotations

import time


class SendClock:
    """One rank's send port. ``cost``: ``fn(src, dst) -> (alpha_s, beta_s_per_byte)`` or None (no emulation);
    ``canon``: a transport address to the launch slot the cost function numbers (a cluster's restarted worker
    has a slot of its own, on the same node as the one it replaced)."""

    def __init__(self, rank: int, canon=None):
        self.rank, self.cost, self.canon = rank, None, canon or (lambda slot: slot)
        self.port_free = 0.0

    def hold(self, peer: int, nbytes: int) -> None:
        """Wait until a message of ``nbytes`` to ``peer`` would have crossed its link."""
        if self.cost is None or not nbytes:
            return
        a, b = self.cost(self.canon(self.rank), self.canon(peer))
        now = time.perf_counter()
        self.port_free = max(now, self.port_free) + a + nbytes * b
        wait = self.port_free - now
        if wait > 0:
            time.sleep(wait)
