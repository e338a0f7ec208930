"""Serving: continuous vs static batching, and paged vs contiguous KV, on one workload side by side.

Issue goals: continuous batching >= 2x static throughput on a mixed-length workload, and
paged KV utilisation >= 90% where contiguous reservation stays well under half. The
workload: ShareGPT-like lognormal lengths (the vLLM paper's means), every request
arriving at once (offline throughput, vLLM's benchmark_throughput). Static batching is
HF ``generate``: a batch's prompts left-padded to its longest, finished rows kept as
padding until the batch ends -- the priced runs pay for both, as the GPU would; on this
CPU the padding is not computed, so the measured static run is its best case. The project's GPT (2 layers x 64,
context 1024, float64) computes every token; each iteration is timed twice over: priced
as Llama-3-8B's roofline on an A100 (where a decode batch costs about one read of the
weights) and measured on this CPU (where a batch costs about the sum of its sequences,
so batching buys little).

    python benchmarks/serve.py [--requests 96]
"""

from __future__ import annotations

import argparse
import copy
import math

from netmorph.mesh.presets import PRESETS as MODELS
from netmorph.mesh.shape import ModelShape
from netmorph.planner.hardware import PRESETS as HARDWARE
from netmorph.serving import workload
from netmorph.serving.engine import Engine, ServeConfig
from netmorph.serving.roofline import iteration_time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=96)
    args = ap.parse_args()
    model = ModelShape(layers=2, hidden=64, heads=4, seq=1024, vocab=512)
    reqs = workload.generate(args.requests, math.inf, model.seq, model.vocab, seed=0)
    gpu = lambda items: iteration_time(MODELS["llama-3-8b"], HARDWARE["a100-80g"], items)  # noqa: E731
    print(
        f"# {args.requests} requests at once, mean prompt {sum(len(r.prompt) for r in reqs) / len(reqs):.0f} / "
        f"output {sum(r.output_len for r in reqs) / len(reqs):.0f} tokens (lognormal, ShareGPT means); at most 64 "
        f"sequences per iteration"
    )
    print("## batching: a pool of 4096 blocks x 16 tokens (the KV cache is not the limit)")
    out = _table(
        model,
        reqs,
        [
            ("static", dict(scheduler="static"), gpu),
            ("continuous", dict(), gpu),
            ("continuous, chunked 256", dict(chunked_prefill=256, max_tokens=512), gpu),
            ("static (measured on this CPU)", dict(scheduler="static"), None),
            ("continuous (measured on this CPU)", dict(), None),
        ],
        4096,
    )
    print(
        f"# continuous / static throughput: {out['continuous'] / out['static']:.2f}x priced as Llama-3-8B on an "
        f"A100 (goal >= 2x); {out['continuous (measured on this CPU)'] / out['static (measured on this CPU)']:.2f}x "
        f"measured on this CPU, where a batch costs the sum of its sequences"
    )
    print("## KV memory: a pool of 512 blocks x 16 tokens, continuous batching")
    _table(
        model, reqs, [("paged", dict(), gpu), ("contiguous (1024-token reservations)", dict(kv="contiguous"), gpu)], 512
    )


def _table(model, reqs, runs, blocks) -> dict:
    print(
        f"{'run':<36} {'tokens/s':>9} {'TTFT p50(s)':>11} {'TPOT p50(ms)':>12} {'KV util':>8} {'mean running':>12} "
        f"{'preempt':>8}"
    )
    out = {}
    for name, kw, price in runs:
        e = Engine(model, ServeConfig(num_blocks=blocks, block_size=16, **kw), price)
        m = e.run(copy.deepcopy(reqs))
        running = sum(t[3] * t[5] for t in e.timeline) / sum(t[5] for t in e.timeline)
        out[name] = m["throughput_tok_s"]
        print(
            f"{name:<36} {m['throughput_tok_s']:>9,.0f} {m['ttft_s']['p50']:>11.2f} {1e3 * m['tpot_s']['p50']:>12.1f} "
            f"{100 * m['kv_utilization']:>7.1f}% {running:>12.1f} {sum(m['preemptions'].values()):>8}"
        )
    return out


if __name__ == "__main__":
    main()
