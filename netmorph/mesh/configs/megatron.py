"""A Megatron-LM ``pretrain_gpt.py`` command line: the model (``--num-layers``, ``--hidden-size``,
``--num-query-groups``, ``--swiglu``, ...) as :class:`~netmorph.mesh.shape.ModelShape` fields and the split
(``--tensor-model-parallel-size``, ``--context-parallel-size``, ``--micro-batch-size``,
``--recompute-granularity``, ``--use-distributed-optimizer``, ``--fp8-format``, ...).
"""

from __future__ import annotations

import math
import shlex

from netmorph.errors import UsageError
from netmorph.files import printable
from netmorph.mesh.presets import MEGATRON_DEFAULTS, check_shape
from netmorph.mesh.shape import ModelShape

# --- Megatron-LM ------------------------------------------------------------------------------------------
# flag -> (target, field, type): model fields go to the ModelShape, config fields to the split
_MEGATRON = {
    "--num-layers": ("model", "layers", int),
    "--hidden-size": ("model", "hidden", int),
    "--num-attention-heads": ("model", "heads", int),
    "--num-query-groups": ("model", "kv_heads", int),
    "--ffn-hidden-size": ("model", "ffn", int),
    "--seq-length": ("model", "seq", int),
    "--padded-vocab-size": ("model", "vocab", int),
    "--vocab-size": ("model", "vocab", int),
    "--num-experts": ("model", "experts", int),
    "--moe-router-topk": ("model", "top_k", int),
    "--moe-expert-capacity-factor": ("model", "capacity_factor", float),
    "--tensor-model-parallel-size": ("split", "tp", int),
    "--pipeline-model-parallel-size": ("split", "pp", int),
    "--context-parallel-size": ("split", "cp", int),
    "--expert-model-parallel-size": ("split", "ep", int),
    "--micro-batch-size": ("split", "microbatch", int),
    "--global-batch-size": ("split", "global_batch", int),
    "--decoder-first-pipeline-num-layers": ("split", "first_stage_layers", int),
    "--decoder-last-pipeline-num-layers": ("split", "last_stage_layers", int),
    "--num-layers-per-virtual-pipeline-stage": ("split", "layers_per_virtual_stage", int),
    "--recompute-granularity": ("split", "recompute", str),
    "--hidden-dropout": ("model", "hidden_dropout", float),
    "--attention-dropout": ("model", "attention_dropout", float),
}
_MEGATRON_FLAGS = {  # flags without a value
    "--swiglu": ("model", "ffn_type", "swiglu"),
    "--untie-embeddings-and-output-weights": ("model", "tied", False),
    "--disable-bias-linear": ("model", "bias", False),
    "--use-flash-attn": ("model", "attention", "flash"),
    "--use-rotary-position-embeddings": ("model", "position", "rope"),
    "--group-query-attention": ("model", None, None),
    "--sequence-parallel": ("split", "sequence_parallel", True),
    "--use-distributed-optimizer": ("split", "zero", 1),
    "--overlap-grad-reduce": ("split", "dp_overlap", True),
    "--tp-comm-overlap": ("split", "tp_overlap", True),
    "--overlap-p2p-communication": ("split", "pp_overlap", True),
    "--recompute-activations": ("split", "recompute", "selective"),
    "--bf16": ("split", "precision", "bf16"),
    "--fp16": ("split", "precision", "bf16"),  # 16-bit: fixes the search
}
# the smallest value each numeric Megatron flag takes (dropouts and the capacity factor are checked apart)
_MEGATRON_MIN = {"--num-experts": 2, "--decoder-first-pipeline-num-layers": 1, "--decoder-last-pipeline-num-layers": 1}


def _megatron_value(key: str, value: str, kind):
    """A Megatron flag's value, typed and in range: one line naming the flag for anything else."""

    def bad(what):
        return UsageError(f"{{megatron_args}}: {key} must be {what}, got {printable(value)!s}", "megatron_args")

    if kind is str:
        return value
    try:
        v = kind(value)
    except ValueError:
        raise bad("a number" if kind is float else "a whole number") from None
    if kind is float:
        if not math.isfinite(v):
            raise bad("a finite number")
        if key == "--moe-expert-capacity-factor" and not 1 <= v <= 64:
            raise bad("in 1..64")
        return v
    lo = _MEGATRON_MIN.get(key, 1)
    if not lo <= v <= 1 << 30:
        raise bad(f"a whole number in {lo}..{1 << 30:,}")
    return v


