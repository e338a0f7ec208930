"""Zero-bubble pipeline schedules (Qi et al. 2024, "Zero Bubble Pipeline Parallelism"; DeepSeek-V3's DualPipeV) as
data.

Each backward is split into B, the input gradient the previous stage waits for, and W, the weight gradient only
the optimizer needs (:mod:`netmorph.models.weight_grad`). 1F1B runs B and W together, so a stage's drain
waits (p - 1)·(T_F + T_B + T_W); moving the W's into those waits leaves (p - 1)·(T_F + T_B - T_W) -- with the
paper's T_F = T_B = T_W, a third of 1F1B's bubble -- at 1F1B's activation memory.

``zb-h1`` is built the way the paper's handcrafted ZB-H1 reads: a pipeline of unit-cost F, B and W played step
by step, every rank taking the ready B first (the critical path), else a W when it owes p of them, else its next
F while it holds fewer than p - r microbatches between F and B (1F1B's activation bound), else a W it owes, else
waiting. Beside 1F1B's activations a rank then holds at most p microbatches' weight-gradient stash (each linear
layer's input and output gradient, what the W GEMMs read; :meth:`Layout.w_stash
<netmorph.mesh.layout.Layout.w_stash>`): with unit F, B and W the played bubble is
0.41 of 1F1B's at p 4, m 8 (theory: (p-1)(F+B-W) over 1F1B's (p-1)(F+B+W), the drain included). The slots it ran, in order, are the schedule:
a list per rank (:func:`netmorph.parallel.pipeline.schedule` makes them its ``Slot`` s) that
:func:`~netmorph.parallel.pipeline.check` plays for deadlock before it runs.

``zbv`` and ``dualpipev`` hold two model chunks a rank in a V: chunk 0 is virtual stage r, chunk 1 stage
2p - 1 - r, so the model runs down the ranks and back up, the bottom's hand-off is local and rank 0 holds both
the embedding and the loss.

- ``zbv``: the paper's ZB-V in torch's ``ScheduleZBVZeroBubble`` order -- 2(p - r) - 1 warm-up forwards of chunk
  0, r pairs of both chunks, p - r rounds of a chunk-1 F, B and W, then F, B, W of each chunk in turn; the
  cool-down runs B's first and fills the drain with the W's owed. 1F1B's activations (2p chunks, p stages'
  worth) and a bubble near zero for m >= 2p - 1.
- ``dualpipev``: DeepSeek's DualPipeV (the "cut-in-half" DualPipe, ``dualpipe/dualpipev.py``), its eight steps
  with its counters: F0 warm-up, F0 F1 pairs, B1 W F1 (zero bubble), the main F0&B1 F1&B0 pairs, B1 F1&B0,
  B1 B0 (the second half's W deferred), W B0, W. A pair that DeepSeek overlaps (one microbatch's forward with
  another's backward, to hide the expert all-to-alls) runs here as F then B; a backward that DualPipeV runs
  whole is B then W at once. 2p + 1 chunks in flight; m >= 2p.
"""

from __future__ import annotations

from collections import namedtuple

Step = namedtuple("Step", "kind microbatch chunk", defaults=(0,))


def zb_h1(pp: int, m: int) -> list[list[Step]]:
    """Every pipeline rank's (kind, microbatch) F, B and W slots of ZB-H1 (one chunk per rank), in order."""
    nxt = [0] * pp  # each rank's next forward
    f_done, b_done = [set() for _ in range(pp)], [set() for _ in range(pp)]
    owed = [[] for _ in range(pp)]  # microbatches whose B ran and W did not, oldest first
    out = [[] for _ in range(pp)]
    while any(len(o) < 3 * m for o in out):
        step = []
        for r in range(pp):
            ready_b = [i for i in sorted(f_done[r] - b_done[r]) if r == pp - 1 or i in b_done[r + 1]]
            if ready_b:
                step.append((r, Step("B", ready_b[0])))
            elif len(owed[r]) >= pp:  # the stash bound: at most p - 1 W's owed past a step
                step.append((r, Step("W", owed[r][0])))
            elif nxt[r] < m and (r == 0 or nxt[r] in f_done[r - 1]) and len(f_done[r]) - len(b_done[r]) < pp - r:
                step.append((r, Step("F", nxt[r])))
            elif owed[r]:
                step.append((r, Step("W", owed[r][0])))
        if not step:
            raise RuntimeError("zb-h1: no rank can move")  # cannot happen: the play is deadlock-free
        for r, s in step:  # every slot of the step ends at once: its results visible next step
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


