"""``netmorph serve``: a small GPT served from a paged KV cache; ``serve kv`` and ``serve roofline`` for real models."""

from __future__ import annotations

import argparse
import math
import sys

from netmorph.cli import print_json
from netmorph.cli.flags import add_timeout, float_in, int_in
from netmorph.cli.serve_print import print_check, print_kv, print_roofline, print_serve, verdict
from netmorph.cli.serve_ranks import check_alone, disaggregated, priced, tensor_parallel
from netmorph.cli.shape import add_shape_flags
from netmorph.errors import UsageError
from netmorph.runtime.env import torchrun_world

FLAGS = {
    "seq": "--context",
    "kv_blocks": "--kv-blocks",
    "block_size": "--block-size",
    "chunked_prefill": "--chunked-prefill",
    "max_tokens": "--max-tokens",
    "max_seqs": "--max-seqs",
    "model": "--model",
    "workload": "--workload",
}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a GPT from a paged KV cache: continuous batching, chunked prefill, "
        "preemption, prefix sharing; `serve kv` / `serve roofline` for real models",
        description="Serve the project's GPT (random weights, float64) to a generated or given "
        "workload with vLLM's paged KV cache and iteration-level scheduling; print "
        "throughput, TTFT and TPOT percentiles, KV utilisation and preemptions. Under torchrun "
        "(torchrun --nproc-per-node N -m netmorph serve --tp N, or N = P + D with "
        "--disaggregate P:D) the job's ranks are the deployment's, over "
        "torch.distributed; rank 0 prints.",
    )
    p.add_argument(
        "action",
        nargs="?",
        default="run",
        choices=("run", "kv", "roofline"),
        help="run (default): serve a workload; kv: KV bytes of a real model; roofline: prefill vs decode",
    )
    p.add_argument("--requests", type=int_in(1, 100_000), default=200, help="generated requests (default 200)")
    p.add_argument(
        "--arrival",
        type=arrival,
        default="poisson:20",
        help="poisson:RATE requests/s (default poisson:20) or 'all' (every request at t = 0)",
    )
    p.add_argument(
        "--workload", metavar="JSONL", help="requests from a file: {prompt_len, output_len, arrival_s} per line"
    )
    p.add_argument(
        "--shared-prefix",
        type=float_in(0, 1),
        default=0.0,
        help="fraction of generated requests that start with one common 64-token system prompt",
    )
    p.add_argument("--kv-blocks", type=int, default=512, help="KV-cache blocks in the pool (default 512)")
    p.add_argument("--block-size", type=int_in(1, 1 << 16), default=16, help="tokens per block (default 16, vLLM's)")
    p.add_argument(
        "--scheduler",
        choices=("continuous", "static"),
        default="continuous",
        help="continuous (Orca / vLLM iteration-level, default) or static (request-level batches)",
    )
    p.add_argument(
        "--kv",
        choices=("paged", "contiguous"),
        default="paged",
        help="paged (default) or contiguous: each request reserves the whole context at admission",
    )
    p.add_argument(
        "--chunked-prefill",
        type=int,
        default=0,
        metavar="TOKENS",
        help="Sarathi-Serve: mix decodes with prefill chunks of at most TOKENS under the token budget",
    )
    p.add_argument(
        "--preemption",
        choices=("recompute", "swap"),
        default="recompute",
        help="when the pool runs out: recompute (default) or swap to a host pool",
    )
    from netmorph.serving.policy import POLICIES

    p.add_argument(
        "--scheduling-policy",
        choices=tuple(POLICIES),
        default="fcfs",
        help="which waiting request goes first and which running one gives way: "
        + "; ".join(f"{k}: {c.help}" for k, c in POLICIES.items())
        + " (default fcfs)",
    )
    p.add_argument("--no-prefix-caching", action="store_true", help="do not share full blocks of common prefixes")
    p.add_argument(
        "--tp",
        type=int_in(1, 16),
        default=1,
        help="tensor-parallel ranks (Megatron's split of heads and MLP, 2 all-reduces per layer per "
        "iteration, counted; needs a priced --time-model)",
    )
    p.add_argument(
        "--disaggregate",
        type=split,
        metavar="P:D",
        help="prefill on P ranks, decode on D ranks of the local fabric; each prompt's KV is sent from "
        "one to the other (DistServe / Splitwise), bytes counted",
    )
    p.add_argument("--max-tokens", type=int, default=2048, help="tokens per iteration (default 2048)")
    p.add_argument("--max-seqs", type=int, default=64, help="sequences per iteration (default 64)")
    p.add_argument("--temperature", type=float_in(0, 100), default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument(
        "--n",
        type=int_in(1, 16),
        default=1,
        help="parallel samples per request (vLLM's n): forked after the prefill, sharing the prompt's "
        "blocks (default 1)",
    )
    p.add_argument(
        "--context",
        type=int_in(2, 1 << 16, "2..65536"),
        default=1024,
        help="the model's context, at least a prompt token and an output token (default 1024)",
    )
    add_shape_flags(p, "serve")
    p.add_argument(
        "--time-model",
        type=time_model,
        default="llama-3-8b@a100-80g",
        metavar="MODEL@HARDWARE|measured",
        help="price each iteration as MODEL's roofline on HARDWARE (default llama-3-8b@a100-80g: a GPU, "
        "where a decode batch costs one read of the weights), or 'measured': this model's wall time "
        "on this CPU",
    )
    p.add_argument(
        "--check",
        type=int,
        default=0,
        metavar="N",
        help="decode the first N completed requests alone (no cache, the training model) and compare",
    )
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument(
        "--model",
        default="llama-3-8b",
        help="kv / roofline: a preset (llama-3-8b, mixtral-8x7b, "
        "deepseek-v2-lite, ...; netmorph plan --help lists them)",
    )
    p.add_argument(
        "--model-config",
        metavar="CONFIG.json",
        help="kv / roofline: a Hugging Face config.json instead of --model (MLA, GQA, MoE as it says)",
    )
    p.add_argument(
        "--tokens", type=int_in(1, 1 << 30, "1..2**30"), default=2048, help="kv: tokens in context (default 2048)"
    )
    p.add_argument("--hardware", default="a100-80g", help="roofline: a100-80g (default), h100-80g, v100-32g")
    p.add_argument(
        "--batch", type=int_in(1, 1 << 24, "1..2**24"), default=1, help="roofline: sequences per pass (default 1)"
    )
    p.add_argument(
        "--context-tokens",
        dest="ctx",
        type=int_in(1, 1 << 24, "1..2**24"),
        default=512,
        help="roofline: tokens already in context at the decode step (default 512)",
    )
    p.add_argument(
        "--prompt",
        type=int_in(1, 1 << 24, "1..2**24"),
        default=512,
        help="roofline: prompt tokens of the prefill (default 512)",
    )
    add_timeout(p, 60)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run, flags=FLAGS)


