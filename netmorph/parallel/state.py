"""Which piece of the full model each rank holds, and the full model put back together from them.

Megatron's checkpoints keep one file per (tp, pp) rank holding its shards under
the full model's names; ``torch.distributed.checkpoint`` records each tensor's
placement. Here a rank's state is ``{full weight name: (its piece, the dimension
the piece is split along, or None when it holds it whole)}`` -- column-parallel
weights and biases split along dim 0, row-parallel weights along dim 1, the word
embedding along the vocabulary -- which is all that is needed to compare any
layout with the 1-rank model, or to move weights from one layout to another.
"""

from __future__ import annotations

import torch


SHARD_DIM = {"qkv.weight": 0, "qkv.bias": 0, "fc.weight": 0, "fc.bias": 0, "proj.weight": 1, "fc2.weight": 1}
FULL = {"ln1.weight": "ln1.w", "ln1.bias": "ln1.b", "ln2.weight": "ln2.w", "ln2.bias": "ln2.b",
        "qkv.weight": "qkv.w", "qkv.bias": "qkv.b", "proj.weight": "proj.w", "proj.bias": "proj.b",
        "fc.weight": "fc.w", "fc.bias": "fc.b", "fc2.weight": "fc2.w", "fc2.bias": "fc2.b"}


def named_pieces(chunks) -> dict:
    """{full weight name: (this rank's piece, the dimension it is split along or None)}."""
    out = {}
    for c in chunks:
        for name, p in c.named_parameters():
            t = p.detach().cpu().clone()              # results travel to the launcher: host memory
            if name == "wte":
                out["wte"] = (t, 0)
            elif name == "wpe":
                out["wpe"] = (t, None)
            elif name.startswith("ln_f."):
                out["ln_f." + name[5]] = (t, None)
            else:
                _, j, rest = name.split(".", 2)
                out[f"{c.first + int(j)}.{FULL[rest]}"] = (t, SHARD_DIM.get(rest))
    return out


def assemble(results: list) -> dict:
    """The full model's weights from every rank's pieces (TP shards concatenated in TP order)."""
    pieces = {}
    for r in sorted((r for r in results if r["dp"] == 0), key=lambda r: (r["pp"], r["tp"])):
        for name, (t, dim) in r["state"].items():
            pieces.setdefault(name, {})[r["tp"]] = (t, dim)
    full = {}
    for name, by_tp in pieces.items():
        dim = by_tp[0][1]
        parts = [by_tp[k][0] for k in sorted(by_tp)]
        full[name] = parts[0] if dim is None else torch.cat(parts, dim=dim)
    return full
