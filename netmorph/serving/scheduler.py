"""The serving scheduler: pure policy, from the queues and the block manager to what runs this iteration.

vLLM's ``Scheduler.schedule() -> SchedulerOutputs`` (v0) without the model: no torch here, so the policy is
tested on its own. Each iteration it decides

- which requests run and how many of their tokens (a whole prompt, a prefill chunk, one decode token), with
  each token's KV slot (block, offset) already allocated in the :class:`~netmorph.serving.blocks.BlockManager`;
- the blocks to move between the pool and the host, in the order decided (a preempted request's blocks out,
  a resumed one's back in), and the copy-on-write copies to make before anything is written;
- who was preempted.

:class:`~netmorph.serving.runner.Runner` carries a :class:`SchedulerOutput` out on the model;
:class:`~netmorph.serving.engine.Engine` turns the logits into tokens and keeps the clock.

Schedulers (``scheduler``):

- ``static`` -- request-level batching (HF ``generate``): when the engine is idle it takes up to ``max_seqs``
  arrived requests, prefills them and decodes until the last one finishes; nobody joins a running batch, and a
  finished row stays in it as padding (its KV held) until the batch ends -- or until the pool needs its blocks.
- ``continuous`` -- iteration-level scheduling (Orca, Yu et al. 2022; vLLM): requests join and leave the batch
  every iteration. As vLLM (v0) does without chunked prefill, an iteration either prefills newly admitted
  requests (in the policy's order, up to ``max_tokens`` prompt tokens) or decodes one token for every running request.
- ``chunked_prefill`` > 0 (Sarathi-Serve, Agrawal et al. 2024): every iteration first decodes one token for
  each running request, then fills the rest of the token budget with prefill chunks of at most that many
  tokens -- long prompts no longer stall the decodes.

When a sequence needs a block and the pool is empty the scheduler preempts the running request its policy names
(:mod:`netmorph.serving.policy`; FCFS, vLLM's default: the latest arrival, so the oldest keep their progress).
``preemption="recompute"`` frees its blocks and puts it back in the queue (FCFS: at its head) to prefill its
prompt and what it generated so far again;
``"swap"`` moves its blocks to a host pool (bytes counted out and back in) and resumes it, before any new
admission, when blocks free up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from netmorph.errors import UsageError
from netmorph.serving.blocks import BlockManager
from netmorph.serving.policy import policy
from netmorph.serving.request import Request, RequestStatus, sample_id

__all__ = ["Request", "RequestStatus", "ScheduledItem", "Scheduler", "SchedulerOutput", "ServeConfig", "sample_id"]


@dataclass
class ServeConfig:
    num_blocks: int = 512
    block_size: int = 16
    scheduler: str = "continuous"  # continuous | static
    kv: str = "paged"  # paged | contiguous
    chunked_prefill: int = 0  # > 0: chunk size (tokens) of Sarathi-style mixed batches
    max_tokens: int = 2048  # tokens per iteration (vLLM's max_num_batched_tokens)
    max_seqs: int = 64  # sequences per iteration (max_num_seqs)
    preemption: str = "recompute"  # recompute | swap
    prefix_caching: bool = True
    temperature: float = 0.0
    scheduling_policy: str = "fcfs"  # a name in netmorph.serving.policy.POLICIES (vLLM's --scheduling-policy)

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
        policy(self.scheduling_policy)  # a registered name, or the one line naming the known ones
        if self.chunked_prefill < 0 or self.chunked_prefill and self.scheduler == "static":
            raise UsageError("{chunked_prefill} needs a token count > 0 and --scheduler continuous", "chunked_prefill")
        if not (1 <= self.max_tokens <= 1 << 20 and 1 <= self.max_seqs <= 4096):
            raise UsageError("{max_tokens} must be in 1..2**20 and {max_seqs} in 1..4096", "max_tokens")


class ScheduledItem(NamedTuple):
    """One request's part of an iteration."""

    request: Request
    tokens: int  # its tokens to compute now (a whole prompt, a prefill chunk, one decode token)
    slots: list  # each token's KV slot [(block, offset)], allocated


