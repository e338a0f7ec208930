"""What happens to a training job while it runs: the scenarios morph's control loop meets, as data.

A scenario is a list of events, each ``KIND@STEP[xFACTOR]``, comma-separated and composable:

- ``link-degrades@STEP[xF]``: the inter-node links F (10) times slower (bandwidth divided, latency multiplied), as
  a congested or degraded network; ``link-recovers@STEP``: healthy again;
- ``node-lost@STEP[:NODE]``: node NODE's ranks gone (the second node, 1, unless NODE is 0), with whatever state only
  they held, as torchelastic sees a lost agent (killed: SIGKILL); ``node-hangs@STEP[:NODE]``: the same ranks stopped
  instead (SIGSTOP: alive, silent -- a hung driver, a stuck NFS read), so that only their heartbeats stopping tells;
  ``node-joins@STEP``: a node of as many ranks back (after a loss) in the lost one's slots, holding nothing;
- ``seq-grows@STEP[xF]``: the context F (2, 4 or 8) times longer, as a long-context phase of training;
- ``memory-shrinks@STEP[xF]``: each rank's memory F (2) times smaller than a whole replica of the training state
  needs (another job on the device, a fragmented allocator): only layouts that shard it fit.

:func:`netmorph.cost.topology.two_nodes` is the emulated two-node cluster they happen on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from netmorph.cost.topology import Topology
from netmorph.errors import UsageError

# kind -> its FACTOR's default (None: takes no FACTOR)
KINDS = {
    "link-degrades": 10.0,
    "link-recovers": None,
    "node-lost": None,
    "node-hangs": None,
    "node-joins": None,
    "seq-grows": 2.0,
    "memory-shrinks": 2.0,
}
LOSSES = ("node-lost", "node-hangs")  # a node out of the job: killed, or stopped
USAGE = (
    "none, or events KIND@STEP[xFACTOR] joined by commas: link-degrades@STEP[xF], link-recovers@STEP, "
    "node-lost@STEP[:NODE], node-hangs@STEP[:NODE] (NODE 0 or 1, default 1), node-joins@STEP, "
    "seq-grows@STEP[xF] (F 2, 4 or 8), memory-shrinks@STEP[xF]"
)


@dataclass(frozen=True)
class Event:
    kind: str
    at: int
    factor: float = 1.0
    node: int = 1  # a loss: which of the two nodes

    @property
    def loss(self) -> bool:
        """A node out of the job (killed or stopped)."""
        return self.kind in LOSSES

    def label(self) -> str:
        return (
            f"{self.kind}@{self.at}"
            + (f"x{self.factor:g}" if KINDS[self.kind] is not None else "")
            + (f":{self.node}" if self.kind in LOSSES and self.node != 1 else "")
        )


@dataclass(frozen=True)
class Scenario:
    """Events in step order; each takes effect from its step on (a loss, a join, a growth or a memory change at
    the first segment boundary from there). A step here is one on the cluster's clock -- steps run, redone ones
    included -- so a run that goes back to a checkpoint does not undo what happened to the cluster."""

    events: tuple = ()

    def _until(self, step: int):
        return [e for e in self.events if e.at <= step]

    def link_factor(self, step: int) -> float:
        """How many times slower the inter-node link is at ``step`` than healthy."""
        f = 1.0
        for e in self._until(step):
            f = e.factor if e.kind == "link-degrades" else 1.0 if e.kind == "link-recovers" else f
        return f

    def topology(self, base: Topology, step: int) -> Topology:
        f = self.link_factor(step)
        if f == 1:
            return base
        return replace(
            base,
            name=f"{base.name} (inter-node x{f:g} slower)",
            beta_inter=base.beta_inter * f,
            alpha_inter=base.alpha_inter * f,
        )

    def world(self, world: int, step: int) -> int:
        """Ranks alive at ``step``: one node's while the other is lost."""
        w = world
        for e in self._until(step):
            w = world // 2 if e.kind in LOSSES else world if e.kind == "node-joins" else w
        return w

    def model(self, model, step: int):
        """The model trained at ``step``: its sequence the product of the growths so far."""
        seq = model.seq
        for e in self._until(step):
            seq = seq * int(e.factor) if e.kind == "seq-grows" else seq
        return model if seq == model.seq else replace(model, seq=seq)

    def memory(self, step: int) -> float:
        """Each rank's memory at ``step`` as a share of a whole replica of the training state (inf: no limit)."""
        m = float("inf")
        for e in self._until(step):
            m = 1 / e.factor if e.kind == "memory-shrinks" else m
        return m

    @property
    def at(self) -> int:
        """The first event's step (the run's healthy part ends there); 0 without events."""
        return self.events[0].at if self.events else 0

    def label(self) -> str:
        return ",".join(e.label() for e in self.events) or "none"


def parse_scenario(text: str) -> Scenario:
    """``none`` or events (module docstring): one line naming what to change for anything else."""
    if text == "none":
        return Scenario()
    events, lost = [], False
    for part in text.split(","):
        kind, _, rest = part.strip().partition("@")
        if kind not in KINDS or not rest:
            raise UsageError(f"{{scenario}} {part!r}: {USAGE}", "scenario")
        rest, colon, node = rest.partition(":")
        if colon and (kind not in LOSSES or node not in ("0", "1")):
            raise UsageError(f"{{scenario}} {part!r}: only node-lost and node-hangs name a NODE, 0 or 1", "scenario")
        at, _, factor = rest.partition("x")
        if factor and KINDS[kind] is None:
            raise UsageError(f"{{scenario}} {part!r}: {kind} takes no FACTOR", "scenario")
        try:
            e = Event(kind, int(at), float(factor) if factor else KINDS[kind] or 1.0, int(node) if colon else 1)
        except ValueError:
            raise UsageError(
                f"{{scenario}} {part!r}: STEP must be a whole number and FACTOR a number", "scenario"
            ) from None
        if e.at < 0 or not 1 <= e.factor <= 1e4:
            raise UsageError(f"{{scenario}} {part!r}: STEP >= 0 and FACTOR in 1..10000", "scenario")
        if kind == "seq-grows" and e.factor not in (2, 4, 8):
            raise UsageError(f"{{scenario}} {part!r}: the sequence grows 2, 4 or 8 times", "scenario")
        if events and e.at < events[-1].at:
            raise UsageError(
                f"{{scenario}} {text!r}: events in step order ({part} after {events[-1].label()})", "scenario"
            )
        if (kind in LOSSES or kind == "node-joins") and lost == (kind in LOSSES):
            raise UsageError(
                f"{{scenario}} {part!r}: "
                + ("a node is already lost" if lost else "node-joins needs a node-lost (or node-hangs) before it"),
                "scenario",
            )
        lost = True if kind in LOSSES else False if kind == "node-joins" else lost
        events.append(e)
    return Scenario(tuple(events))
