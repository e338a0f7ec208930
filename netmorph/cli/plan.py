"""``netmorph plan``: the best (tp, pp, dp, microbatch, v, ZeRO, recompute) split, and why.

``netmorph plan ...`` searches every configuration and ranks those that fit;
``netmorph plan estimate ... --tp 8 --pp 8 --dp 16`` breaks one configuration down.
Configuration flags given to the search fix that dimension.
"""

from __future__ import annotations

import dataclasses
import sys
import time

from netmorph.cli import print_json
from netmorph.cli.flags import int_in, schedule_list
from netmorph.cli.split import add_split_args, config_from, model_and_hardware, print_notes
from netmorph.errors import UsageError, spell
from netmorph.mesh.settings import SPLIT_BACKWARD
from netmorph.units import fmt_memory, fmt_params

# library parameters a layout's rejection names, as this command's flags (the rest are --name)
FLAGS = {"micro_batch_size": "--microbatch", "microbatches": "--global-batch"}

FIXABLE = (
    "tp",
    "cp",
    "pp",
    "dp",
    "ep",
    "microbatch",
    "interleave",
    "zero",
    "recompute",
    "sequence_parallel",
    "precision",
)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="search DP/TP/PP/CP/EP/ZeRO splits; `plan estimate` breaks one down",
        description="Predict memory per GPU and step time for parallel training configurations "
        "(Narayanan et al. 2021, Korthikanti et al. 2022, ZeRO) and rank them.",
    )
    p.add_argument(
        "action",
        nargs="?",
        default="search",
        choices=("search", "estimate"),
        help="search (default): rank every split that fits; estimate: break one split down",
    )
    add_split_args(p)
    p.add_argument(
        "--schedules",
        type=schedule_list,
        metavar="LIST",
        help="search: the pipeline schedules to try on every pipeline, comma-separated, or all (1f1b "
        "and interleaved, zb-h1, zbv, dualpipev); default --schedule's alone (Megatron's 1F1B)",
    )
    p.add_argument("--top", type=int_in(1, 1000), default=5, help="how many plans to print (default 5)")
    p.add_argument("--json", action="store_true", help="print the plans (and for a search the rejections) as JSON")
    p.set_defaults(run=run, flags=FLAGS)


def _gb(x):
    return f"{x / 1e9:.1f}"


