"""3D parallelism (PTD-P): tensor x pipeline x data parallel, with ZeRO over the data-parallel group.

Megatron-LM's training loop on netmorph's mesh (tp innermost, order tp-cp-ep-dp-pp):
each rank builds its model chunks (layers of its pipeline stage, sharded over its
TP group), lays its parameters out in one flat buffer, and per step runs the
pipeline schedule over its microbatches, then synchronises gradients -- SP's
replicated parameters over TP, the tied word embedding between the first and last
stage (Megatron's embedding group), the rest over DP (all-reduce, or ZeRO's
reduce-scatter + all-gather) -- and steps Adam.

:func:`train_rank` is the SPMD function every rank runs (under ``launch`` or
``torchrun``); :func:`reference` is the 1-rank run every layout must equal.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

import torch

from netmorph.errors import UsageError
from netmorph.mesh import DeviceMesh
from netmorph.mesh.layout import Layout
from netmorph.mesh.placement import rank_parameters
from netmorph.mesh.shape import ModelShape, check_shape
from netmorph.models.gpt import GPTStage, synthetic_batch
from netmorph.parallel.data_parallel import DataParallelBucket, DataParallelNaive
from netmorph.parallel.flat import Adam, FlatParams
from netmorph.parallel.pipeline import Executor, check, schedule
from netmorph.parallel.state import named_pieces
from netmorph.parallel.tensor_parallel import TensorParallel
from netmorph.parallel.traffic import predicted
from netmorph.parallel.zero import ZeRO

DTYPES = {"float64": torch.float64, "float32": torch.float32}


# the trainer's own defaults where a Layout's differ: two microbatches of two sequences, DDP's overlapped buckets
TRAIN_LAYOUT = Layout(global_batch=4, micro_batch_size=2, dp_overlap=True)
RUN_FIELDS = ("steps", "lr", "dtype", "dp_mode", "bucket_mb", "compute_ms", "trace", "start_step")


@dataclass(frozen=True)
class TrainConfig:
    """One training run: the model, its layout, and how long and how it runs (Megatron's arguments in three
    groups: ``TransformerConfig``, the parallel sizes, the training options)."""

    model: ModelShape = field(default_factory=ModelShape)
    layout: Layout = TRAIN_LAYOUT
    steps: int = 4
    lr: float = 3e-3
    dtype: str = "float64"
    dp_mode: str = "bucket"          # "bucket" (DDP's reducer) or "naive" (one all-reduce per gradient)
    bucket_mb: float = 1.0
    compute_ms: float = 0.0          # emulated compute per microbatch forward on a stage, shared by its interleaved
                                     # chunks (backward: twice)
    trace: bool = False              # return every rank's ledger records too (for a Chrome trace)
    start_step: int = 0              # the first step's index: the data a resumed (or resharded) run continues on

    @classmethod
    def make(cls, model: ModelShape | None = None, microbatches: int = 2, micro_batch_size: int = 2,
             overlap: bool = True, **kw) -> TrainConfig:
        """Megatron's flat arguments: the run options by name, every other keyword a :class:`Layout` field
        (``microbatches`` per step and data-parallel rank gives the global batch)."""
        run = {k: kw.pop(k) for k in RUN_FIELDS if k in kw}
        dp = kw.get("dp", 1)
        layout = Layout(global_batch=dp * microbatches * micro_batch_size, micro_batch_size=micro_batch_size,
                        dp_overlap=overlap, **kw)
        return cls(model=model or ModelShape(), layout=layout, **run)

    @property
    def world(self) -> int:
        return self.layout.world

    def check(self) -> None:
        if not 1 <= self.steps <= 1 << 24:
            raise UsageError(f"{{steps}} must be >= 1, got {self.steps}", "steps")
        if not 0 < self.bucket_mb < 1 << 20:
            raise UsageError(f"{{bucket_mb}} must be a size in MiB > 0, got {self.bucket_mb}", "bucket_mb")
        if not 0 <= self.compute_ms < 1e4:
            raise UsageError(f"{{compute_ms}} must be in [0, 10000), got {self.compute_ms}", "compute_ms")
        if self.dtype not in DTYPES:
            raise UsageError(f"{{dtype}} must be float64 or float32, got {self.dtype!r}", "dtype")
        if self.dp_mode not in ("bucket", "naive"):
            raise UsageError(f"{{dp_mode}} must be bucket or naive, got {self.dp_mode!r}", "dp_mode")
        check_shape(self.model)
        lay = self.layout.require(self.model, trainer=True)
        check(schedule(lay.pipeline_schedule, lay.pp, lay.microbatches, lay.interleave), lay.interleave)


@dataclass
class RankGroups:
    """This rank's place in the mesh and its groups (objects, no globals)."""

    tp_group: object
    pp_group: object
    dp_group: object
    emb_group: object | None
    tp_rank: int
    pp_rank: int
    dp_rank: int


