"""Pipeline schedules as data: per pipeline rank, the ordered :class:`Slot` s ``(F|B|W, microbatch, chunk)`` it
runs -- the one object that is printed, drawn, played for deadlock and peak memory, priced by the planner and the
step simulator, and executed by :class:`netmorph.parallel.pipeline.Executor`.

- ``afab`` -- GPipe (Huang et al. 2019): all forwards, then all backwards; m microbatches in flight on every
  stage; bubble (p-1)/(m+p-1).
- ``1f1b`` -- PipeDream-flush, Megatron's ``forward_backward_pipelining_without_interleaving``: p-r-1 warm-up
  forwards, then one forward one backward, then the cool-down; at most p microbatches in flight; the same
  bubble, less memory.
- ``interleaved`` -- Megatron's ``forward_backward_pipelining_with_interleaving`` (Narayanan et al. 2021): each
  rank holds V model chunks (virtual stage ``c·p + r``); bubble (p-1)/(V·m+p-1); needs m a multiple of p.
- ``zb-h1``, ``zbv``, ``dualpipev`` -- the zero-bubble ones (:mod:`netmorph.mesh.zero_bubble`): each backward
  as B, the input gradient, and a later W, the weight gradient that fills the bubble; the last two hold two
  chunks a rank in a V (chunk 1 is virtual stage 2p - 1 - r).

Torch-free, so the planner plays a schedule as the trainer runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from netmorph.errors import UsageError
from netmorph.mesh.settings import SCHEDULES, SPLIT_BACKWARD, V_SHAPED
from netmorph.mesh.zero_bubble import dualpipev, zb_h1, zbv

__all__ = [
    "SCHEDULES",
    "SPLIT_BACKWARD",
    "V_SHAPED",
    "Slot",
    "bubble",
    "check",
    "draw",
    "idle",
    "idle_of",
    "in_flight",
    "levels",
    "peaks",
    "rank_of",
    "schedule",
    "stage_of",
    "theory",
    "w_stash",
]
_BUILT = {"zb-h1": zb_h1, "zbv": zbv, "dualpipev": dualpipev}


@dataclass(frozen=True)
class Slot:
    kind: str  # "F", "B" (with W: the input gradient alone) or "W" (the weight gradient)
    microbatch: int
    chunk: int = 0  # model chunk on this rank (interleaved: virtual stage chunk·p + rank; a V: 2p-1-rank)

    def __str__(self):
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


def schedule(name: str, pp: int, m: int, v: int = 1) -> list[list[Slot]]:
    """Every pipeline rank's slots, in order."""
    if name not in SCHEDULES:
        raise UsageError(f"{{schedule}} must be one of {', '.join(SCHEDULES)}, got {name!r}", "schedule")
    if name in V_SHAPED:
        if pp < 2 or v != 2 or (name == "dualpipev" and m < 2 * pp):
            raise UsageError(
                f"{{schedule}} {name} runs two chunks on each of pp > 1 ranks"
                + (f" and at least 2·pp = {2 * pp} {{microbatches}}" if name == "dualpipev" else ""),
                "schedule",
            )
    elif name != "interleaved" and v != 1:
        raise UsageError(f"{{interleave}} {v} needs {{schedule}} interleaved", "interleave")
    if name in _BUILT:
        return [list(row) for row in _built(name, pp, m)]
    if name == "afab":
        return [[Slot("F", i) for i in range(m)] + [Slot("B", i) for i in range(m)] for _ in range(pp)]
    if name == "1f1b":
        out = []
        for r in range(pp):
            warm = min(pp - r - 1, m)
            slots = [Slot("F", i) for i in range(warm)]
            f, b = warm, 0
            while f < m:
                slots += [Slot("F", f), Slot("B", b)]
                f, b = f + 1, b + 1
            slots += [Slot("B", i) for i in range(b, m)]
            out.append(slots)
        return out
    if pp < 2 or m % pp:
        raise UsageError(
            f"the interleaved schedule needs pp > 1 and {{microbatches}} ({m}) a multiple of pp ({pp})", "microbatches"
        )
    total = m * v

    def virtual(k, forward):
        """Megatron's ``get_model_chunk_id`` and microbatch of the k-th forward (or backward)."""
        group = k % (pp * v)
        chunk = group // pp
        if not forward:
            chunk = v - 1 - chunk
        return chunk, (k // (pp * v)) * pp + group % pp

    out = []
    for r in range(pp):
        warm = min((pp - r - 1) * 2 + (v - 1) * pp, total)
        slots = []
        for k in range(warm):
            c, i = virtual(k, True)
            slots.append(Slot("F", i, c))
        f, b = warm, 0
        while f < total:
            c, i = virtual(f, True)
            slots.append(Slot("F", i, c))
            c, i = virtual(b, False)
            slots.append(Slot("B", i, c))
            f, b = f + 1, b + 1
        while b < total:
            c, i = virtual(b, False)
            slots.append(Slot("B", i, c))
            b += 1
        out.append(slots)
    return out


def in_flight(name: str, p: int, m: int, v: int, group: int, i: int) -> float:
    """Microbatches whose activations pipeline rank ``i`` holds at its peak, in units of the stage's whole layers:
    GPipe (afab) runs every forward first, so all m; 1F1B holds the p - i its warmup starts (Narayanan et al.
    2021), as does ZB-H1; Megatron's interleaved schedule runs 2(p - i - 1) + (v - 1)·N warmup forwards of one
    chunk (1/v of the stage's layers) each, then one more before its first backward (schedules.py's
    ``num_warmup_microbatches``; N = pp is Megatron's default, Llama 3 tunes it, section 3.3.2); ZB-V, in
    torch's order, min(2p, m + i + 1, 2m) chunks -- 1F1B's p stages' worth once m >= 2p - 1 --; DualPipeV
    2p + 1 chunks (DualPipe's table: PP + 1, PP = 2p stages)."""
    if p == 1:
        return 1.0
    if name == "afab":
        return float(m)
    if name == "interleaved":
        return min(2 * (p - i - 1) + (v - 1) * group + 1, m * v) / v
    if name == "zbv":
        return min(2 * p, m + i + 1, 2 * m) / 2
    if name == "dualpipev":
        return (2 * p + 1) / 2
    return float(min(p - i, m))


def w_stash(name: str, p: int, m: int, i: int) -> float:
    """Microbatches whose weight gradients pipeline rank ``i`` owes at its peak (B ran, W not yet), in units of
    the stage's whole layers: each keeps its linear layers' inputs and output gradients for W. ZB-H1 owes up to
    p (the B just run and p - 1 waiting for the drain, once m - p + 1 + i reach it); ZB-V, in torch's order,
    2i + 1 chunks once m >= 2p - 1 (fewer below: an upper bound there); DualPipeV i + 1 chunks (its
    ``WeightGradStore`` queue). 1F1B and the others owe none: their B runs W at once."""
    if p == 1 or name not in SPLIT_BACKWARD:
        return 0.0
    if name == "zb-h1":
        return float(min(max(m - p + 1 + i, 1), p))
    if name == "zbv":
        return (2 * i + 1) / 2
    return (i + 1) / 2


@lru_cache(maxsize=256)
def _built(name: str, pp: int, m: int) -> tuple:
    """A zero-bubble schedule's slots, built once (a planner's search plays the same ones many times)."""
    return tuple(tuple(Slot(*s) for s in row) for row in _BUILT[name](pp, m))


def stage_of(rank: int, chunk: int, pp: int, v_shaped: bool = False) -> int:
    """The virtual stage of ``rank``'s ``chunk``: chunk·p + rank (a loop), or in a V chunk 1 is 2p - 1 - rank."""
    return 2 * pp - 1 - rank if v_shaped and chunk == 1 else chunk * pp + rank


def rank_of(vs: int, pp: int, v_shaped: bool = False) -> int:
    """The pipeline rank that runs virtual stage ``vs``: :func:`stage_of` turned round."""
    return 2 * pp - 1 - vs if v_shaped and vs >= pp else vs % pp


def levels(row: list[Slot], split: bool = True):
    """(chunks in flight, weight gradients owed) after each of one rank's slots: an F holds a chunk until its B,
    and under a split backward (``split``) a B owes its W until the W runs."""
    held = owed = 0
    for s in row:
        held += {"F": 1, "B": -1, "W": 0}[s.kind]
        owed += {"F": 0, "B": 1 if split else 0, "W": -1}[s.kind]
        yield held, owed


def _needs(s: Slot, vs: int, stages: int) -> list:
    """What slot ``s`` of virtual stage ``vs`` waits for: F the previous stage's F, B its own F and the next
    stage's B, W its B."""
    if s.kind == "F":
        return [] if vs == 0 else [("F", vs - 1, s.microbatch)]
    if s.kind == "W":
        return [("B", vs, s.microbatch)]
    return [("F", vs, s.microbatch)] + ([] if vs == stages - 1 else [("B", vs + 1, s.microbatch)])


def _order(slots, v: int, v_shaped: bool) -> list:
    """Every slot as (rank, kind, what it ends, what it needs) in an order it can run -- each rank's slots in
    their order, each after what it needs (unbounded send queues). Raises if the schedule deadlocks."""
    pp = len(slots)
    stages = pp * v
    done, pos, out = set(), [0] * pp, []
    while any(pos[r] < len(slots[r]) for r in range(pp)):
        moved = False
        for r in range(pp):
            while pos[r] < len(slots[r]):
                s = slots[r][pos[r]]
                key = (s.kind, stage_of(r, s.chunk, pp, v_shaped), s.microbatch)
                need = _needs(s, key[1], stages)
                if any(d not in done for d in need):
                    break
                done.add(key)
                out.append((r, s.kind, key, need))
                pos[r] += 1
                moved = True
        if not moved:
            stuck = {r: str(slots[r][pos[r]]) for r in range(pp) if pos[r] < len(slots[r])}
            raise RuntimeError(f"pipeline schedule deadlocks: ranks wait at {stuck}")
    return out


def _makespan(order: list, pp: int, cost: dict) -> float:
    """When the last slot ends, each starting once its rank is free and what it needs has ended."""
    end, free = {}, [0.0] * pp
    for r, kind, key, need in order:
        t = free[r]
        for d in need:
            if end[d] > t:
                t = end[d]
        free[r] = end[key] = t + cost[kind]
    return max(free)


def _split(slots) -> bool:
    return any(s.kind == "W" for row in slots for s in row)


def check(slots: list[list[Slot]], v: int = 1, v_shaped: bool = False) -> int:
    """Play the schedule with unbounded send queues: raise if it deadlocks; return the most
    microbatches (chunks) any rank holds in flight (forwarded, not yet backwarded)."""
    return max(peaks(slots, v, v_shaped)[0])


def peaks(slots: list[list[Slot]], v: int = 1, v_shaped: bool = False) -> tuple[list, list]:
    """Each rank's peak chunks in flight (F run, B not) and peak weight gradients owed (B run, W not), once the
    schedule is known to run (:func:`check`)."""
    _order(slots, v, v_shaped)
    split = _split(slots)
    walks = [list(levels(row, split)) for row in slots]
    return [max(a for a, _ in w) for w in walks], [max(max(b for _, b in w), 0) for w in walks]


def _cost(slots, cost):
    return cost or {"F": 1.0, "B": 1.0 if _split(slots) else 2.0, "W": 1.0}


def idle(slots: list[list[Slot]], v: int = 1, v_shaped: bool = False, cost=None) -> float:
    """The least loaded rank's idle seconds, played with ``cost``: the makespan less its busy time."""
    cost = _cost(slots, cost)
    return _makespan(_order(slots, v, v_shaped), len(slots), cost) - min(
        sum(cost[s.kind] for s in row) for row in slots
    )


@lru_cache(maxsize=256)
def _order_of(name: str, pp: int, m: int, v: int) -> tuple:
    return tuple(_order(schedule(name, pp, m, v), v, name in V_SHAPED))


def idle_of(name: str, pp: int, m: int, v: int, f: float, b: float, w: float) -> float:
    """:func:`idle` of schedule ``name`` with F, B and W of ``f``, ``b`` and ``w`` seconds, its order found once
    (a planner's search plays the same schedule at many costs)."""
    busy = m * v * (f + b + w)
    return _makespan(_order_of(name, pp, m, v), pp, {"F": f, "B": b, "W": w}) - busy


def bubble(slots: list[list[Slot]], v: int = 1, v_shaped: bool = False, cost=None) -> float:
    """The idle share of the schedule played with ``cost`` seconds a slot kind (default the paper's unit F, B and
    W; a joint backward "B" of a schedule with no W costs B + W), each slot starting when it is ready and its
    rank free: 1 - (busy time) / (ranks x makespan)."""
    cost = _cost(slots, cost)
    busy = sum(cost[s.kind] for row in slots for s in row)
    return 1 - busy / (len(slots) * _makespan(_order(slots, v, v_shaped), len(slots), cost))


def theory(name: str, pp: int, m: int, v: int = 1) -> tuple[float, str]:
    """(bubble fraction, its form) of schedule ``name`` with the paper's unit F, B and W (1F1B's B is both):
    GPipe and 1F1B (p-1)/(m+p-1); interleaved (p-1)/(v·m+p-1); ZB-H1 (p-1)(F+B-W) idle of 3m busy slots,
    (p-1)/(3m+p-1); ZB-V and DualPipeV p - 1 idle chunk slots of 6m, (p-1)/(6m+p-1) (ZB-V from m >= 2p - 1)."""
    if name == "zb-h1":
        return (pp - 1) / (3 * m + pp - 1), "(p-1)/(3m+p-1)"
    if name in V_SHAPED:
        return (pp - 1) / (6 * m + pp - 1), "(p-1)/(6m+p-1)"
    return (pp - 1) / (v * m + pp - 1), "(p-1)/(v·m+p-1)"


def draw(slots: list[list[Slot]]) -> str:
    """One line per rank, one cell per slot: ``F0 F1 B0 ...``."""
    return "\n".join(f"rank {r}: " + " ".join(str(s) for s in row) for r, row in enumerate(slots))
