"""nccl-tests' output table, with netmorph's counts and the closed form beside it.

nccl-tests (``all_reduce_perf``) prints ``size count type redop time algbw busbw
#wrong`` where algbw = size / time and busbw = algbw times the op's bus factor
(2(p-1)/p for all-reduce; (p-1)/p for all-gather, reduce-scatter, all-to-all;
1 for broadcast and reduce), so busbw is comparable to the link speed whatever
the world size. Bandwidths are decimal GB/s.
"""

from __future__ import annotations

from netmorph.collectives import BUSBW_FACTOR
from netmorph.collectives.formulas import closed_form
from netmorph.cost.topology import Topology

# nccl-tests' type names
DTYPES = {"float": ("float32", 4), "float32": ("float32", 4), "half": ("float16", 2), "float16": ("float16", 2),
          "bfloat16": ("bfloat16", 2), "double": ("float64", 8), "float64": ("float64", 8),
          "int32": ("int32", 4), "int64": ("int64", 8), "int8": ("int8", 1), "uint8": ("uint8", 1)}


def size_bands(winners, sizes, sep: str = "–") -> str:
    """Per-size winners as ranges: 'recursive_doubling 1 KiB–256 KiB, rabenseifner 512 KiB–1 GiB'."""
    from netmorph.units import fmt_bytes
    runs = []
    for a, n in zip(winners, sizes):
        if runs and runs[-1][0] == a:
            runs[-1][2] = n
        else:
            runs.append([a, n, n])
    return ", ".join(f"{a} {fmt_bytes(lo)}{sep}{fmt_bytes(hi)}" for a, lo, hi in runs)


def bandwidths(op: str, nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s, nccl-tests' definitions."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * BUSBW_FACTOR[op](world)


def record(pred, topo: Topology, dtype: str, redop: str, auto: bool = False, reason: str = "") -> dict:
    """One JSON-ready row: the counts, the prediction, and the closed form on a flat topology."""
    c = pred.counts
    algbw, busbw = bandwidths(pred.op, pred.nbytes, pred.time, pred.world)
    rec = {
        "op": pred.op, "algo": pred.algo, "world": pred.world, "bytes": pred.nbytes,
        "count": pred.nbytes // pred.itemsize, "type": dtype, "redop": redop,
        "rounds": c.rounds, "messages": c.messages, "bytes_on_wire": c.bytes_on_wire,
        "max_bytes_sent": c.max_bytes_sent,
        "bytes_sent_per_rank": c.bytes_sent.tolist(), "bytes_reduced_per_rank": c.bytes_reduced.tolist(),
        "predicted_time_s": pred.time, "algbw_gbps": algbw, "busbw_gbps": busbw, "topology": topo.name,
        "topology_kind": "flat" if topo.flat else "two-level",
    }
    if auto:
        rec["auto"] = True
        rec["reason"] = reason
    if topo.flat:
        f = closed_form(pred.op, pred.algo, pred.world, pred.nbytes, topo.alpha, topo.beta, topo.gamma)
        if f is not None:
            rec["closed_form"] = {"rounds": f.rounds, "rounds_expr": f.rounds_expr,
                                  "max_bytes_sent": f.sent, "sent_expr": f.sent_expr,
                                  "time_s": f.time, "time_expr": f.time_expr}
    return rec


HEADER = (f"{'size':>12} {'count':>11} {'type':>8} {'redop':>5}  {'algorithm':<27}{'time(us)':>11} "
          f"{'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'rounds':>7} {'msgs':>9} {'bytes_on_wire':>15} "
          f"{'max_sent/rank':>14}")


def _ok(want, got, rel=1e-9):
    return "✓" if want is not None and abs(want - got) <= rel * max(abs(want), abs(got), 1e-30) else "✗"


def format_row(rec: dict, mark: str = " ") -> str:
    algo = rec["algo"] + (" (auto)" if rec.get("auto") else "")
    return (f"{rec['bytes']:>12} {rec['count']:>11} {rec['type']:>8} {rec['redop']:>5} {mark}{algo:<27}"
            f"{rec['predicted_time_s'] * 1e6:>11.2f} {rec['algbw_gbps']:>11.3f} {rec['busbw_gbps']:>11.3f} "
            f"{rec['rounds']:>7} {rec['messages']:>9} {rec['bytes_on_wire']:>15,} {rec['max_bytes_sent']:>14,}")


def format_formula(rec: dict) -> str:
    """The closed forms under a row, evaluated, with ✓ where the measured number equals them."""
    f = rec.get("closed_form")
    if f is None:
        why = ("a two-level topology has no single α, β" if rec["topology_kind"] == "two-level"
               else "tree nodes with two children queue on one receive port")
        return f"#   closed form: none ({why}); the event simulation is the reference"
    parts = [f"rounds {f['rounds_expr']} = {f['rounds']} {_ok(f['rounds'], rec['rounds'])}"]
    if f["max_bytes_sent"] is not None:
        parts.append(f"sent/rank {f['sent_expr']} = {f['max_bytes_sent']:,.0f} "
                     f"{_ok(f['max_bytes_sent'], rec['max_bytes_sent'])}")
    if f["time_s"] is not None:
        parts.append(f"time {f['time_expr']} = {f['time_s'] * 1e6:.2f} us "
                     f"{_ok(f['time_s'], rec['predicted_time_s'])}")
    else:
        parts.append(f"time {f['time_expr']}")
    return "#   closed form: " + " | ".join(parts)