class _Rank:
    """One rank's slots as a V schedule's source writes them: F and B of chunk c take each chunk's next
    microbatch (counters per chunk, as torch's and DeepSeek's code keep them); a B's W runs at once ("now"), waits
    in a first-in first-out queue ("queue", DualPipeV's ``WeightGradStore``) or is placed by the caller
    ("later")."""

    def __init__(self):
        self.ops, self.nf, self.nb, self.queue = [], [0, 0], [0, 0], []

    def f(self, c: int) -> None:
        self.ops.append(Step("F", self.nf[c], c))
        self.nf[c] += 1

    def b(self, c: int, w: str = "now") -> None:
        self.ops.append(Step("B", self.nb[c], c))
        if w != "later":
            (self.ops if w == "now" else self.queue).append(Step("W", self.nb[c], c))
        self.nb[c] += 1

    def w(self) -> None:
        self.ops.append(self.queue.pop(0))


def zbv(pp: int, m: int) -> list[list[Step]]:
    """Every rank's F, B, W slots of ZB-V (two chunks in a V), in torch's ``ScheduleZBVZeroBubble`` order: its
    microbatches past m (it plays at least 2p - 1) dropped."""
    n = max(2 * pp - 1, m)
    out = []
    for r in range(pp):
        k = _Rank()
        for _ in range(2 * (pp - r) - 1):
            k.f(0)
        for _ in range(r):
            k.f(1), k.f(0)
        for _ in range(pp - r):
            k.f(1), k.b(1)
        while k.nf[1] < k.nf[0] or k.nf[0] < n:
            if k.nf[0] < n:
                k.f(0)
            k.b(0)
            k.f(1), k.b(1)
        owed = list(k.nb)  # the cool-down: B's first, their W's after
        for _ in range(r):
            k.b(0, "later"), k.b(1, "later")
        for _ in range(pp - r):
            k.b(0, "later")
            k.ops.append(Step("W", owed[0], 0))
            owed[0] += 1
        k.ops += [Step("W", i, 1) for i in range(owed[1], k.nb[1])] + [Step("W", i, 0) for i in range(owed[0], k.nb[0])]
        out.append([s for s in k.ops if s.microbatch < m])
    return out


def dualpipev(pp: int, m: int) -> list[list[Step]]:
    """Every rank's F, B, W slots of DualPipeV: DeepSeek's eight steps, B's with zero bubble queue their W
    (first in, first out, as its ``WeightGradStore``), the others run W at once. Needs m >= 2p."""
    out = []
    for r in range(pp):
        k = _Rank()
        for _ in range(2 * (pp - r - 1)):  # 1: nF0
            k.f(0)
        for _ in range(r + 1):  # 2: nF0F1
            k.f(0), k.f(1)
        for _ in range(pp - r - 1):  # 3: nB1W1F1, zero bubble
            k.b(1, "queue"), k.w(), k.f(1)
        for _ in range(m - 2 * pp + r + 1):  # 4, the main step: nF0B1F1B0 (F&B pairs)
            k.f(0), k.b(1), k.f(1), k.b(0)
        for _ in range(pp - r - 1):  # 5: nB1F1B0
            k.b(1), k.f(1), k.b(0)
        zb = False
        for i in range(r + 1):  # 6: nB1B0, the second half's W deferred
            zb = zb or (i == (r + 1) // 2 and r % 2 == 1)
            k.b(1, "queue" if zb else "now")
            zb = zb or (i == (r + 1) // 2 and r % 2 == 0)
            k.b(0, "queue" if zb else "now")
        for _ in range(pp - r - 1):  # 7: nWB0
            k.w(), k.b(0, "queue")
        while k.queue:  # 8: nW
            k.w()
        out.append(k.ops)
    return out
