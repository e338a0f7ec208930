"""Request workloads: a generated ShareGPT-like mix, or a JSONL file.

Generated: arrivals are a Poisson process of ``rate`` requests/s (exponential gaps,
as vLLM's ``benchmark_serving.py --request-rate``); prompt and output lengths are
lognormal with the means of the ShareGPT conversations the vLLM paper serves (Kwon et
al. 2023, section 6.1 and Fig. 11: 161.31 prompt and 337.99 output tokens on average;
Alpaca's are 19.31 and 58.45) and a spread ``sigma`` of our choosing (the paper gives
histograms, not a fitted shape), then clipped so that prompt + output fits the context
-- vLLM's evaluation likewise cuts prompts to the model's context. Token ids are drawn
at random, except that a ``shared_prefix`` fraction of requests start with one common
system prompt (prefix caching's case).

File: one JSON object per line, ``{"prompt_len": int, "output_len": int, "arrival_s": float}``
(optionally ``"prompt": [token ids]`` and ``"priority": int``, lower served first under
``--scheduling-policy priority``, default 0, as vLLM's); a malformed line rejects that request
with a reason and the rest are served.
"""

from __future__ import annotations

import json
import math

import numpy as np

from netmorph.errors import UsageError
from netmorph.files import printable, read_text_limited
from netmorph.serving.engine import Request

SHAREGPT_MEAN = (161.31, 337.99)  # prompt, output tokens (vLLM paper, ShareGPT)


def generate(
    n: int,
    rate: float,
    context: int,
    vocab: int,
    seed: int = 0,
    sigma: float = 1.0,
    means=SHAREGPT_MEAN,
    shared_prefix: float = 0.0,
    prefix_len: int = 64,
    samples: int = 1,
) -> list:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / rate, n) if math.isfinite(rate) else np.zeros(n)
    arrivals = np.cumsum(gaps) - gaps[0]
    mu = [math.log(m) - sigma**2 / 2 for m in means]  # lognormal with the given mean
    p_len = np.maximum(1, np.round(rng.lognormal(mu[0], sigma, n))).astype(int)
    o_len = np.maximum(1, np.round(rng.lognormal(mu[1], sigma, n))).astype(int)
    system = [int(t) for t in rng.integers(0, vocab, prefix_len)]
    out = []
    for i in range(n):
        o = int(min(o_len[i], context // 2))
        p = int(min(p_len[i], context - o))
        prompt = [int(t) for t in rng.integers(0, vocab, p)]
        if rng.random() < shared_prefix:
            prompt = (system + prompt)[: context - o]
        out.append(Request(i, prompt, o, float(arrivals[i]), n=samples))
    return out


FIELDS = ("prompt_len", "output_len", "arrival_s")
LINE = (
    '{"prompt_len": int >= 1, "output_len": int >= 1, "arrival_s": seconds >= 0[, "prompt": [token ids]]'
    '[, "priority": int]}'
)
OPTIONAL = ("prompt", "priority")


def load(path: str, context: int, vocab: int, seed: int = 0) -> tuple[list, list]:
    """(requests, [(line number, reason)] for the lines that could not be read); a file none of whose lines can
    be read is refused (UsageError on ``workload``, naming the first bad line)."""
    rng = np.random.default_rng(seed)
    reqs, bad = [], []
    for k, line in enumerate(read_text_limited(path, "workload", 64 << 20).splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            if not isinstance(d, dict):
                raise ValueError("not a JSON object")
            missing = [k for k in FIELDS if k not in d]
            if missing:
                raise ValueError(
                    f"the field{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                    f"{'are' if len(missing) > 1 else 'is'} missing; a line is {LINE}"
                )
            unknown = sorted(set(d) - set(FIELDS) - set(OPTIONAL))
            if unknown:
                raise ValueError(f"unknown field {unknown[0]!r}; a line is {LINE}")
            p, o, t = (d[k] for k in FIELDS)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (p, o)) or p < 1 or o < 1:
                raise ValueError("prompt_len and output_len must be integers >= 1")
            if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or not 0 <= t <= 1e9:
                raise ValueError("arrival_s must be a number of seconds in 0..1e9")
            if p > 1 << 20:
                raise ValueError(f"prompt_len {p} is absurd")
            priority = d.get("priority", 0)
            if not isinstance(priority, int) or isinstance(priority, bool) or not -(1 << 31) <= priority < 1 << 31:
                raise ValueError("priority must be an integer (lower is served first)")
            prompt = d.get("prompt")
            if prompt is None:
                prompt = [int(x) for x in rng.integers(0, vocab, p)]
            elif not (
                isinstance(prompt, list)
                and len(prompt) == p
                and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < vocab for x in prompt)
            ):
                raise ValueError(f"prompt must be a list of prompt_len token ids in 0..{vocab - 1}")
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            bad.append((k, f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)))
            continue
        reqs.append(Request(len(reqs), prompt, o, float(t), priority=priority))
    if not reqs:
        first = f"; line {bad[0][0]}: {bad[0][1]}" if bad else ""
        raise UsageError(
            f"{{workload}} {printable(path)}: no request could be read ({len(bad)} line(s) rejected{first})", "workload"
        )
    return reqs, bad
