"""One training step of one rank split by what it did, from its own clock: the slots of the pipeline schedule
(:class:`~netmorph.parallel.pipeline.Executor`'s spans), the ledger's messages by phase (each round from its
send to its completion, waiting for the peer included) and the optimizer's window -- the measured side of the
planner's :func:`~netmorph.planner.timing.step_time` parts, as Megatron's timers (``forward-backward``,
``all-grads-sync``, ``optimizer``) split an iteration.

- ``compute``: the forward and backward slots less the collectives that ran inside them;
- ``tp``: tensor-parallel collectives (``tp``, ``tp.sp-grads``), inside the slots or not;
- ``cp``: context parallelism's K/V exchange inside the attention (ring hops, gathers or all-to-alls);
- ``ep``: the mixture of experts' all-to-alls and their counts (``moe.*``);
- ``dp``: gradient reduction and ZeRO's gathers (``dp``, ``zero``, ``edp``, ``zero.edp``): ZeRO's whole (the
  rank's own thread runs it), DDP's buckets outside the slots -- what the backward did not hide;
- ``optimizer``: the optimizer's step less the ZeRO gathers inside it;
- ``rest``: the step's remainder -- the pipeline's bubble, waits for a neighbour stage and its sends, the tied
  embedding's reduction, the loss, the host's own work.

The seven add up to the step.
"""

from __future__ import annotations

from dataclasses import dataclass

PHASES = ("compute", "tp", "cp", "ep", "dp", "optimizer", "rest")


@dataclass(frozen=True)
class LedgerPhase:
    """One tag of the trainer's ledger (``with comm.phase(name)``), the one record traffic, the step split and
    every printer read: ``group`` the step part its time counts to in :func:`split_step` (``"zero"``: ZeRO's,
    run on the rank's own thread, counted to ``dp``; None: the step's rest), ``form`` the shape of the closed
    form :mod:`netmorph.parallel.traffic` holds its bytes to, ``label`` what it is; ``shown``: a column of
    ``train``'s table."""

    name: str
    group: str | None
    form: str
    label: str
    shown: bool = True


LEDGER: dict = {}


def register_phase(ph: LedgerPhase) -> LedgerPhase:
    LEDGER[ph.name] = ph
    return ph


for _ph in (
    LedgerPhase("dp", "dp", "2(d-1)/d·Ψ·B", "the gradients' all-reduce over dp (DDP's buckets)"),
    LedgerPhase("zero", "zero", "2(d-1)/d·Ψ·B; ZeRO-3 (2m+1)(d-1)/d·Ψ·B", "ZeRO's reduce-scatter and gathers"),
    LedgerPhase("tp", "tp", "l·m·8(t-1)/t·bsh·B + embedding, LM head, loss", "tensor-parallel collectives"),
    LedgerPhase("tp.sp-grads", "tp", "2(t-1)/t·n·B", "sequence parallelism's replicated gradients over tp"),
    LedgerPhase(
        "cp",
        "cp",
        "l·m·{6(cp-1), 4(cp-1), 8(cp-1)/cp}·bsh/(cp·t)·B (p2p, all_gather, a2a)",
        "context parallelism's K/V exchange (ring attention, all-gather, Ulysses' all-to-alls)",
    ),
    LedgerPhase("pp", None, "chunk boundaries·m·bsh/t'·B", "pipeline activations forward, gradients back"),
    LedgerPhase(
        "pp.tag", None, "32 B a send", "each pipeline send's header (kind, stage, microbatch, size)", shown=False
    ),
    LedgerPhase("pp.emb", None, "V/t·h·B", "the tied word embedding's gradient, first and last stage"),
    LedgerPhase("edp", "dp", "2(e-1)/e·Ψ_E·B", "the experts' all-reduce over their expert data-parallel group"),
    LedgerPhase("zero.edp", "zero", "2(e-1)/e·Ψ_E·B", "ZeRO over the experts' expert data-parallel group"),
    LedgerPhase("moe.dispatch", "ep", "rows routed away·h·B", "tokens to their experts"),
    LedgerPhase("moe.combine", "ep", "rows routed here·h·B", "expert outputs back to their tokens"),
    LedgerPhase("moe.dispatch.bwd", "ep", "rows routed here·h·B", "the dispatch's gradient"),
    LedgerPhase("moe.combine.bwd", "ep", "rows routed away·h·B", "the combine's gradient"),
    LedgerPhase("moe.counts", "ep", "(ep-1)·E/ep·8 per layer forward", "tokens per expert, before a dispatch"),
    LedgerPhase(
        "moe.cp",
        "ep",
        "dropless 2(cp-1)/cp·(E+1)·8, capacity (cp-1)·2k·T·8 per layer forward",
        "the microbatch's routing over cp: tokens per expert (dropless) or every token's experts "
        "and gates (a capacity)",
    ),
    LedgerPhase("metrics", None, "8 B over dp", "the step's loss, summed for the log", shown=False),
    LedgerPhase("checkpoint", None, "the save plan's objects", "a checkpoint's plan exchange", shown=False),
):
    register_phase(_ph)