def run(args) -> int:
    if args.action == "estimate" and args.schedules:
        raise UsageError("--schedules is for a search; `plan estimate` prices one --schedule")
    model, hw = model_and_hardware(args)
    return _estimate(args, model, hw) if args.action == "estimate" else _search(args, model, hw)


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
        print(
            "# note: "
            + (
                f"ZeRO-3 with pp {c.pp} runs as FSDP2 under torch.distributed.pipelining "
                "(reshard_after_forward=False, gradients reduce-scattered at the last microbatch): "
                "priced with ZeRO-1's memory and traffic"
                if c.zero == 3
                else f"ZeRO-2 with pp {c.pp} is Llama 3's FSDP: weights gathered once a step, gradients "
                "and optimizer sharded, a reduce-scatter after every microbatch"
            ),
            file=sys.stderr,
        )
    if args.json:
        print_json(e.as_dict(), indent=1)
        return 0
    mem = e.memory
    print(f"# netmorph plan estimate: {_describe(model)} on {c.gpus} x {hw.name}")
    print(
        f"# {c.label()}, global batch {gb} ({c.microbatches} microbatches per pipeline)"
        + (f"; warning: {why}" if why else "")
    )
    active = (
        f", {fmt_params(model.active_params())} active per token (top-{model.top_k} of {model.experts} experts)"
        if model.experts
        else ""
    )
    print(
        f"parameters         {fmt_params(model.params())}{active}"
        + ("" if model.bare else f"; layers per stage {_stages(c.stage_layers(model.layers))}")
    )
    print(
        "memory per GPU     "
        + ", ".join(f"{k} {fmt_memory(getattr(mem, k))}" for k in ("params", "grads", "optimizer", "activations"))
    )
    print(
        f"                   total {fmt_memory(mem.total)} of "
        f"{_gb(hw.memory_bytes)} GB ({hw.memory_bytes / 2**30:.0f} GiB): {'fits' if e.fits else 'DOES NOT FIT'}"
    )
    if model.bare:
        return 0
    st, part, r = e.step, e.step.parts, e.rates
    print(
        f"FLOPs / iteration  {e.flops.executed:.4g} (eq. 3 convention, recompute {c.knobs.recompute}); "
        f"model FLOPs {e.flops.megatron:.4g} (Megatron: full s x s attention), {e.flops.causal:.4g} causal"
    )
    extra = "".join(
        f" + {name} {getattr(part, key):.3f}"
        for name, key in (("CP", "context_parallel"), ("EP", "expert_parallel"))
        if getattr(part, key)
    )
    print(
        f"step time          {st.step_time_s:.3f} s = matmul {part.matmul:.3f} + elementwise "
        f"{part.elementwise:.3f} + bubble {part.bubble:.3f} + TP {part.tensor_parallel:.3f}{extra} + PP "
        f"{part.pipeline_p2p:.3f} + DP {part.data_parallel:.3f} + ZeRO-3 {part.zero3_gather:.3f} + optimizer "
        f"{part.optimizer:.3f}"
        + (f" + compute slowed beside comm {part.overlap_slowdown:.3f}" if part.overlap_slowdown else "")
    )
    fp8 = (
        f" of the 16-bit peak ({100 * r.mfu * hw.peak_flops / hw.fp8_flops:.1f}% of FP8's)"
        if c.precision.name == "fp8"
        else ""
    )
    print(
        f"throughput         {r.tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {100 * r.mfu:.1f}%{fp8}, "
        f"{r.tokens_per_s:,.0f} tokens/s ({r.tokens_per_s_per_gpu:,.0f} per GPU), bubble "
        f"{100 * st.bubble_fraction:.1f}% of ideal time "
        + (
            f"({c.pipeline_schedule}: the weight gradients fill it, its slots played)"
            if c.pipeline_schedule in SPLIT_BACKWARD and pp > 1
            else f"((p-1)/(v·m) = {pp - 1}/({c.interleave}·{c.microbatches}))"
        )
    )
    return 0


PARTS = (
    ("bubble", lambda p: p.bubble),
    ("tensor-parallel comm", lambda p: p.tensor_parallel),
    ("context-parallel comm", lambda p: p.context_parallel),
    ("expert-parallel all-to-all", lambda p: p.expert_parallel),
    ("pipeline p2p", lambda p: p.pipeline_p2p),
    ("data-parallel comm", lambda p: p.data_parallel + p.zero3_gather),
    ("recomputed matmuls", lambda p: p.matmul),
    ("memory-bound kernels", lambda p: p.elementwise),
    ("optimizer step", lambda p: p.optimizer),
)


def _why_slower(by_split, top, n=5):
    """For the best configuration of each other (tp, pp) split: how much slower, and the part that grew most."""
    best = top[0].step
    shown = {(e.layout.tp, e.layout.pp) for e in top}
    out = []
    for e in by_split:
        c, st = e.layout, e.step
        if (c.tp, c.pp) in shown:
            continue
        name, grew = max(((nm, f(st.parts) - f(best.parts)) for nm, f in PARTS), key=lambda x: x[1])
        out.append(
            f"tp{c.tp} pp{c.pp} dp{c.dp}: {st.step_time_s:.2f} s "
            f"(+{100 * (st.step_time_s / best.step_time_s - 1):.0f}%), mostly {name} "
            f"(+{grew:.2f} s{', bubble ' + format(st.bubble_fraction, '.0%') if name == 'bubble' else ''})"
        )
        if len(out) == n:
            break
    return out


