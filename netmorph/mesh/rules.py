"""Every rule a :class:`~netmorph.mesh.layout.Layout` must obey, the single source of the divisibility rules.

Megatron-LM checks these in ``validate_args`` and ``initialize_model_parallel`` (heads over tp, layers over the
pipeline stages and their virtual chunks, the global batch over dp x micro-batch, the interleaved schedule's
microbatch groups, sequence parallelism with tp), DeepSpeed its ZeRO stage, and Megatron-Core its kernels' own
(context parallelism's fused attention). Each rule returns a typed :class:`~netmorph.mesh.rejection.Rejection`
naming the field at fault and what to change, so the planner tallies them, the trainer raises the first, and a
command prints it as one line. :meth:`Layout.check` is :func:`rejections`; a rule that only netmorph's own torch
trainer has is :mod:`netmorph.parallel.limits`'s, not this vocabulary's.
"""

from __future__ import annotations

from netmorph.mesh.rejection import Rejection, in_range
from netmorph.mesh.shape import ModelShape

# the rules of Megatron's kernels, not of every layout: netmorph's own trainer attends cp chunk pair by chunk pair
# itself (the online softmax), so it and the maps of its buffers skip them
KERNEL_RULES = ("cp-flash",)


def rejections(c, model: ModelShape | None = None, world: int | None = None) -> list:
    """Every :class:`Rejection` of layout ``c`` (a :class:`~netmorph.mesh.layout.Layout`, which calls this from its
    ``check``, so this module does not import it) for ``model`` on ``world`` ranks (empty: it runs), in the order
    the planner reports them: the fields' own ranges first (and alone, if any fails), then the world, the model's
    divisibility rules, the batch, the pipeline schedule's and the knobs'."""
    out = _ranges(c)
    if out:
        return out
    if world is not None and world != c.world:
        out.append(
            Rejection(
                "world",
                "world",
                world,
                f"tp x cp x pp x dp = {c.tp}x{c.cp}x{c.pp}x{c.dp} = {c.world}, not the {world} ranks",
                "{tp}/{pp}/{dp}",
            )
        )
    if model is not None and not model.bare:
        out += _model_rules(c, model)
    if c.batch.global_batch % (c.dp * c.batch.micro_batch_size):
        out.append(
            Rejection(
                "batch",
                "global_batch",
                c.batch.global_batch,
                f"global batch {c.batch.global_batch} does not split into dp {c.dp} x "
                f"microbatch {c.batch.micro_batch_size}",
                "{global_batch} or {micro_batch_size}",
            )
        )
    m = c.microbatches
    if c.v_shaped:
        kind = c.pipeline_schedule
        if c.pp == 1 or c.interleave != 2:
            bad = f"pp {c.pp}" if c.pp == 1 else f"interleave {c.interleave}"
            out.append(
                Rejection(
                    "v-shape",
                    "schedule",
                    kind,
                    f"{kind} runs two model chunks on each of pp > 1 ranks (a V); got {bad}",
                    "{pp}" if c.pp == 1 else "{interleave}",
                )
            )
        elif kind == "dualpipev" and m < 2 * c.pp:
            out.append(
                Rejection(
                    "v-shape",
                    "schedule",
                    kind,
                    f"dualpipev needs at least 2·pp = {2 * c.pp} microbatches (one a stage), got {m}",
                    "{microbatches} or {pp}",
                )
            )
    elif c.interleave > 1 and (c.pp == 1 or m % c.group):
        out.append(
            Rejection(
                "interleave",
                "interleave",
                c.interleave,
                f"interleaving needs pp > 1 and microbatches ({m}) a multiple of "
                + (f"the microbatch group ({c.group})" if c.batch.microbatch_group else f"pp ({c.pp})"),
                "{microbatches} or {interleave}",
            )
        )
    group = c.batch.microbatch_group
    if group and (group < c.pp or c.pipeline_schedule != "interleaved"):
        out.append(
            Rejection(
                "interleave",
                "microbatch_group",
                group,
                f"a microbatch group ({group}) goes with "
                f"the interleaved schedule and at least pp ({c.pp}) microbatches (Megatron's "
                "dependency check)",
                "{microbatch_group}",
            )
        )
    if c.knobs.sequence_parallel and c.tp == 1:
        out.append(
            Rejection(
                "sp-needs-tp",
                "sequence_parallel",
                True,
                "sequence parallelism needs tp > 1",
                "{sequence_parallel} or {tp}",
            )
        )
    return out


def _ranges(c) -> list:
    """The fields' own ranges: the degrees', then the batch's, the precision's and the knobs'."""
    out = []
    if c.expert_tp and c.tp % c.expert_tp:
        out.append(Rejection("range", "expert_tp", c.expert_tp, f"expert_tp must divide tp {c.tp}, got {c.expert_tp}"))
    out += in_range(c, ("tp", "cp", "ep", "dp", "pp", "interleave"))
    if c.zero not in (0, 1, 2, 3):
        out.append(Rejection("range", "zero", c.zero, f"zero must be 0, 1, 2 or 3, got {c.zero}"))
    return out + c.batch.check() + c.precision.check() + c.knobs.check()


def _model_rules(c, model: ModelShape) -> list:
    out = []
    if model.heads % c.tp or model.kv % c.tp:
        what = f"the {model.heads} heads" if model.heads % c.tp else f"the {model.kv} KV heads (query groups)"
        out.append(Rejection("heads", "tp", c.tp, f"tp {c.tp} does not divide {what}", "{tp} or {heads}"))
    stages = c.stage_layers(model.layers)
    if sum(stages) != model.layers or min(stages) < 1:
        out.append(
            Rejection(
                "layers",
                "pp",
                c.pp,
                f"{model.layers} layers do not fill pp {c.pp} stages with at "
                f"least one each (first {c.knobs.first_stage_layers or 'even'}, last "
                f"{c.knobs.last_stage_layers or 'even'})",
                "{pp} or {first_stage_layers}/{last_stage_layers}",
            )
        )
    elif c.interleave > 1 and min(stages) < c.interleave:
        out.append(
            Rejection(
                "layers",
                "interleave",
                c.interleave,
                f"interleave {c.interleave} needs at least "
                f"{c.interleave} layers on every stage (the smallest of pp {c.pp} has {min(stages)})",
                "{pp} or {interleave}",
            )
        )
    if c.cp > 1 and model.attention != "flash":
        out.append(
            Rejection(
                "cp-flash",
                "cp",
                c.cp,
                "context parallelism runs ring attention in a fused (flash) kernel, "
                "as Megatron-Core's Transformer Engine path does; this model's attention is standard",
                "{cp} or {attention}",
            )
        )
    if c.cp > 1 and model.seq % (2 * c.cp):
        out.append(
            Rejection(
                "cp", "cp", c.cp, f"cp {c.cp}: the sequence {model.seq} does not split into 2 x cp chunks", "{cp}"
            )
        )
    if c.cp > 1 and c.knobs.cp_comm_type == "a2a" and model.heads % (c.tp * c.cp):
        out.append(
            Rejection(
                "cp",
                "cp",
                c.cp,
                f"cp {c.cp} a2a (Ulysses) splits the heads of each tp rank over cp: "
                f"heads {model.heads} must divide by tp x cp = {c.tp * c.cp}",
                "{cp} or {cp_comm_type}",
            )
        )
    if c.ep > 1 and (not model.experts or model.experts % c.ep or c.dp % c.ep):
        out.append(
            Rejection("ep", "ep", c.ep, f"ep {c.ep} must divide the experts ({model.experts}) and dp ({c.dp})", "{ep}")
        )
    return out
