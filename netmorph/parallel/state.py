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

from netmorph.mesh.placement import Shard, chunk_parameters


def named_pieces(chunks) -> dict:
    """{full weight name: (this rank's piece, the dimension it is split along over tp, "ep" for experts split
    over ep, or None)}: each chunk's
    parameters paired, in registration order, with :func:`~netmorph.mesh.placement.chunk_parameters`'
    rows for the same layers."""
    out = {}
    for c in chunks:
        rows = chunk_parameters(c.cfg, c.first, c.last)
        params = list(c.named_parameters())
        if len(rows) != len(params) or any(not n.endswith(r.module) for r, (n, _) in zip(rows, params)):
            raise RuntimeError("the GPT's modules and netmorph.mesh.placement's table disagree")
        for row, (_, p) in zip(rows, params):
            dim = "ep" if row.is_expert else row.placement.dim if isinstance(row.placement, Shard) else None
            out[row.name] = (p.detach().cpu().clone(), dim)  # results travel to the launcher: host memory
    return out


def assemble(results: list) -> dict:
    """The full model's weights from every rank's pieces: TP shards concatenated in TP order (from the first
    data-parallel replica), experts in EP order (from the first expert data-parallel replica)."""
    pieces = {}
    for r in sorted(results, key=lambda r: (r.pp, r.tp, r.ep)):
        for name, (t, dim) in r.state.pieces.items():
            if dim == "ep":
                if r.edp == 0 and r.tp == 0:
                    pieces.setdefault(name, {})[r.ep] = (t, 0)
            elif r.dp == 0:
                pieces.setdefault(name, {})[r.tp] = (t, dim)
    full = {}
    for name, by_tp in pieces.items():
        dim = by_tp[0][1]
        parts = [by_tp[k][0] for k in sorted(by_tp)]
        full[name] = parts[0] if dim is None else torch.cat(parts, dim=dim)
    return full
