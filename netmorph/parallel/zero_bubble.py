"""Zero-bubble pipeline schedules (Qi et al. 2024, "Zero Bubble Pipeline Parallelism") as data.

Each backward is split into B, the input gradient the previous stage waits for, and W, the weight gradient only
the optimizer needs (:mod:`netmorph.models.weight_grad`). 1F1B runs B and W together, so a stage's drain
waits (p - 1)·(T_F + T_B + T_W); moving the W's into those waits leaves (p - 1)·(T_F + T_B - T_W) -- with the
paper's T_F = T_B = T_W, a third of 1F1B's bubble -- at 1F1B's activation memory.

``zb-h1`` is built the way the paper's handcrafted ZB-H1 reads: a pipeline of unit-cost F, B and W played step
by step, every rank taking the ready B first (the critical path), else a W when it owes p of them, else its next
F while it holds fewer than p - r microbatches between F and B (1F1B's activation bound), else a W it owes, else
waiting. Beside 1F1B's activations a rank then holds at most p - 1 microbatches' weight-gradient stash (each
linear layer's input and output gradient, what the W GEMMs read): with unit F, B and W the played bubble is
0.41 of 1F1B's at p 4, m 8 (theory: (p-1)(F+B-W) over 1F1B's (p-1)(F+B+W), the drain included). The slots it ran, in order, are the schedule:
a list per rank (:func:`netmorph.parallel.pipeline.schedule` makes them its ``Slot`` s) that
:func:`~netmorph.parallel.pipeline.check` plays for deadlock before it runs.
"""

from __future__ import annotations

from collections import namedtuple

Step = namedtuple("Step", "kind microbatch")


def zb_h1(pp: int, m: int) -> list[list[Step]]:
    """Every pipeline rank's (kind, microbatch) F, B and W slots of ZB-H1 (one chunk per rank), in order."""
    nxt = [0] * pp                          # each rank's next forward
    f_done, b_done = [set() for _ in range(pp)], [set() for _ in range(pp)]
    owed = [[] for _ in range(pp)]          # microbatches whose B ran and W did not, oldest first
    out = [[] for _ in range(pp)]
    while any(len(o) < 3 * m for o in out):
        step = []
        for r in range(pp):
            ready_b = [i for i in sorted(f_done[r] - b_done[r]) if r == pp - 1 or i in b_done[r + 1]]
            if ready_b:
                step.append((r, Step("B", ready_b[0])))
            elif len(owed[r]) >= pp:                # the stash bound: at most p - 1 W's owed past a step
                step.append((r, Step("W", owed[r][0])))
            elif nxt[r] < m and (r == 0 or nxt[r] in f_done[r - 1]) and len(f_done[r]) - len(b_done[r]) < pp - r:
                step.append((r, Step("F", nxt[r])))
            elif owed[r]:
                step.append((r, Step("W", owed[r][0])))
        if not step:
            raise RuntimeError("zb-h1: no rank can move")          # cannot happen: the play is deadlock-free
        for r, s in step:                   # every slot of the step ends at once: its results visible next step
            out[r].append(s)
            if s.kind == "F":
                f_done[r].add(s.microbatch)
                nxt[r] += 1
            elif s.kind == "B":
                b_done[r].add(s.microbatch)
                owed[r].append(s.microbatch)
            else:
                owed[r].pop(0)
    return out


def bubble(slots: list, cost=None) -> float:
    """The idle share of the schedule played with ``cost`` seconds a slot kind (default the paper's unit F, B and
    W; a joint backward "B" of a schedule with no W costs B + W), each slot starting when it is ready and its
    rank free: 1 - (busy time) / (ranks x makespan)."""
    split = any(s.kind == "W" for row in slots for s in row)
    cost = cost or {"F": 1.0, "B": 1.0 if split else 2.0, "W": 1.0}
    pp = len(slots)
    end, free, pos = {}, [0.0] * pp, [0] * pp
    while any(pos[r] < len(slots[r]) for r in range(pp)):
        moved = False
        for r in range(pp):
            while pos[r] < len(slots[r]):
                s = slots[r][pos[r]]
                if s.kind == "F":
                    deps = [] if r == 0 else [("F", r - 1, s.microbatch)]
                elif s.kind == "B":
                    deps = [("F", r, s.microbatch)] + ([] if r == pp - 1 else [("B", r + 1, s.microbatch)])
                else:
                    deps = [("B", r, s.microbatch)]
                if any(d not in end for d in deps):
                    break
                start = max([free[r]] + [end[d] for d in deps])
                free[r] = end[(s.kind, r, s.microbatch)] = start + cost[s.kind]
                pos[r] += 1
                moved = True
        if not moved:
            raise RuntimeError("the schedule deadlocks")
    busy = sum(cost[s.kind] for row in slots for s in row)
    return 1 - busy / (pp * max(free))
