"""Reshard the live training state from one layout to another: a transfer plan as data, then run it.

What Megatron's and torch.distributed.checkpoint's resharding (and Varuna's job morphing)
do through a checkpoint, done rank to rank over the fabric: every rank of layout B needs
its parameters, Adam moments and step count; layout A's ranks hold them in other pieces.
:func:`plan` decides, from the two layouts' element maps (:mod:`netmorph.morph.layouts`),
who sends which elements of which state to whom -- a rank keeps what it already holds; an
element it lacks comes from the first rank of A that holds it, preferring one on the same
node -- and counts it before anything moves: bytes per (source, destination), messages,
the rounds of a one-message-per-peer exchange. :func:`run_rank` executes it on a rank with
the runtime's ``send``/``recv`` (ledger phase ``morph``), so the counted bytes are what the
ledger records. Both layouts run on the same world of ranks (rank i of A becomes rank i of B) -- or,
after a node is lost, B runs on A's survivors (``alive``; survivor i becomes rank i of B) and only
what they hold can be sent: an element no survivor holds raises :class:`StateLost`, and the run
must go back to its last checkpoint (:func:`restore`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from netmorph.cost.topology import node_of
from netmorph.mesh.elements import element_map
from netmorph.mesh.layout import Layout
from netmorph.morph.layouts import grow_sources
from netmorph.runtime.launch import launch

KINDS = ("params", "m", "v")


class StateLost(ValueError):
    """Some element of the training state was held only by ranks that are gone."""


@dataclass
class Transfer:
    """Elements one rank sends another: for each state kind, the source offsets and destination offsets."""

    src: int
    dst: int
    parts: dict = field(default_factory=dict)  # kind -> (source offsets, destination offsets)

    @property
    def elements(self) -> int:
        return sum(len(s) for s, _ in self.parts.values())


@dataclass
class Plan:
    before: Layout
    after: Layout
    world: int
    itemsize: int
    transfers: list  # Transfer, src != dst
    local: dict  # rank -> {kind: (offsets in A, offsets in B)} kept in place
    maps_before: list
    maps_after: list
    sources: dict = None  # when the context grew: kind -> the id in A each id of B starts from (-1: zero)

    def bytes_matrix(self) -> np.ndarray:
        """[src, dst] bytes on the wire."""
        out = np.zeros((self.world, self.world), dtype=np.int64)
        for t in self.transfers:
            out[t.src, t.dst] += t.elements * self.itemsize
        return out

    @property
    def bytes(self) -> int:
        return int(self.bytes_matrix().sum())

    @property
    def messages(self) -> int:
        return len(self.transfers)

    @property
    def rounds(self) -> int:
        """Rounds of an exchange in which each rank sends and receives at most one message per round."""
        if not self.transfers:
            return 0
        out = np.zeros(self.world, dtype=np.int64)
        inn = np.zeros(self.world, dtype=np.int64)
        for t in self.transfers:
            out[t.src] += 1
            inn[t.dst] += 1
        return int(max(out.max(), inn.max()))

    def kept_bytes(self) -> int:
        return sum(len(a) for kinds in self.local.values() for a, _ in kinds.values()) * self.itemsize

    def summary(self) -> dict:
        return {
            "before": self.before.tag(),
            "after": self.after.tag(),
            "bytes": self.bytes,
            "messages": self.messages,
            "rounds": self.rounds,
            "kept_bytes": self.kept_bytes(),
        }


def _holders(maps, kind: str):
    """(global ids, rank, offset) of every element some rank holds of ``kind``, sorted by (id, rank)."""
    ids, ranks, offs = [], [], []
    for r, m in enumerate(maps):
        lo, hi = m.params if kind == "params" else m.optimizer
        g = m.flat[lo:hi]
        keep = g >= 0
        ids.append(g[keep])
        ranks.append(np.full(int(keep.sum()), r, dtype=np.int64))
        offs.append(np.arange(lo, hi, dtype=np.int64)[keep])
    ids, ranks, offs = (np.concatenate(x) for x in (ids, ranks, offs))
    order = np.lexsort((ranks, ids))
    return ids[order], ranks[order], offs[order]


def plan(cfg, before: Layout, after: Layout, itemsize: int = 8, gpus_per_node: int = 8, alive=None, grown=None) -> Plan:
    """The transfer plan from ``before`` to ``after`` for model ``cfg``: on the same ranks, or on ``before``'s
    surviving ranks ``alive`` (``after.world`` of them, in order; the plan numbers them 0.. as ``after`` does),
    or on ``before``'s ranks and ranks joining after them (``after.world`` larger: the joiners hold nothing and
    are sent all they need); into ``grown``, ``cfg`` with a longer context, if given
    (:func:`~netmorph.morph.layouts.grow_sources`)."""
    alive = list(range(before.world)) if alive is None else sorted(alive)
    joining = after.world > len(alive) and alive == list(range(before.world))
    if (after.world != len(alive) and not joining) or not set(alive) <= set(range(before.world)):
        raise ValueError(
            f"{after.tag()} must span the {len(alive)} surviving ranks of {before.tag()}'s "
            f"{before.world} ({after.world} != {len(alive)})"
        )
    before_maps = element_map(cfg, before)
    A = [before_maps[r] for r in alive]
    B = element_map(grown or cfg, after)
    sources = grow_sources(cfg, grown) if grown else None
    world = after.world
    transfers: dict = {}
    local: dict = {}
    for kind in KINDS:
        h_ids, h_rank, h_off = _holders(A, kind)
        for dst, m in enumerate(B):
            lo, hi = m.params if kind == "params" else m.optimizer
            need = m.flat[lo:hi]
            keep = need >= 0
            need, at = need[keep], np.arange(lo, hi, dtype=np.int64)[keep]
            if sources:
                need = sources[kind][need]
                need, at = need[need >= 0], at[need >= 0]  # the rest start at zero: nothing to send
            first = np.searchsorted(h_ids, need, side="left")
            last = np.searchsorted(h_ids, need, side="right")
            if np.any(first == last):
                raise StateLost(
                    f"{kind}: {int((first == last).sum()):,} elements held by no surviving rank of {before.tag()}"
                )
            # the source: dst itself when it holds the element, else the first holder on dst's node, else the first
            src = h_rank[first].copy()
            off = h_off[first].copy()
            span = int((last - first).max())
            found_self = np.zeros(len(need), dtype=bool)
            found_node = np.zeros(len(need), dtype=bool)
            for k in range(span):
                idx = first + k
                valid = idx < last
                r = np.where(valid, h_rank[np.minimum(idx, len(h_rank) - 1)], -1)
                o = h_off[np.minimum(idx, len(h_off) - 1)]
                is_self = valid & (r == dst) & ~found_self
                src[is_self], off[is_self] = dst, o[is_self]
                found_self |= is_self
                near = valid & ~found_self & ~found_node & (node_of(r, gpus_per_node) == node_of(dst, gpus_per_node))
                src[near], off[near] = r[near], o[near]
                found_node |= near
            for s in np.unique(src):
                sel = src == s
                if s == dst:
                    local.setdefault(dst, {})[kind] = (off[sel], at[sel])
                else:
                    t = transfers.setdefault((int(s), dst), Transfer(int(s), dst))
                    t.parts[kind] = (off[sel], at[sel])
    return Plan(before, after, world, itemsize, [transfers[k] for k in sorted(transfers)], local, A, B, sources)


def run_rank(comm, p: Plan, state: dict) -> dict:
    """This rank's state under ``p.after`` from its state under ``p.before``.

    ``state``: {"params": the flat buffer (numpy; only its held range meaningful), "m", "v": Adam's moments
    over the optimizer range, "t": Adam's step}; the result also says how many ``seconds`` the exchange took
    here. Messages go in the ``morph`` ledger phase: a rank posts all
    its receives, then all its sends, then waits for them all."""
    me = comm.rank
    A, B = (p.maps_before[me] if me < len(p.maps_before) else None), p.maps_after[me]  # None: a rank joining
    dtype = state["params"].dtype
    out = {"params": np.zeros(B.flat.size, dtype=dtype), "t": state["t"]}
    olo, ohi = B.optimizer
    for kind in ("m", "v"):
        out[kind] = np.zeros(ohi - olo, dtype=dtype)

    def src_view(kind):
        return state["params"] if kind == "params" else state[kind]

    def src_base(kind):
        return 0 if kind == "params" else A.optimizer[0]

    def dst_put(kind, at, values):
        if kind == "params":
            out["params"][at] = values
        else:
            out[kind][at - olo] = values

    for kind, (src_off, dst_off) in p.local.get(me, {}).items():
        dst_put(kind, dst_off, src_view(kind)[src_off - src_base(kind)])
    t0 = time.perf_counter()
    with comm.phase("morph"):
        incoming = [(t, np.empty(t.elements, dtype=dtype)) for t in p.transfers if t.dst == me]
        works = [comm.irecv(buf, t.src) for t, buf in incoming]
        for t in (t for t in p.transfers if t.src == me):
            buf = np.concatenate([src_view(k)[t.parts[k][0] - src_base(k)] for k in KINDS if k in t.parts])
            works.append(comm.isend(buf, t.dst))
        for w in works:
            w.wait()
        for t, buf in incoming:
            pos = 0
            for k in KINDS:
                if k in t.parts:
                    n = len(t.parts[k][1])
                    dst_put(k, t.parts[k][1], buf[pos : pos + n])
                    pos += n
    out["seconds"] = time.perf_counter() - t0
    return out


def execute(p: Plan, states: list, backend: str = "local", timeout: float = 30.0, topology=None) -> tuple[list, object]:
    """Run ``p`` on ``p.world`` processes from every rank's ``states`` (rank order; fewer than ``p.world``, or None,
    for ranks joining), on an emulated ``topology`` if given; (new states, Ledger)."""
    got = launch(_run, p.world, p, states, backend=backend, timeout=timeout, ledger=True, topology=topology)
    return list(got), got.ledger


def _run(comm, p: Plan, states: list) -> dict:
    if comm.rank < len(states) and states[comm.rank] is not None:
        return run_rank(comm, p, states[comm.rank])
    # a rank joining: it holds nothing but knows the step count (the rendezvous tells it)
    return run_rank(comm, p, {"params": np.zeros(0, dtype=states[0]["params"].dtype), "t": states[0]["t"]})


def gather_reference(p: Plan, states: list) -> dict:
    """The whole model's state gathered to one place from layout ``p.before``'s (surviving) ranks: {kind: array
    over global ids} -- what every rank of ``p.after`` must hold its pieces of."""
    return gather(p.maps_before, states)


def gather(maps: list, states: list) -> dict:
    """{kind: array over global ids} from the ranks' ``states`` under their element ``maps`` (NaN: held by none)."""
    n = max(int(m.flat.max()) for m in maps) + 1
    out = {}
    for kind in KINDS:
        full = np.full(n, np.nan)
        for m, st in zip(maps, states):
            lo, hi = m.params if kind == "params" else m.optimizer
            g = m.flat[lo:hi]
            vals = st["params"][lo:hi] if kind == "params" else st[kind]
            full[g[g >= 0]] = vals[g >= 0]
        out[kind] = full
    return out