def _describe(model):
    if model.bare:
        return model.name
    return (
        f"{model.name} ({model.params() / 1e9:.1f}e9 params: l {model.layers}, h {model.hidden}, "
        f"heads {model.heads}, s {model.seq}, V {model.vocab}; {model.describe()})"
    )


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

    base = Layout.of(
        dp_overlap=bool(args.dp_overlap),
        param_bytes=args.param_bytes,
        grad_bytes=args.grad_bytes,
        optimizer_bytes=args.optimizer_bytes,
        first_stage_layers=args.first_stage_layers or 0,
        last_stage_layers=args.last_stage_layers or 0,
        tp_overlap=bool(args.tp_overlap),
        pp_overlap=bool(args.pp_overlap),
        param_gather_overlap=bool(args.param_gather_overlap),
        zero_memory=args.zero_memory,
        schedule=args.schedule or "",
        microbatch_group=args.microbatch_group or 0,
        cp_comm_type=args.cp_comm_type,
    )
    fixed = {k: getattr(args, k) for k in FIXABLE if getattr(args, k) is not None}
    t0 = time.perf_counter()
    if args.schedules and args.schedule:
        raise UsageError("--schedule fixes one pipeline schedule and --schedules tries several: give one of them")
    result = search(
        model, args.gpus, hw, args.global_batch, base, top=args.top, fixed=fixed, schedules=args.schedules or ()
    )
    elapsed = time.perf_counter() - t0
    top = result.ranked
    print_notes(args)
    if args.json:
        rejected = [
            {**dataclasses.asdict(r), "flag": spell(r.flag, FLAGS)}
            for r in sorted(result.rejected.values(), key=lambda r: -r.count)
        ]
        print_json(
            {
                "plans": [e.as_dict() for e in top],
                "searched": result.searched,
                "fits": result.fits,
                "rejected": rejected,
            },
            indent=1,
        )
        return 0 if top else 1
    total, n_fit = result.searched, result.fits
    print(f"# netmorph plan: {_describe(model)} on {args.gpus} x {hw.name}, global batch {args.global_batch}")
    print(
        f"# searched {total:,} configurations in {elapsed:.2f} s: {n_fit:,} fit"
        + (f" (fixed: {', '.join(f'{k} {v}' for k, v in fixed.items())})" if fixed else "")
        + "; ranked by predicted step time"
    )
    if top:
        ep = model.experts > 0
        print(
            f"{'#':>2} {'tp':>3} {'cp':>3} {'pp':>3} {'dp':>5} "
            + (f"{'ep':>3} " if ep else "")
            + f"{'mb':>3} {'v':>2} "
            + (f"{'schedule':>11} " if args.schedules else "")
            + f"{'zero':>4} {'recompute':>9} "
            f"{'sp':>2} {'prec':>4} {'step(s)':>9} {'TFLOP/s':>8} {'MFU':>6} {'bubble':>6}  "
            f"{'GB: params/grads/opt/act = total':<36} {'comm s: tp/cp/pp/dp':<20}"
        )
        for i, e in enumerate(top, 1):
            c, m, cm = e.layout, e.memory, e.step.parts
            mem = f"{_gb(m.params)}/{_gb(m.grads)}/{_gb(m.optimizer)}/{_gb(m.activations)} = {_gb(m.total)}"
            comm = (
                f"{cm.tensor_parallel:.2f}/{cm.context_parallel:.2f}/{cm.pipeline_p2p:.2f}/"
                f"{cm.data_parallel + cm.zero3_gather:.2f}"
            )
            sched = c.pipeline_schedule if c.pp > 1 else ""
            print(
                f"{i:>2} {c.tp:>3} {c.cp:>3} {c.pp:>3} {c.dp:>5} "
                + (f"{c.ep:>3} " if ep else "")
                + f"{c.batch.micro_batch_size:>3} {c.interleave:>2} "
                + (f"{sched or '-':>11} " if args.schedules else "")
                + f"{c.zero:>4} {c.knobs.recompute:>9} {'y' if c.knobs.sequence_parallel else '-':>2} "
                f"{c.precision.name:>4} {e.step.step_time_s:>9.3f} {e.rates.tflops_per_gpu:>8.1f} "
                f"{100 * e.rates.mfu:>5.1f}% {100 * e.step.bubble_fraction:>5.1f}%  {mem:<36} {comm:<20}"
            )
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
