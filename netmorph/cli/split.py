"""The model, the machine and the split: the flags ``plan`` and ``simulate step`` share, and what they name --
the model (a preset, a Hugging Face config.json, a Megatron-LM command line, a DeepSpeed config), the hardware
and the one :class:`~netmorph.mesh.layout.Layout` the configuration flags give."""

from __future__ import annotations

import argparse
import sys

from netmorph.cli.flags import int_in, pipeline_schedule
from netmorph.cli.shape import add_shape_flags
from netmorph.errors import UsageError
from netmorph.mesh.settings import CP_COMM, SCHEDULES

SIZE = int_in(1, 1 << 24, "1..16,777,216")  # a parallel degree, a device count, a batch
BYTES = int_in(0, 64)  # bytes per parameter, gradient or optimizer state


def add_split_args(p, bare: bool = True) -> None:
    """The model, the machine and the split: the flags `plan` and `simulate step` share."""
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        help="preset: llama-3-8b/70b/405b, llama-2-7b/70b, mixtral-8x7b, bloom-176b, "
        "mpt-1b .. mpt-70b, gpt3-175b, ptdp-1.7b .. ptdp-1t (Narayanan Table 1), "
        "mt-22b .. mt-1t",
    )
    g.add_argument("--model-config", help="a Hugging Face config.json: the model you train")
    g.add_argument("--megatron-args", help="a Megatron-LM pretrain command line (quoted): model and split")
    g.add_argument("--deepspeed-config", help="a DeepSpeed ds_config.json: batch sizes, ZeRO stage, precision")
    add_shape_flags(g, "plan", {"seq": "default 2048", "vocab": "default 51200"})
    g.add_argument("--kv-heads", type=int, help="key/value heads (grouped-query attention; default: --heads)")
    g.add_argument("--ffn", type=int, help="MLP intermediate width (default 4 x hidden)")
    g.add_argument("--ffn-type", choices=("gelu", "swiglu"), help="two-matrix GeLU MLP or three-matrix SwiGLU")
    g.add_argument(
        "--position", choices=("learned", "rope", "alibi"), help="position encoding (learned: s x h parameters)"
    )
    g.add_argument(
        "--untie-embeddings",
        action="store_true",
        default=None,
        help="a separate output layer (Llama) instead of one tied to the word embedding",
    )
    g.add_argument(
        "--attention",
        choices=("flash", "standard"),
        help="flash: no stored s x s scores, recomputed in backward (default for models from flags "
        "and configs; the 2021-22 paper presets are standard)",
    )
    g.add_argument(
        "--dropout",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--no-dropout: the model trains without dropout (Llama, MPT), so no masks are stored "
        "(default: as the preset or config; on for a model from flags)",
    )
    g.add_argument("--experts", type=int, help="mixture of experts: experts per layer")
    g.add_argument("--top-k", type=int, help="experts each token visits (default 2 with --experts)")
    g.add_argument(
        "--capacity-factor",
        type=float,
        help="MoE expert capacity over its even share (default 1: dropless, no padding)",
    )
    if bare:
        g.add_argument("--params", type=float, help="a bare parameter count: model-state memory only (estimate)")
    h = p.add_argument_group("machine")
    h.add_argument("--gpus", type=SIZE, help="devices (default: tp x cp x pp x dp for estimate)")
    h.add_argument(
        "--hardware", default="a100-80g", help="a100-80g (default), a100-40g, h100-80g, h200, v100-32g, or a JSON file"
    )
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
    c.add_argument(
        "--schedule",
        type=pipeline_schedule,
        choices=SCHEDULES,
        help="pipeline schedule: afab (or gpipe: every forward first), 1f1b (default), interleaved "
        "(default with --interleave > 1), zb-h1, zbv, dualpipev (zero bubble: the weight gradients "
        "fill the bubble; zbv and dualpipev two chunks a rank in a V); sets the activations each "
        "stage holds, the weight gradients it owes and the bubble (search: fix it)",
    )
    c.add_argument(
        "--microbatch-group",
        type=int,
        metavar="N",
        help="interleaved: microbatches each chunk runs before the next (Megatron's "
        "--microbatch-group-size-per-virtual-pipeline-stage, Llama 3's N; default pp)",
    )
    c.add_argument("--first-stage-layers", type=int, help="layers on the first pipeline stage (default: even split)")
    c.add_argument("--last-stage-layers", type=int, help="layers on the last pipeline stage (default: even split)")
    c.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="ZeRO stage over the DP group (search: fix it)")
    c.add_argument(
        "--zero-memory",
        choices=("paper", "deepspeed"),
        default="paper",
        help="ZeRO's model states as the ZeRO paper's Table 1 counts them (default) or as DeepSpeed "
        "allocates them (its estimate_zero2/3_model_states_mem_needs, term by term)",
    )
    c.add_argument(
        "--recompute",
        choices=("none", "selective", "full"),
        help="activation recomputation (Korthikanti et al.; search: fix it)",
    )
    c.add_argument(
        "--sequence-parallel",
        action="store_true",
        default=None,
        help="Megatron sequence parallelism (search: fix it on)",
    )
    c.add_argument(
        "--precision",
        choices=("bf16", "fp8"),
        help="bf16, or fp8 matmuls (Transformer Engine) on hardware that has them (search: fix it)",
    )
    c.add_argument(
        "--dp-overlap",
        action="store_true",
        default=None,
        help="overlap the gradient reduction (and FSDP's gathers) with compute",
    )
    c.add_argument(
        "--tp-overlap",
        action="store_true",
        default=None,
        help="Megatron --tp-comm-overlap: TP collectives pipelined with the GEMMs",
    )
    c.add_argument(
        "--param-gather-overlap",
        action="store_true",
        default=None,
        help="Megatron --overlap-param-gather: the distributed optimizer's all-gather behind the next "
        "forward (with --dp-overlap)",
    )
    c.add_argument(
        "--pp-overlap",
        action="store_true",
        default=None,
        help="Megatron --overlap-p2p-communication: pipeline sends behind compute",
    )
    c.add_argument(
        "--cp-comm-type",
        choices=CP_COMM,
        default="p2p",
        help="Megatron --cp-comm-type: p2p (default; ring attention, K and V blocks passed behind the "
        "attention core), all_gather (Llama 3: K and V all-gathered before it, exposed) or a2a "
        "(DeepSpeed-Ulysses: all-to-alls trade the sequence split for a head split, exposed)",
    )
    c.add_argument("--param-bytes", type=BYTES, default=2, help="bytes per weight (default 2)")
    c.add_argument(
        "--grad-bytes",
        type=BYTES,
        default=4,
        help="bytes per gradient (default 4, fp32 main grads; 2 gives ZeRO's 16 B/param)",
    )
    c.add_argument("--optimizer-bytes", type=BYTES, default=12, help="optimizer bytes per parameter (default 12)")


