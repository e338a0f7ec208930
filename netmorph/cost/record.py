"""A predicted collective as one JSON-ready row: its counts, its time and bandwidths (nccl-tests' algbw and
busbw), and on a flat topology its closed form -- what ``netmorph collective`` prints and ``--json`` returns."""

from __future__ import annotations

from netmorph.collectives import bandwidths
from netmorph.collectives.formulas import closed_form
from netmorph.cost.topology import Topology


def record(pred, topo: Topology, dtype: str, redop: str, auto: bool = False, reason: str = "") -> dict:
    """One JSON-ready row: the counts, the prediction, and the closed form on a flat topology."""
    c = pred.counts
    algbw, busbw = bandwidths(pred.op, pred.nbytes, pred.time, pred.world)
    rec = {
        "op": pred.op,
        "algo": pred.algo,
        "world": pred.world,
        "bytes": pred.nbytes,
        "count": pred.nbytes // pred.itemsize,
        "type": dtype,
        "redop": redop,
        "rounds": c.rounds,
        "messages": c.messages,
        "bytes_on_wire": c.bytes_on_wire,
        "max_bytes_sent": c.max_bytes_sent,
        "bytes_sent_per_rank": c.bytes_sent.tolist(),
        "bytes_reduced_per_rank": c.bytes_reduced.tolist(),
        "predicted_time_s": pred.time,
        "algbw_gbps": algbw,
        "busbw_gbps": busbw,
        "topology": topo.name,
        "topology_kind": "flat" if topo.flat else "two-level",
    }
    if auto:
        rec["auto"] = True
        rec["reason"] = reason
    if topo.flat:
        f = closed_form(pred.op, pred.algo, pred.world, pred.nbytes, topo.alpha, topo.beta, topo.gamma)
        if f is not None:
            rec["closed_form"] = {
                "rounds": f.rounds,
                "rounds_expr": f.rounds_expr,
                "max_bytes_sent": f.sent,
                "sent_expr": f.sent_expr,
                "time_s": f.time,
                "time_expr": f.time_expr,
            }
    return rec
