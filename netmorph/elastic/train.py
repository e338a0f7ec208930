"""Data-parallel training that keeps going when a worker dies: detect, agree on a new view, re-form in place.

The job (BSP data-parallel least squares, float64, so a recovered run can be
compared with a failure-free one to rounding): every step the global batch of
``global_batch`` samples is split over the current members; each computes the
gradient of its share and the loss sum, one ring all-reduce adds them up, and
every member applies the same update.

When a member dies mid-step (``kills``: SIGKILL at the all-reduce of a given step),
the launcher marks it dead in the fabric, every survivor's all-reduce raises
``PeerLost``, and each survivor:

1. posts how many steps it has completed (a survivor may be one step ahead: its
   part of the ring may have finished before the death);
2. once every surviving member has posted, proposes the next view -- the members
   minus the dead, resuming at the smallest completed step -- through
   :class:`~netmorph.elastic.membership.Rendezvous` (the first proposal wins;
   everyone adopts it);
3. rolls back the one step it may be ahead (it kept the previous parameters: an
   in-memory commit), re-forms its communicator on the epoch's fresh channels
   (``comm.reform``) and redoes the step, re-splitting the same global batch.

Nothing is read from disk; at most the step in flight is redone. This is what
torchrun's restart-all (tear every worker down, reload the last checkpoint, redo
every step since) is measured against.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass

import numpy as np

from netmorph.elastic import gpt
from netmorph.elastic.agent import HEARTBEAT, admit, admitted, agree, arm_faults, fence_hung
from netmorph.elastic.heartbeat import Heartbeat, publish_pid
from netmorph.elastic.membership import Rendezvous
from netmorph.errors import UsageError
from netmorph.runtime import launch
from netmorph.runtime.transport import PeerLost, PeerTimeout


@dataclass(frozen=True)
class ElasticConfig:
    workers: int = 4
    min_workers: int = 2
    steps: int = 60
    global_batch: int = 96
    dim: int = 32
    samples: int = 2048
    lr: float = 0.5
    seed: int = 0
    kills: tuple = ()  # ((rank, step), ...): that rank is SIGKILLed in that step's all-reduce
    joins: tuple = ()  # ((count, step), ...): that many new workers join at that step
    hangs: tuple = ()  # ((rank, step), ...): that rank SIGSTOPs itself in that step (hung, not dead)
    detector: str = "phi"  # who is hung after a timeout: "phi" (accrual) or "fixed" (torchelastic's timeout)
    timeout: float = 10.0
    commit_every: int = 1  # in-memory commits; > 1 is Horovod Elastic's rollback to the last commit
    job: str = "lsq"  # "lsq": least squares on a ring; "gpt": netmorph train's GPT (elastic/gpt.py)
    model: object = None  # the GPT's ModelShape (None: elastic.gpt.MODEL)
    nodes: int = 0  # a cluster of torchrun jobs (elastic/cluster.py): its nodes; 0: the one-box launch
    late_nodes: tuple = ()  # nodes that start after the launch (launch --join NODE@STEP): not in the first view
    tp: int = 1  # tensor parallel inside each node (a cluster's): the node is the group's failure domain
    pp: int = 1  # pipeline stages inside each node, likewise: a replica is tp x pp of one node's workers

    def check(self) -> None:
        if not 1 <= self.workers <= 32:
            raise UsageError(f"{{workers}} must be in 1..32, got {self.workers}", "workers")
        if not 1 <= self.min_workers <= self.workers:
            raise UsageError(
                f"{{min_workers}} must be in 1..{{workers}} = {self.workers}, got {self.min_workers}", "min_workers"
            )
        if not 1 <= self.steps <= 100_000:
            raise UsageError(f"{{steps}} must be in 1..100000, got {self.steps}", "steps")
        if not 0 <= self.seed < 1 << 32:
            raise UsageError(f"{{seed}} must be in 0..2**32-1, got {self.seed}", "seed")
        for name, events in (("kill", self.kills), ("hang", self.hangs)):
            for rank, step in events:
                if not 0 <= rank < self.workers:
                    raise UsageError(f"{{{name}}} {rank}@{step}: no rank {rank} among {self.workers} workers", name)
                if not 0 <= step < self.steps:
                    raise UsageError(f"{{{name}}} {rank}@{step}: step {step} is past --steps {self.steps}", name)
        if self.detector not in ("phi", "fixed"):
            raise UsageError(f"{{detector}} must be phi or fixed, got {self.detector!r}", "detector")
        victims = [r for r, _ in self.kills + self.hangs]
        if len(set(victims)) != len(victims):
            raise UsageError("{kill}/{hang}: each rank can fail once", "kill")
        for n, step in self.joins:
            if not (1 <= n <= 16 and 1 <= step < self.steps):
                raise UsageError(f"{{join}} {n}@{step}: 1..16 workers at a step in 1..{self.steps - 1}", "join")
        if len({s for _, s in self.joins}) != len(self.joins):
            raise UsageError("{join}: one join event per step", "join")
        if self.workers + sum(n for n, _ in self.joins) > 32:
            raise UsageError("{workers} plus the joiners must be at most 32 processes", "join")
        if self.job not in ("lsq", "gpt"):
            raise UsageError(f"{{job}} must be lsq or gpt, got {self.job!r}", "job")
        if self.job == "gpt" and self.seed:
            raise UsageError(
                "{seed} draws the least-squares problem (--job lsq); the GPT's weights and data are the trainer's own",
                "seed",
            )
        if self.nodes and (self.workers % self.nodes or self.job != "gpt"):
            raise UsageError(
                f"{{workers}} {self.workers} must be nodes x processes per node ({self.nodes} nodes), training the GPT",
                "workers",
            )
        if self.nodes and len(self.initial_members()) < self.min_workers:
            raise UsageError(
                f"the nodes started at launch give {len(self.initial_members())} worker(s), fewer than "
                f"{{min_workers}} {self.min_workers}: lower it or start fewer nodes late",
                "min_workers",
            )
        for name, n in (("tp", self.tp), ("pp", self.pp)):
            if not 1 <= n <= 32:
                raise UsageError(f"{{{name}}} must be in 1..32, got {n}", name)
        mp, name = self.tp * self.pp, "pp" if self.pp > 1 else "tp"
        if mp > 1 and not self.nodes:
            raise UsageError(
                f"{{{name}}} splits each node's model over its workers, and a node goes and comes back whole "
                "(its torchrun job): run it as a cluster, netmorph launch --nodes N --nproc-per-node K "
                f"-- elastic --{name} {name[0].upper()}",
                name,
            )
        if mp > 1 and (self.workers // self.nodes) % mp:
            raise UsageError(
                f"{{tp}} x {{pp}} = {mp} must divide the workers of a node ({self.workers // self.nodes}, "
                f"--nproc-per-node): a model-parallel group never crosses nodes",
                name,
            )
        if mp > 1:
            from netmorph.elastic.gpt import train_config

            train_config(self, mp, 1, 0)  # the trainer's own limits (heads, hidden, vocab over tp; layers over pp)
        if self.job == "gpt":
            bad = sorted({n for n in self.sizes() if self.global_batch % (n // mp)})
            if bad:
                dp = f" ({mp} workers a replica: {', '.join(str(n // mp) for n in bad)} replicas)" if mp > 1 else ""
                raise UsageError(
                    f"{{global_batch}} {self.global_batch} sequences must split evenly over every "
                    f"membership the run reaches ({', '.join(map(str, self.sizes()))} members; not "
                    f"{', '.join(map(str, bad))}{dp})",
                    "global_batch",
                )

    def sizes(self) -> list:
        """The member counts the run goes through, in order (a kill or a hang one fewer, a join more); on a cluster
        every whole number of nodes (a node goes and comes back whole: its torchrun job)."""
        if self.nodes:
            k = self.workers // self.nodes
            return [m * k for m in range(1, self.nodes + 1)]
        n, out = self.workers, [self.workers]
        changes = [(s, -1) for _, s in self.kills + self.hangs] + [(s, k) for k, s in self.joins]
        for _, d in sorted(changes):
            n += d
            out.append(n)
        return [k for k in out if k >= 1]

    def initial_members(self) -> list:
        """The first view: the launch's workers (on a cluster the slots of the nodes started with it)."""
        if not self.nodes:
            return list(range(self.workers))
        k = self.workers // self.nodes
        return [n * k + i for n in range(self.nodes) if n not in self.late_nodes for i in range(k)]

    def spares(self) -> dict:
        """Joining ranks (numbered after the launch's workers) -> the step they join at."""
        out, nxt = {}, self.workers
        for n, step in sorted(self.joins, key=lambda j: j[1]):
            for _ in range(n):
                out[nxt] = step
                nxt += 1
        return out


