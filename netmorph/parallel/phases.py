"""One training step of one rank split by what it did, from its own clock: the slots of the pipeline schedule
(:class:`~netmorph.parallel.pipeline.Executor`'s spans), the ledger's messages by phase (each round from its
send to its completion, waiting for the peer included) and the optimizer's window -- the measured side of the
planner's :func:`~netmorph.planner.timing.step_time` parts, as Megatron's timers (``forward-backward``,
``all-grads-sync``, ``optimizer``) split an iteration.

- ``compute``: the forward and backward slots less the collectives that ran inside them;
- ``tp``: tensor-parallel collectives (``tp``, ``tp.sp-grads``), inside the slots or not;
- ``ep``: the mixture of experts' all-to-alls and their counts (``moe.*``);
- ``dp``: gradient reduction and ZeRO's gathers (``dp``, ``zero``, ``edp``, ``zero.edp``): ZeRO's whole (the
  rank's own thread runs it), DDP's buckets outside the slots -- what the backward did not hide;
- ``optimizer``: the optimizer's step less the ZeRO gathers inside it;
- ``rest``: the step's remainder -- the pipeline's bubble, waits for a neighbour stage and its sends, the tied
  embedding's reduction, the loss, the host's own work.

The six add up to the step.
"""

from __future__ import annotations

PHASES = ("compute", "tp", "ep", "dp", "optimizer", "rest")
# ledger phase (its first word) -> the step's part; ``zero`` runs on the rank's own thread (ZeRO-3's gathers
# inside the slots), ``dp`` / ``edp`` on DDP's communication thread where the trainer overlaps its buckets
GROUPS = {"tp": "tp", "moe": "ep", "zero": "zero", "dp": "dp", "edp": "dp"}


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
    comm = {g: [] for g in set(GROUPS.values())}
    for r in records:
        group = GROUPS.get(r.phase.split(".")[0]) if r.phase else None
        if group is not None and r.t1 > lo and r.t0 < hi:
            comm[group].append((max(r.t0, lo), min(r.t1, hi)))
    comm = {k: union(v) for k, v in comm.items()}
    own = union(comm["tp"] + comm["ep"] + comm["zero"])      # what the rank's own thread waited on in its slots
    reduce = union(comm["zero"] + comm["dp"])
    out = {"compute": length(busy) - overlap(own, busy), "tp": length(comm["tp"]), "ep": length(comm["ep"]),
           "dp": length(comm["zero"]) + length(comm["dp"]) - overlap(comm["dp"], busy)}
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