def rank_groups(comm, cfg: TrainConfig) -> RankGroups:
    dm = DeviceMesh(comm, tp=cfg.layout.tp, pp=cfg.layout.pp, dp=cfg.layout.dp)
    me = comm.rank
    emb = None
    if cfg.layout.pp > 1:                  # the tied embedding's group: each pipeline's first and last stage
        for ranks in dm.mesh.groups("pp"):
            g = comm.new_group([ranks[0], ranks[-1]])
            if me in (ranks[0], ranks[-1]):
                emb = g
    return RankGroups(dm["tp"], dm["pp"], dm["dp"], emb, dm.get_local_rank("tp"), dm.get_local_rank("pp"),
                  dm.get_local_rank("dp"))


def build_chunks(comm, cfg: TrainConfig, lay: RankGroups):
    """This rank's model chunks: chunk c is virtual stage c·pp + pp_rank."""
    tp = TensorParallel(comm, lay.tp_group, cfg.layout.sequence_parallel)
    dtype = DTYPES[cfg.dtype]
    chunks = [GPTStage(cfg.model, *cfg.layout.chunk_layers(cfg.model.layers, lay.pp_rank, c), tp, dtype)
              for c in range(cfg.layout.interleave)]
    return chunks, tp


def _sleep_ms(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1000)


