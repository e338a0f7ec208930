"""Training a small MoE language model over expert- and data-parallel ranks, and its 1-rank reference.

The model (stand-alone; the GPT of :mod:`netmorph.models.gpt` keeps its dense MLP):
token embedding (tied to the LM head) → ``layers`` × [x + MoE(LayerNorm(x))] →
LayerNorm → logits, trained on the bigram language of :func:`netmorph.models.gpt.
synthetic_batch` (next token from the current one: something an MoE can learn and
route by).

Layout as Megatron's ``--expert-model-parallel-size``: world = ep × dp on
:class:`netmorph.mesh.DeviceMesh` (ep inner). Each rank routes its own tokens;
experts are sharded over the EP group; non-expert parameters (embedding, norms,
routers) are replicated and their gradients all-reduced over the whole world;
expert gradients -- already summed over the EP group by the all-to-all's backward --
are all-reduced over the ranks holding the same experts (the expert-data-parallel
group). Both are divided by the world size: the objective is the mean over ranks of
(cross-entropy + aux loss + z-loss) on each rank's tokens, with capacity per rank.

:func:`reference` computes exactly that objective on one process with every expert,
chunk by chunk, so a distributed run must equal it.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from netmorph.errors import UsageError
from netmorph.models.capacity import POLICIES, capacity
from netmorph.models.moe import MoELayer

PHASES = ("moe.dispatch", "moe.combine", "moe.dispatch.bwd", "moe.combine.bwd")


@dataclass(frozen=True)
class MoEConfig:
    ep: int = 4
    dp: int = 1
    experts: int = 8
    top_k: int = 2
    capacity_factor: float | None = 1.25          # None: dropless
    drop_policy: str = "position"
    pre_softmax: bool = False
    aux_loss_coeff: float = 0.01
    z_loss_coeff: float = 0.0
    jitter_eps: float = 0.0
    layers: int = 2
    hidden: int = 32
    ffn: int = 64
    vocab: int = 64
    seq: int = 16
    batch: int = 4                                 # sequences per rank per step
    steps: int = 20
    lr: float = 3e-3
    seed: int = 0
    dtype: str = "float32"
    backend: str = "local"
    timeout: float = 60.0

    @property
    def world(self) -> int:
        return self.ep * self.dp

    @property
    def tokens_per_rank(self) -> int:
        return self.seq * self.batch

    @property
    def capacity(self) -> int | None:
        if self.capacity_factor is None:
            return None
        return capacity(self.tokens_per_rank, self.experts, self.top_k, self.capacity_factor)

    def check(self) -> None:
        for name in ("ep", "dp", "experts", "top_k", "layers", "hidden", "ffn", "vocab", "seq", "batch", "steps"):
            if getattr(self, name) < 1:
                raise UsageError(f"{{{name}}} must be >= 1, got {getattr(self, name)}", name)
        if not 0 <= self.seed < 1 << 32:
            raise UsageError(f"{{seed}} must be in 0..2**32-1, got {self.seed}", "seed")
        if self.top_k > self.experts:
            raise UsageError(f"{{top_k}} {self.top_k} > {{experts}} {self.experts}: a token picks distinct experts",
                             "top_k")
        if self.experts % self.ep:
            raise UsageError(f"{{experts}} {self.experts} is not divisible by {{ep}} {self.ep}: each expert-parallel "
                             f"rank holds the same number of experts", "experts")
        if self.capacity_factor is not None and not (0 < self.capacity_factor <= 1e3):
            raise UsageError(f"{{capacity_factor}} must be in (0, 1000], got {self.capacity_factor} "
                             f"(or --dropless for no capacity)", "capacity_factor")
        if self.drop_policy not in POLICIES:
            raise UsageError(f"{{drop_policy}} must be one of {', '.join(POLICIES)}", "drop_policy")
        if self.world > 32:
            raise UsageError(f"ep x dp = {self.world} processes; keep it <= 32 on one machine", "ep")
        if self.tokens_per_rank * self.hidden > 1 << 24 or self.experts > 1024 or self.steps > 100_000:
            raise UsageError("the model or run is too large for a laptop demo: seq x batch x hidden <= 2**24, "
                             "experts <= 1024, steps <= 100000", "hidden")
        for name in ("aux_loss_coeff", "z_loss_coeff", "jitter_eps", "lr"):
            v = getattr(self, name)
            if not (0 <= v <= 100 and math.isfinite(v)):
                raise UsageError(f"{{{name}}} must be in [0, 100], got {v}", name)
        if self.jitter_eps >= 1:
            raise UsageError(f"{{jitter_eps}} must be < 1, got {self.jitter_eps}", "jitter_eps")


def _dtype(cfg):
    return torch.float64 if cfg.dtype == "float64" else torch.float32


def full_weights(cfg: MoEConfig) -> dict:
    """Every weight of the 1-rank model, drawn in one order from ``cfg.seed`` (all E experts)."""
    g = torch.Generator().manual_seed(cfg.seed)
    h, f, E, V = cfg.hidden, cfg.ffn, cfg.experts, cfg.vocab

    def normal(*shape, s=0.02):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * s

    w = {"emb": normal(V, h), "ln_f.w": torch.ones(h, dtype=torch.float64), "ln_f.b": torch.zeros(h, dtype=torch.float64)}
    for i in range(cfg.layers):
        w.update({f"{i}.ln.w": torch.ones(h, dtype=torch.float64), f"{i}.ln.b": torch.zeros(h, dtype=torch.float64),
                  f"{i}.router": normal(h, E, s=0.1), f"{i}.w1": normal(E, h, f), f"{i}.b1": torch.zeros(E, f),
                  f"{i}.w2": normal(E, f, h, s=0.02 / math.sqrt(2 * cfg.layers)), f"{i}.b2": torch.zeros(E, h)})
    return {k: v.to(_dtype(cfg)) for k, v in w.items()}


class MoEModel(nn.Module):
    def __init__(self, cfg: MoEConfig, comm=None, ep_group=None):
        super().__init__()
        from netmorph.runtime.base import Group
        dt = _dtype(cfg)
        ep_group = ep_group or Group([0])
        self.cfg = cfg
        self.emb = nn.Parameter(torch.zeros(cfg.vocab, cfg.hidden, dtype=dt))                # (V, h)
        self.ln = nn.ParameterList()
        self.moe = nn.ModuleList()
        for _ in range(cfg.layers):
            self.ln.append(nn.Parameter(torch.zeros(2, cfg.hidden, dtype=dt)))               # (2, h): w, b
            self.moe.append(MoELayer(comm, ep_group, cfg.hidden, cfg.ffn, cfg.experts, cfg.top_k,
                                     cfg.capacity_factor, cfg.drop_policy, cfg.pre_softmax, cfg.aux_loss_coeff,
                                     cfg.z_loss_coeff, cfg.jitter_eps, dt))
        self.ln_f = nn.Parameter(torch.zeros(2, cfg.hidden, dtype=dt))                       # (2, h)
        self.load(full_weights(cfg))

    def load(self, w: dict) -> None:
        with torch.no_grad():
            self.emb.copy_(w["emb"])
            self.ln_f.copy_(torch.stack([w["ln_f.w"], w["ln_f.b"]]))
            for i, (ln, moe) in enumerate(zip(self.ln, self.moe)):
                ln.copy_(torch.stack([w[f"{i}.ln.w"], w[f"{i}.ln.b"]]))
                moe.router.weight.copy_(w[f"{i}.router"])
                sl = slice(moe.first, moe.first + moe.local)
                for name in ("w1", "b1", "w2", "b2"):
                    getattr(moe, name).copy_(w[f"{i}.{name}"][sl])

    def expert_parameters(self):
        return [p for m in self.moe for p in m.expert_parameters()]

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor, cap: int | None, seeds):
        """``tokens``/``targets`` (T,) -> (loss, ce, aux, z, [LayerStats]); ``seeds[l]`` seeds layer l's jitter."""
        h = self.cfg.hidden
        x = self.emb[tokens]                                                    # (T, h)
        aux = z = x.new_zeros(())
        stats = []
        for ln, moe, seed in zip(self.ln, self.moe, seeds):
            g = torch.Generator().manual_seed(seed)
            y, r, st = moe(F.layer_norm(x, (h,), ln[0], ln[1]), cap, g)          # (T, h)
            x = x + y
            aux, z = aux + r.aux_loss, z + r.z_loss
            stats.append(st)
        logits = F.layer_norm(x, (h,), self.ln_f[0], self.ln_f[1]) @ self.emb.t()  # (T, V)
        ce = F.cross_entropy(logits, targets)
        return ce + aux + z, ce, aux, z, stats


