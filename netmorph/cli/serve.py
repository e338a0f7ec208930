"""``netmorph serve``: a small GPT served from a paged KV cache; ``serve kv`` and ``serve roofline`` for real models."""

from __future__ import annotations

import argparse
import copy
import math
import sys

from netmorph.cli import add_timeout, float_in, int_in, print_json
from netmorph.cli.shape import add_shape_flags
from netmorph.errors import UsageError
from netmorph.runtime.env import torchrun_world

FLAGS = {"seq": "--context", "kv_blocks": "--kv-blocks", "block_size": "--block-size",
         "chunked_prefill": "--chunked-prefill",
         "max_tokens": "--max-tokens", "max_seqs": "--max-seqs", "model": "--model", "workload": "--workload"}


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a GPT from a paged KV cache: continuous batching, chunked prefill, "
                                     "preemption, prefix sharing; `serve kv` / `serve roofline` for real models",
                       description="Serve the project's GPT (random weights, float64) to a generated or given "
                                   "workload with vLLM's paged KV cache and iteration-level scheduling; print "
                                   "throughput, TTFT and TPOT percentiles, KV utilisation and preemptions. Under torchrun "
                                   "(torchrun --nproc-per-node N -m netmorph serve --tp N, or N = P + D with "
                                   "--disaggregate P:D) the job's ranks are the deployment's, over "
                                   "torch.distributed; rank 0 prints.")
    p.add_argument("action", nargs="?", default="run", choices=("run", "kv", "roofline"),
                   help="run (default): serve a workload; kv: KV bytes of a real model; roofline: prefill vs decode")
    p.add_argument("--requests", type=int_in(1, 100_000), default=200, help="generated requests (default 200)")
    p.add_argument("--arrival", type=arrival, default="poisson:20",
                   help="poisson:RATE requests/s (default poisson:20) or 'all' (every request at t = 0)")
    p.add_argument("--workload", metavar="JSONL", help="requests from a file: {prompt_len, output_len, arrival_s} "
                                                       "per line")
    p.add_argument("--shared-prefix", type=float_in(0, 1), default=0.0,
                   help="fraction of generated requests that start with one common 64-token system prompt")
    p.add_argument("--kv-blocks", type=int, default=512, help="KV-cache blocks in the pool (default 512)")
    p.add_argument("--block-size", type=int_in(1, 1 << 16), default=16, help="tokens per block (default 16, vLLM's)")
    p.add_argument("--scheduler", choices=("continuous", "static"), default="continuous",
                   help="continuous (Orca / vLLM iteration-level, default) or static (request-level batches)")
    p.add_argument("--kv", choices=("paged", "contiguous"), default="paged",
                   help="paged (default) or contiguous: each request reserves the whole context at admission")
    p.add_argument("--chunked-prefill", type=int, default=0, metavar="TOKENS",
                   help="Sarathi-Serve: mix decodes with prefill chunks of at most TOKENS under the token budget")
    p.add_argument("--preemption", choices=("recompute", "swap"), default="recompute",
                   help="when the pool runs out: recompute (default) or swap to a host pool")
    from netmorph.serving.policy import POLICIES
    p.add_argument("--scheduling-policy", choices=tuple(POLICIES), default="fcfs",
                   help="which waiting request goes first and which running one gives way: "
                        + "; ".join(f"{k}: {c.help}" for k, c in POLICIES.items()) + " (default fcfs)")
    p.add_argument("--no-prefix-caching", action="store_true", help="do not share full blocks of common prefixes")
    p.add_argument("--tp", type=int_in(1, 16), default=1,
                   help="tensor-parallel ranks (Megatron's split of heads and MLP, 2 all-reduces per layer per "
                        "iteration, counted; needs a priced --time-model)")
    p.add_argument("--disaggregate", type=split, metavar="P:D",
                   help="prefill on P ranks, decode on D ranks of the local fabric; each prompt's KV is sent from "
                        "one to the other (DistServe / Splitwise), bytes counted")
    p.add_argument("--max-tokens", type=int, default=2048, help="tokens per iteration (default 2048)")
    p.add_argument("--max-seqs", type=int, default=64, help="sequences per iteration (default 64)")
    p.add_argument("--temperature", type=float_in(0, 100), default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument("--n", type=int_in(1, 16), default=1,
                   help="parallel samples per request (vLLM's n): forked after the prefill, sharing the prompt's "
                        "blocks (default 1)")
    p.add_argument("--context", type=int_in(2, 1 << 16, "2..65536"), default=1024,
                   help="the model's context, at least a prompt token and an output token (default 1024)")
    add_shape_flags(p, "serve")
    p.add_argument("--time-model", type=time_model, default="llama-3-8b@a100-80g",
                   metavar="MODEL@HARDWARE|measured",
                   help="price each iteration as MODEL's roofline on HARDWARE (default llama-3-8b@a100-80g: a GPU, "
                        "where a decode batch costs one read of the weights), or 'measured': this model's wall time "
                        "on this CPU")
    p.add_argument("--check", type=int, default=0, metavar="N",
                   help="decode the first N completed requests alone (no cache, the training model) and compare")
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--model", default="llama-3-8b", help="kv / roofline: a preset (llama-3-8b, mixtral-8x7b, "
                   "deepseek-v2-lite, ...; netmorph plan --help lists them)")
    p.add_argument("--model-config", metavar="CONFIG.json",
                   help="kv / roofline: a Hugging Face config.json instead of --model (MLA, GQA, MoE as it says)")
    p.add_argument("--tokens", type=int_in(1, 1 << 30, "1..2**30"), default=2048,
                   help="kv: tokens in context (default 2048)")
    p.add_argument("--hardware", default="a100-80g", help="roofline: a100-80g (default), h100-80g, v100-32g")
    p.add_argument("--batch", type=int_in(1, 1 << 24, "1..2**24"), default=1,
                   help="roofline: sequences per pass (default 1)")
    p.add_argument("--context-tokens", dest="ctx", type=int_in(1, 1 << 24, "1..2**24"), default=512,
                   help="roofline: tokens already in context at the decode step (default 512)")
    p.add_argument("--prompt", type=int_in(1, 1 << 24, "1..2**24"), default=512,
                   help="roofline: prompt tokens of the prefill (default 512)")
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
    if out["attention"] == "mla":
        print(f"# {out['model']}: {out['layers']} layers x (latent {out['kv_lora_rank']} + rotary key "
              f"{out['qk_rope_head_dim']}) x {out['dtype_bytes']} B (multi-head latent attention)")
    else:
        print(f"# {out['model']}: 2 x {out['layers']} layers x {out['kv_heads']} KV heads x {out['head_dim']} head "
              f"dim x {out['dtype_bytes']} B")
    print(f"bytes per token   {out['bytes_per_token']:>16,}  ({out['bytes_per_token'] / 2**10:,.0f} KiB)")
    print(f"bytes per block   {out['bytes_per_block']:>16,}  ({args.block_size} tokens)")
    print(f"{out['tokens']:,} tokens      {out['bytes_total']:>16,}  ({out['bytes_total'] / 2**30:,.2f} GiB; "
          f"{out['blocks']:,} blocks reserve {out['bytes_reserved'] / 2**30:,.2f} GiB)")
    return 0


def _roofline(args) -> int:
    from netmorph.planner.hardware import load_hardware
    from netmorph.serving.kv import get_model
    from netmorph.serving.roofline import roofline
    out = roofline(get_model(args.model, args.model_config), load_hardware(args.hardware), args.batch, args.prompt,
                   args.ctx)
    if args.json:
        print_json(out)
        return 0
    print(f"# {out['model']} on {out['hardware']}: ridge point {out['ridge_flops_per_byte']:.0f} FLOP/B "
          f"(peak FLOP/s / HBM B/s); batch {args.batch}")
    print(f"{'phase':<34} {'GFLOP':>10} {'GB read':>9} {'FLOP/B':>8} {'time(ms)':>9}  bound")
    for key, label in (("prefill", f"prefill ({args.prompt} tokens)"),
                       ("decode", f"decode (1 token, {args.ctx} in context)")):
        ph = out[key]
        print(f"{label:<34} {ph['flops'] / 1e9:>10,.1f} {ph['bytes'] / 1e9:>9.2f} {ph['intensity']:>8.1f} "
              f"{1e3 * ph['time_s']:>9.3f}  {ph['bound']}")
    print("# decode reads every weight (of a mixture of experts, those its tokens route to) to produce one token per "
          "sequence: batching is what raises its intensity")
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
    model = check_shape(ModelShape(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.context,
                                   vocab=args.vocab))
    for why in Layout(tp=args.tp).check(model)[:1]:
        raise why.error()
    check_deployment(args.tp, args.disaggregate, args.n, priced=args.time_model != "measured")
    if not 0 <= args.check <= args.requests:
        raise UsageError(f"--check must be in 0..--requests, got {args.check}")
    rate = _rate(args.arrival)
    cfg = ServeConfig(num_blocks=args.kv_blocks, block_size=args.block_size, scheduler=args.scheduler, kv=args.kv,
                      chunked_prefill=args.chunked_prefill, max_tokens=args.max_tokens, max_seqs=args.max_seqs,
                      preemption=args.preemption, prefix_caching=not args.no_prefix_caching,
                      temperature=args.temperature, scheduling_policy=args.scheduling_policy)
    cfg.check()
    bad = []
    if args.workload:
        reqs, bad = workload.load(args.workload, args.context, args.vocab, args.seed)
        for r in reqs:
            r.n = args.n
    else:
        reqs = workload.generate(args.requests, rate, args.context, args.vocab, args.seed,
                                 shared_prefix=args.shared_prefix, samples=args.n)
    from netmorph.runtime import budget
    ranks = args.tp if args.tp > 1 else sum(args.disaggregate) if args.disaggregate else 1
    memory, seconds = budget.serving(
        params=model.params(), layers=args.layers, hidden=args.hidden, kv_slots=args.kv_blocks * args.block_size,
        ranks=ranks, prompt_tokens=sum(len(r.prompt) for r in reqs), output_tokens=args.n * sum(r.output_len
                                                                                                 for r in reqs),
        max_seqs=args.max_seqs)
    budget.check(memory, seconds, f"serving {len(reqs):,} requests", "--kv-blocks, --block-size, --hidden or --layers",
                 "--requests (or the workload), --layers or --hidden")
    for line, why in bad:
        print(f"netmorph serve: {args.workload}:{line}: request rejected: {why}", file=sys.stderr)
    if torchrun_world() is not None and not (args.disaggregate or args.tp > 1):
        raise UsageError("under torchrun serve runs over the job's ranks: give --tp N or --disaggregate P:D")
    if args.disaggregate:
        return _disaggregated(args, model, cfg, reqs, bad)
    if args.tp > 1:
        return _tensor_parallel(args, model, cfg, reqs, bad)
    engine = Engine(model, cfg, _time_model(args.time_model)[0])
    from netmorph.cli.progress import Bar
    with Bar("serve", unit="requests") as bar, bar.task("serving", len(reqs)) as task:
        out = engine.run(reqs, lambda done, total: bar.update(task, completed=done))
    out["rejected"] += len(bad)
    out["rejections"] = [{"line": k, "reason": why} for k, why in bad] + out["rejections"]
    outputs = out.pop("outputs")
    if args.check:
        out["check"] = _check(args, model, reqs, outputs)
    if args.json:
        print_json(out)
        return 0 if not args.check or out["check"]["identical"] == out["check"]["requests"] > 0 else 1
    for r in out["rejections"][:5]:
        if "request" in r:
            print(f"netmorph serve: request {r['request']} rejected: {r['reason']}", file=sys.stderr)
    _print(args, cfg, model, out)
    return _print_check(out) if args.check else 0


def _disaggregated(args, model, cfg, reqs, bad) -> int:
    from netmorph.serving.disagg import serve_disaggregated
    from netmorph.serving.engine import Engine
    P, D = args.disaggregate
    price, priced_model, hardware = _time_model(args.time_model)
    # prefill and decode on two nodes: a token's KV crosses at the NIC's bandwidth
    kv_s = priced_model.kv_bytes_per_token() / hardware.nic_bandwidth if price else 0.0
    from netmorph.cli.progress import Bar
    with Bar("serve") as bar:
        with bar.task("one colocated engine"):
            together = Engine(model, cfg, price).run(copy.deepcopy(reqs))     # the side-by-side, and the refusals
        rejected = together["rejections"]
        refused = {x["request"] for x in rejected}
        ok = [r for r in reqs if r.rid not in refused]
        with bar.task(f"disaggregated {P}:{D} on {P + D} ranks"):
            out = serve_disaggregated(model, cfg, copy.deepcopy(ok), P, D, timeout=args.timeout, price=price,
                                      kv_seconds_per_token=kv_s, backend=_backend())
    if out is None:                     # a torchrun rank other than 0: rank 0 prints
        return 0
    out["colocated"] = {k: together[k] for k in ("ttft_s", "tpot_s", "throughput_tok_s", "duration_s")}
    outputs = out.pop("outputs")
    out["rejected"] = len(rejected) + len(bad)
    out["rejections"] = [{"line": k, "reason": why} for k, why in bad] + rejected
    out["scheduler"], out["kv"] = f"disaggregated {P}:{D}", cfg.kv
    if args.check:
        out["check"] = _check(args, model, ok, outputs)
    good = not args.check or out["check"]["identical"] == out["check"]["requests"] > 0
    if args.json:
        print_json(out)
        return 0 if good else 1
    n = max(out["completed"], 1)
    print(f"# netmorph serve --disaggregate {P}:{D}: prefill on ranks 0..{P - 1}, decode on ranks {P}..{P + D - 1} "
          f"of the local fabric; {len(ok)} requests ({out['rejected']} rejected)")
    print(f"requests       {out['completed']} completed, {out['tokens_out']:,} tokens out")
    c = out["colocated"]

    def ms(d, k):
        return f"{1e3 * d[k]:.1f}" if d[k] is not None else "-"
    print(f"{'':<26} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9} {'tokens/s':>9}   (ms)")
    for label, d in ((f"disaggregated {P}:{D}", out), ("colocated (one engine)", c)):
        print(f"{label:<26} {ms(d['ttft_s'], 'p50'):>9} {ms(d['ttft_s'], 'p99'):>9} {ms(d['tpot_s'], 'p50'):>9} "
              f"{ms(d['tpot_s'], 'p99'):>9} {d['throughput_tok_s']:>9,.0f}")
    print(f"KV on the wire {out['kv_transfer_bytes']:,} B measured = {out['kv_transfer_bytes_formula']:,} B from "
          f"2 x layers x hidden x 8 B x prompt tokens ({'equal' if out['kv_transfer_bytes'] == out['kv_transfer_bytes_formula'] else 'DIFFERENT'}); "
          f"{out['kv_transfer_bytes'] / n / 1024:,.1f} KiB per request, + {out['kv_header_bytes']:,} B of headers")
    if args.time_model != "measured":
        print(f"# time: iterations priced as {args.time_model.replace('@', ' on ')}; the KV crosses between the "
              f"prefill and decode nodes at the NIC's bandwidth")
    return _print_check(out) if args.check else 0


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
        raise argparse.ArgumentTypeError(f"expected MODEL@HARDWARE ({', '.join(MODELS)} @ {', '.join(HARDWARE)}) or "
                                         f"'measured', got {text!r}")
    return text


def arrival(text: str) -> str:
    """``--arrival`` (an argparse type): poisson:RATE (requests/s, > 0) or 'all'; kept as written."""
    _rate(text)
    return text


def _check(args, model, reqs, outputs) -> dict:
    """Decode the first ``--check`` completed requests alone (the training model, no cache) and compare."""
    from netmorph.serving.model import generate_alone
    by_id = {r.rid: r for r in reqs}
    ids = sorted(i for i in outputs if i in by_id)[:args.check]
    same = sum(outputs[i] == generate_alone(model, by_id[i].prompt, by_id[i].output_len, args.temperature,
                                            i * 1_000_003) for i in ids)
    return {"requests": len(ids), "identical": same}


def _print_check(out) -> int:
    c = out["check"]
    if not c["requests"]:
        print("# check: nothing to check -- no request completed (every one was rejected) ✗")
        return 1
    ok = c["identical"] == c["requests"]
    print(f"# check: {c['identical']}/{c['requests']} requests decoded alone (no cache, the training model) give "
          f"the same tokens {'✓' if ok else '✗'}")
    return 0 if ok else 1


def _backend() -> str:
    """Under torchrun the job's ranks are the deployment's (WORLD_SIZE = --tp, or P + D); else netmorph's own."""
    return "job" if torchrun_world() is not None else "local"


def _tensor_parallel(args, model, cfg, reqs, bad) -> int:
    from netmorph.cli.progress import Bar
    from netmorph.serving.tp import serve_tensor_parallel
    with Bar("serve") as bar, bar.task(f"tensor parallel on {args.tp} ranks"):
        out = serve_tensor_parallel(model, cfg, reqs, args.tp, _time_model(args.time_model)[0], timeout=args.timeout,
                                    backend=_backend())
    if out is None:                     # a torchrun rank other than 0: rank 0 prints
        return 0
    outputs = out.pop("outputs")
    out["rejected"] += len(bad)
    if args.check:
        out["check"] = _check(args, model, reqs, outputs)
    good = not args.check or out["check"]["identical"] == out["check"]["requests"] > 0
    if args.json:
        print_json(out)
        return 0 if good else 1
    _print(args, cfg, model, out)
    print(f"tensor parallel {args.tp} ranks: {out['tp_allreduces']:,} all-reduces (2 per layer per iteration), "
          f"{out['tp_allreduce_bytes']:,} B sent over all ranks = 2 x layers x 2(t-1) x {out['tokens_computed']:,} "
          f"tokens x hidden x 8 B = {out['tp_allreduce_bytes_formula']:,} B "
          f"({'equal' if out['tp_allreduce_bytes'] == out['tp_allreduce_bytes_formula'] else 'DIFFERENT'}); "
          f"each rank keeps {args.heads // args.tp} of {args.heads} heads' KV")
    return _print_check(out) if args.check else 0


def _time_model(text: str):
    """(price of an iteration, the real model, the hardware) for MODEL@HARDWARE; (None, None, None) for
    'measured'."""
    if text == "measured":
        return None, None, None
    from netmorph.mesh.presets import PRESETS as MODELS
    from netmorph.planner.hardware import PRESETS as HARDWARE
    from netmorph.serving.roofline import iteration_time
    name, _, hw = text.partition("@")
    m, h = MODELS[name], HARDWARE[hw]
    return (lambda items: iteration_time(m, h, items)), m, h


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


def _print(args, cfg, model, out) -> None:
    t, p = out["ttft_s"], out["tpot_s"]

    def ms(d, k):
        return f"{1e3 * d[k]:.1f}" if d[k] is not None else "-"
    src = args.workload or f"{args.requests} generated (ShareGPT-like lengths, {args.arrival})"
    print(f"# netmorph serve: GPT {model.layers} layers x {model.hidden} (context {model.seq}), "
          f"{src}; {out['scheduler']} scheduler, {cfg.kv} KV: {cfg.num_blocks} blocks x {cfg.block_size} tokens, "
          f"preemption by {cfg.preemption}, {cfg.scheduling_policy} policy")
    print(f"requests       {out['completed']} completed, {out['rejected']} rejected, {out['tokens_out']:,} tokens out "
          f"in {out['duration_s']:.2f} s ({out['iterations']:,} iterations)")
    print(f"throughput     {out['throughput_tok_s']:,.0f} tokens/s, {out['throughput_req_s']:.2f} requests/s")
    print(f"TTFT (ms)      p50 {ms(t, 'p50')}  p90 {ms(t, 'p90')}  p99 {ms(t, 'p99')}")
    print(f"TPOT (ms)      p50 {ms(p, 'p50')}  p90 {ms(p, 'p90')}  p99 {ms(p, 'p99')}")
    print(f"KV cache       {100 * out['kv_utilization']:.1f}% of reserved slots hold a token (time-averaged); "
          f"{out['prefix_cached_tokens']:,} prompt tokens served from shared blocks; {out['cow_copies']} copy-on-write")
    print(f"preemptions    {out['preemptions']['recompute']} by recompute, {out['preemptions']['swap']} by swap "
          f"({out['swap_bytes']:,} B swapped out and in)")
    if len(out.get("by_priority", {})) > 1:
        print(f"by priority    ({out['scheduling_policy']} policy; lower is served first)")
        for prio, d in out["by_priority"].items():
            print(f"  priority {prio:>3}  {d['count']:>5} requests  TTFT p50 {ms(d['ttft_s'], 'p50')} "
                  f"p90 {ms(d['ttft_s'], 'p90')} ms  TPOT p50 {ms(d['tpot_s'], 'p50')} ms")
    if args.time_model == "measured":
        print("# time: the measured compute of each iteration on this machine (CPU, float64), idle gaps jumped")
    else:
        print(f"# time: each iteration priced as {args.time_model.replace('@', ' on ')} (roofline: weights once per "
              f"batch, each sequence's KV); the tokens are this small model's, computed for real")
