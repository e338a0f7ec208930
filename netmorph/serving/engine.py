"""The serving loop: requests arrive, the scheduler forms each iteration's batch, the runner computes it, the
engine turns logits into tokens and keeps the clock -- vLLM's ``LLMEngine.step()`` over its ``Scheduler`` and
``ModelRunner`` (:mod:`netmorph.serving.scheduler`, :mod:`netmorph.serving.runner`).

Time: the engine's clock advances by each iteration's time and jumps to the next arrival when idle, so TTFT and
TPOT are latencies under the given arrival process. The iteration's time is either measured (the real
computation of this small model on this machine's CPU, where a batch costs about the sum of its sequences) or
priced by a time model -- :func:`netmorph.serving.roofline.iteration_time`, a real model's roofline on a GPU,
where a decode batch costs about one read of the weights whatever its size. The tokens are computed for real
either way. A request with ``n`` > 1 forks its samples after the prefill (vLLM's parallel sampling): every
block shared, the first write into the last one copied.
"""

from __future__ import annotations

import time

import numpy as np

from netmorph.errors import UsageError
from netmorph.serving.model import sample
from netmorph.serving.runner import Runner
from netmorph.serving.scheduler import Request, RequestStatus, Scheduler, ServeConfig, sample_id

__all__ = ["Engine", "Request", "ServeConfig", "check_deployment", "sample_id"]


def check_deployment(tp: int, disaggregate, samples: int, priced: bool) -> None:
    """The ranks a model is served on: one engine, ``tp`` tensor-parallel ranks (each schedules alike, so the
    iterations must be priced, not timed on each rank's own clock), or ``disaggregate`` = (prefill, decode)
    ranks -- or the one line that says which field to change."""
    if tp > 1 and (not priced or disaggregate):
        raise UsageError(
            "{tp} > 1 needs a priced {time_model} (every rank must schedule alike) and no {disaggregate}", "tp"
        )
    if samples > 1 and disaggregate:
        raise UsageError("{n} > 1 is not supported with {disaggregate} yet", "n")