def batch_for(cfg: MoEConfig, step: int, rank: int):
    """Rank ``rank``'s tokens and targets at ``step``, flattened to (seq·batch,)."""
    from netmorph.mesh.shape import ModelShape
    from netmorph.models.gpt import synthetic_batch
    g = ModelShape(seq=cfg.seq, vocab=cfg.vocab, seed=cfg.seed)
    first = (step * cfg.world + rank) * cfg.batch
    tokens, targets = synthetic_batch(g, range(first, first + cfg.batch))       # (seq, batch) each
    return tokens.reshape(-1), targets.reshape(-1)


def _seeds(cfg, step, rank):
    return [hash((cfg.seed, step, rank, layer)) & 0x7FFFFFFF for layer in range(cfg.layers)]


@dataclass
class StepRecord:
    loss: float
    ce: float
    aux: float
    routed: list                 # (layers, E) routed assignments of this rank
    kept: list                   # (layers, E)
    send: list                   # (layers, world): rows this rank sent to each global rank
    phase_bytes: dict = field(default_factory=dict)
    step_s: float = 0.0          # this rank's wall time for the step
    a2a_s: float = 0.0           # of which in the all-to-alls (dispatch, combine, both backward)
    links: dict = field(default_factory=dict)     # (phase, destination rank) -> bytes this rank sent


