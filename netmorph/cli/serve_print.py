"""What ``netmorph serve`` prints: ``serve kv``'s bytes per token, ``serve roofline``'s phases, one engine's
latencies and cache (vLLM's benchmark_serving columns: TTFT and TPOT percentiles, throughput), the
disaggregated deployment beside one colocated engine with the KV bytes on the wire against their formula, and
``--check``'s verdict."""

from __future__ import annotations


def print_kv(args, out) -> None:
    """``serve kv``: the KV cache of a real model, per token, per block and for ``--tokens``."""
    if out["attention"] == "mla":
        print(
            f"# {out['model']}: {out['layers']} layers x (latent {out['kv_lora_rank']} + rotary key "
            f"{out['qk_rope_head_dim']}) x {out['dtype_bytes']} B (multi-head latent attention)"
        )
    else:
        print(
            f"# {out['model']}: 2 x {out['layers']} layers x {out['kv_heads']} KV heads x {out['head_dim']} head "
            f"dim x {out['dtype_bytes']} B"
        )
    print(f"bytes per token   {out['bytes_per_token']:>16,}  ({out['bytes_per_token'] / 2**10:,.0f} KiB)")
    print(f"bytes per block   {out['bytes_per_block']:>16,}  ({args.block_size} tokens)")
    print(
        f"{out['tokens']:,} tokens      {out['bytes_total']:>16,}  ({out['bytes_total'] / 2**30:,.2f} GiB; "
        f"{out['blocks']:,} blocks reserve {out['bytes_reserved'] / 2**30:,.2f} GiB)"
    )


def print_roofline(args, out) -> None:
    """``serve roofline``: prefill and decode against the hardware's ridge point."""
    print(
        f"# {out['model']} on {out['hardware']}: ridge point {out['ridge_flops_per_byte']:.0f} FLOP/B "
        f"(peak FLOP/s / HBM B/s); batch {args.batch}"
    )
    print(f"{'phase':<34} {'GFLOP':>10} {'GB read':>9} {'FLOP/B':>8} {'time(ms)':>9}  bound")
    for key, label in (
        ("prefill", f"prefill ({args.prompt} tokens)"),
        ("decode", f"decode (1 token, {args.ctx} in context)"),
    ):
        ph = out[key]
        print(
            f"{label:<34} {ph['flops'] / 1e9:>10,.1f} {ph['bytes'] / 1e9:>9.2f} {ph['intensity']:>8.1f} "
            f"{1e3 * ph['time_s']:>9.3f}  {ph['bound']}"
        )
    print(
        "# decode reads every weight (of a mixture of experts, those its tokens route to) to produce one token per "
        "sequence: batching is what raises its intensity"
    )


def print_disaggregated(args, out, requests: int) -> None:
    """``--disaggregate P:D``: its latencies beside one colocated engine's, and the KV that crossed."""
    P, D = args.disaggregate
    n = max(out["completed"], 1)
    print(
        f"# netmorph serve --disaggregate {P}:{D}: prefill on ranks 0..{P - 1}, decode on ranks {P}..{P + D - 1} "
        f"of the local fabric; {requests} requests ({out['rejected']} rejected)"
    )
    print(f"requests       {out['completed']} completed, {out['tokens_out']:,} tokens out")
    c = out["colocated"]

    def ms(d, k):
        return f"{1e3 * d[k]:.1f}" if d[k] is not None else "-"

    print(f"{'':<26} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9} {'tokens/s':>9}   (ms)")
    for label, d in ((f"disaggregated {P}:{D}", out), ("colocated (one engine)", c)):
        print(
            f"{label:<26} {ms(d['ttft_s'], 'p50'):>9} {ms(d['ttft_s'], 'p99'):>9} {ms(d['tpot_s'], 'p50'):>9} "
            f"{ms(d['tpot_s'], 'p99'):>9} {d['throughput_tok_s']:>9,.0f}"
        )
    print(
        f"KV on the wire {out['kv_transfer_bytes']:,} B measured = {out['kv_transfer_bytes_formula']:,} B from "
        f"2 x layers x hidden x 8 B x prompt tokens ({'equal' if out['kv_transfer_bytes'] == out['kv_transfer_bytes_formula'] else 'DIFFERENT'}); "
        f"{out['kv_transfer_bytes'] / n / 1024:,.1f} KiB per request, + {out['kv_header_bytes']:,} B of headers"
    )
    if args.time_model != "measured":
        print(
            f"# time: iterations priced as {args.time_model.replace('@', ' on ')}; the KV crosses between the "
            f"prefill and decode nodes at the NIC's bandwidth"
        )