def run(args) -> int:
    if args.action == "kv":
        return _kv(args)
    if args.action == "roofline":
        return _roofline(args)
    return _serve(args)


def _kv(args) -> int:
    from netmorph.serving.kv import get_model, kv_table

    out = kv_table(get_model(args.model, args.model_config), args.tokens, args.block_size)
    if args.json:
        print_json(out)
        return 0
    print_kv(args, out)
    return 0


def _roofline(args) -> int:
    from netmorph.planner.hardware import load_hardware
    from netmorph.serving.kv import get_model
    from netmorph.serving.roofline import roofline

    out = roofline(
        get_model(args.model, args.model_config), load_hardware(args.hardware), args.batch, args.prompt, args.ctx
    )
    if args.json:
        print_json(out)
        return 0
    print_roofline(args, out)
    return 0


def _serve(args) -> int:
    from netmorph.errors import require

    require("torch", "netmorph serve")
    from netmorph.mesh.layout import Layout
    from netmorph.mesh.presets import check_shape
    from netmorph.mesh.shape import ModelShape
    from netmorph.serving import workload
    from netmorph.serving.engine import Engine, ServeConfig, check_deployment

    # the model's shape and the tp split by the rules training and the planner use (one source of each)
    model = check_shape(
        ModelShape(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.context, vocab=args.vocab)
    )
    for why in Layout(tp=args.tp).check(model)[:1]:
        raise why.error()
    check_deployment(args.tp, args.disaggregate, args.n, priced=args.time_model != "measured")
    if not 0 <= args.check <= args.requests:
        raise UsageError(f"--check must be in 0..--requests, got {args.check}")
    rate = _rate(args.arrival)
    cfg = ServeConfig(
        num_blocks=args.kv_blocks,
        block_size=args.block_size,
        scheduler=args.scheduler,
        kv=args.kv,
        chunked_prefill=args.chunked_prefill,
        max_tokens=args.max_tokens,
        max_seqs=args.max_seqs,
        preemption=args.preemption,
        prefix_caching=not args.no_prefix_caching,
        temperature=args.temperature,
        scheduling_policy=args.scheduling_policy,
    )
    cfg.check()
    bad = []
    if args.workload:
        reqs, bad = workload.load(args.workload, args.context, args.vocab, args.seed)
        for r in reqs:
            r.n = args.n
    else:
        reqs = workload.generate(
            args.requests, rate, args.context, args.vocab, args.seed, shared_prefix=args.shared_prefix, samples=args.n
        )
    from netmorph.runtime import budget

    ranks = args.tp if args.tp > 1 else sum(args.disaggregate) if args.disaggregate else 1
    memory, seconds = budget.serving(
        params=model.params(),
        layers=args.layers,
        hidden=args.hidden,
        kv_slots=args.kv_blocks * args.block_size,
        ranks=ranks,
        prompt_tokens=sum(len(r.prompt) for r in reqs),
        output_tokens=args.n * sum(r.output_len for r in reqs),
        max_seqs=args.max_seqs,
    )
    budget.check(
        memory,
        seconds,
        f"serving {len(reqs):,} requests",
        "--kv-blocks, --block-size, --hidden or --layers",
        "--requests (or the workload), --layers or --hidden",
    )
    for line, why in bad:
        print(f"netmorph serve: {args.workload}:{line}: request rejected: {why}", file=sys.stderr)
    if torchrun_world() is not None and not (args.disaggregate or args.tp > 1):
        raise UsageError("under torchrun serve runs over the job's ranks: give --tp N or --disaggregate P:D")
    if args.disaggregate:
        return disaggregated(args, model, cfg, reqs, bad)
    if args.tp > 1:
        return tensor_parallel(args, model, cfg, reqs, bad)
    engine = Engine(model, cfg, priced(args.time_model)[0])
    from netmorph.cli.progress import Bar

    with Bar("serve", unit="requests") as bar, bar.task("serving", len(reqs)) as task:
        out = engine.run(reqs, lambda done, total: bar.update(task, completed=done))
    out["rejected"] += len(bad)
    out["rejections"] = [{"line": k, "reason": why} for k, why in bad] + out["rejections"]
    outputs = out.pop("outputs")
    if args.check:
        out["check"] = check_alone(args, model, reqs, outputs)
    if args.json:
        print_json(out)
        return verdict(out)
    for r in out["rejections"][:5]:
        if "request" in r:
            print(f"netmorph serve: request {r['request']} rejected: {r['reason']}", file=sys.stderr)
    print_serve(args, cfg, model, out)
    return print_check(out) if args.check else 0


