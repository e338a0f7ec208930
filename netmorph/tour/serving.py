"""A ShareGPT-shaped workload (lengths scaled down 4x) served by the project's GPT, each iteration priced as
Llama-3-8B's roofline on an A100: paged against contiguous KV, three schedulers under growing load, and every
message of a training step, a disaggregated serve and a tensor-parallel serve by phase."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from netmorph.mesh.presets import PRESETS as MODELS
from netmorph.mesh.shape import ModelShape
from netmorph.parallel.config import TrainConfig
from netmorph.parallel.run import train
from netmorph.planner.hardware import PRESETS as HARDWARE
from netmorph.serving import workload
from netmorph.serving.disagg import serve_disaggregated
from netmorph.serving.engine import Engine, ServeConfig
from netmorph.serving.roofline import iteration_time
from netmorph.serving.tp import serve_tensor_parallel

STEPS = 3
RATES = (4.0, 8.0, 16.0)
SCHEDULERS = (
    ("static", dict(scheduler="static")),
    ("continuous", {}),
    ("continuous + chunked prefill 64", dict(chunked_prefill=64, max_tokens=128)),
)
PHASES = {
    "kv": "KV transfer (prefill -> decode ranks)",
    "tp.prefill": "prefill: TP all-reduces",
    "tp.decode": "decode: TP all-reduces",
}
TRAINING = "training: gradient all-reduce"


@dataclass
class Serving:
    kv: dict  # {"paged" | "contiguous": (KV timeline [(t, slots holding a token, reserved)], metrics)}
    curves: dict  # {scheduler: [metrics at each of RATES]}
    requests: int  # of each load point
    phases: dict  # {run: [(t, bytes, phase name)]}: every message of the three runs


def _price(items):
    return iteration_time(MODELS["llama-3-8b"], HARDWARE["a100-80g"], items)


def _phase_traffic() -> dict:
    """One data-parallel training step, a disaggregated serve and a tensor-parallel serve on the fabric: every
    message (its time from the ledger, its bytes, its phase)."""
    t = train(TrainConfig.make(dp=4, steps=2, trace=True))
    train_msgs = [
        (e["ts"] / 1e6, e["args"]["bytes"], TRAINING)
        for e in t.trace["traceEvents"]
        if e.get("ph") == "X" and e.get("cat", "").startswith("dp")
    ]
    model = ModelShape(layers=2, hidden=64, heads=4, seq=512, vocab=256)
    reqs = workload.generate(16, 200.0, model.seq, model.vocab, seed=1, means=(161.31 / 2, 337.99 / 8))
    cfg = ServeConfig(num_blocks=256, block_size=16)
    d = serve_disaggregated(model, cfg, copy.deepcopy(reqs), 1, 2, keep_ledger=True)
    p = serve_tensor_parallel(model, cfg, copy.deepcopy(reqs), 2, _price, keep_ledger=True)
    return {
        "one training step, dp 4": train_msgs,
        "serving, prefill 1 rank : decode 2 ranks": [
            (r.t0, r.bytes, PHASES[r.phase]) for r in d["ledger"] if r.phase in PHASES
        ],
        "serving, tensor parallel 2": [(r.t0, r.bytes, PHASES[r.phase]) for r in p["ledger"] if r.phase in PHASES],
    }


def run(tick=lambda: None, quick: bool = False) -> Serving:
    """``quick``: 12 requests per load point instead of 24."""
    model = ModelShape(layers=2, hidden=32, heads=4, seq=512, vocab=256)
    means = (161.31 / 4, 337.99 / 4)

    def serve(n, rate, **kw):
        reqs = workload.generate(n, rate, model.seq, model.vocab, seed=0, means=means)
        e = Engine(model, ServeConfig(block_size=16, **kw), _price)
        metrics = e.run(copy.deepcopy(reqs))
        return e.timeline, metrics

    kv = {name: serve(32, 40.0, num_blocks=64, kv=name) for name in ("paged", "contiguous")}
    tick()
    n = 12 if quick else 24
    curves = {name: [serve(n, rate, num_blocks=512, **kw)[1] for rate in RATES] for name, kw in SCHEDULERS}
    tick()
    phases = _phase_traffic()
    tick()
    return Serving(kv, curves, n, phases)