def train_rank(comm, cfg: MoEConfig):
    """The SPMD rank function: returns (per-step records, this rank's parameters by name)."""
    from netmorph.mesh import DeviceMesh
    # one thread per rank, as torchrun's OMP_NUM_THREADS=1; it also keeps a forked rank out of the
    # OpenMP pool its parent may hold (a fork-after-threads deadlock otherwise)
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    mesh = DeviceMesh(comm, ep=cfg.ep, dp=cfg.dp)
    ep_group, edp_group = mesh["ep"], mesh["dp"]
    model = MoEModel(cfg, comm, ep_group)
    experts = {id(p) for p in model.expert_parameters()}
    dense = [p for p in model.parameters() if id(p) not in experts]
    opt = _Adam(model.parameters(), cfg.lr)
    records = []
    for step in range(cfg.steps):
        at = len(comm.ledger.records)
        t0, a0 = time.perf_counter(), sum(m.clock[0] for m in model.moe)
        tokens, targets = batch_for(cfg, step, comm.rank)
        loss, ce, aux, _, stats = model(tokens, targets, cfg.capacity, _seeds(cfg, step, comm.rank))
        opt.zero_grad()
        loss.backward()
        _sync(comm, dense, None, "dp.grad")                     # replicated: over every rank
        _sync(comm, model.expert_parameters(), edp_group, "dp.expert_grad")
        for p in model.parameters():
            p.grad /= cfg.world
        opt.step()
        step_s, a2a_s = time.perf_counter() - t0, sum(m.clock[0] for m in model.moe) - a0
        means = np.array([loss.item(), ce.item(), aux.item()])
        with comm.phase("stats"):
            comm.all_reduce(means, op="avg")
        sent, links = {}, {}
        for rec in comm.ledger.records[at:]:
            sent[rec[5]] = sent.get(rec[5], 0) + rec[2]
            if rec[5] in PHASES:
                links[(rec[5], rec[1])] = links.get((rec[5], rec[1]), 0) + rec[2]
        send = [[0] * cfg.world for _ in stats]
        for li, st in enumerate(stats):
            for j, n in enumerate(st.send_rows):
                send[li][ep_group.ranks[j]] = n
        records.append(StepRecord(*means.tolist(), [st.routed.tolist() for st in stats],
                                  [st.kept.tolist() for st in stats], send, sent, step_s, a2a_s, links))
    return records, {k: v.detach().clone() for k, v in _named(model).items()}