def split(text: str) -> tuple[int, int]:
    """``--disaggregate P:D`` (an argparse type): prefill and decode ranks, 1..8 each."""
    try:
        P, D = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected P:D prefill and decode ranks, e.g. 1:2, got {text!r}") from None
    if not (1 <= P <= 8 and 1 <= D <= 8):
        raise argparse.ArgumentTypeError(f"{text}: 1..8 prefill and 1..8 decode ranks")
    return P, D


def time_model(text: str) -> str:
    """``--time-model`` (an argparse type): MODEL@HARDWARE of the presets, or 'measured'."""
    from netmorph.mesh.presets import PRESETS as MODELS
    from netmorph.planner.hardware import PRESETS as HARDWARE

    name, _, hw = text.partition("@")
    if text != "measured" and (name not in MODELS or hw not in HARDWARE):
        raise argparse.ArgumentTypeError(
            f"expected MODEL@HARDWARE ({', '.join(MODELS)} @ {', '.join(HARDWARE)}) or 'measured', got {text!r}"
        )
    return text


def arrival(text: str) -> str:
    """``--arrival`` (an argparse type): poisson:RATE (requests/s, > 0) or 'all'; kept as written."""
    _rate(text)
    return text


def _rate(text: str) -> float:
    if text == "all":
        return math.inf
    kind, _, value = text.partition(":")
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if kind != "poisson" or not 0 < rate <= 1e6:
        raise argparse.ArgumentTypeError(f"expected poisson:RATE (requests/s, > 0) or 'all', got {text!r}")
    return rate
