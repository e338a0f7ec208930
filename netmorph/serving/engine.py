"""The serving loop: requests arrive, the scheduler forms each iteration's batch, the model steps.

Schedulers (``scheduler``):

- ``static`` -- request-level batching (HF ``generate``): when the engine is idle it
  takes up to ``max_seqs`` arrived requests, prefills them and decodes until the
  last one finishes; nobody joins a running batch, and a finished row stays in it
  as padding (its KV held, and a priced iteration still pays for its token) until
  the batch ends -- or until the pool needs its blocks. As ``generate`` left-pads a
  batch's prompts to the longest, a priced prefill costs rows x the longest prompt
  and every row's decode attends over the padded length.
- ``continuous`` -- iteration-level scheduling (Orca, Yu et al. 2022; vLLM): requests
  join and leave the batch every iteration. As vLLM (v0) does without chunked
  prefill, an iteration either prefills newly admitted requests (FCFS, up to
  ``max_tokens`` prompt tokens) or decodes one token for every running request.
- ``chunked_prefill`` > 0 (Sarathi-Serve, Agrawal et al. 2024): every iteration first
  decodes one token for each running request, then fills the rest of the token
  budget with prefill chunks of at most that many tokens -- long prompts no longer
  stall the decodes.

When a sequence needs a block and the pool is empty the scheduler preempts, vLLM's
policy: the latest-arrived running request goes first (FCFS fairness: the oldest
keep their progress). ``preemption="recompute"`` frees its blocks and puts it back at
the head of the queue to prefill its prompt and what it generated so far again;
``"swap"`` copies its blocks to a host pool (bytes counted out and back in) and
resumes it, before any new admission, when blocks free up.

Time: the engine's clock advances by each iteration's time and jumps to the next
arrival when idle, so TTFT and TPOT are latencies under the given arrival process. The
iteration's time is either measured (the real computation of this small model on this
machine's CPU, where a batch costs about the sum of its sequences) or priced by a time
model -- :func:`netmorph.serving.roofline.iteration_time`, a real model's roofline on a
GPU, where a decode batch costs about one read of the weights whatever its size. The
tokens are computed for real either way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from netmorph.errors import UsageError
from netmorph.serving.blocks import BlockManager
from netmorph.serving.model import PagedGPT, sample


@dataclass
class Request:
    rid: int
    prompt: list
    output_len: int
    arrival: float
    tokens: list = field(default_factory=list)       # prompt + generated
    computed: int = 0                                # tokens whose KV is in the cache
    status: str = "waiting"                          # waiting | running | swapped | finished | rejected
    first_token_at: float | None = None
    finished_at: float | None = None
    swapped: list | None = None                      # the host copy of its blocks
    reason: str = ""
    n: int = 1                                       # parallel samples (vLLM's SamplingParams.n)
    parent: int | None = None                        # a sample forked from this request id

    @property
    def generated(self) -> int:
        return len(self.tokens) - len(self.prompt)


def sample_id(rid: int, k: int) -> int:
    """The id of request ``rid``'s k-th parallel sample (k = 0 is the request itself)."""
    return rid + k * 1_000_000_000


@dataclass
class ServeConfig:
    num_blocks: int = 512
    block_size: int = 16
    scheduler: str = "continuous"     # continuous | static
    kv: str = "paged"                 # paged | contiguous
    chunked_prefill: int = 0          # > 0: chunk size (tokens) of Sarathi-style mixed batches
    max_tokens: int = 2048            # tokens per iteration (vLLM's max_num_batched_tokens)
    max_seqs: int = 64                # sequences per iteration (max_num_seqs)
    preemption: str = "recompute"     # recompute | swap
    prefix_caching: bool = True
    temperature: float = 0.0

    def check(self) -> None:
        if not 1 <= self.block_size <= 1024:
            raise UsageError(f"{{block_size}} must be in 1..1024, got {self.block_size}", "block_size")
        if not 1 <= self.num_blocks <= 1 << 20:
            raise UsageError(f"{{kv_blocks}} must be in 1..1048576, got {self.num_blocks}", "kv_blocks")
        if self.scheduler not in ("continuous", "static"):
            raise UsageError(f"{{scheduler}} must be continuous or static, got {self.scheduler!r}", "scheduler")
        if self.kv not in ("paged", "contiguous"):
            raise UsageError(f"{{kv}} must be paged or contiguous, got {self.kv!r}", "kv")
        if self.preemption not in ("recompute", "swap"):
            raise UsageError(f"{{preemption}} must be recompute or swap, got {self.preemption!r}", "preemption")
        if self.chunked_prefill < 0 or self.chunked_prefill and self.scheduler == "static":
            raise UsageError("{chunked_prefill} needs a token count > 0 and --scheduler continuous",
                             "chunked_prefill")
        if not (1 <= self.max_tokens <= 1 << 20 and 1 <= self.max_seqs <= 4096):
            raise UsageError("{max_tokens} must be in 1..2**20 and {max_seqs} in 1..4096", "max_tokens")