def _expected(reference: dict, kind: str, ids: np.ndarray, sources) -> np.ndarray:
    """The values elements ``ids`` of the new layout start from: the reference's, through ``sources`` when the
    context grew (0 for a fresh element)."""
    if sources is None:
        return reference[kind][ids]
    src = sources[kind][ids]
    return np.where(src >= 0, reference[kind][np.maximum(src, 0)], 0.0)


def restore(cfg, layout: Layout, states: list, after: Layout, grown=None) -> list:
    """Every rank's state under ``after`` (of model ``grown`` if given) from a checkpoint of all of ``layout``'s
    ranks -- what loading a torch.distributed.checkpoint into a new sharding does, read locally (no bytes on the
    fabric)."""
    ref = gather(element_map(cfg, layout), states)
    sources = grow_sources(cfg, grown) if grown else None
    dtype = states[0]["params"].dtype
    out = []
    for m in element_map(grown or cfg, after):
        st = {"params": np.zeros(m.flat.size, dtype=dtype), "t": states[0]["t"]}
        held = m.flat >= 0
        st["params"][held] = _expected(ref, "params", m.flat[held], sources)
        lo, hi = m.optimizer
        g = m.flat[lo:hi]
        for kind in ("m", "v"):
            st[kind] = np.zeros(hi - lo, dtype=dtype)
            st[kind][g >= 0] = _expected(ref, kind, g[g >= 0], sources)
        out.append(st)
    return out


def matches(p: Plan, states: list, reference: dict) -> bool:
    """Whether every rank's state under ``p.after`` holds exactly the reference's values at its global ids (through
    the plan's ``sources`` when the context grew)."""
    for m, st in zip(p.maps_after, states):
        for kind in KINDS:
            lo, hi = m.params if kind == "params" else m.optimizer
            g = m.flat[lo:hi]
            have = st["params"][lo:hi] if kind == "params" else st[kind]
            if not np.array_equal(have[g >= 0], _expected(reference, kind, g[g >= 0], p.sources)):
                return False
    return True
