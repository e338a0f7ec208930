"""What netmorph's own torch trainer cannot run, beside what no layout can (:meth:`Layout.check
<netmorph.mesh.layout.Layout.check>`): its GPT is GPT-2's shape, it builds even stages, ZeRO-1 at most beside a
pipeline (DeepSpeed's pipeline engine), each expert whole on every tp rank. These are
the trainer's limits, so they live with the trainer: the shared vocabulary holds only the rules every layout
obeys. :func:`check` is both, the list the trainer, morph's twin and ``validate`` ask."""

from __future__ import annotations

from netmorph.mesh.layout import Layout, Rejection
from netmorph.mesh.rules import KERNEL_RULES
from netmorph.mesh.shape import ModelShape


def check(layout: Layout, model: ModelShape | None = None, world: int | None = None) -> list:
    """Every rejection of ``layout`` for ``model`` on the trainer (empty: it runs), the flags named ``train``'s."""
    out = [r for r in layout.check(model, world) if r.key not in KERNEL_RULES]
    return out if any(r.key == "range" for r in out) else out + trainer_rules(layout, model)


def require(layout: Layout, model: ModelShape | None = None, ignore=()) -> Layout:
    """``layout``, or the UsageError of its first rejection on the trainer (the keys in ``ignore`` aside: a layout
    whose batch the caller sets later)."""
    bad = [r for r in check(layout, model) if r.key not in ignore]
    if bad:
        raise bad[0].error()
    return layout


def trainer_rules(c: Layout, model: ModelShape | None = None) -> list:
    """The :class:`~netmorph.mesh.layout.Rejection` s of netmorph's own trainer on top of the vocabulary's rules."""
    out = []
    if c.batch.microbatch_group and c.batch.microbatch_group >= c.pp and c.pipeline_schedule == "interleaved":
        out.append(
            Rejection(
                "interleave",
                "microbatch_group",
                c.batch.microbatch_group,
                "netmorph's trainer runs the interleaved schedule with a microbatch group of pp (Megatron's default)",
                "{microbatch_group}",
            )
        )
    if c.pp > 1 and c.zero >= 2:
        out.append(
            Rejection(
                "zero-pp",
                "zero",
                c.zero,
                f"ZeRO-{c.zero} with pipeline parallelism: netmorph's "
                "trainer, as DeepSpeed's pipeline engine, runs stage 1 only",
                "{zero} or {pp}",
            )
        )
    if c.interleave > 1 and c.pipeline_schedule != "interleaved" and not c.v_shaped:
        out.append(
            Rejection(
                "trainer", "interleave", c.interleave, f"interleave {c.interleave} needs the interleaved schedule"
            )
        )
    if model is None:
        return out
    gpt2 = (
        ("ffn_type", "gelu"),
        ("position", "learned"),
        ("tied", True),
        ("bias", True),
        ("kv_heads", 0),
        ("shared_experts", 0),
        ("extra_positions", 0),
        ("embedding_norm", False),
        ("head_width", 0),
        ("attention_bias", ""),
        ("qk_norm", False),
        ("layer_norms", 2),
        ("kv_lora_rank", 0),
        ("dense_at", ()),
    )
    for k, want in gpt2 + (("ffn", 0),) * (model.ffn != 4 * model.hidden):
        if getattr(model, k) != want and not (k == "kv_heads" and model.kv == model.heads):
            out.append(
                Rejection(
                    "trainer",
                    k,
                    getattr(model, k),
                    f"netmorph's torch GPT is GPT-2's shape (GeLU MLP "
                    f"of 4 x hidden, learned positions, tied embedding, biases, multi-head attention; "
                    f"routed experts without shared ones); {k} {getattr(model, k)!r} is priced by the "
                    f"planner only",
                )
            )
    if c.cp > 1 and c.knobs.sequence_parallel and (model.seq // c.cp) % c.tp:
        out.append(
            Rejection(
                "trainer",
                "seq",
                model.seq,
                f"seq {model.seq} / cp {c.cp} is not divisible by tp "
                f"{c.tp} (sequence parallelism over each cp rank's positions)",
            )
        )
    if model.experts and c.knobs.sequence_parallel:
        out.append(
            Rejection(
                "trainer",
                "sequence_parallel",
                True,
                "experts with sequence parallelism: the router "
                "would see 1/tp of the tokens (Megatron gathers them first); not built",
            )
        )
    if model.experts and c.tp > 1 and c.expert_tp != 1:
        out.append(
            Rejection(
                "trainer",
                "expert_tp",
                c.expert_tp,
                "netmorph's trainer keeps each expert whole on every tp rank: expert_tp must be 1",
            )
        )
    if model.experts and c.zero >= 3:
        out.append(
            Rejection(
                "trainer",
                "zero",
                c.zero,
                "experts with ZeRO-3: the expert replicas' on-demand gathers are not built; use ZeRO 0-2",
            )
        )
    if model.vocab % c.tp:
        out.append(
            Rejection(
                "trainer",
                "vocab",
                model.vocab,
                f"vocab {model.vocab} is not divisible by tp {c.tp} (the vocabulary-parallel embedding)",
            )
        )
    if model.layers % c.stages:
        out.append(
            Rejection(
                "trainer",
                "layers",
                model.layers,
                f"layers {model.layers} is not divisible by pp x "
                f"interleave = {c.stages} (the trainer builds even stages)",
            )
        )
    if c.knobs.sequence_parallel and model.seq % c.tp:
        out.append(
            Rejection(
                "trainer", "seq", model.seq, f"seq {model.seq} is not divisible by tp {c.tp} (sequence parallelism)"
            )
        )
    return out