def verdict(out) -> int:
    """The exit code of a run: 1 where ``--check`` found a request decoded alone that differs, or had none to check
    (every one rejected); 0 otherwise, or with no ``--check``."""
    c = out.get("check")
    return 0 if c is None or c["identical"] == c["requests"] > 0 else 1


def print_check(out) -> int:
    """``--check``'s line: the requests decoded alone give the same tokens; its :func:`verdict`."""
    c = out["check"]
    if not c["requests"]:
        print("# check: nothing to check -- no request completed (every one was rejected) ✗")
    else:
        ok = c["identical"] == c["requests"]
        print(
            f"# check: {c['identical']}/{c['requests']} requests decoded alone (no cache, the training model) give "
            f"the same tokens {'✓' if ok else '✗'}"
        )
    return verdict(out)


def print_serve(args, cfg, model, out) -> None:
    """One engine's run: requests, throughput, TTFT and TPOT percentiles, the KV cache, preemptions, priorities."""
    t, p = out["ttft_s"], out["tpot_s"]

    def ms(d, k):
        return f"{1e3 * d[k]:.1f}" if d[k] is not None else "-"

    src = args.workload or f"{args.requests} generated (ShareGPT-like lengths, {args.arrival})"
    print(
        f"# netmorph serve: GPT {model.layers} layers x {model.hidden} (context {model.seq}), "
        f"{src}; {out['scheduler']} scheduler, {cfg.kv} KV: {cfg.num_blocks} blocks x {cfg.block_size} tokens, "
        f"preemption by {cfg.preemption}, {cfg.scheduling_policy} policy"
    )
    print(
        f"requests       {out['completed']} completed, {out['rejected']} rejected, {out['tokens_out']:,} tokens out "
        f"in {out['duration_s']:.2f} s ({out['iterations']:,} iterations)"
    )
    print(f"throughput     {out['throughput_tok_s']:,.0f} tokens/s, {out['throughput_req_s']:.2f} requests/s")
    print(f"TTFT (ms)      p50 {ms(t, 'p50')}  p90 {ms(t, 'p90')}  p99 {ms(t, 'p99')}")
    print(f"TPOT (ms)      p50 {ms(p, 'p50')}  p90 {ms(p, 'p90')}  p99 {ms(p, 'p99')}")
    print(
        f"KV cache       {100 * out['kv_utilization']:.1f}% of reserved slots hold a token (time-averaged); "
        f"{out['prefix_cached_tokens']:,} prompt tokens served from shared blocks; {out['cow_copies']} copy-on-write"
    )
    print(
        f"preemptions    {out['preemptions']['recompute']} by recompute, {out['preemptions']['swap']} by swap "
        f"({out['swap_bytes']:,} B swapped out and in)"
    )
    if len(out.get("by_priority", {})) > 1:
        print(f"by priority    ({out['scheduling_policy']} policy; lower is served first)")
        for prio, d in out["by_priority"].items():
            print(
                f"  priority {prio:>3}  {d['count']:>5} requests  TTFT p50 {ms(d['ttft_s'], 'p50')} "
                f"p90 {ms(d['ttft_s'], 'p90')} ms  TPOT p50 {ms(d['tpot_s'], 'p50')} ms"
            )
    if args.time_model == "measured":
        print("# time: the measured compute of each iteration on this machine (CPU, float64), idle gaps jumped")
    else:
        print(
            f"# time: each iteration priced as {args.time_model.replace('@', ' on ')} (roofline: weights once per "
            f"batch, each sequence's KV); the tokens are this small model's, computed for real"
        )