def train_rank(comm, cfg: TrainConfig, progress=None, inits=None) -> dict:
    """One rank's part of ``cfg.steps`` training steps; what it measured (``progress``: a
    :class:`~netmorph.runtime.progress.ProgressCounter` bumped once per step). ``inits[rank]``, when given,
    is the rank's state to start from -- {"params": its flat buffer, "m", "v": Adam's moments over its
    range, "t": Adam's step}, as ``flat_state`` returns it or :func:`netmorph.morph.reshard.run_rank`
    makes it for this layout."""
    torch.manual_seed(0)
    torch.set_num_threads(1)            # torchrun's OMP_NUM_THREADS=1: one process per core, no spinning pools
    split = cfg.layout
    lay = rank_groups(comm, cfg)
    chunks, tp = build_chunks(comm, cfg, lay)
    device = torch.device(comm.device)     # cuda:LOCAL_RANK under torchrun with GPUs (NCCL), else the CPU
    for c in chunks:
        c.to(device)                       # the same initial weights on every device: drawn on the CPU
    dtype = DTYPES[cfg.dtype]
    params = [p for c in chunks for p in c.parameters()]
    names = [p.name for p in rank_parameters(cfg.model, cfg.layout, lay.pp_rank)]
    flat = FlatParams(params, pad_to=split.dp, dtype=dtype, names=names)
    zero = ZeRO(comm, lay.dp_group, flat, split.zero, cfg.lr) if split.zero else None
    adam = None if zero else Adam(0, flat.padded, lr=cfg.lr, dtype=dtype, device=device)
    if inits is not None:
        _load(inits[comm.rank], flat, zero, adam)
    dp = None
    if not zero:
        overlap = split.dp_overlap and split.tp == 1 and split.pp == 1
        dp = (DataParallelNaive(comm, lay.dp_group, flat) if cfg.dp_mode == "naive"
              else DataParallelBucket(comm, lay.dp_group, flat, cfg.bucket_mb, overlap))
    slots = schedule(split.pipeline_schedule, split.pp, split.microbatches, split.interleave)[lay.pp_rank]
    T = cfg.model.seq // (split.tp if tp.sequence_parallel else 1)
    ex = Executor(comm, lay.pp_group, chunks, split.interleave, (T, split.micro_batch_size, cfg.model.hidden), dtype)
    last_backward = max(i for i, s in enumerate(slots) if s.kind == "B")
    is_last_stage = lay.pp_rank == split.pp - 1
    losses, times, peaks, bounds, idle = [], [], [], [], []
    saved = 0
    try:
        for step in range(cfg.steps):
            t0 = time.perf_counter()
            if zero:
                zero.zero_grad()
            else:
                flat.zero_grad()
            base = ((cfg.start_step + step) * split.dp + lay.dp_rank) * split.microbatches * split.micro_batch_size

            def inputs(i, base=base):
                lo = base + i * split.micro_batch_size
                return tuple(t.to(device) for t in synthetic_batch(cfg.model, range(lo, lo + split.micro_batch_size)))

            # compute_ms is a stage's compute per microbatch: its interleaved chunks share it
            hooks = _Hooks(zero, dp, last_backward, cfg.compute_ms / split.interleave,
                           flat.data.untyped_storage()._cdata)
            t_pipe = time.perf_counter()
            mb_losses, peak = ex.run(slots, inputs, split.microbatches, hooks)
            t_pipe = time.perf_counter() - t_pipe
            idle.append(1 - hooks.busy / t_pipe if t_pipe > 0 else 0.0)
            if dp is not None:
                dp.finish()
            _sync_replicated(comm, lay, tp, chunks, flat)
            if zero:
                zero.step()
            else:
                adam.step(flat.data, flat.grad)
            loss = torch.tensor([sum(mb_losses)], dtype=torch.float64, device=device)
            if is_last_stage and lay.tp_rank == 0:
                with comm.phase("metrics"):
                    comm.all_reduce(loss, group=lay.dp_group)
            losses.append(float(loss) / (split.dp * split.microbatches))
            t1 = time.perf_counter()
            times.append(t1 - t0)
            bounds.append((t0, t1))
            peaks.append(peak)
            saved = max(saved, hooks.saved_per_microbatch)
            if progress is not None:
                progress.bump(comm.rank)
        if zero:
            zero.gather()
        state = named_pieces(chunks)
        opt = zero.adam if zero else adam
        flat_state = {"params": flat.data.cpu().numpy().copy(), "m": opt.m.cpu().numpy().copy(),
                      "v": opt.v.cpu().numpy().copy(), "t": opt.t}
    finally:
        if dp is not None:
            dp.close()
    mem = zero.bytes() if zero else {**flat.bytes(), "optimizer": adam.bytes()}
    # activations: what autograd saved for one microbatch's backward, times the most microbatches held
    mem["activations_peak"] = None if zero and zero.stage >= 3 else saved * max(peaks)
    isz = flat.data.element_size()
    pred = predicted(cfg, lay.pp_rank, flat.padded, isz, any(c.is_first for c in chunks),
                     any(c.is_last for c in chunks), sum(len(c.blocks) for c in chunks),
                     sum(p.numel() for p in tp.replicated()))
    if not zero and split.dp > 1 and cfg.dp_mode == "naive":
        pred["dp"] = (sum(_ring_sent(p.numel(), lay.dp_group.size(), lay.dp_rank, isz) for p in flat.params),
                      "Σ over parameters of one ring all-reduce each")
    return {"rank": comm.rank, "tp": lay.tp_rank, "pp": lay.pp_rank, "dp": lay.dp_rank,
            "losses": losses if is_last_stage and lay.tp_rank == 0 else None, "step_times": times,
            "flat_state": flat_state,
            "in_flight_peak": max(peaks), "memory_bytes": mem, "state": state, "idle_fraction": idle,
            "timeline": ex.spans, "step_bounds": bounds, "ledger": comm.ledger.records if cfg.trace else None,
            "bytes_by_step": _bytes_by_step(comm.ledger, bounds), "predicted": pred, "params": flat.numel,
            "flat_index": {**flat.entries(), "optimizer_range": (zero.lo, zero.hi) if zero else (0, flat.padded)}}


