"""The model-shape flags, defined once for every command that builds a GPT (``train``, ``moe``, ``morph``,
``serve``, ``plan``, ``simulate``): Megatron-LM's names beside netmorph's short ones, one range each, and each
command's default small model in one table. A command past this machine's memory or time is refused by its
budget (:mod:`netmorph.runtime.budget`), not by a smaller range of its own."""

from __future__ import annotations

from netmorph.cli.flags import int_in

# field: (flags, Megatron's name first where it has one; what it is)
SHAPE = {
    "layers": (("--layers", "--num-layers"), "transformer layers l"),
    "hidden": (("--hidden", "--hidden-size"), "hidden size h"),
    "heads": (("--heads", "--num-attention-heads"), "attention heads a"),
    "seq": (("--seq", "--seq-length"), "sequence length s"),
    "vocab": (("--vocab", "--vocab-size"), "vocabulary V"),
}
RANGE = (1, 1 << 24)  # every shape flag's bounds; what fits is the budget's to say

# each command's default model (None: the planner's preset or its own defaults decide)
DEFAULTS = {
    "train": {"layers": 4, "hidden": 64, "heads": 4, "seq": 32, "vocab": 128},
    "moe": {"layers": 2, "hidden": 32, "heads": 4, "seq": 16, "vocab": 64},
    "morph": {"layers": 4, "hidden": 32, "heads": 4, "seq": 16, "vocab": 64},
    "serve": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 512},  # its sequence is --context
    "plan": {"layers": None, "hidden": None, "heads": None, "seq": None, "vocab": None},
}


def add_shape_flags(group, command: str, notes: dict | None = None) -> None:
    """The shape flags ``command`` takes (:data:`DEFAULTS`' keys), its defaults in the help; ``notes``: a word
    to add to a flag's help ({field: text})."""
    lo, hi = RANGE
    for field, default in DEFAULTS[command].items():
        flags, what = SHAPE[field]
        note = (notes or {}).get(field, "")
        shown = f" (default {default})" if default is not None else ""
        group.add_argument(
            *flags,
            dest=field,
            type=int_in(lo, hi, "1..2**24"),
            default=default,
            help=f"{what}{', ' + note if note else ''}{shown}",
        )