def problem(cfg: ElasticConfig):
    """X (N, d), y (N,): a least-squares problem drawn from ``cfg.seed``."""
    rng = np.random.default_rng(cfg.seed)
    x = rng.standard_normal((cfg.samples, cfg.dim)) / np.sqrt(cfg.dim)  # (N, d)
    w_true = rng.standard_normal(cfg.dim)  # (d,)
    y = x @ w_true + 0.1 * rng.standard_normal(cfg.samples)  # (N,)
    return x, y


def global_batch(cfg: ElasticConfig, step: int) -> np.ndarray:
    return (step * cfg.global_batch + np.arange(cfg.global_batch)) % cfg.samples


def _grad_loss(x, y, w, idx):
    """The gradient and the loss summed over samples ``idx`` (not yet divided by the batch)."""
    r = x[idx] @ w - y[idx]  # (n,)
    return np.concatenate([x[idx].T @ r, [0.5 * float(r @ r)]])  # (d + 1,)


def reference(cfg: ElasticConfig):
    """The failure-free run on one process: per-step losses and the final parameters."""
    x, y = problem(cfg)
    w = np.zeros(cfg.dim)
    losses = []
    for step in range(cfg.steps):
        g = _grad_loss(x, y, w, global_batch(cfg, step))
        losses.append(g[-1] / cfg.global_batch)
        w = w - cfg.lr * g[:-1] / cfg.global_batch
    return losses, w