@dataclass
class SchedulerOutput:
    """What to run this iteration (vLLM's ``SchedulerOutputs``)."""

    items: list = field(default_factory=list)  # [ScheduledItem]
    block_ops: list = field(default_factory=list)  # [("out" | "in", request id, blocks)] in the order decided
    copies: list = field(default_factory=list)  # [(src, dst)] copy-on-write, before anything is written
    preempted: list = field(default_factory=list)  # requests preempted while forming this batch
    padding: int = 0  # a static batch's finished rows still in it

    @property
    def tokens(self) -> int:
        return sum(n for _, n, _ in self.items)


class Scheduler:
    """The policy over one block manager; ``bytes_per_block`` prices a swap."""

    def __init__(self, cfg: ServeConfig, max_context: int, bytes_per_block: int):
        cfg.check()
        self.cfg = cfg
        self.policy = policy(cfg.scheduling_policy)
        self.bm = BlockManager(
            cfg.num_blocks,
            cfg.block_size,
            max_context,
            contiguous=cfg.kv == "contiguous",
            prefix_caching=cfg.prefix_caching,
        )
        self.bytes_per_block = bytes_per_block
        self.preemptions = {"swap": 0, "recompute": 0}
        self.swap_bytes = 0
        self.prefix_cached_tokens = 0  # prompt tokens found in cached blocks (not computed again)
        self.frozen = False
        self.padding = []  # static batches: finished rows kept until the batch ends (HF generate)
        self.batch_prompt = self.batch_step = 0  # a static batch's longest prompt and decode steps so far

    # -- admission ----------------------------------------------------------------------------------------
    def reject_reason(self, r: Request, vocab: int) -> str:
        total = len(r.prompt) + r.output_len
        if not r.prompt or r.output_len < 1:
            return "a request needs at least one prompt token and one output token"
        if total > self.bm.max_context:
            return (
                f"prompt {len(r.prompt)} + output {r.output_len} tokens exceed the model's context "
                f"{self.bm.max_context}"
            )
        if self.bm.blocks_needed(total) * r.n > self.cfg.num_blocks:
            return (
                f"needs {self.bm.blocks_needed(total) * r.n} blocks ({r.n} sample(s)), more than the whole pool "
                f"({self.cfg.num_blocks} x {self.cfg.block_size} tokens)"
            )
        if max(r.prompt) >= vocab or min(r.prompt) < 0:
            return f"prompt token ids must be in 0..{vocab - 1}"
        return ""

    def _admit(self, r: Request) -> bool:
        """Blocks for the request's tokens so far (prompt, plus what it generated before a recompute)."""
        if not self.bm.can_allocate(len(r.tokens), r.tokens):
            return False
        cached = self.bm.allocate(r.rid, r.tokens)
        self.prefix_cached_tokens += cached
        r.computed = cached
        r.status = RequestStatus.RUNNING
        return True

    def _admit_next(self, waiting: list, running: list, budget: int | None = None):
        """The request the policy tries next, admitted (moved to ``running``), or None (also when its tokens so
        far are more than ``budget``)."""
        r = self.policy.next_to_admit(waiting)
        if r is None or budget is not None and len(r.tokens) > budget or not self._admit(r):
            return None
        waiting.remove(r)
        running.append(r)
        return r

    def _preempt(self, out: SchedulerOutput, running: list, waiting: list, swapped: list) -> None:
        victim = self.policy.victim(running)
        running.remove(victim)
        out.preempted.append(victim)
        if self.cfg.preemption == "swap":
            blocks = list(self.bm.tables[victim.rid].blocks)
            out.block_ops.append(("out", victim.rid, blocks))  # the runner copies them to the host
            victim.swapped = len(blocks)
            self.swap_bytes += len(blocks) * self.bytes_per_block
            self.bm.swap_out(victim.rid)
            victim.status = RequestStatus.SWAPPED
            swapped.append(victim)
            self.preemptions["swap"] += 1
        else:
            self.bm.free_seq(victim.rid)
            victim.computed = 0
            victim.status = RequestStatus.WAITING
            self.policy.requeue(waiting, victim)
            self.preemptions["recompute"] += 1

    def _swap_in(self, out: SchedulerOutput, swapped: list, running: list) -> None:
        while swapped:
            r = self.policy.next_to_swap_in(swapped)
            if r.swapped > self.bm.num_free():
                return
            out.block_ops.append(("in", r.rid, list(self.bm.swap_in(r.rid, r.swapped))))
            self.swap_bytes += r.swapped * self.bytes_per_block
            r.swapped, r.status = 0, RequestStatus.RUNNING
            swapped.remove(r)
            running.append(r)

    # -- one iteration ------------------------------------------------------------------------------------
    def _batch(self, out: SchedulerOutput, running, waiting, swapped) -> list:
        """[(request, number of its tokens to compute now)] for this iteration."""
        cfg = self.cfg
        batch, budget = [], cfg.max_tokens
        if cfg.scheduler == "static":
            if not running and not self.frozen:
                while len(running) < cfg.max_seqs and self._admit_next(waiting, running):
                    pass
                self.batch_prompt = max((len(r.tokens) for r in running), default=0)
                self.batch_step = 0
            return [(r, len(r.tokens) - r.computed) for r in running]
        if swapped and not self.frozen:
            self._swap_in(out, swapped, running)
        decodes = [r for r in running if len(r.tokens) - r.computed == 1]
        partial = [r for r in running if len(r.tokens) - r.computed > 1]
        if not cfg.chunked_prefill:
            if not swapped and not self.frozen:  # vLLM v0: admit and prefill before decoding
                admitted = []
                while len(running) < cfg.max_seqs:  # the first one whatever its length, as vLLM v0
                    r = self._admit_next(waiting, running, budget if admitted else None)
                    if r is None:
                        break
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
        while budget > 0 and not swapped and not self.frozen and len(running) < cfg.max_seqs:
            r = self._admit_next(waiting, running)
            if r is None:
                break
            n = min(cfg.chunked_prefill, budget, len(r.tokens) - r.computed)
            batch.append((r, n))
            budget -= n
        return batch

    def schedule(self, running: list, waiting: list, swapped: list) -> SchedulerOutput:
        """This iteration's batch with every slot allocated; preempts (and releases a static batch's padding)
        until it fits the pool."""
        out = SchedulerOutput()
        self.frozen = False  # after a preemption nothing is admitted or swapped in this step
        while True:
            batch = self._batch(out, running, waiting, swapped)
            need = sum(self.bm.blocks_to_grow(r.rid, n) for r, n in batch)
            if need <= self.bm.num_free():
                break
            if self.padding:  # a static batch's finished rows give way first
                self.release_padding()
                continue
            if not running:
                raise RuntimeError("nothing left to preempt and the batch does not fit (admission should refuse it)")
            self._preempt(out, running, waiting, swapped)
            self.frozen = True
        out.items = [ScheduledItem(r, n, [self.bm.slot(r.rid, r.tokens) for _ in range(n)]) for r, n in batch]
        out.copies, self.bm.copies = list(self.bm.copies), []
        out.padding = len(self.padding)
        return out

    def finish(self, r: Request) -> None:
        """A request is done: its blocks go back to the pool (a static batch keeps its row as padding)."""
        r.status = RequestStatus.FINISHED
        if self.cfg.scheduler == "static":
            self.padding.append(r)
        else:
            self.bm.free_seq(r.rid)

    def release_padding(self) -> None:
        for p in self.padding:
            self.bm.free_seq(p.rid)
        self.padding = []
