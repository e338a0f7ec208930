"""Tensor-parallel serving over the fabric: Megatron's split of every layer, decode's side of communication.

Each of ``tp`` ranks holds ``heads/tp`` attention heads (their QKV rows, their slice of
the output projection, **their part of the KV cache**) and ``1/tp`` of the MLP; every
layer ends its attention and its MLP with an all-reduce of the row-parallel partial
sums (Megatron's g), so every iteration sends ``2 · layers`` all-reduces of
``N · hidden`` values, ``N`` = the tokens in the batch (one per decoding sequence): a
ring all-reduce sends ``2(t-1)/t`` of that per rank, ``2(t-1)`` times it over all ranks.
Training sends one large gradient all-reduce per step; decode sends many small ones,
every token.

Every rank runs the same scheduler on the same requests. Its decisions depend on the
clock, so the iterations must be priced by a time model (deterministic on every rank),
and the all-reduce gives every rank the same bits, so every rank samples the same
tokens.
"""

from __future__ import annotations

from netmorph.parallel.tensor_parallel import TensorParallel
from netmorph.runtime import launch
from netmorph.runtime.base import Group
from netmorph.serving.engine import Engine


def _rank(comm, model_cfg, serve_cfg, requests, tp: int, price):
    layers = TensorParallel(comm, Group(range(tp)), phase="tp.decode")  # training's layers, Megatron's f and g

    def tag(items):  # the ledger tells a prefill iteration's all-reduces from a decode one's
        layers.phase = "tp.prefill" if any(len(it[0]) > 1 for it in items) else "tp.decode"

    engine = Engine(model_cfg, serve_cfg, price, layers=layers, on_forward=tag)
    out = engine.run(requests)
    out["tokens_per_iteration"] = [int(x[4]) for x in engine.timeline]
    out["kv_bytes_per_block_per_rank"] = engine.runner.bytes_per_block()
    return out


def serve_tensor_parallel(
    model_cfg,
    serve_cfg,
    requests,
    tp: int,
    price,
    timeout: float = 60.0,
    keep_ledger: bool = False,
    backend: str = "local",
) -> dict | None:
    """Serve on ``tp`` ranks; rank 0's metrics, plus the all-reduce bytes measured and from the formula
    (ledger phases ``tp.prefill`` and ``tp.decode``; ``keep_ledger``: every message, as ``ledger``).
    ``backend="job"``: the ranks are a torchrun job's, this process one of them (None on ranks other than 0)."""
    serve_cfg.check()
    got = launch(_rank, tp, model_cfg, serve_cfg, requests, tp, price, ledger=True, timeout=timeout, backend=backend)
    if got is None:
        return None
    results, ledger = list(got), got.ledger
    out = results[0]
    assert all(r["outputs"] == out["outputs"] for r in results), "TP ranks sampled different tokens"
    tokens = sum(out.pop("tokens_per_iteration"))
    phases = ledger.by_phase()
    tp_phases = [v for k, v in phases.items() if k.startswith("tp.")]
    out.update(
        tp=tp,
        tp_allreduce_bytes=sum(v["bytes"] for v in tp_phases),
        tp_bytes_by_phase={k: v["bytes"] for k, v in phases.items() if k.startswith("tp.")},
        tp_allreduce_bytes_formula=2 * model_cfg.layers * 2 * (tp - 1) * tokens * model_cfg.hidden * 8,
        tp_allreduces=2 * model_cfg.layers * out["iterations"],
        tp_messages=sum(v["messages"] for v in tp_phases),
        tokens_computed=tokens,
    )
    if keep_ledger:
        out["ledger"] = ledger.records
    return out