_MEGATRON_VALUED_OTHER = {"--position-embedding-type", "--fp8-format", "--transformer-impl", "--attention-backend"}


def from_megatron_args(text: str) -> tuple[dict, dict, list]:
    """(ModelShape fields, split fields, flags not modelled) from a Megatron-LM command line."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise UsageError(f"{{megatron_args}}: cannot split it into words ({e})", "megatron_args") from None
    model, split, unknown = {"attention": "flash"}, {}, []  # Megatron-Core's default: Transformer Engine
    source = {}  # field -> the flag that set it
    fp8 = False
    i = 0
    while i < len(words) and not words[i].startswith("--"):  # the launcher and script: torchrun pretrain_gpt.py
        i += 1
    while i < len(words):
        w = words[i]
        if not w.startswith("--"):
            unknown.append(printable(w))
            i += 1
            continue
        key, eq, inline = w.partition("=")
        takes_value = key in _MEGATRON or key in _MEGATRON_VALUED_OTHER
        value = inline if eq else None
        if takes_value and value is None:
            if i + 1 >= len(words) or words[i + 1].startswith("--"):
                raise UsageError(f"{{megatron_args}}: {printable(key)} needs a value", "megatron_args")
            value = words[i + 1]
            i += 1
        i += 1
        if key in _MEGATRON:
            target, field, kind = _MEGATRON[key]
            v = _megatron_value(key, value, kind)
            (model if target == "model" else split)[field] = v
            source[field] = key
        elif key in _MEGATRON_FLAGS:
            target, field, v = _MEGATRON_FLAGS[key]
            if field:
                (model if target == "model" else split)[field] = v
                source[field] = key
        elif key == "--position-embedding-type":
            model["position"] = {"rope": "rope", "learned_absolute": "learned", "none": "alibi"}.get(value, value)
        elif key == "--fp8-format":
            fp8 = True
        elif key in ("--transformer-impl", "--attention-backend"):
            model["attention"] = "standard" if value in ("local", "unfused") else "flash"
        else:
            # a flag the planner does not model; skip its value if it has one
            if not eq and i < len(words) and not words[i].startswith("--"):
                i += 1
            unknown.append(printable(key))
    if fp8:  # --bf16 --fp8-format hybrid: FP8 matmuls
        split["precision"] = "fp8"
    rc = split.get("recompute")
    if rc is not None and rc not in ("full", "selective"):
        raise UsageError(
            f"{{megatron_args}}: --recompute-granularity must be full or selective, got {rc!r}", "megatron_args"
        )
    lpv = split.pop("layers_per_virtual_stage", None)
    if lpv:
        layers, pp = model.get("layers"), split.get("pp", 1)
        if not layers or layers % (pp * lpv):
            raise UsageError(
                f"{{megatron_args}}: --num-layers-per-virtual-pipeline-stage {lpv} does not divide "
                f"--num-layers {layers} over {pp} stages",
                "megatron_args",
            )
        split["interleave"] = layers // (pp * lpv)
    # Megatron's dropouts default to 0.1; with both at 0 no masks are stored
    probs = [model.pop(k, 0.1) for k in ("hidden_dropout", "attention_dropout")]
    if any(not 0 <= p < 1 for p in probs):
        raise UsageError(
            f"{{megatron_args}}: --hidden-dropout/--attention-dropout must be in [0, 1), got "
            f"{', '.join(map(str, probs))}",
            "megatron_args",
        )
    model["dropout"] = any(probs)
    if model.get("ffn_type") == "swiglu" and "ffn" not in model and model.get("hidden"):
        model["ffn"] = int(4 * model["hidden"] * 2 / 3 / 64) * 64  # Megatron's SwiGLU default width
    if all(k in model for k in ("layers", "hidden", "heads")):
        try:
            check_shape(ModelShape("megatron-args", **{**MEGATRON_DEFAULTS, **model}))
        except UsageError as e:  # the command line's own numbers disagree: name its flags
            raise UsageError(f"{{megatron_args}}: {e.render(source)}", "megatron_args") from None
    return model, split, unknown