def rank_fn(comm, cfg: ElasticConfig):
    me = comm.rank
    publish_pid(comm.store, me)  # for fencing a hung rank
    heart = Heartbeat(comm.store, me, HEARTBEAT).start()
    x, y = problem(cfg)
    rdzv = Rendezvous(comm.store, cfg.min_workers)
    view = rdzv.start(range(cfg.workers))
    epochs = [(view.epoch, list(view.members), view.first_step)]
    arm = arm_faults(comm, dict(cfg.kills).get(me), dict(cfg.hangs).get(me))
    spares = cfg.spares()
    w, prev = np.zeros(cfg.dim), np.zeros(cfg.dim)
    losses, events, timeline = {}, [], []  # timeline: (monotonic s, steps done, members)
    step = 0
    if me in spares:  # a joiner: wait to be admitted, then catch up
        view = admitted(comm, rdzv, cfg, spares[me])
        w, step = np.empty(cfg.dim), view.first_step
        comm.broadcast(w, src=min(view.members))  # the parameters: what it would load from a checkpoint
        epochs.append((view.epoch, list(view.members), view.first_step))
        prev = w
    else:
        comm.reform(view.members, view.epoch)  # the spares are not in the first view
    committed = (step, w)  # Horovod Elastic's state.commit()
    joining = sorted({s for s in spares.values() if s > step})
    while step < cfg.steps:
        if joining and step == joining[0]:
            joining.pop(0)
            t_start = time.monotonic()
            new = [r for r, s in spares.items() if s == step]
            view = admit(comm, rdzv, view, new, step, cfg)
            comm.broadcast(w, src=min(view.members))  # the joiners receive the parameters
            epochs.append((view.epoch, list(view.members), view.first_step))
            events.append(
                {
                    "kind": "join",
                    "ranks": new,
                    "epoch": view.epoch,
                    "detected_at": t_start,
                    "agreed_at": time.monotonic(),
                    "step": step,
                    "steps_redone": 0,
                }
            )
            continue
        mine = np.array_split(global_batch(cfg, step), len(view.members))[view.members.index(me)]
        buf = _grad_loss(x, y, w, mine)
        arm(step)  # a kill or hang set for this step fires as its all-reduce starts
        try:
            comm.all_reduce(buf, algo="ring")
        except (PeerLost, PeerTimeout) as e:
            t_detect = time.monotonic()
            hung_at = None
            if isinstance(e, PeerTimeout):  # silent, not dead: find who is hung, fence it
                hung_at = fence_hung(comm, view, cfg)
            before = set(view.members)
            view, ahead = agree(comm, rdzv, view, step, cfg)
            if me not in view.members:
                return None  # excluded (only a hang could do this here)
            if ahead:
                w, step = prev, step - 1  # roll back the step we had finished
            if cfg.commit_every > 1:  # rollback: to the last commit, not the last step
                first = committed[0] if committed[0] <= view.first_step else view.first_step
                w = committed[1] if committed[0] <= view.first_step else w
            else:
                first = view.first_step
            redone = step - first + 1
            step = first
            comm.reform(view.members, view.epoch)
            epochs.append((view.epoch, list(view.members), view.first_step))
            events.append(
                {
                    "kind": "hang" if isinstance(e, PeerTimeout) else "kill",
                    "epoch": view.epoch,
                    "lost": sorted(before - set(view.members)),
                    "failed_at": hung_at,
                    "detected_at": t_detect,
                    "agreed_at": time.monotonic(),
                    "step": step,
                    "steps_redone": redone,
                }
            )
            continue
        prev = w
        w = w - cfg.lr * buf[:-1] / cfg.global_batch
        losses[step] = buf[-1] / cfg.global_batch
        if events and "resumed_at" not in events[-1]:
            events[-1]["resumed_at"] = time.monotonic()
        step += 1
        timeline.append((time.monotonic(), step, len(view.members)))
        if step % cfg.commit_every == 0:
            committed = (step, w)
    heart.stop()
    return {"w": w, "losses": losses, "events": events, "epochs": epochs, "timeline": timeline}


