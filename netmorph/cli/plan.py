"""``netmorph plan``: the best (tp, pp, dp, microbatch, v, ZeRO, recompute) split, and why.

``netmorph plan ...`` searches every configuration and ranks those that fit;
``netmorph plan estimate ... --tp 8 --pp 8 --dp 16`` breaks one configuration down.
Configuration flags given to the search fix that dimension.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from netmorph.cli import int_in, pipeline_schedule, print_json, schedule_list
from netmorph.cli.shape import add_shape_flags
from netmorph.errors import UsageError, spell
from netmorph.mesh.settings import CP_COMM, SCHEDULES, SPLIT_BACKWARD
from netmorph.units import fmt_memory, fmt_params

# library parameters a layout's rejection names, as this command's flags (the rest are --name)
FLAGS = {"micro_batch_size": "--microbatch", "microbatches": "--global-batch"}

SIZE = int_in(1, 1 << 24, "1..16,777,216")     # a parallel degree, a device count, a batch
BYTES = int_in(0, 64)                           # bytes per parameter, gradient or optimizer state

FIXABLE = ("tp", "cp", "pp", "dp", "ep", "microbatch", "interleave", "zero", "recompute", "sequence_parallel",
           "precision")


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="search DP/TP/PP/CP/EP/ZeRO splits; `plan estimate` breaks one down",
                       description="Predict memory per GPU and step time for parallel training configurations "
                                   "(Narayanan et al. 2021, Korthikanti et al. 2022, ZeRO) and rank them.")
    p.add_argument("action", nargs="?", default="search", choices=("search", "estimate"),
                   help="search (default): rank every split that fits; estimate: break one split down")
    add_split_args(p)
    p.add_argument("--schedules", type=schedule_list, metavar="LIST",
                   help="search: the pipeline schedules to try on every pipeline, comma-separated, or all (1f1b "
                        "and interleaved, zb-h1, zbv, dualpipev); default --schedule's alone (Megatron's 1F1B)")
    p.add_argument("--top", type=int_in(1, 1000), default=5, help="how many plans to print (default 5)")
    p.add_argument("--json", action="store_true", help="print the plans (and for a search the rejections) as JSON")
    p.set_defaults(run=run, flags=FLAGS)


def add_split_args(p, bare: bool = True) -> None:
    """The model, the machine and the split: the flags `plan` and `simulate step` share."""
    g = p.add_argument_group("model")
    g.add_argument("--model", help="preset: llama-3-8b/70b/405b, llama-2-7b/70b, mixtral-8x7b, bloom-176b, "
                                   "mpt-1b .. mpt-70b, gpt3-175b, ptdp-1.7b .. ptdp-1t (Narayanan Table 1), "
                                   "mt-22b .. mt-1t")
    g.add_argument("--model-config", help="a Hugging Face config.json: the model you train")
    g.add_argument("--megatron-args", help="a Megatron-LM pretrain command line (quoted): model and split")
    g.add_argument("--deepspeed-config", help="a DeepSpeed ds_config.json: batch sizes, ZeRO stage, precision")
    add_shape_flags(g, "plan", {"seq": "default 2048", "vocab": "default 51200"})
    g.add_argument("--kv-heads", type=int, help="key/value heads (grouped-query attention; default: --heads)")
    g.add_argument("--ffn", type=int, help="MLP intermediate width (default 4 x hidden)")
    g.add_argument("--ffn-type", choices=("gelu", "swiglu"), help="two-matrix GeLU MLP or three-matrix SwiGLU")
    g.add_argument("--position", choices=("learned", "rope", "alibi"), help="position encoding (learned: s x h "
                                                                           "parameters)")
    g.add_argument("--untie-embeddings", action="store_true", default=None,
                   help="a separate output layer (Llama) instead of one tied to the word embedding")
    g.add_argument("--attention", choices=("flash", "standard"),
                   help="flash: no stored s x s scores, recomputed in backward (default for models from flags "
                        "and configs; the 2021-22 paper presets are standard)")
    g.add_argument("--dropout", action=argparse.BooleanOptionalAction, default=None,
                   help="--no-dropout: the model trains without dropout (Llama, MPT), so no masks are stored "
                        "(default: as the preset or config; on for a model from flags)")
    g.add_argument("--experts", type=int, help="mixture of experts: experts per layer")
    g.add_argument("--top-k", type=int, help="experts each token visits (default 2 with --experts)")
    g.add_argument("--capacity-factor", type=float, help="MoE expert capacity over its even share (default 1: "
                                                         "dropless, no padding)")
    if bare:
        g.add_argument("--params", type=float, help="a bare parameter count: model-state memory only (estimate)")
    h = p.add_argument_group("machine")
    h.add_argument("--gpus", type=SIZE, help="devices (default: tp x cp x pp x dp for estimate)")
    h.add_argument("--hardware", default="a100-80g",
                   help="a100-80g (default), a100-40g, h100-80g, h200, v100-32g, or a JSON file")
    h.add_argument("--efficiency", type=float, help="override the hardware's matmul efficiency (fraction of peak)")
    c = p.add_argument_group("configuration")
    c.add_argument("--global-batch", type=SIZE, help="sequences per iteration")
    c.add_argument("--tp", type=SIZE, help="tensor-parallel size (search: fix it)")
    c.add_argument("--cp", type=SIZE, help="context-parallel size: the sequence split, ring attention (search: fix it)")
    c.add_argument("--pp", type=SIZE, help="pipeline stages (search: fix it)")
    c.add_argument("--dp", type=SIZE, help="data-parallel size (default: gpus / (tp x cp x pp))")
    c.add_argument("--ep", type=SIZE, help="expert-parallel size, within dp (search: fix it)")
    c.add_argument("--microbatch", type=SIZE, help="sequences per microbatch b (search: fix it)")
    c.add_argument("--interleave", type=SIZE, help="model chunks per pipeline stage, v (default 1)")
    c.add_argument("--schedule", type=pipeline_schedule, choices=SCHEDULES,
                   help="pipeline schedule: afab (or gpipe: every forward first), 1f1b (default), interleaved "
                        "(default with --interleave > 1), zb-h1, zbv, dualpipev (zero bubble: the weight gradients "
                        "fill the bubble; zbv and dualpipev two chunks a rank in a V); sets the activations each "
                        "stage holds, the weight gradients it owes and the bubble (search: fix it)")
    c.add_argument("--microbatch-group", type=int, metavar="N",
                   help="interleaved: microbatches each chunk runs before the next (Megatron's "
                        "--microbatch-group-size-per-virtual-pipeline-stage, Llama 3's N; default pp)")
    c.add_argument("--first-stage-layers", type=int, help="layers on the first pipeline stage (default: even split)")
    c.add_argument("--last-stage-layers", type=int, help="layers on the last pipeline stage (default: even split)")
    c.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="ZeRO stage over the DP group (search: fix it)")
    c.add_argument("--zero-memory", choices=("paper", "deepspeed"), default="paper",
                   help="ZeRO's model states as the ZeRO paper's Table 1 counts them (default) or as DeepSpeed "
                        "allocates them (its estimate_zero2/3_model_states_mem_needs, term by term)")
    c.add_argument("--recompute", choices=("none", "selective", "full"),
                   help="activation recomputation (Korthikanti et al.; search: fix it)")
    c.add_argument("--sequence-parallel", action="store_true", default=None,
                   help="Megatron sequence parallelism (search: fix it on)")
    c.add_argument("--precision", choices=("bf16", "fp8"),
                   help="bf16, or fp8 matmuls (Transformer Engine) on hardware that has them (search: fix it)")
    c.add_argument("--dp-overlap", action="store_true", default=None,
                   help="overlap the gradient reduction (and FSDP's gathers) with compute")
    c.add_argument("--tp-overlap", action="store_true", default=None,
                   help="Megatron --tp-comm-overlap: TP collectives pipelined with the GEMMs")
    c.add_argument("--param-gather-overlap", action="store_true", default=None,
                   help="Megatron --overlap-param-gather: the distributed optimizer's all-gather behind the next "
                        "forward (with --dp-overlap)")
    c.add_argument("--pp-overlap", action="store_true", default=None,
                   help="Megatron --overlap-p2p-communication: pipeline sends behind compute")
    c.add_argument("--cp-comm-type", choices=CP_COMM, default="p2p",
                   help="Megatron --cp-comm-type: p2p (default; ring attention, K and V blocks passed behind the "
                        "attention core), all_gather (Llama 3: K and V all-gathered before it, exposed) or a2a "
                        "(DeepSpeed-Ulysses: all-to-alls trade the sequence split for a head split, exposed)")
    c.add_argument("--param-bytes", type=BYTES, default=2, help="bytes per weight (default 2)")
    c.add_argument("--grad-bytes", type=BYTES, default=4, help="bytes per gradient (default 4, fp32 main grads; "
                                                             "2 gives ZeRO's 16 B/param)")
    c.add_argument("--optimizer-bytes", type=BYTES, default=12, help="optimizer bytes per parameter (default 12)")


ARCH = {"kv_heads": "kv_heads", "ffn_type": "ffn_type", "position": "position", "attention": "attention",
        "experts": "experts", "top_k": "top_k", "capacity_factor": "capacity_factor", "dropout": "dropout"}


def _common(args):
    """The model and the hardware the flags name; a config file's split settings are folded into ``args``
    (a flag given on the command line wins) and the settings the planner does not model are printed."""
    from netmorph.mesh.configs import from_deepspeed_config, from_hf_config, from_megatron_args
    from netmorph.mesh.presets import MEGATRON_DEFAULTS, from_args
    from netmorph.mesh.shape import ModelShape
    from netmorph.planner.hardware import load_hardware
    sources = [k for k in ("model", "model_config", "megatron_args") if getattr(args, k, None)]
    if len(sources) > 1:
        raise UsageError("give one of --model, --model-config and --megatron-args (flags override its fields)")
    base, notes = None, []
    if getattr(args, "model_config", None):
        fields, unknown = from_hf_config(args.model_config)
        base = ModelShape(**fields)
        if unknown:
            notes.append(f"{args.model_config}: not modelled: {', '.join(unknown)}")
    split = {}
    if getattr(args, "megatron_args", None):
        fields, split, unknown = from_megatron_args(args.megatron_args)
        missing = [f"--{k.replace('_', '-')}" for k in ("layers", "hidden", "heads") if k not in fields]
        if missing:
            raise UsageError(f"--megatron-args lacks --num-layers/--hidden-size/--num-attention-heads "
                             f"(missing: {', '.join(missing)})")
        base = ModelShape("megatron-args", **{**MEGATRON_DEFAULTS, **fields})
        if unknown:
            notes.append(f"--megatron-args: not modelled: {' '.join(unknown)}")
    if getattr(args, "deepspeed_config", None):
        ds, unknown = from_deepspeed_config(args.deepspeed_config)
        accum = ds.pop("grad_accum", None)
        if accum and "global_batch" not in ds and ds.get("microbatch") and args.global_batch is None:
            dp = args.dp or ((args.gpus or 0) // ((args.tp or 1) * (args.pp or 1) * (args.cp or 1)))
            if dp:
                ds["global_batch"] = ds["microbatch"] * accum * dp
        split.update(ds)
        if unknown:
            notes.append(f"{args.deepspeed_config}: not modelled: {', '.join(unknown)}")
    for k, v in split.items():                      # a config file's split, unless a flag says otherwise
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    arch = {k: getattr(args, a, None) for a, k in ARCH.items()}
    if getattr(args, "untie_embeddings", None):
        arch["tied"] = False
    if arch["experts"] and arch["top_k"] is None and not (base and base.experts):
        arch["top_k"] = 2
    model = from_args(args.model, args.layers, args.hidden, args.heads, args.seq, args.vocab, args.ffn,
                      getattr(args, "params", None), base=base, **arch)
    hw = load_hardware(args.hardware, args.efficiency)
    for k in ("first_stage_layers", "last_stage_layers"):
        v = getattr(args, k)
        if v is not None and not 1 <= v <= max(model.layers, 1):
            raise UsageError(f"--{k.replace('_', '-')} must be in 1..{model.layers} (the layers), got {v}")
    args.notes = notes                  # printed with the result, not before an error
    return model, hw


def print_notes(args, file=None) -> None:
    for line in getattr(args, "notes", []):
        print(f"# note: {line}", file=file or sys.stderr)


def _gb(x):
    return f"{x / 1e9:.1f}"


def run(args) -> int:
    if args.action == "estimate" and args.schedules:
        raise UsageError("--schedules is for a search; `plan estimate` prices one --schedule")
    model, hw = _common(args)
    return _estimate(args, model, hw) if args.action == "estimate" else _search(args, model, hw)


def config_from(args):
    """The one split the flags name (tp, cp, pp default 1; dp from --gpus)."""
    from netmorph.mesh.layout import Layout
    tp, pp, cp = args.tp or 1, args.pp or 1, args.cp or 1
    inner = tp * pp * cp
    if args.dp is None:
        if args.gpus is None:
            dp = 1
        elif args.gpus % inner:
            raise UsageError(f"--gpus {args.gpus} is not divisible by tp x cp x pp = {inner}; change --gpus, --tp, "
                             f"--cp or --pp")
        else:
            dp = args.gpus // inner
    else:
        dp = args.dp
    if args.gpus is not None and args.gpus != inner * dp:
        raise UsageError(f"--gpus {args.gpus} != tp x cp x pp x dp = {tp}x{cp}x{pp}x{dp} = {inner * dp}; fix "
                         f"--gpus/--tp/--cp/--pp/--dp")
    mb = args.microbatch or 1
    gb = args.global_batch or dp * mb
    return Layout.of(tp=tp, cp=cp, ep=args.ep or 1, dp=dp, pp=pp, zero=args.zero or 0,
                     interleave=args.interleave or 1, global_batch=gb, micro_batch_size=mb,
                  sequence_parallel=bool(args.sequence_parallel), recompute=args.recompute or "none",
                  dp_overlap=bool(args.dp_overlap), tp_overlap=bool(args.tp_overlap), pp_overlap=bool(args.pp_overlap),
                  param_gather_overlap=bool(args.param_gather_overlap),
                  zero_memory=args.zero_memory, cp_comm_type=args.cp_comm_type,
                  precision=args.precision or "bf16", param_bytes=args.param_bytes, grad_bytes=args.grad_bytes,
                  optimizer_bytes=args.optimizer_bytes, first_stage_layers=args.first_stage_layers or 0,
                  last_stage_layers=args.last_stage_layers or 0, schedule=args.schedule or "",
                  microbatch_group=args.microbatch_group or 0)


def _estimate(args, model, hw) -> int:
    from netmorph.planner.search import check, estimate
    c = config_from(args)
    pp, gb = c.pp, c.batch.global_batch
    why = check(model, c, hw)
    if why and not why.soft:
        raise UsageError(f"{why}; change {why.flag}")
    e = estimate(model, c, hw)
    print_notes(args)
    if c.pp > 1 and c.zero >= 2:
        print("# note: " + (f"ZeRO-3 with pp {c.pp} runs as FSDP2 under torch.distributed.pipelining "
                            "(reshard_after_forward=False, gradients reduce-scattered at the last microbatch): "
                            "priced with ZeRO-1's memory and traffic" if c.zero == 3 else
                            f"ZeRO-2 with pp {c.pp} is Llama 3's FSDP: weights gathered once a step, gradients "
                            "and optimizer sharded, a reduce-scatter after every microbatch"), file=sys.stderr)
    if args.json:
        print_json(e, indent=1)
        return 0
    mem = e["memory_bytes"]
    print(f"# netmorph plan estimate: {_describe(model)} on {c.gpus} x {hw.name}")
    print(f"# {c.label()}, global batch {gb} ({c.microbatches} microbatches per pipeline)"
          + (f"; warning: {why}" if why else ""))
    active = (f", {fmt_params(e['active_params_count'])} active per token (top-{model.top_k} of "
              f"{model.experts} experts)" if model.experts else "")
    print(f"parameters         {fmt_params(e['params_count'])}{active}"
          + ("" if model.bare else f"; layers per stage {_stages(e['stage_layers'])}"))
    print("memory per GPU     " + ", ".join(f"{k} {fmt_memory(mem[k])}" for k in ("params", "grads", "optimizer",
                                                                            "activations")))
    print(f"                   total {fmt_memory(mem['total'])} of "
          f"{_gb(hw.memory_bytes)} GB ({hw.memory_bytes / 2**30:.0f} GiB): {'fits' if e['fits'] else 'DOES NOT FIT'}")
    if model.bare:
        return 0
    cm = e["comm_s"]
    print(f"FLOPs / iteration  {e['flops_per_iteration']:.4g} (eq. 3 convention, recompute {c.knobs.recompute}); "
          f"model FLOPs {e['megatron_flops_per_iteration']:.4g} (Megatron: full s x s attention), "
          f"{e['model_flops_per_iteration']:.4g} causal")
    extra = "".join(f" + {name} {cm[key]:.3f}" for name, key in (("CP", "context_parallel"), ("EP", "expert_parallel"))
                    if cm[key])
    print(f"step time          {e['step_time_s']:.3f} s = matmul {e['matmul_s']:.3f} + elementwise "
          f"{e['elementwise_s']:.3f} + bubble {e['bubble_s']:.3f} + TP {cm['tensor_parallel']:.3f}{extra} + PP "
          f"{cm['pipeline_p2p']:.3f} + DP {cm['data_parallel']:.3f} + ZeRO-3 {cm['zero3_gather']:.3f} + optimizer "
          f"{e['optimizer_s']:.3f}" + (f" + compute slowed beside comm {e['overlap_slowdown_s']:.3f}"
                                      if e["overlap_slowdown_s"] else ""))
    fp8 = (f" of the 16-bit peak ({100 * e['mfu'] * hw.peak_flops / hw.fp8_flops:.1f}% of FP8's)"
           if c.precision.name == "fp8" else "")
    print(f"throughput         {e['tflops_per_gpu']:.1f} TFLOP/s per GPU, MFU {100 * e['mfu']:.1f}%{fp8}, "
          f"{e['tokens_per_s']:,.0f} tokens/s ({e['tokens_per_s_per_gpu']:,.0f} per GPU), bubble "
          f"{100 * e['bubble_fraction']:.1f}% of ideal time " + (
              f"({c.pipeline_schedule}: the weight gradients fill it, its slots played)"
              if c.pipeline_schedule in SPLIT_BACKWARD and pp > 1 else
              f"((p-1)/(v·m) = {pp - 1}/({c.interleave}·{c.microbatches}))"))
    return 0


PARTS = (("bubble", lambda e: e["bubble_s"]), ("tensor-parallel comm", lambda e: e["comm_s"]["tensor_parallel"]),
         ("context-parallel comm", lambda e: e["comm_s"]["context_parallel"]),
         ("expert-parallel all-to-all", lambda e: e["comm_s"]["expert_parallel"]),
         ("pipeline p2p", lambda e: e["comm_s"]["pipeline_p2p"]),
         ("data-parallel comm", lambda e: e["comm_s"]["data_parallel"] + e["comm_s"]["zero3_gather"]),
         ("recomputed matmuls", lambda e: e["matmul_s"]),
         ("memory-bound kernels", lambda e: e["elementwise_s"]), ("optimizer step", lambda e: e["optimizer_s"]))


def _why_slower(by_split, top, n=5):
    """For the best configuration of each other (tp, pp) split: how much slower, and the part that grew most."""
    best = top[0]
    shown = {(e["tp"], e["pp"]) for e in top}
    out = []
    for e in by_split:
        if (e["tp"], e["pp"]) in shown:
            continue
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
            f"heads {model.heads}, s {model.seq}, V {model.vocab}; {model.describe()})")


def _stages(counts):
    """[7, 8, 8, ..., 8, 7] as '7, 8 x 14, 7'."""
    out, i = [], 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out.append(f"{counts[i]}" + (f" x {j - i}" if j - i > 1 else ""))
        i = j
    return ", ".join(out)


def _search(args, model, hw) -> int:
    from netmorph.planner.search import search
    if args.gpus is None:
        raise UsageError("--gpus is required to search (how many devices to split over)")
    if args.global_batch is None:
        raise UsageError("--global-batch is required to search (sequences per iteration)")
    for k in ("tp", "cp", "pp", "dp"):
        v = getattr(args, k)
        if v is not None and args.gpus % v:
            raise UsageError(f"--{k} {v} does not divide --gpus {args.gpus}")
    from netmorph.mesh.layout import Layout
    base = Layout.of(dp_overlap=bool(args.dp_overlap), param_bytes=args.param_bytes, grad_bytes=args.grad_bytes,
                  optimizer_bytes=args.optimizer_bytes, first_stage_layers=args.first_stage_layers or 0,
                  last_stage_layers=args.last_stage_layers or 0, tp_overlap=bool(args.tp_overlap),
                  pp_overlap=bool(args.pp_overlap), param_gather_overlap=bool(args.param_gather_overlap),
                  zero_memory=args.zero_memory, schedule=args.schedule or "",
                  microbatch_group=args.microbatch_group or 0, cp_comm_type=args.cp_comm_type)
    fixed = {k: getattr(args, k) for k in FIXABLE if getattr(args, k) is not None}
    t0 = time.perf_counter()
    if args.schedules and args.schedule:
        raise UsageError("--schedule fixes one pipeline schedule and --schedules tries several: give one of them")
    result = search(model, args.gpus, hw, args.global_batch, base, top=args.top, fixed=fixed,
                    schedules=args.schedules or ())
    elapsed = time.perf_counter() - t0
    top = result.ranked
    print_notes(args)
    if args.json:
        rejected = [{**dataclasses.asdict(r), "flag": spell(r.flag, FLAGS)}
                    for r in sorted(result.rejected.values(), key=lambda r: -r.count)]
        print_json({"plans": top, "searched": result.searched, "fits": result.fits, "rejected": rejected}, indent=1)
        return 0 if top else 1
    total, n_fit = result.searched, result.fits
    print(f"# netmorph plan: {_describe(model)} on {args.gpus} x {hw.name}, global batch {args.global_batch}")
    print(f"# searched {total:,} configurations in {elapsed:.2f} s: {n_fit:,} fit"
          + (f" (fixed: {', '.join(f'{k} {v}' for k, v in fixed.items())})" if fixed else "")
          + "; ranked by predicted step time")
    if top:
        ep = model.experts > 0
        print(f"{'#':>2} {'tp':>3} {'cp':>3} {'pp':>3} {'dp':>5} " + (f"{'ep':>3} " if ep else "")
              + f"{'mb':>3} {'v':>2} " + (f"{'schedule':>11} " if args.schedules else "") + f"{'zero':>4} {'recompute':>9} "
              f"{'sp':>2} {'prec':>4} {'step(s)':>9} {'TFLOP/s':>8} {'MFU':>6} {'bubble':>6}  "
              f"{'GB: params/grads/opt/act = total':<36} {'comm s: tp/cp/pp/dp':<20}")
        for i, e in enumerate(top, 1):
            m, cm = e["memory_bytes"], e["comm_s"]
            mem = f"{_gb(m['params'])}/{_gb(m['grads'])}/{_gb(m['optimizer'])}/{_gb(m['activations'])} = {_gb(m['total'])}"
            comm = (f"{cm['tensor_parallel']:.2f}/{cm['context_parallel']:.2f}/{cm['pipeline_p2p']:.2f}/"
                    f"{cm['data_parallel'] + cm['zero3_gather']:.2f}")
            print(f"{i:>2} {e['tp']:>3} {e['cp']:>3} {e['pp']:>3} {e['dp']:>5} " + (f"{e['ep']:>3} " if ep else "")
                  + f"{e['microbatch']:>3} {e['interleave']:>2} "
                  + (f"{e['schedule'] or '-':>11} " if args.schedules else "") +
                  f"{e['zero']:>4} {e['recompute']:>9} {'y' if e['sequence_parallel'] else '-':>2} {e['precision']:>4} "
                  f"{e['step_time_s']:>9.3f} {e['tflops_per_gpu']:>8.1f} {100 * e['mfu']:>5.1f}% "
                  f"{100 * e['bubble_fraction']:>5.1f}%  {mem:<36} {comm:<20}")
    else:
        print("# nothing fits: every configuration was rejected (see below)")
    if top:
        lines = _why_slower(result.by_split, top)
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