def _load(init: dict, flat, zero, adam) -> None:
    """Start from a given state: the flat parameters (under ZeRO the shard too; under ZeRO-3 only the shard
    persists), Adam's moments over this rank's range and its step count."""
    params = torch.as_tensor(init["params"], dtype=flat.data.dtype, device=flat.data.device)
    if zero:
        zero.shard.copy_(params[zero.lo:zero.hi])
        if zero.gathered:
            flat.data.copy_(params)
    else:
        flat.data.copy_(params)
    opt = zero.adam if zero else adam
    opt.m.copy_(torch.as_tensor(init["m"]))
    opt.v.copy_(torch.as_tensor(init["v"]))
    opt.t = int(init["t"])


def _ring_sent(n: int, g: int, r: int, isz: int) -> int:
    from netmorph.collectives import build
    from netmorph.schedule import count
    return int(count(build("allreduce", "ring", g, n, isz)).bytes_sent[r])


def _bytes_by_step(ledger, bounds) -> list:
    """{phase: bytes this rank sent} for each step, from the ledger's timestamps."""
    out = [{} for _ in bounds]
    starts = [b[0] for b in bounds]
    for rec in ledger.records:
        k = bisect.bisect_right(starts, rec[8]) - 1
        if 0 <= k < len(out) and rec[8] <= bounds[k][1]:
            ph = rec[5] or "(untagged)"
            out[k][ph] = out[k].get(ph, 0) + rec[2]
    return out


class _Hooks:
    """What runs around each forward and backward: ZeRO-3's gather, DDP's arming, emulated compute
    (``compute_ms`` per forward, twice that per backward), and the time spent computing -- the
    rest of a pipeline rank's step is waiting: its bubble."""

    def __init__(self, zero, dp, last_backward: int, compute_ms: float, params_storage):
        self.zero, self.dp, self.last, self.ms = zero, dp, last_backward, compute_ms
        self.busy = 0.0
        self.params_storage = params_storage
        self.saved_per_microbatch = 0         # bytes autograd saves for one microbatch's backward (max)

    def forward(self, fn):
        t0 = time.perf_counter()
        _sleep_ms(self.ms)
        if self.zero and self.zero.stage >= 3:
            out = self.zero.forward(fn)       # ZeRO-3's own hooks see the saved tensors (not measured)
        else:
            seen = {}

            def pack(x):
                if x.untyped_storage()._cdata != self.params_storage:
                    seen[(x.data_ptr(), x.numel(), x.dtype)] = x.numel() * x.element_size()
                return x

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
                out = fn()
            self.saved_per_microbatch = max(self.saved_per_microbatch, sum(seen.values()))
        self.busy += time.perf_counter() - t0
        return out

    def backward(self, index: int, fn):
        t0 = time.perf_counter()
        _sleep_ms(2 * self.ms)
        if self.dp is not None and index == self.last:
            self.dp.arm()
        fn()
        if self.zero:
            self.zero.after_backward()
        self.busy += time.perf_counter() - t0


def _sync_replicated(comm, lay: RankGroups, tp, chunks, flat) -> None:
    """SP's replicated parameters over TP; the tied word embedding between first and last stage."""
    rep = tp.replicated()
    if rep:
        with comm.phase("tp.sp-grads"):
            for p in rep:
                lo, hi = flat.span(p)
                comm.all_reduce(flat.grad[lo:hi], group=lay.tp_group, algo="ring")
    if lay.emb_group is not None:
        for c in chunks:
            if hasattr(c, "wte") and (c.is_first or c.is_last):
                lo, hi = flat.span(c.wte)
                with comm.phase("pp.emb"):
                    comm.all_reduce(flat.grad[lo:hi], group=lay.emb_group, algo="ring")