def shown_phases() -> tuple:
    """The ledger phases ``train`` prints a column for, in the registry's order."""
    return tuple(name for name, ph in LEDGER.items() if ph.shown)


def group_of(phase: str | None) -> str | None:
    """The step part a ledger record's phase counts to (an unregistered one: the step's rest)."""
    ph = LEDGER.get(phase) if phase else None
    return ph.group if ph is not None else None


def union(intervals) -> list:
    """The intervals merged: sorted, disjoint (t0, t1) pairs covering the same time."""
    out = []
    for t0, t1 in sorted(intervals):
        if out and t0 <= out[-1][1]:
            out[-1][1] = max(out[-1][1], t1)
        elif t1 > t0:
            out.append([t0, t1])
    return [tuple(x) for x in out]


def length(intervals) -> float:
    return sum(t1 - t0 for t0, t1 in intervals)


def overlap(a, b) -> float:
    """Seconds covered by both of two merged interval lists."""
    i = j = 0
    out = 0.0
    while i < len(a) and j < len(b):
        out += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def split_step(records, bounds, slots, optimizer) -> dict:
    """{phase: seconds} of one step (:data:`PHASES`): ``records`` the ledger's messages of this rank (t0, t1 on its
    clock), ``bounds`` the step's (t0, t1), ``slots`` its forward and backward slots' (t0, t1), ``optimizer`` the
    optimizer step's (t0, t1)."""
    lo, hi = bounds
    busy = union(slots)
    comm = {g: [] for g in ("tp", "cp", "ep", "zero", "dp")}
    for r in records:
        group = group_of(r.phase)
        if group is not None and r.t1 > lo and r.t0 < hi:
            comm[group].append((max(r.t0, lo), min(r.t1, hi)))
    comm = {k: union(v) for k, v in comm.items()}
    own = union(comm["tp"] + comm["cp"] + comm["ep"] + comm["zero"])  # what the rank's own thread waited on
    reduce = union(comm["zero"] + comm["dp"])
    out = {
        "compute": length(busy) - overlap(own, busy),
        "tp": length(comm["tp"]),
        "cp": length(comm["cp"]),
        "ep": length(comm["ep"]),
        "dp": length(comm["zero"]) + length(comm["dp"]) - overlap(comm["dp"], busy),
    }
    opt = union([(max(optimizer[0], lo), min(optimizer[1], hi))])
    out["optimizer"] = length(opt) - overlap(reduce, opt)
    out["rest"] = max(0.0, (hi - lo) - sum(out.values()))
    return out


def step_parts(reports, skip: int = 1) -> dict:
    """{phase: seconds}: the busiest rank's steps (the most compute: the pipeline's slowest stage) split, the mean
    over its steps after the first ``skip`` -- the parts add up to its mean step."""
    rank = max(reports, key=lambda r: sum(ph["compute"] for ph in r.phases_s[skip:] or r.phases_s))
    steps = rank.phases_s[skip:] or rank.phases_s
    return {k: sum(ph[k] for ph in steps) / len(steps) for k in PHASES}