def train(cfg: ElasticConfig, check: bool = False) -> dict:
    """Launch the job with its kills; the recovery record (and, with ``check``, the failure-free run)."""
    importlib.import_module("torch.distributed")  # the store's module, before the clock starts
    cfg.check()
    t0 = time.monotonic()
    world = cfg.workers + sum(n for n, _ in cfg.joins)
    member = gpt.gpt_rank if cfg.job == "gpt" else rank_fn
    got = launch(member, world, cfg, elastic=True, timeout=cfg.timeout)
    results, deaths = list(got), got.deaths
    return summary(cfg, results, deaths, t0, time.monotonic() - t0, check)


def summary(cfg: ElasticConfig, results: list, deaths: list, t0: float, wall: float, check: bool = False) -> dict:
    """The run's record from its members' (None for one that left): events timed from each death (``deaths``:
    (rank, when)), the epochs, the losses, and with ``check`` the failure-free run beside it."""
    one_rank = gpt.reference if cfg.job == "gpt" else reference
    survivors = [r for r in results if r is not None]
    first = max(survivors, key=lambda r: len(r["losses"]))  # a member since step 0
    died = dict(deaths)
    kill_steps = dict(cfg.kills + cfg.hangs)
    events = []
    kills = iter(sorted(deaths, key=lambda d: d[1]))  # for an event that names no rank
    for e in first["events"]:
        if e["kind"] == "join":
            events.append(
                {
                    "kind": "join",
                    "rank": e["ranks"],
                    "step": e["step"],
                    "detected_after_s": 0.0,
                    "agreed_after_s": e["agreed_at"] - e["detected_at"],
                    "resumed_after_s": e.get("resumed_at", e["agreed_at"]) - e["detected_at"],
                    "steps_redone": 0,
                    "at_s": e["detected_at"] - t0,
                }
            )
            continue
        lost = [r for r in e["lost"] if r in died]
        if not lost:  # the event names no rank: the next death
            r, _ = next(kills, (None, None))
            lost = [] if r is None else [r]
        rank = lost[0] if lost else None
        t_dead = min((died[r] for r in lost), default=e["detected_at"])  # several can die in one step
        if e.get("failed_at") is not None:  # a hang: from when it stopped, not when fenced
            t_dead = e["failed_at"]
        events.append(
            {
                "kind": e["kind"],
                "rank": rank,
                "ranks": lost,
                "step": kill_steps.get(rank, e["step"]),
                "detected_after_s": max(0.0, e["detected_at"] - t_dead),
                "agreed_after_s": e["agreed_at"] - t_dead,
                "resumed_after_s": e.get("resumed_at", e["agreed_at"]) - t_dead,
                "steps_redone": e["steps_redone"],
                "at_s": t_dead - t0,
            }
        )
    losses = [first["losses"][s] for s in range(cfg.steps)]
    out = {
        "workers": cfg.workers,
        "min_workers": cfg.min_workers,
        "steps": cfg.steps,
        "events": events,
        "epochs": [{"epoch": ep, "members": m, "first_step": s} for ep, m, s in first["epochs"]],
        "losses": losses,
        "wall_s": wall,
        "dead": sorted(died),
        "timeline": [(t - t0, step, n) for t, step, n in first["timeline"]],
    }
    if check:
        ref_losses, ref_w = one_rank(cfg)
        out["reference_losses"] = ref_losses
        out["max_rel_loss_diff"] = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
        out["max_rel_param_diff"] = max(
            float(np.max(np.abs(r["w"] - ref_w)) / np.max(np.abs(ref_w))) for r in survivors
        )
    return out
