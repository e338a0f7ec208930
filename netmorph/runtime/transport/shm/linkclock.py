"""Link emulation on the local fabric: a piece becomes visible at ``start + α + bytes_so_far·β``.

Given per-link α and β (a ``fn(src, dst) -> (alpha_s, beta_s_per_byte)``, see
:func:`netmorph.runtime.links.link_cost`), the sender stamps every piece with the
time the modelled link would deliver it, and the receiver leaves it unread until
then. ``CLOCK_MONOTONIC`` (``time.perf_counter``) is shared by all processes of the
machine. One send port per rank: a message starts when the previous one has left.
So a two-level topology can be emulated on one machine and measured against the
cost model.
"""

from __future__ import annotations

import time


class LinkClock:
    def __init__(self, rank: int, link_cost=None):
        self.rank = rank
        self.cost = link_cost  # None: links are as fast as memory
        self.port_free = 0.0  # when this rank's send port is free again
        self.next_visible = float("inf")  # when the earliest piece withheld from us shows

    def stamp(self, not_before, i: int, st) -> None:
        """Stamp piece ``i`` of out-stream ``st`` (``st.sent`` bytes pushed so far, this piece included)."""
        if self.cost is None:
            not_before[i] = 0.0
            return
        a, b = self.cost(self.rank, st.peer)
        if st.start is None:
            st.start = max(time.perf_counter(), self.port_free)
        not_before[i] = st.start + a + st.sent * b
        if st.sent == st.total:
            self.port_free = not_before[i]

    def visible(self, not_before, i: int) -> bool:
        """Whether piece ``i`` has arrived; if not, remember when it will."""
        if self.cost is None:
            return True
        t = float(not_before[i])
        if t > time.perf_counter():
            self.next_visible = min(self.next_visible, t)
            return False
        return True

    def nap(self, longest: float) -> float:
        """How long a sleeper may sleep before a withheld piece becomes visible (then forget it)."""
        if self.next_visible == float("inf"):
            return longest
        nap = min(longest, max(self.next_visible - time.perf_counter(), 0.0))
        self.next_visible = float("inf")
        return nap
