"""``netmorph plan``: the best (tp, pp, dp, microbatch, v, ZeRO, recompute) split, and why.

``netmorph plan ...`` searches every configuration and ranks those that fit;
``netmorph plan estimate ... --tp 8 --pp 8 --dp 16`` breaks one configuration down.
Configuration flags given to the search fix that dimension.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

from netmorph.errors import UsageError

FIXABLE = ("tp", "pp", "dp", "microbatch", "interleave", "zero", "recompute", "sequence_parallel")


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="search DP/TP/PP/ZeRO splits; `plan estimate` breaks one down",
                       description="Predict memory per GPU and step time for parallel training configurations "
                                   "(Narayanan et al. 2021, Korthikanti et al. 2022, ZeRO) and rank them.")
    p.add_argument("action", nargs="?", default="search", choices=("search", "estimate"),
                   help="search (default): rank every split that fits; estimate: break one split down")
    add_split_args(p)
    p.add_argument("--top", type=int, default=5, help="how many plans to print (default 5)")
    p.add_argument("--json", action="store_true", help="print the plans (and for a search the rejections) as JSON")
    p.set_defaults(run=run)


def add_split_args(p, bare: bool = True) -> None:
    """The model, the machine and the split: the flags `plan` and `simulate step` share."""
    g = p.add_argument_group("model")
    g.add_argument("--model", help="preset: gpt3-175b, ptdp-1.7b .. ptdp-1t (Narayanan Table 1), mt-22b .. mt-1t")
    g.add_argument("--layers", type=int, help="transformer layers l")
    g.add_argument("--hidden", type=int, help="hidden size h")
    g.add_argument("--heads", type=int, help="attention heads a")
    g.add_argument("--seq", type=int, help="sequence length (default 2048)")
    g.add_argument("--vocab", type=int, help="vocabulary (default 51200)")
    g.add_argument("--ffn", type=int, help="FFN width (default 4 x hidden)")
    if bare:
        g.add_argument("--params", type=float, help="a bare parameter count: model-state memory only (estimate)")
    h = p.add_argument_group("machine")
    h.add_argument("--gpus", type=int, help="devices (default: tp x pp x dp for estimate)")
    h.add_argument("--hardware", default="a100-80g", help="a100-80g (default), h100-80g, v100-32g, or a JSON file")
    h.add_argument("--efficiency", type=float, help="override the hardware's matmul efficiency (fraction of peak)")
    c = p.add_argument_group("configuration")
    c.add_argument("--global-batch", type=int, help="sequences per iteration")
    c.add_argument("--tp", type=int, help="tensor-parallel size (estimate: required; search: fix it)")
    c.add_argument("--pp", type=int, help="pipeline stages (estimate: required; search: fix it)")
    c.add_argument("--dp", type=int, help="data-parallel size (default: gpus / (tp x pp))")
    c.add_argument("--microbatch", type=int, help="sequences per microbatch b (search: fix it)")
    c.add_argument("--interleave", type=int, help="model chunks per pipeline stage, v (default 1)")
    c.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="ZeRO stage over the DP group (search: fix it)")
    c.add_argument("--recompute", choices=("none", "selective", "full"),
                   help="activation recomputation (Korthikanti et al.; search: fix it)")
    c.add_argument("--sequence-parallel", action="store_true", default=None,
                   help="Megatron sequence parallelism (search: fix it on)")
    c.add_argument("--dp-overlap", action="store_true", help="overlap the gradient reduction with backward")
    c.add_argument("--param-bytes", type=int, default=2, help="bytes per weight (default 2)")
    c.add_argument("--grad-bytes", type=int, default=4, help="bytes per gradient (default 4, fp32 main grads; "
                                                             "2 gives ZeRO's 16 B/param)")
    c.add_argument("--optimizer-bytes", type=int, default=12, help="optimizer bytes per parameter (default 12)")


def _common(args):
    from netmorph.planner.hardware import load_hardware
    from netmorph.planner.model import from_args
    model = from_args(args.model, args.layers, args.hidden, args.heads, args.seq, args.vocab, args.ffn,
                      getattr(args, "params", None))
    hw = load_hardware(args.hardware, args.efficiency)
    for k in ("param_bytes", "grad_bytes", "optimizer_bytes"):
        if getattr(args, k) < 0:
            raise UsageError(f"--{k.replace('_', '-')} must be >= 0")
    for k in ("tp", "pp", "dp", "microbatch", "interleave", "gpus", "global_batch"):
        v = getattr(args, k)
        if v is not None and not 1 <= v <= 1 << 24:
            raise UsageError(f"--{k.replace('_', '-')} must be in 1..{1 << 24:,}, got {v}")
    return model, hw


def _gb(x):
    return f"{x / 1e9:.1f}"


def run(args) -> int:
    model, hw = _common(args)
    return _estimate(args, model, hw) if args.action == "estimate" else _search(args, model, hw)


def config_from(args):
    """The one split the flags name (tp, pp default 1; dp from --gpus)."""
    from netmorph.planner.config import ParallelConfig
    tp, pp = args.tp or 1, args.pp or 1
    if args.dp is None:
        if args.gpus is None:
            dp = 1
        elif args.gpus % (tp * pp):
            raise UsageError(f"--gpus {args.gpus} is not divisible by tp x pp = {tp * pp}; change --gpus, --tp or --pp")
        else:
            dp = args.gpus // (tp * pp)
    else:
        dp = args.dp
    if args.gpus is not None and args.gpus != tp * pp * dp:
        raise UsageError(f"--gpus {args.gpus} != tp x pp x dp = {tp}x{pp}x{dp} = {tp * pp * dp}; fix --gpus/--tp/--pp/--dp")
    mb = args.microbatch or 1
    gb = args.global_batch or dp * mb
    return ParallelConfig(tp, pp, dp, mb, gb, args.interleave or 1, args.zero or 0, args.recompute or "none",
                          bool(args.sequence_parallel), args.dp_overlap, args.param_bytes, args.grad_bytes,
                          args.optimizer_bytes)


def _estimate(args, model, hw) -> int:
    from netmorph.planner.search import check, estimate
    c = config_from(args)
    pp, gb = c.pp, c.global_batch
    why = check(model, c, hw)
    if why and not why.soft:
        raise UsageError(f"{why}; change {why.flag}")
    e = estimate(model, c, hw)
    if args.json:
        json.dump(e, sys.stdout, indent=1, default=float)
        sys.stdout.write("\n")
        return 0
    mem = e["memory_bytes"]
    print(f"# netmorph plan estimate: {_describe(model)} on {c.gpus} x {hw.name}")
    print(f"# {c.label()}, global batch {gb} ({c.microbatches} microbatches per pipeline)"
          + (f"; warning: {why}" if why else ""))
    print(f"parameters         {e['params_count'] / 1e9:,.2f} x 1e9 (Narayanan eq. 2)")
    print("memory per GPU     " + ", ".join(f"{k} {_gb(mem[k])} GB ({mem[k] / 2**30:.1f} GiB)"
                                            for k in ("params", "grads", "optimizer", "activations")))
    print(f"                   total {_gb(mem['total'])} GB ({mem['total'] / 2**30:.1f} GiB) of "
          f"{_gb(hw.memory_bytes)} GB ({hw.memory_bytes / 2**30:.0f} GiB): {'fits' if e['fits'] else 'DOES NOT FIT'}")
    if model.bare:
        return 0
    cm = e["comm_s"]
    print(f"FLOPs / iteration  {e['flops_per_iteration']:.4g} (eq. 3, recompute {c.recompute}); model FLOPs "
          f"{e['model_flops_per_iteration']:.4g}")
    print(f"step time          {e['step_time_s']:.3f} s = matmul {e['matmul_s']:.3f} + elementwise "
          f"{e['elementwise_s']:.3f} + bubble {e['bubble_s']:.3f} + TP {cm['tensor_parallel']:.3f} + PP "
          f"{cm['pipeline_p2p']:.3f} + DP {cm['data_parallel']:.3f} + ZeRO-3 {cm['zero3_gather']:.3f} + optimizer "
          f"{e['optimizer_s']:.3f}")
    print(f"throughput         {e['tflops_per_gpu']:.1f} TFLOP/s per GPU, MFU {100 * e['mfu']:.1f}%, "
          f"{e['tokens_per_s']:,.0f} tokens/s, bubble {100 * e['bubble_fraction']:.1f}% of ideal time "
          f"((p-1)/(v·m) = {pp - 1}/({c.interleave}·{c.microbatches}))")
    return 0


PARTS = (("bubble", lambda e: e["bubble_s"]), ("tensor-parallel comm", lambda e: e["comm_s"]["tensor_parallel"]),
         ("pipeline p2p", lambda e: e["comm_s"]["pipeline_p2p"]),
         ("data-parallel comm", lambda e: e["comm_s"]["data_parallel"] + e["comm_s"]["zero3_gather"]),
         ("recomputed matmuls", lambda e: e["matmul_s"]),
         ("memory-bound kernels", lambda e: e["elementwise_s"]), ("optimizer step", lambda e: e["optimizer_s"]))


def _why_slower(ranked, top, n=5):
    """For the best configuration of each other (tp, pp) split: how much slower, and the part that grew most."""
    best = ranked[0]
    shown = {(e["tp"], e["pp"]) for e in top}
    seen, out = set(), []
    for e in ranked:
        key = (e["tp"], e["pp"])
        if key in shown or key in seen:
            continue
        seen.add(key)
        name, grew = max(((nm, f(e) - f(best)) for nm, f in PARTS), key=lambda x: x[1])
        out.append(f"tp{e['tp']} pp{e['pp']} dp{e['dp']}: {e['step_time_s']:.2f} s "
                   f"(+{100 * (e['step_time_s'] / best['step_time_s'] - 1):.0f}%), mostly {name} "
                   f"(+{grew:.2f} s{', bubble ' + format(e['bubble_fraction'], '.0%') if name == 'bubble' else ''})")
        if len(out) == n:
            break
    return out


def _describe(model):
    if model.bare:
        return model.name
    return (f"{model.name} ({model.params() / 1e9:.1f}e9 params: l {model.layers}, h {model.hidden}, "
            f"heads {model.heads}, s {model.seq}, V {model.vocab})")


def _search(args, model, hw) -> int:
    from netmorph.planner.search import search
    if args.gpus is None:
        raise UsageError("--gpus is required to search (how many devices to split over)")
    if args.global_batch is None:
        raise UsageError("--global-batch is required to search (sequences per iteration)")
    for k in ("tp", "pp", "dp"):
        v = getattr(args, k)
        if v is not None and args.gpus % v:
            raise UsageError(f"--{k} {v} does not divide --gpus {args.gpus}")
    from netmorph.planner.config import ParallelConfig
    base = ParallelConfig(dp_overlap=args.dp_overlap, param_bytes=args.param_bytes, grad_bytes=args.grad_bytes,
                          optimizer_bytes=args.optimizer_bytes)
    t0 = time.perf_counter()
    result = search(model, args.gpus, hw, args.global_batch, base, top=0)
    ranked = result.ranked
    fixed = {k: getattr(args, k) for k in FIXABLE if getattr(args, k) is not None}
    if fixed:
        ranked = [e for e in ranked if all(e[k] == v for k, v in fixed.items())]
    elapsed = time.perf_counter() - t0
    top = ranked[:args.top]
    if args.json:
        rejected = [dataclasses.asdict(r) for r in sorted(result.rejected.values(), key=lambda r: -r.count)]
        json.dump({"plans": top, "searched": result.searched, "fits": result.fits, "rejected": rejected},
                  sys.stdout, indent=1, default=float)
        sys.stdout.write("\n")
        return 0 if top else 1
    total, n_fit = result.searched, result.fits
    print(f"# netmorph plan: {_describe(model)} on {args.gpus} x {hw.name}, global batch {args.global_batch}")
    print(f"# searched {total:,} configurations in {elapsed:.2f} s: {n_fit:,} fit"
          + (f", {len(ranked):,} match {fixed}" if fixed else "") + "; ranked by predicted step time")
    if top:
        print(f"{'#':>2} {'tp':>3} {'pp':>3} {'dp':>5} {'mb':>3} {'v':>2} {'zero':>4} {'recompute':>9} {'sp':>2} "
              f"{'step(s)':>9} {'TFLOP/s':>8} {'MFU':>6} {'bubble':>6}  {'GB: params/grads/opt/act = total':<36}"
              f" {'comm s: tp/pp/dp':<20}")
        for i, e in enumerate(top, 1):
            m, cm = e["memory_bytes"], e["comm_s"]
            mem = f"{_gb(m['params'])}/{_gb(m['grads'])}/{_gb(m['optimizer'])}/{_gb(m['activations'])} = {_gb(m['total'])}"
            comm = f"{cm['tensor_parallel']:.2f}/{cm['pipeline_p2p']:.2f}/{cm['data_parallel'] + cm['zero3_gather']:.2f}"
            print(f"{i:>2} {e['tp']:>3} {e['pp']:>3} {e['dp']:>5} {e['microbatch']:>3} {e['interleave']:>2} "
                  f"{e['zero']:>4} {e['recompute']:>9} {'y' if e['sequence_parallel'] else '-':>2} "
                  f"{e['step_time_s']:>9.3f} {e['tflops_per_gpu']:>8.1f} {100 * e['mfu']:>5.1f}% "
                  f"{100 * e['bubble_fraction']:>5.1f}%  {mem:<36} {comm:<20}")
    else:
        print("# nothing fits: every configuration was rejected (see below)")
    if top:
        lines = _why_slower(ranked, top)
        if lines:
            print("# other splits that fit, best of each, and what costs them most against plan 1:")
            for line in lines:
                print(f"#   {line}")
    print("# rejected, by reason (count: an example):")
    for r in sorted(result.rejected.values(), key=lambda r: -r.count):
        print(f"#   {r.count:>8,}  {r.example}")
    if top:
        print("# memory in decimal GB; `netmorph plan estimate` with the same flags breaks one plan down")
    return 0 if top else 1
