"""What happens to a training job while it runs: the scenarios morph's control loop meets, as data.

A scenario is one event at one step: ``link-degrades@STEP[xFACTOR]`` (the inter-node link FACTOR times slower,
as a congested or degraded network), ``node-lost@STEP`` (a node's ranks gone, as torchelastic sees a lost
agent), ``seq-grows@STEP[xFACTOR]`` (the context FACTOR times longer, as a long-context phase of training).
:func:`netmorph.cost.topology.two_nodes` is the emulated two-node cluster they happen on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from netmorph.cost.topology import Topology
from netmorph.errors import UsageError


@dataclass(frozen=True)
class Scenario:
    """What changes mid-run, from step ``at`` on: ``link-degrades`` -- the inter-node links' bandwidth divided by
    ``factor`` (their latency multiplied by it); ``node-lost`` -- the second node's ranks are gone, with whatever
    state only they held; ``seq-grows`` -- the sequences are ``factor`` times longer (a long-context phase); or
    ``none``. A loss or a growth happens at the first segment boundary from ``at`` on."""

    kind: str = "none"
    at: int = 0
    factor: float = 10.0

    def link_factor(self, step: int) -> float:
        """How many times slower the inter-node link is at ``step`` than healthy."""
        return self.factor if self.kind == "link-degrades" and step >= self.at else 1.0

    def topology(self, base: Topology, step: int) -> Topology:
        if self.link_factor(step) != 1:
            return replace(base, name=f"{base.name} (inter-node x{self.factor:g} slower)",
                           beta_inter=base.beta_inter * self.factor, alpha_inter=base.alpha_inter * self.factor)
        return base

    def world(self, world: int, step: int) -> int:
        """Ranks alive at ``step``: the first node's alone once the second is lost."""
        return world // 2 if self.kind == "node-lost" and step >= self.at else world

    def model(self, model, step: int):
        """The model trained at ``step``: ``factor`` times the sequence length once it grew."""
        return replace(model, seq=model.seq * int(self.factor)) if self.kind == "seq-grows" and step >= self.at \
            else model

    def label(self) -> str:
        if self.kind == "none":
            return "none"
        return f"{self.kind}@{self.at}" + (f"x{self.factor:g}" if self.kind == "seq-grows" else "")


DEFAULT_FACTOR = {"link-degrades": 10.0, "node-lost": 1.0, "seq-grows": 2.0}


def parse_scenario(text: str) -> Scenario:
    """``none``, ``link-degrades@STEP[xFACTOR]``, ``node-lost@STEP`` or ``seq-grows@STEP[xFACTOR]``."""
    if text == "none":
        return Scenario()
    kind, _, rest = text.partition("@")
    usage = "none, link-degrades@STEP[xFACTOR], node-lost@STEP or seq-grows@STEP[xFACTOR]"
    if kind not in DEFAULT_FACTOR or not rest:
        raise UsageError(f"{{scenario}} {text!r}: {usage}", "scenario")
    at, _, factor = rest.partition("x")
    if factor and kind == "node-lost":
        raise UsageError(f"{{scenario}} {text!r}: node-lost takes no FACTOR", "scenario")
    try:
        s = Scenario(kind, int(at), float(factor) if factor else DEFAULT_FACTOR[kind])
    except ValueError:
        raise UsageError(f"{{scenario}} {text!r}: STEP must be a whole number and FACTOR a number", "scenario") \
            from None
    if s.at < 0 or not 1 <= s.factor <= 1e4:
        raise UsageError(f"{{scenario}} {text!r}: STEP >= 0 and FACTOR in 1..10000", "scenario")
    if kind == "seq-grows" and s.factor not in (2, 4, 8):
        raise UsageError(f"{{scenario}} {text!r}: the sequence grows 2, 4 or 8 times", "scenario")
    return s
