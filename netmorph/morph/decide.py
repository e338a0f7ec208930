"""When to move: the control loop's decision, the same on a real run and on a simulated clock.

After each segment the controller is given what the run measured -- its median step, the busiest stage's
compute (its forward and backward slots), the inter-node link's seconds per byte -- and writes it into its twin
(:meth:`~netmorph.morph.twin.Twin.measured`). The twin then prices every candidate layout of the world; the best
replaces the current one only if

- it saves more than ``hysteresis`` of the current step (so the model's error and the machine's noise do not
  flap the split), for ``confirm`` looks in a row, and
- the saving over the steps left pays for the move: the reshard plan's busiest rank's bytes over the slowest
  link it crosses, plus a round of α per message round (:func:`move_cost`).

When the job itself changes (a node lost, the context grown) the controller re-plans at once
(:meth:`Controller.replan`). :func:`rehearse` plays the whole loop on a simulated clock -- the twin at the
scenario's true link is the machine -- so a test can hold the decisions without a wall clock.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from netmorph.cost.topology import node_of
from netmorph.errors import UsageError
from netmorph.mesh.layout import Layout
from netmorph.morph.reshard import plan
from netmorph.morph.scenario import Scenario
from netmorph.morph.twin import Twin

__all__ = ["Controller", "Decision", "Look", "Run", "move_cost", "rehearse", "resized"]


@dataclass
class Decision:
    step: int
    before: str
    after: str
    measured_step_s: float
    predicted_current_s: float  # the current split (after a node loss or join: resized)
    predicted_best_s: float
    reshard_bytes: int
    reshard_s: float  # predicted by move_cost; the real run replaces it by the measured
    payback_steps: float
    reason: str = "bottleneck moved"
    top: tuple = ()  # ((layout tag, predicted s), ...) the twin's best few
    target: Layout | None = None  # the layout moved to (``after`` is its tag)


@dataclass
class Run:
    layout_path: list  # (first step, layout label)
    step_s: list  # every step run's time (the slowest rank's), redone steps included
    reshard_s: float = 0.0  # moving state: reshards, and reading a checkpoint back
    decisions: list = field(default_factory=list)
    losses: list = field(default_factory=list)  # one per step of the run's data, as the surviving run saw it
    events: list = field(default_factory=list)  # (steps run so far, seconds spent, step, what): every move
    tokens: list = field(default_factory=list)  # every step run's tokens (the sequence may grow)
    redone: int = 0  # steps trained again after going back to a checkpoint
    failed: str = ""  # why the run could not go on ("" if it finished)
    decide_s: list = field(default_factory=list)  # seconds each of the controller's looks took (pricing included)
    twin: Twin | None = None  # the adaptive run's twin as it ended, what the run measured written in

    @property
    def total_s(self) -> float:
        return math.inf if self.failed else sum(self.step_s) + self.reshard_s

    def throughput(self) -> list:
        """Tokens/s of every step run."""
        return [n / t for n, t in zip(self.tokens, self.step_s)]


@dataclass
class Look:
    """What one segment measured."""

    step: int  # steps done
    layout: Layout
    seq: int
    step_s: float  # the median step (the slowest rank's)
    busy_s: float | None  # the busiest stage's forward and backward slots a step (None: not measured)
    beta: float | None  # the inter-node link's s/B as the run saw it (None: one node)


def resized(layout: Layout, world: int):
    """What a static split becomes on ``world`` ranks -- torchelastic's restart with fewer (or, when a node joins,
    more) data-parallel replicas: the same tp, pp and ZeRO, dp scaled -- or None when its model-parallel group
    does not fit them."""
    if world == layout.world:
        return layout
    mp = layout.tp * layout.pp * layout.cp
    if world % mp:
        return None
    return replace(layout, dp=world // mp)


def move_cost(twin: Twin, before: Layout, after: Layout, seq: int | None = None, beta: float | None = None):
    """(the reshard plan, its predicted seconds): the busiest rank's bytes (sent or received) over the slowest link
    the plan crosses, plus one α of that link per message round."""
    hw = twin.hardware
    model = twin._model(seq)
    p = plan(model, before, after, gpus_per_node=hw.gpus_per_node)
    moved = p.bytes_matrix()
    busiest = float(max(moved.sum(axis=1).max(), moved.sum(axis=0).max()))
    node = node_of(np.arange(len(moved)), hw.gpus_per_node)
    across = bool(moved[node[:, None] != node[None, :]].any())
    b = (beta or twin.beta0) if across else 1 / hw.nvlink_bandwidth
    a = hw.alpha_inter if across else hw.alpha_intra
    return p, busiest * b + p.rounds * a


class Controller:
    """The decisions of one run: :meth:`look` after each segment, :meth:`replan` when the job changes."""

    def __init__(self, twin: Twin, steps: int, hysteresis: float = 0.10, confirm: int = 2, top: int = 3):
        self.twin, self.steps, self.hysteresis, self.confirm, self.top = twin, steps, hysteresis, confirm, top
        self.streak, self.wanted, self.beta = 0, None, twin.beta0

    def _ranked(self, world: int, seq: int) -> list:
        return [(lay, self.twin.predict(lay, self.beta, seq)) for lay in self.twin.layouts(world, seq, self.beta)]

    def look(self, m: Look) -> tuple:
        """(one line saying what was measured, what the twin predicts for the best few, the gain and the cost,
        and what it decided; the :class:`Decision` to move now, or None)."""
        if m.beta is not None:
            self.beta = m.beta
        if m.busy_s is not None and m.layout.zero < 3:  # ZeRO-3's gathers run inside the slots: not compute
            self.twin = self.twin.measured(m.layout, m.busy_s, self.beta, m.seq)
        ranked = self._ranked(m.layout.world, m.seq)
        best, best_s = ranked[0]
        current = self.twin.predict(m.layout, self.beta, m.seq)
        left = self.steps - m.step
        link = "" if m.beta is None else f", link {1 / m.beta / 1e6:.3g} MB/s"
        busy = "" if m.busy_s is None else f", compute {1e3 * m.busy_s:.0f} ms"
        top = ", ".join(f"{lay.tag()} {1e3 * s:.0f}" for lay, s in ranked[: self.top])
        line = (
            f"  step {m.step:>4}: {m.layout.tag()} measured {1e3 * m.step_s:.0f} ms/step{busy}{link}; "
            f"model {1e3 * current:.0f} ms; best {top} ms"
        )
        gain = current - best_s
        if best == m.layout or gain <= self.hysteresis * current or left <= 0:
            self.streak, self.wanted = 0, None
            why = (
                "the best"
                if best == m.layout
                else "no steps left"
                if left <= 0
                else f"gain {1e3 * gain:.0f} ms/step under {100 * self.hysteresis:.0f}%"
            )
            return line + f"; stay ({why})", None
        self.streak = self.streak + 1 if best == self.wanted else 1
        self.wanted = best
        p, cost = move_cost(self.twin, m.layout, best, m.seq, self.beta)
        gains = f"gain {1e3 * gain:.0f} ms/step x {left} steps = {gain * left:.2f} s, move {1e3 * cost:.0f} ms"
        if self.streak < self.confirm:
            return line + f"; {gains}: wait ({self.streak} of {self.confirm} looks)", None
        if gain * left <= cost:
            return line + f"; {gains}: stay (does not pay)", None
        self.streak, self.wanted = 0, None
        d = Decision(
            m.step,
            m.layout.tag(),
            best.tag(),
            m.step_s,
            current,
            best_s,
            p.bytes,
            cost,
            cost / gain,
            top=tuple((lay.tag(), s) for lay, s in ranked[: self.top]),
            target=best,
        )
        return line + f"; {gains}: move to {best.tag()}", d

    def replan(self, layout: Layout, world: int, seq: int, share: float = math.inf) -> tuple:
        """(the best layout of ``world`` ranks on ``seq``-long sequences in ``share`` of a replica's memory, its
        prediction, the prediction of ``layout`` resized to ``world`` (inf if it does not fit), the best few) when
        the job changed."""
        self.streak, self.wanted = 0, None
        self.twin = replace(self.twin, memory_share=share)
        ranked = self._ranked(world, seq)
        if not ranked:
            raise UsageError(f"no layout of {world} ranks fits {100 * share:.0f}% of a replica's memory (--scenario)")
        same = resized(layout, world)
        fits = same is not None and same in [lay for lay, _ in ranked]
        current = self.twin.predict(same, self.beta, seq) if fits else math.inf
        return ranked[0][0], ranked[0][1], current, tuple((lay.tag(), s) for lay, s in ranked[: self.top])


def rehearse(
    twin: Twin,
    scenario: Scenario,
    start: Layout,
    steps: int,
    segment: int,
    truth: Twin | None = None,
    hysteresis: float = 0.10,
    confirm: int = 2,
    log=lambda line: None,
) -> Run:
    """The control loop on a simulated clock: the machine is ``truth`` (default: the twin itself) with the
    scenario applied -- its inter-node link ``scenario.link_factor(step)`` times slower, its world and sequence
    as :meth:`Scenario.world` and :meth:`Scenario.model` say -- each segment's steps take what ``truth``
    predicts, and a move takes what :func:`move_cost` predicts. Deterministic: no process, no wall clock."""
    truth = truth or twin
    ctl = Controller(twin, steps, hysteresis, confirm)
    run = Run([(0, start.tag())], [])
    layout, step, world, seq = start, 0, start.world, twin.model.seq
    while step < steps:
        w, s, share = scenario.world(start.world, step), scenario.model(twin.model, step).seq, scenario.memory(step)
        beta = truth.beta0 * scenario.link_factor(step)
        if (w, s, share) != (world, seq, ctl.twin.memory_share):
            best, best_s, current, top = ctl.replan(layout, w, s, share)
            if best != resized(layout, w):
                run.decisions.append(
                    Decision(
                        step, layout.tag(), best.tag(), math.nan, current, best_s, 0, 0.0, 0.0, "the job changed", top
                    )
                )
            log(f"  -> at step {step}: {layout.tag()} -> {best.tag()}")
            layout, world, seq = best, w, s
            run.layout_path.append((step, layout.tag()))
        n = min(segment, steps - step)
        t = truth.step(layout, beta, seq)
        run.step_s += [t.step_time_s] * n
        run.tokens += [twin.global_batch * seq] * n
        step += n
        t0 = time.perf_counter()
        line, d = ctl.look(Look(step, layout, seq, t.step_time_s, t.compute_s + t.parts.tensor_parallel, beta))
        run.decide_s.append(time.perf_counter() - t0)
        log(line)
        if d is not None:
            run.decisions.append(d)
            run.reshard_s += d.reshard_s
            layout = d.target
            run.layout_path.append((step, layout.tag()))
    run.twin = ctl.twin
    return run