class Engine:
    def __init__(self, model_cfg, cfg: ServeConfig, time_model=None, layers=None, on_forward=None):
        """``time_model([(new tokens, tokens in context)] per sequence) -> seconds`` prices an iteration (e.g.
        :func:`netmorph.serving.roofline.iteration_time` for a real model on a GPU); None: the measured wall time
        of this model's iteration here. ``layers`` and ``on_forward``: the :class:`Runner`'s."""
        cfg.check()
        self.cfg, self.mcfg, self.time_model = cfg, model_cfg, time_model
        self.runner = Runner(model_cfg, cfg.num_blocks, cfg.block_size, layers=layers, on_forward=on_forward)
        self.scheduler = Scheduler(cfg, model_cfg.seq, self.runner.bytes_per_block())
        self.bm = self.scheduler.bm
        self.clock = 0.0
        self.timeline = []  # (t, slots holding a token, slots reserved, running, tokens, seconds)
        self.iterations = 0

    def _price(self, out) -> float | None:
        """The iteration's time by the time model (None: measure it)."""
        if not self.time_model:
            return None
        sch = self.scheduler
        if self.cfg.scheduler == "static":
            # HF generate: every row (finished ones too) padded to the batch's longest prompt
            P, k = sch.batch_prompt, sch.batch_step
            rows = [
                (P, 0) if n > 1 and r.computed == 0 else (1, P + k) if n == 1 else (n, r.computed)
                for r, n, _ in out.items
            ]
            if all(n == 1 for _, n, _ in out.items):
                sch.batch_step += 1
            return self.time_model(rows + [(1, P + k)] * out.padding)
        return self.time_model([(n, r.computed) for r, n, _ in out.items])

    def step(self, running, waiting, swapped) -> list:
        """Schedule and run one iteration; returns the requests that finished in it."""
        t0 = time.perf_counter()
        out = self.scheduler.schedule(running, waiting, swapped)
        logits = self.runner.execute(out, self.bm.tables)
        priced = self._price(out)
        done, forks = [], []
        for (r, n, _), lg in zip(out.items, logits):
            r.computed += n
            if r.computed < len(r.tokens):  # a prefill chunk: no token yet
                continue
            if r.n > 1 and r.generated == 0 and r.parent is None:  # parallel sampling: fork after the prefill
                for k in range(1, r.n):
                    child = Request(
                        sample_id(r.rid, k),
                        r.prompt,
                        r.output_len,
                        r.arrival,
                        list(r.tokens),
                        r.computed,
                        RequestStatus.RUNNING,
                        parent=r.rid,
                        priority=r.priority,
                    )
                    self.bm.fork(r.rid, child.rid)  # every block shared, the last partial one too
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
            running.remove(r)
            self.scheduler.finish(r)
        if not running:
            self.scheduler.release_padding()
        self.timeline.append((self.clock, self.bm.used_slots(), self.bm.reserved_slots(), len(running), out.tokens, dt))
        return done

    # -- disaggregation: requests whose prefill ran elsewhere ----------------------------------------------
    def admit_prefilled(self, r: Request, kv, first: int) -> bool:
        """Write a prompt's transferred keys and values (``kv``: layers x 2 x n x heads x head_dim) into fresh
        blocks and continue from its first token; False if the pool cannot hold it now."""
        n = len(r.prompt)
        if not self.bm.can_allocate(n + 1):
            return False
        r.tokens = list(r.prompt)
        self.bm.allocate(r.rid, r.tokens)
        self.runner.write_kv([self.bm.slot(r.rid, r.tokens) for _ in range(n)], kv)
        r.tokens.append(first)
        r.computed, r.status = n, RequestStatus.RUNNING
        return True

    def decode_prefilled(self, arrivals) -> dict:
        """Decode every (request, kv, first token, ready at) of ``arrivals`` to the end: a request joins when its
        KV has arrived (``ready``, on this engine's clock) and the pool can hold it; its TTFT is the prefill
        rank's (``first_token_at`` set by the caller)."""
        pending = sorted(arrivals, key=lambda a: (a[3], a[0].rid))
        running, waiting, swapped, finished = [], [], [], []
        while pending or running or waiting or swapped:
            while pending and pending[0][3] <= self.clock and len(running) < self.cfg.max_seqs and not waiting:
                r, kv, first, _ = pending[0]
                t_first = r.first_token_at
                if not self.admit_prefilled(r, kv, first):
                    break
                r.first_token_at = t_first
                pending.pop(0)
                if r.generated >= r.output_len:
                    self.bm.free_seq(r.rid)
                    r.status, r.finished_at = RequestStatus.FINISHED, max(self.clock, t_first)
                    finished.append(r)
                else:
                    running.append(r)
            if not (running or waiting or swapped):
                if pending and pending[0][3] > self.clock:
                    self.clock = pending[0][3]  # idle until the next KV arrives
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
            why = self.scheduler.reject_reason(r, self.mcfg.vocab)
            if why:
                r.status, r.reason = RequestStatus.REJECTED, why
                rejected.append(r)
        pending = [r for r in pending if r.status != RequestStatus.REJECTED]
        waiting, running, swapped, finished = [], [], [], []
        i = 0
        while i < len(pending) or waiting or running or swapped:
            while i < len(pending) and pending[i].arrival <= self.clock:
                waiting.append(pending[i])
                i += 1
            self.scheduler.policy.order(waiting)
            if not (waiting or running or swapped):
                self.clock = pending[i].arrival  # idle until the next arrival
                continue
            done = self.step(running, waiting, swapped)
            finished += done
            if progress is not None and done:
                progress(sum(r.parent is None for r in finished), len(pending))
        return self.metrics(requests, finished, rejected)

    def metrics(self, requests, finished, rejected) -> dict:
        samples, finished = finished, [r for r in finished if r.parent is None]  # requests; samples count tokens

        def pct(a):
            return {f"p{q}": float(np.percentile(a, q)) if len(a) else None for q in (50, 90, 99)}

        def ttft(reqs):
            return pct(np.array([r.first_token_at - r.arrival for r in reqs]))

        def tpot(sams):
            return pct(
                np.array([(r.finished_at - r.first_token_at) / (r.generated - 1) for r in sams if r.generated > 1])
            )

        tl = np.array(self.timeline) if self.timeline else np.zeros((0, 6))
        dts = tl[:, 5] if len(tl) else np.zeros(0)
        util = float((tl[:, 1] * dts).sum() / max((tl[:, 2] * dts).sum(), 1e-30)) if len(tl) else 0.0
        span = max((r.finished_at for r in finished), default=0.0) - min((r.arrival for r in finished), default=0.0)
        tokens_out = sum(r.generated for r in samples)
        by_priority = {}
        for prio in sorted({r.priority for r in finished}):
            mine = [r for r in finished if r.priority == prio]
            by_priority[str(prio)] = {
                "count": len(mine),
                "ttft_s": ttft(mine),
                "tpot_s": tpot([r for r in samples if r.priority == prio]),
            }
        return {
            "requests": len(requests),
            "completed": len(finished),
            "rejected": len(rejected),
            "rejections": [{"request": r.rid, "reason": r.reason} for r in rejected],
            "tokens_out": tokens_out,
            "duration_s": span,
            "throughput_tok_s": tokens_out / span if span > 0 else 0.0,
            "throughput_req_s": len(finished) / span if span > 0 else 0.0,
            "ttft_s": ttft(finished),
            "tpot_s": tpot(samples),
            "by_priority": by_priority,
            "kv_utilization": util,
            "preemptions": dict(self.scheduler.preemptions),
            "swap_bytes": self.scheduler.swap_bytes,
            "cow_copies": self.bm.cow_copies,
            "iterations": self.iterations,
            "prefix_cached_tokens": self.scheduler.prefix_cached_tokens,
            "scheduler": self.cfg.scheduler
            + (f"+chunked({self.cfg.chunked_prefill})" if self.cfg.chunked_prefill else ""),
            "scheduling_policy": self.cfg.scheduling_policy,
            "kv": self.cfg.kv,
            "free_blocks_at_end": self.bm.num_free(),
            "num_blocks": self.cfg.num_blocks,
            "outputs": {r.rid: r.tokens[len(r.prompt) :] for r in samples},
        }
