"""nccl-tests' output table, with netmorph's counts and the closed form beside it.

nccl-tests (``all_reduce_perf``) prints ``size count type redop time algbw busbw
#wrong`` where algbw = size / time and busbw = algbw times the op's bus factor
(2(p-1)/p for all-reduce; (p-1)/p for all-gather, reduce-scatter, all-to-all;
1 for broadcast and reduce; :func:`netmorph.collectives.bandwidths`), so busbw is
comparable to the link speed whatever the world size. Bandwidths are decimal
GB/s. One printer (:class:`Column`, :func:`header`, :func:`row`) serves the
predicted table of ``netmorph collective`` and the measured one of ``netmorph
bench``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from netmorph.collectives import bandwidths
from netmorph.collectives.formulas import closed_form
from netmorph.cost.topology import Topology
from netmorph.units import fmt_bytes


@dataclass(frozen=True)
class Column:
    """One column: its title, width and alignment, the cell's value, its format spec, and the gap before it."""

    title: str
    width: int
    cell: Callable[[dict], object]
    spec: str = ""
    align: str = ">"
    sep: str = " "


def header(columns) -> str:
    """The title line, starting with '#' as nccl-tests' does."""
    line = "".join((c.sep if i else "") + format(c.title, f"{c.align}{c.width}") for i, c in enumerate(columns))
    return "#" + line[1:]


def row(columns, rec: dict) -> str:
    out = []
    for i, c in enumerate(columns):
        v = c.cell(rec)
        spec = c.spec if not isinstance(v, str) else ""
        out.append((c.sep if i else "") + format(v, f"{c.align}{c.width}{spec}"))
    return "".join(out)


# netmorph collective: predicted time and the schedule's counts; rec["mark"] flags the fastest
PREDICTED = (
    Column("size", 12, lambda r: r["bytes"]), Column("count", 11, lambda r: r["count"]),
    Column("type", 8, lambda r: r["type"]), Column("redop", 5, lambda r: r["redop"]),
    Column(" algorithm", 28, lambda r: r.get("mark", " ") + r["algo"] + (" (auto)" if r.get("auto") else ""),
           align="<"),
    Column("time(us)", 11, lambda r: r["predicted_time_s"] * 1e6, ".2f", sep=""),
    Column("algbw(GB/s)", 11, lambda r: r["algbw_gbps"], ".3f"),
    Column("busbw(GB/s)", 11, lambda r: r["busbw_gbps"], ".3f"),
    Column("rounds", 7, lambda r: r["rounds"]), Column("msgs", 9, lambda r: r["messages"]),
    Column("bytes_on_wire", 15, lambda r: r["bytes_on_wire"], ","),
    Column("max_sent/rank", 14, lambda r: r["max_bytes_sent"], ","),
)

# netmorph bench: measured time beside the prediction and the memory-copy bound
MEASURED = (
    Column("size", 12, lambda r: r["bytes"]), Column("count", 10, lambda r: r["count"]),
    Column("type", 8, lambda r: r["type"]), Column("algorithm", 26, lambda r: r["algo"], align="<"),
    Column("backend", 13, lambda r: r["backend"], align="<"),
    Column("time(us)", 10, lambda r: r["time_s"] * 1e6, ".1f", sep=""),
    Column("algbw(GB/s)", 11, lambda r: r["algbw_gbps"], ".3f"),
    Column("busbw(GB/s)", 11, lambda r: r["busbw_gbps"], ".3f"),
    Column("#wrong", 6, lambda r: r["wrong"]),
    Column("pred(us)", 10, lambda r: "-" if r["predicted_time_s"] is None else r["predicted_time_s"] * 1e6, ".1f"),
    Column("of memcpy", 9, lambda r: r["of_memcpy"], ".0%"),
)


def size_bands(winners, sizes, sep: str = "–") -> str:
    """Per-size winners as ranges: 'recursive_doubling 1 KiB–256 KiB, rabenseifner 512 KiB–1 GiB'."""
    runs = []
    for a, n in zip(winners, sizes):
        if runs and runs[-1][0] == a:
            runs[-1][2] = n
        else:
            runs.append([a, n, n])
    return ", ".join(f"{a} {fmt_bytes(lo)}{sep}{fmt_bytes(hi)}" for a, lo, hi in runs)


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


def _ok(want, got, rel=1e-9):
    return "✓" if want is not None and abs(want - got) <= rel * max(abs(want), abs(got), 1e-30) else "✗"


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
