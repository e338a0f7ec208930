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

import numpy as np


def _rank(comm, model_cfg, serve_cfg, requests, P: int, D: int):
    import torch

    from netmorph.serving.engine import Engine
    from netmorph.serving.model import sample
    torch.set_num_threads(1)
    me = comm.rank
    engine = Engine(model_cfg, serve_cfg)
    order = sorted(requests, key=lambda r: (r.arrival, r.rid))
    if me < P:                                                   # prefill
        for r in (q for q in order if q.rid % P == me):
            r.tokens = list(r.prompt)
            engine.bm.allocate(r.rid, r.tokens)
            n = len(r.prompt)
            slots = [engine.bm.slot(r.rid, r.tokens[:j + 1]) for j in range(n)]
            (logits,) = engine.model.forward([(r.tokens, 0, slots, engine.bm.tables[r.rid].blocks)])
            first = sample(logits, serve_cfg.temperature, r.rid * 1_000_003 + n)
            table = engine.bm.tables[r.rid].blocks
            kv = np.stack([np.stack([engine.model.gather(i, table, n)[0].numpy(),
                                     engine.model.gather(i, table, n)[1].numpy()])
                           for i in range(model_cfg.layers)])           # (layers, 2, n, heads, hd)
            dst = P + r.rid % D
            with comm.phase("kv.hdr"):
                comm.send(np.array([r.rid, n, first], dtype=np.int64), dst)
            with comm.phase("kv"):
                comm.send(np.ascontiguousarray(kv), dst)
            engine.bm.free_seq(r.rid)
        return {"role": "prefill", "free_blocks_at_end": engine.bm.num_free()}
    arrivals = []
    heads, hd = model_cfg.heads, model_cfg.hidden // model_cfg.heads
    for r in (q for q in order if q.rid % D == me - P):          # decode
        hdr = np.empty(3, dtype=np.int64)
        comm.recv(hdr, r.rid % P)
        kv = np.empty((model_cfg.layers, 2, int(hdr[1]), heads, hd))
        comm.recv(kv, r.rid % P)
        arrivals.append((r, kv, int(hdr[2])))
    out = engine.decode_prefilled(arrivals)
    return {"role": "decode", **out}


def serve_disaggregated(model_cfg, serve_cfg, requests, P: int, D: int, timeout: float = 60.0,
                        keep_ledger: bool = False) -> dict:
    """Run the workload on P prefill + D decode ranks of the local fabric; outputs and the KV bytes moved."""
    from netmorph.runtime import launch
    serve_cfg.check()
    results, ledger = launch(_rank, P + D, model_cfg, serve_cfg, requests, P, D, ledger=True, timeout=timeout)
    outputs, completed, tokens = {}, 0, 0
    for res in results:
        if res["role"] == "decode":
            outputs.update(res["outputs"])
            completed += res["completed"]
            tokens += res["tokens_out"]
    per_token = 2 * model_cfg.layers * model_cfg.hidden * 8                    # float64 K and V, every head
    phases = ledger.by_phase()
    return {"requests": len(requests), "completed": completed, "tokens_out": tokens, "prefill_ranks": P,
            "decode_ranks": D, "kv_transfer_bytes": phases.get("kv", {}).get("bytes", 0),
            "kv_transfer_bytes_formula": sum(per_token * len(r.prompt) for r in requests),
            "kv_header_bytes": phases.get("kv.hdr", {}).get("bytes", 0),
            "free_blocks_at_end": [res["free_blocks_at_end"] for res in results], "outputs": outputs,
            **({"ledger": ledger.records} if keep_ledger else {})}