ARCH = {
    "kv_heads": "kv_heads",
    "ffn_type": "ffn_type",
    "position": "position",
    "attention": "attention",
    "experts": "experts",
    "top_k": "top_k",
    "capacity_factor": "capacity_factor",
    "dropout": "dropout",
}


def model_and_hardware(args):
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
            raise UsageError(
                f"--megatron-args lacks --num-layers/--hidden-size/--num-attention-heads "
                f"(missing: {', '.join(missing)})"
            )
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
    for k, v in split.items():  # a config file's split, unless a flag says otherwise
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    arch = {k: getattr(args, a, None) for a, k in ARCH.items()}
    if getattr(args, "untie_embeddings", None):
        arch["tied"] = False
    if arch["experts"] and arch["top_k"] is None and not (base and base.experts):
        arch["top_k"] = 2
    model = from_args(
        args.model,
        args.layers,
        args.hidden,
        args.heads,
        args.seq,
        args.vocab,
        args.ffn,
        getattr(args, "params", None),
        base=base,
        **arch,
    )
    hw = load_hardware(args.hardware, args.efficiency)
    for k in ("first_stage_layers", "last_stage_layers"):
        v = getattr(args, k)
        if v is not None and not 1 <= v <= max(model.layers, 1):
            raise UsageError(f"--{k.replace('_', '-')} must be in 1..{model.layers} (the layers), got {v}")
    args.notes = notes  # printed with the result, not before an error
    return model, hw


def print_notes(args, file=None) -> None:
    for line in getattr(args, "notes", []):
        print(f"# note: {line}", file=file or sys.stderr)


def config_from(args):
    """The one split the flags name (tp, cp, pp default 1; dp from --gpus)."""
    from netmorph.mesh.layout import Layout

    tp, pp, cp = args.tp or 1, args.pp or 1, args.cp or 1
    inner = tp * pp * cp
    if args.dp is None:
        if args.gpus is None:
            dp = 1
        elif args.gpus % inner:
            raise UsageError(
                f"--gpus {args.gpus} is not divisible by tp x cp x pp = {inner}; change --gpus, --tp, --cp or --pp"
            )
        else:
            dp = args.gpus // inner
    else:
        dp = args.dp
    if args.gpus is not None and args.gpus != inner * dp:
        raise UsageError(
            f"--gpus {args.gpus} != tp x cp x pp x dp = {tp}x{cp}x{pp}x{dp} = {inner * dp}; fix "
            f"--gpus/--tp/--cp/--pp/--dp"
        )
    mb = args.microbatch or 1
    gb = args.global_batch or dp * mb
    return Layout.of(
        tp=tp,
        cp=cp,
        ep=args.ep or 1,
        dp=dp,
        pp=pp,
        zero=args.zero or 0,
        interleave=args.interleave or 1,
        global_batch=gb,
        micro_batch_size=mb,
        sequence_parallel=bool(args.sequence_parallel),
        recompute=args.recompute or "none",
        dp_overlap=bool(args.dp_overlap),
        tp_overlap=bool(args.tp_overlap),
        pp_overlap=bool(args.pp_overlap),
        param_gather_overlap=bool(args.param_gather_overlap),
        zero_memory=args.zero_memory,
        cp_comm_type=args.cp_comm_type,
        precision=args.precision or "bf16",
        param_bytes=args.param_bytes,
        grad_bytes=args.grad_bytes,
        optimizer_bytes=args.optimizer_bytes,
        first_stage_layers=args.first_stage_layers or 0,
        last_stage_layers=args.last_stage_layers or 0,
        schedule=args.schedule or "",
        microbatch_group=args.microbatch_group or 0,
    )