class _Adam:
    """Adam with torch.optim.Adam's defaults (betas 0.9, 0.999; eps 1e-8) and its arithmetic, each parameter
    through the trainer's elementwise Adam (:class:`netmorph.parallel.flat.Adam`). torch.optim's first
    step imports torch._dynamo, which leaves an empty compiler cache folder (/tmp/torchinductor_*) behind."""

    def __init__(self, params, lr: float):
        from netmorph.parallel.flat import Adam
        self.params = [p for p in params]
        self.opts = [Adam(0, p.numel(), lr=lr, betas=(0.9, 0.999), dtype=p.dtype) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for p, opt in zip(self.params, self.opts):
            if p.grad is not None:
                opt.step(p.data.view(-1), p.grad.reshape(-1))


def _sync(comm, params, group, phase):
    """All-reduce (sum) the gradients of ``params`` as one flat buffer."""
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    if (group or comm.WORLD).size() > 1:
        with comm.phase(phase):
            comm.all_reduce(flat, group=group)
    at = 0
    for g in grads:
        g.copy_(flat[at:at + g.numel()].view_as(g))
        at += g.numel()


def _named(model: MoEModel) -> dict:
    """Parameters by full-model name; experts by their global ids (``0.w1.5`` = layer 0, expert 5)."""
    out = {"emb": model.emb, "ln_f": model.ln_f}
    for i, (ln, moe) in enumerate(zip(model.ln, model.moe)):
        out[f"{i}.ln"], out[f"{i}.router"] = ln, moe.router.weight
        for name in ("w1", "b1", "w2", "b2"):
            for e in range(moe.local):
                out[f"{i}.{name}.{moe.first + e}"] = getattr(moe, name)[e]
    return out


def reference(cfg: MoEConfig):
    """The same objective on one process with all E experts: per-step losses and final parameters."""
    torch.manual_seed(cfg.seed)
    model = MoEModel(cfg)
    opt = _Adam(model.parameters(), cfg.lr)
    losses, routing = [], []
    for step in range(cfg.steps):
        total = 0.0
        opt.zero_grad()
        step_routing = []
        for r in range(cfg.world):
            tokens, targets = batch_for(cfg, step, r)
            loss, ce, aux, _, stats = model(tokens, targets, cfg.capacity, _seeds(cfg, step, r))
            (loss / cfg.world).backward()
            total += loss.item()
            step_routing.append([st.kept.tolist() for st in stats])
        opt.step()
        losses.append(total / cfg.world)
        routing.append(step_routing)
    return losses, routing, {k: v.detach().clone() for k, v in _named(model).items()}


def predicted_phase_bytes(cfg: MoEConfig, send: list, rank: int) -> dict:
    """Bytes ``rank`` sends per all-to-all phase in one step, from the traffic matrix: ``send[l][s][d]``
    rows rank s sent to rank d in layer l. Dispatch and the combine's gradient carry this rank's row
    of the matrix; the combine and the dispatch's gradient its column."""
    b = 8 if cfg.dtype == "float64" else 4
    out_rows = sum(n for layer in send for d, n in enumerate(layer[rank]) if d != rank)
    in_rows = sum(layer[s][rank] for layer in send for s in range(cfg.world) if s != rank)
    h = cfg.hidden * b
    return {"moe.dispatch": out_rows * h, "moe.combine.bwd": out_rows * h,
            "moe.combine": in_rows * h, "moe.dispatch.bwd": in_rows * h}


def drops_at(cfg: MoEConfig, routed_per_rank, capacity_factor: float) -> float:
    """The fraction of assignments a capacity factor would drop from these routings (each rank's
    (L, E) routed counts): sum over ranks, layers and experts of max(0, routed - C), over all assignments.
    Any drop policy drops that many; which ones differs."""
    cap = capacity(cfg.tokens_per_rank, cfg.experts, cfg.top_k, capacity_factor)
    r = np.asarray(routed_per_rank)
    return float(np.maximum(0, r - cap).sum() / (cfg.tokens_per_rank * cfg.top_k * r.shape[0] * r.shape[1]))


def train(cfg: MoEConfig, check: bool = False) -> dict:
    """Launch ``cfg.world`` ranks; the run's summary (see ``netmorph moe --json``)."""
    from netmorph.runtime import launch
    cfg.check()
    results = launch(train_rank, cfg.world, cfg, backend=cfg.backend, timeout=cfg.timeout)
    recs = [r for r, _ in results]
    steps = []
    for s in range(cfg.steps):
        per = [recs[r][s] for r in range(cfg.world)]
        send = [[per[r].send[li] for r in range(cfg.world)] for li in range(cfg.layers)]   # (L, world, world)
        routed = np.sum([p.routed for p in per], axis=0)                                  # (L, E)
        kept = np.sum([p.kept for p in per], axis=0)                                      # (L, E)
        assigned = cfg.tokens_per_rank * cfg.top_k * cfg.world * cfg.layers
        measured = [{ph: per[r].phase_bytes.get(ph, 0) for ph in PHASES} for r in range(cfg.world)]
        predicted = [predicted_phase_bytes(cfg, send, r) for r in range(cfg.world)]
        matrix = np.sum(send, axis=0)                                                     # (world, world) rows
        row_bytes = cfg.hidden * (8 if cfg.dtype == "float64" else 4)
        links_exact = all(
            per[r].links.get((ph, d), 0) == row_bytes * int(matrix[r][d] if ph in ("moe.dispatch", "moe.combine.bwd")
                                                            else matrix[d][r])
            for r in range(cfg.world) for d in range(cfg.world) if d != r for ph in PHASES)
        steps.append({"loss": per[0].loss, "ce": per[0].ce, "aux": per[0].aux,
                      "drop_fraction": 1 - kept.sum() / assigned,
                      "load_imbalance": float(np.max(routed.max(1) / routed.mean(1))),
                      "largest_expert_batch": int(kept.max()),
                      "routed_per_rank": [p.routed for p in per],                         # (world, L, E)
                      "traffic": np.sum(send, axis=0).tolist(),
                      "a2a_bytes": [sum(m.values()) for m in measured],
                      "predicted_a2a_bytes": [sum(p.values()) for p in predicted],
                      # torch's own all_to_all_single is one ledger entry of its whole input: no per-peer bytes
                      "exact": None if cfg.backend == "torch-native" else measured == predicted and links_exact,
                      "step_s": max(p.step_s for p in per), "a2a_s": max(p.a2a_s for p in per)})
    out = {"config": asdict(cfg), "capacity": cfg.capacity, "steps": steps}
    if check:
        ref_losses, ref_routing, ref_params = reference(cfg)
        full = {}
        for _, params in results:
            full.update(params)
        out["reference_losses"] = ref_losses
        out["max_rel_loss_diff"] = max(abs(a["loss"] - b) / abs(b) for a, b in zip(steps, ref_losses))
        out["max_param_diff"] = max(float((full[k] - v).abs().max()) for k, v in ref_params.items())
        # routing decisions: every step's per-expert kept assignments, summed over ranks, as on one rank
        out["same_routing"] = all(
            np.array_equal(np.sum([recs[r][s].kept for r in range(cfg.world)], axis=0), np.sum(ref_routing[s], axis=0))
            for s in range(cfg.steps))
    return out
