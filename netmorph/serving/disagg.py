"""Prefill/decode disaggregation over the fabric (DistServe, Zhong et al. 2024; Splitwise, Patel et al. 2024).

Prefill is compute-bound and decode bandwidth-bound; on one GPU they interfere (a long
prefill stalls every decode in its iteration). Disaggregation runs them on different
rank groups: ``P`` prefill ranks compute each request's prompt and its first token,
then stream the prompt's keys and values -- every layer's, for every prompt position --
to one of ``D`` decode ranks with the runtime's ``send``, which writes them into its own
paged pool and decodes. Requests go round-robin (prefill rank ``rid mod P``, decode
rank ``rid mod D``); each prefill rank sends in arrival order and each decode rank
receives in arrival order, so the pairwise-FIFO sends cannot deadlock.

The bytes on the wire per request are the KV formula times the prompt length,
``2 · layers · heads · head_dim · bytes`` per token (the ledger's ``kv`` phase; a
24-byte header per request rides in ``kv.hdr``).
"""

from __future__ import annotations

import time

import numpy as np

from netmorph.runtime import launch
from netmorph.serving.engine import Engine
from netmorph.serving.model import sample
from netmorph.serving.runner import Runner
from netmorph.serving.scheduler import Scheduler


def _rank(comm, model_cfg, serve_cfg, requests, P: int, D: int, price, kv_seconds_per_token: float):
    import torch

    torch.set_num_threads(1)
    me = comm.rank
    order = sorted(requests, key=lambda r: (r.arrival, r.rid))
    if me < P:  # the prefill role: one request at a time
        runner = Runner(model_cfg, serve_cfg.num_blocks, serve_cfg.block_size)
        bm = Scheduler(serve_cfg, model_cfg.seq, runner.bytes_per_block()).bm  # the pool as the engine's
        # (contiguous KV too)
        clock = 0.0
        for r in (q for q in order if q.rid % P == me):
            t0 = time.perf_counter()
            r.tokens = list(r.prompt)
            bm.allocate(r.rid, r.tokens)
            n = len(r.prompt)
            slots = [bm.slot(r.rid, r.tokens) for _ in range(n)]
            (logits,) = runner.forward([(r.tokens, 0, slots, bm.tables[r.rid].blocks)])
            first = sample(logits, serve_cfg.temperature, r.rid * 1_000_003 + n)
            clock = max(clock, r.arrival) + (price([(n, 0)]) if price else time.perf_counter() - t0)
            ready = clock + n * kv_seconds_per_token  # the KV crosses to the decode node
            kv = runner.read_kv(bm.tables[r.rid].blocks, n)  # (layers, 2, n, heads, hd)
            dst = P + r.rid % D
            with comm.phase("kv.hdr"):
                comm.send(np.array([r.rid, n, first, clock, ready], dtype=np.float64), dst)
            with comm.phase("kv"):
                comm.send(np.ascontiguousarray(kv), dst)
            bm.free_seq(r.rid)
        return {"role": "prefill", "free_blocks_at_end": bm.num_free()}
    engine = Engine(model_cfg, serve_cfg, price)  # the decode role
    arrivals = []
    heads, hd = model_cfg.heads, model_cfg.hidden // model_cfg.heads
    for r in (q for q in order if q.rid % D == me - P):  # decode
        hdr = np.empty(5, dtype=np.float64)
        comm.recv(hdr, r.rid % P)
        kv = np.empty((model_cfg.layers, 2, int(hdr[1]), heads, hd))
        comm.recv(kv, r.rid % P)
        r.first_token_at = float(hdr[3])
        arrivals.append((r, kv, int(hdr[2]), float(hdr[4])))
    out = engine.decode_prefilled(arrivals)
    done = [r for r, *_ in arrivals if r.status == "finished"]
    out["ttft_list"] = [r.first_token_at - r.arrival for r in done]
    out["tpot_list"] = [(r.finished_at - r.first_token_at) / (r.generated - 1) for r in done if r.generated > 1]
    out["last_finish"] = max((r.finished_at for r in done), default=0.0)
    return {"role": "decode", **out}


def serve_disaggregated(
    model_cfg,
    serve_cfg,
    requests,
    P: int,
    D: int,
    timeout: float = 60.0,
    keep_ledger: bool = False,
    price=None,
    kv_seconds_per_token: float = 0.0,
    backend: str = "local",
) -> dict | None:
    """Run the workload on P prefill + D decode ranks of the local fabric; outputs, the KV bytes moved, and
    latencies. ``price`` prices iterations (see :class:`~netmorph.serving.engine.Engine`);
    ``kv_seconds_per_token``: the priced transfer of one token's KV between the nodes (e.g. the real model's KV
    bytes per token over the NIC's bandwidth). ``backend="job"``: the P + D ranks are a torchrun job's, this
    process one of them (None on ranks other than 0)."""
    serve_cfg.check()
    got = launch(
        _rank,
        P + D,
        model_cfg,
        serve_cfg,
        requests,
        P,
        D,
        price,
        kv_seconds_per_token,
        ledger=True,
        timeout=timeout,
        backend=backend,
    )
    if got is None:
        return None
    results, ledger = list(got), got.ledger
    outputs, completed, tokens, ttft, tpot, ends = {}, 0, 0, [], [], []
    for res in results:
        if res["role"] == "decode":
            outputs.update(res["outputs"])
            completed += res["completed"]
            tokens += res["tokens_out"]
            ttft += res["ttft_list"]
            tpot += res["tpot_list"]
            ends.append(res["last_finish"])
    span = max(ends, default=0.0) - min((r.arrival for r in requests), default=0.0)
    per_token = 2 * model_cfg.layers * model_cfg.hidden * 8  # float64 K and V, every head
    phases = ledger.by_phase()

    def pct(a):
        return {f"p{q}": float(np.percentile(a, q)) if len(a) else None for q in (50, 90, 99)}

    return {
        "requests": len(requests),
        "completed": completed,
        "tokens_out": tokens,
        "prefill_ranks": P,
        "ttft_s": pct(ttft),
        "tpot_s": pct(tpot),
        "duration_s": span,
        "throughput_tok_s": tokens / span if span > 0 else 0.0,
        "decode_ranks": D,
        "kv_transfer_bytes": phases.get("kv", {}).get("bytes", 0),
        "kv_transfer_bytes_formula": sum(per_token * len(r.prompt) for r in requests),
        "kv_header_bytes": phases.get("kv.hdr", {}).get("bytes", 0),
        "free_blocks_at_end": [res["free_blocks_at_end"] for res in results],
        "outputs": outputs,
        **({"ledger": ledger.records} if keep_ledger else {}),
    }