class Engine:
    def __init__(self, model_cfg, cfg: ServeConfig, time_model=None, shard=None):
        """``time_model([(new tokens, tokens in context)] per sequence) -> seconds`` prices an iteration (e.g.
        :func:`netmorph.serving.roofline.iteration_time` for a real model on a GPU); None: the measured wall time
        of this model's iteration here."""
        cfg.check()
        import torch
        # one intra-op thread, as its ranks under serve --tp / --disaggregate run (torchrun's OMP_NUM_THREADS=1):
        # this model's matmuls are too small to split, and an OpenMP pool spinning on every core of a busy
        # machine made one engine use 8-10x the CPU it needs
        torch.set_num_threads(1)
        self.cfg, self.mcfg, self.time_model = cfg, model_cfg, time_model
        self.model = PagedGPT(model_cfg, cfg.num_blocks, cfg.block_size, shard=shard)
        self.bm = BlockManager(cfg.num_blocks, cfg.block_size, model_cfg.seq, contiguous=cfg.kv == "contiguous",
                               prefix_caching=cfg.prefix_caching)
        self.clock = 0.0
        self.preemptions = {"swap": 0, "recompute": 0}
        self.swap_bytes = 0
        self.timeline = []               # (t, slots holding a token, slots reserved, running, tokens this iteration)
        self.iterations = 0
        self.frozen = False
        self.padding = []                # static batches: finished rows kept until the batch ends (HF generate)
        self.batch_prompt = self.batch_step = 0   # a static batch's longest prompt and decode steps so far
        self.prefix_cached_tokens = 0    # prompt tokens found in shared blocks (not computed again)

    # -- admission ----------------------------------------------------------------------------------------
    def _reject_reason(self, r: Request) -> str:
        total = len(r.prompt) + r.output_len
        if not r.prompt or r.output_len < 1:
            return "a request needs at least one prompt token and one output token"
        if total > self.mcfg.seq:
            return f"prompt {len(r.prompt)} + output {r.output_len} tokens exceed the model's context {self.mcfg.seq}"
        if self.bm.blocks_needed(total) * r.n > self.cfg.num_blocks:
            return (f"needs {self.bm.blocks_needed(total) * r.n} blocks ({r.n} sample(s)), more than the whole pool "
                    f"({self.cfg.num_blocks} x {self.cfg.block_size} tokens)")
        if max(r.prompt) >= self.mcfg.vocab or min(r.prompt) < 0:
            return f"prompt token ids must be in 0..{self.mcfg.vocab - 1}"
        return ""

    def _admit(self, r: Request) -> bool:
        """Blocks for the request's tokens so far (prompt, plus what it generated before a recompute)."""
        if not self.bm.can_allocate(len(r.tokens), r.tokens):
            return False
        cached = self.bm.allocate(r.rid, r.tokens)
        self.prefix_cached_tokens += cached
        r.computed = cached
        r.status = "running"
        return True

    def _preempt(self, running: list, waiting: list, swapped: list) -> Request:
        victim = max(running, key=lambda q: (q.arrival, q.rid))          # vLLM: the latest arrival goes first
        running.remove(victim)
        if self.cfg.preemption == "swap":
            blocks = list(self.bm.tables[victim.rid].blocks)
            victim.swapped = (self.model.read_blocks(blocks), len(blocks))
            self.swap_bytes += len(blocks) * self.model.bytes_per_block()
            self.bm.swap_out(victim.rid)
            victim.status = "swapped"
            swapped.append(victim)
            self.preemptions["swap"] += 1
        else:
            self.bm.free_seq(victim.rid)
            victim.computed = 0
            victim.status = "waiting"
            waiting.insert(0, victim)
            self.preemptions["recompute"] += 1
        return victim

    def _swap_in(self, swapped: list, running: list) -> None:
        while swapped:
            r = min(swapped, key=lambda q: (q.arrival, q.rid))
            saved, n = r.swapped
            if n > self.bm.num_free():
                return
            blocks = self.bm.swap_in(r.rid, n)
            self.model.write_blocks(blocks, saved)
            self.swap_bytes += n * self.model.bytes_per_block()
            r.swapped, r.status = None, "running"
            swapped.remove(r)
            running.append(r)

    # -- one iteration ------------------------------------------------------------------------------------
    def _slots(self, r: Request, n: int) -> list:
        return [self.bm.slot(r.rid, r.tokens) for _ in range(n)]

    def _batch(self, running, waiting, swapped) -> list:
        """[(request, number of its tokens to compute now)] for this iteration."""
        cfg = self.cfg
        batch, budget = [], cfg.max_tokens
        if cfg.scheduler == "static":
            if not running and not self.frozen:
                while waiting and len(running) < cfg.max_seqs and self._admit(waiting[0]):
                    running.append(waiting.pop(0))
                self.batch_prompt = max((len(r.tokens) for r in running), default=0)
                self.batch_step = 0
            return [(r, len(r.tokens) - r.computed) for r in running]
        if swapped and not self.frozen:
            self._swap_in(swapped, running)
        decodes = [r for r in running if len(r.tokens) - r.computed == 1]
        partial = [r for r in running if len(r.tokens) - r.computed > 1]
        if not cfg.chunked_prefill:
            if not swapped and not self.frozen:                # vLLM v0: admit and prefill before decoding
                admitted = []
                while (waiting and len(running) < cfg.max_seqs
                       and (not admitted or len(waiting[0].tokens) <= budget) and self._admit(waiting[0])):
                    r = waiting.pop(0)
                    running.append(r)
                    admitted.append(r)
                    budget -= len(r.tokens) - r.computed
                if admitted:
                    return [(r, len(r.tokens) - r.computed) for r in admitted]
            return [(r, 1) for r in decodes]
        for r in decodes[:budget]:
            batch.append((r, 1))
        budget -= len(batch)
        for r in partial:
            if budget <= 0:
                break
            n = min(cfg.chunked_prefill, budget, len(r.tokens) - r.computed)
            batch.append((r, n))
            budget -= n
        while (budget > 0 and not swapped and not self.frozen and waiting and len(running) < cfg.max_seqs
               and self._admit(waiting[0])):
            r = waiting.pop(0)
            running.append(r)
            n = min(cfg.chunked_prefill, budget, len(r.tokens) - r.computed)
            batch.append((r, n))
            budget -= n
        return batch

    def step(self, running, waiting, swapped) -> list:
        """Schedule and run one iteration; returns the requests that finished in it."""
        t0 = time.perf_counter()
        self.frozen = False                  # after a preemption nothing is admitted or swapped in this step
        while True:
            batch = self._batch(running, waiting, swapped)
            need = sum(self.bm.blocks_to_grow(r.rid, n) for r, n in batch)
            if need <= self.bm.num_free():
                break
            if self.padding:                                  # a static batch's finished rows give way first
                self._release_padding()
                continue
            if not running:
                raise RuntimeError("nothing left to preempt and the batch does not fit (admission should refuse it)")
            self._preempt(running, waiting, swapped)
            self.frozen = True
        items = [(r, n, self._slots(r, n)) for r, n in batch]
        for src, dst in self.bm.copies:                       # copy-on-write before anything is written
            self.model.copy_block(src, dst)
        self.bm.copies.clear()
        work = [(r.tokens[r.computed:r.computed + n], r.computed, slots, self.bm.tables[r.rid].blocks)
                for r, n, slots in items]
        logits = self.model.forward(work) if work else []
        done = []
        priced = None
        if self.time_model and self.cfg.scheduler == "static":
            # HF generate: every row (finished ones too) padded to the batch's longest prompt
            P, k = self.batch_prompt, self.batch_step
            rows = [(P, 0) if n > 1 and r.computed == 0 else (1, P + k) if n == 1 else (n, r.computed)
                    for r, n, _ in items]
            priced = self.time_model(rows + [(1, P + k)] * len(self.padding))
            if all(n == 1 for _, n, _ in items):
                self.batch_step += 1
        elif self.time_model:
            priced = self.time_model([(n, r.computed) for r, n, _ in items])
        forks = []
        for (r, n, _), lg in zip(items, logits):
            r.computed += n
            if r.computed < len(r.tokens):                    # a prefill chunk: no token yet
                continue
            if r.n > 1 and r.generated == 0 and r.parent is None:   # parallel sampling: fork after the prefill
                for k in range(1, r.n):
                    child = Request(sample_id(r.rid, k), r.prompt, r.output_len, r.arrival, list(r.tokens),
                                    r.computed, "running", parent=r.rid)
                    self.bm.fork(r.rid, child.rid)        # every block shared, the last partial one too
                    child.tokens.append(sample(lg, self.cfg.temperature, child.rid * 1_000_003 + len(child.tokens)))
                    forks.append(child)
            r.tokens.append(sample(lg, self.cfg.temperature, r.rid * 1_000_003 + len(r.tokens)))
            dt = priced if priced is not None else time.perf_counter() - t0
            if r.first_token_at is None:
                r.first_token_at = self.clock + dt
            if r.generated >= r.output_len:
                done.append(r)
        dt = priced if priced is not None else time.perf_counter() - t0
        self.clock += dt
        self.iterations += 1
        for c in forks:
            c.first_token_at = self.clock
            running.append(c)
            if c.generated >= c.output_len:
                done.append(c)
        for r in done:
            r.finished_at = self.clock
            r.status = "finished"
            running.remove(r)
            if self.cfg.scheduler == "static":
                self.padding.append(r)                    # HF generate: a finished row stays in the batch as padding
            else:
                self.bm.free_seq(r.rid)
        if not running:
            self._release_padding()
        self.timeline.append((self.clock, self.bm.used_slots(), self.bm.reserved_slots(), len(running),
                              sum(n for _, n, _ in items), dt))
        return done

    def _release_padding(self) -> None:
        for p in self.padding:
            self.bm.free_seq(p.rid)
        self.padding = []

    # -- disaggregation: requests whose prefill ran elsewhere ----------------------------------------------
    def admit_prefilled(self, r: Request, kv, first: int) -> bool:
        """Write a prompt's transferred keys and values (``kv``: layers x 2 x n x heads x head_dim) into fresh
        blocks and continue from its first token; False if the pool cannot hold it now."""
        n = len(r.prompt)
        if not self.bm.can_allocate(n + 1):
            return False
        r.tokens = list(r.prompt)
        self.bm.allocate(r.rid, r.tokens)
        slots = [self.bm.slot(r.rid, r.tokens) for _ in range(n)]
        sb = torch.tensor([b for b, _ in slots], dtype=torch.long)
        so = torch.tensor([o for _, o in slots], dtype=torch.long)
        for layer in range(self.mcfg.layers):
            self.model.k[layer][sb, so] = torch.as_tensor(kv[layer, 0])
            self.model.v[layer][sb, so] = torch.as_tensor(kv[layer, 1])
        r.tokens.append(first)
        r.computed, r.status = n, "running"
        return True

    def decode_prefilled(self, arrivals) -> dict:
        """Decode every (request, kv, first token, ready at) of ``arrivals`` to the end: a request joins when its
        KV has arrived (``ready``, on this engine's clock) and the pool can hold it; its TTFT is the prefill
        rank's (``first_token_at`` set by the caller)."""
        pending = sorted(arrivals, key=lambda a: (a[3], a[0].rid))
        running, waiting, swapped, finished = [], [], [], []
        while pending or running or waiting or swapped:
            while (pending and pending[0][3] <= self.clock and len(running) < self.cfg.max_seqs and not waiting):
                r, kv, first, _ = pending[0]
                t_first = r.first_token_at
                if not self.admit_prefilled(r, kv, first):
                    break
                r.first_token_at = t_first
                pending.pop(0)
                if r.generated >= r.output_len:
                    self.bm.free_seq(r.rid)
                    r.status, r.finished_at = "finished", max(self.clock, t_first)
                    finished.append(r)
                else:
                    running.append(r)
            if not (running or waiting or swapped):
                if pending and pending[0][3] > self.clock:
                    self.clock = pending[0][3]                  # idle until the next KV arrives
                    continue
                raise RuntimeError("a prefilled request does not fit the decode pool")
            finished += self.step(running, waiting, swapped)
        return self.metrics([a[0] for a in arrivals], finished, [])

    # -- the run ------------------------------------------------------------------------------------------
    def run(self, requests: list, progress=None) -> dict:
        pending = sorted(requests, key=lambda r: (r.arrival, r.rid))
        rejected = []
        for r in pending:
            r.tokens = list(r.prompt)
            why = self._reject_reason(r)
            if why:
                r.status, r.reason = "rejected", why
                rejected.append(r)
        pending = [r for r in pending if r.status != "rejected"]
        waiting, running, swapped, finished = [], [], [], []
        i = 0
        while i < len(pending) or waiting or running or swapped:
            while i < len(pending) and pending[i].arrival <= self.clock:
                waiting.append(pending[i])
                i += 1
            waiting.sort(key=lambda r: (r.computed == 0 and r.generated == 0, r.arrival, r.rid))
            if not (waiting or running or swapped):
                self.clock = pending[i].arrival                 # idle until the next arrival
                continue
            done = self.step(running, waiting, swapped)
            finished += done
            if progress is not None and done:
                progress(sum(r.parent is None for r in finished), len(pending))
        return self.metrics(requests, finished, rejected)

    def metrics(self, requests, finished, rejected) -> dict:
        samples, finished = finished, [r for r in finished if r.parent is None]     # requests; samples count tokens
        ttft = np.array([r.first_token_at - r.arrival for r in finished])
        tpot = np.array([(r.finished_at - r.first_token_at) / (r.generated - 1) for r in samples if r.generated > 1])
        tl = np.array(self.timeline) if self.timeline else np.zeros((0, 6))
        dts = tl[:, 5] if len(tl) else np.zeros(0)
        util = float((tl[:, 1] * dts).sum() / max((tl[:, 2] * dts).sum(), 1e-30)) if len(tl) else 0.0
        span = max((r.finished_at for r in finished), default=0.0) - min((r.arrival for r in finished), default=0.0)
        tokens_out = sum(r.generated for r in samples)

        def pct(a):
            return {f"p{q}": float(np.percentile(a, q)) if len(a) else None for q in (50, 90, 99)}
        return {"requests": len(requests), "completed": len(finished), "rejected": len(rejected),
                "rejections": [{"request": r.rid, "reason": r.reason} for r in rejected],
                "tokens_out": tokens_out, "duration_s": span,
                "throughput_tok_s": tokens_out / span if span > 0 else 0.0,
                "throughput_req_s": len(finished) / span if span > 0 else 0.0,
                "ttft_s": pct(ttft), "tpot_s": pct(tpot), "kv_utilization": util,
                "preemptions": dict(self.preemptions), "swap_bytes": self.swap_bytes,
                "cow_copies": self.bm.cow_copies, "iterations": self.iterations,
                "prefix_cached_tokens": self.prefix_cached_tokens,
                "scheduler": self.cfg.scheduler + (f"+chunked({self.cfg.chunked_prefill})"
                                                   if self.cfg.chunked_prefill else ""),
                "kv": self.cfg.kv, "free_blocks_at_end": self.bm.num_free(), "num_blocks": self.cfg.num_blocks,
                "outputs": {r.rid: r.tokens[len(r.prompt):] for r in samples}}
