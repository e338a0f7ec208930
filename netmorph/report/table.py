"""nccl-tests' output table, with netmorph's counts and the closed form beside it.

nccl-tests (``all_reduce_perf``) prints ``size count type redop time algbw busbw
#wrong`` where algbw = size / time and busbw = algbw times the op's bus factor
(2(p-1)/p for all-reduce; (p-1)/p for all-gather, reduce-scatter, all-to-all;
1 for broadcast and reduce; :func:`netmorph.collectives.bandwidths`), so busbw is
comparable to the link speed whatever the world size. Bandwidths are decimal
GB/s. One printer (:class:`Column`, :func:`header`, :func:`row`) serves the
predicted table of ``netmorph collective``; ``netmorph bench`` prints nccl-tests'
own table, character for character (:func:`nccl_header`, :func:`nccl_row`,
:func:`nccl_footer`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from netmorph.units import NCCL_TYPES, fmt_bytes


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
    Column("size", 12, lambda r: r["bytes"]),
    Column("count", 11, lambda r: r["count"]),
    Column("type", 8, lambda r: r["type"]),
    Column("redop", 5, lambda r: r["redop"]),
    Column(
        " algorithm", 28, lambda r: r.get("mark", " ") + r["algo"] + (" (auto)" if r.get("auto") else ""), align="<"
    ),
    Column("time(us)", 11, lambda r: r["predicted_time_s"] * 1e6, ".2f", sep=""),
    Column("algbw(GB/s)", 11, lambda r: r["algbw_gbps"], ".3f"),
    Column("busbw(GB/s)", 11, lambda r: r["busbw_gbps"], ".3f"),
    Column("rounds", 7, lambda r: r["rounds"]),
    Column("msgs", 9, lambda r: r["messages"]),
    Column("bytes_on_wire", 15, lambda r: r["bytes_on_wire"], ","),
    Column("max_sent/rank", 14, lambda r: r["max_bytes_sent"], ","),
)

# nccl-tests' own table (src/util.cu: writeResultHeader, writeBenchmarkLinePreamble, writeBenchmarkLineBody,
# writeResultFooter), character for character: netmorph bench prints it
_NCCL_NAME = {numpy: nccl for nccl, numpy in NCCL_TYPES.items()}  # numpy's type name -> nccl-tests'


def nccl_float(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: two decimals if they fit the width, then one, then none, then an exponent."""
    for fmt in (f"{width}.2f", f"{width}.1f", f"{width}.0f"):
        text = format(value, fmt)
        if len(text) <= width:
            return text
    return format(value, f"{width}.1e" if width >= 7 else f"{width}.0e")


def nccl_header(time_title: str = "time") -> list[str]:
    """The lines nccl-tests prints above the rows (its trailing spaces included)."""
    return [
        "#",
        f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}           out-of-place                       in-place          ",
        f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  {time_title:>7}  {'algbw':>6}  "
        f"{'busbw':>6}  {'#wrong':>6}  {time_title:>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6} ",
        f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  "
        f"{'':>6}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6} ",
    ]


def _body(time_s: float, algbw: float, busbw: float, wrong: int) -> str:
    cells = f"  {nccl_float(time_s * 1e6, 7):>7}  {nccl_float(algbw, 6):>6}  {nccl_float(busbw, 6):>6}"
    return cells + (f"  {wrong:6g}" if wrong >= 0 else "    N/A")


def nccl_row(r: dict) -> str:
    """One row: size, count, type, redop, root (-1 where the op has none), then out of place and in place."""
    root = r["root"] if r["op"] in ("broadcast", "reduce") else -1
    redop = r["redop"] if r["op"] in ("allreduce", "reduce", "reduce_scatter") else "none"
    return (
        f"{r['bytes']:12d}  {r['count']:12d}  {_NCCL_NAME.get(r['type'], r['type']):>8}  {redop:>6}  {root:6d}"
        + _body(r["time_s"], r["algbw_gbps"], r["busbw_gbps"], r["wrong"])
        + _body(r["in_place_time_s"], r["in_place_algbw_gbps"], r["in_place_busbw_gbps"], r["in_place_wrong"])
    )


def wrong_elements(rows: list) -> int:
    """The wrong elements over every row, out of place and in place (-1: not checked, counts none)."""
    return sum(max(0, r[k]) for r in rows for k in ("wrong", "in_place_wrong"))


def nccl_footer(rows: list, program: str) -> list[str]:
    """nccl-tests' closing lines: wrong elements over every row, the mean busbw of every out-of-place and
    in-place measurement, the program that ran."""
    bad = wrong_elements(rows)
    bws = [r[k] for r in rows for k in ("busbw_gbps", "in_place_busbw_gbps")]
    avg = sum(bws) / len(bws) if bws else 0.0
    return [
        f"# {'Out of bounds values':<20} : {bad} {'FAILED' if bad else 'OK'}",
        f"# {'Avg bus bandwidth':<20} : {avg:g} ",
        "#",
        f"# Collective test concluded: {program}",
    ]


PROGRAMS = {
    "allreduce": "all_reduce_perf",
    "allgather": "all_gather_perf",
    "reduce_scatter": "reduce_scatter_perf",
    "broadcast": "broadcast_perf",
    "reduce": "reduce_perf",
    "alltoall": "alltoall_perf",
}


def size_bands(winners, sizes, sep: str = "–") -> str:
    """Per-size winners as ranges: 'recursive_doubling 1 KiB–256 KiB, rabenseifner 512 KiB–1 GiB'."""
    runs = []
    for a, n in zip(winners, sizes):
        if runs and runs[-1][0] == a:
            runs[-1][2] = n
        else:
            runs.append([a, n, n])
    return ", ".join(f"{a} {fmt_bytes(lo)}{sep}{fmt_bytes(hi)}" for a, lo, hi in runs)


def _ok(want, got, rel=1e-9):
    return "✓" if want is not None and abs(want - got) <= rel * max(abs(want), abs(got), 1e-30) else "✗"


def format_formula(rec: dict) -> str:
    """The closed forms under a row, evaluated, with ✓ where the measured number equals them."""
    f = rec.get("closed_form")
    if f is None:
        why = (
            "a two-level topology has no single α, β"
            if rec["topology_kind"] == "two-level"
            else "tree nodes with two children queue on one receive port"
        )
        return f"#   closed form: none ({why}); the event simulation is the reference"
    parts = [f"rounds {f['rounds_expr']} = {f['rounds']} {_ok(f['rounds'], rec['rounds'])}"]
    if f["max_bytes_sent"] is not None:
        parts.append(
            f"sent/rank {f['sent_expr']} = {f['max_bytes_sent']:,.0f} {_ok(f['max_bytes_sent'], rec['max_bytes_sent'])}"
        )
    if f["time_s"] is not None:
        parts.append(f"time {f['time_expr']} = {f['time_s'] * 1e6:.2f} us {_ok(f['time_s'], rec['predicted_time_s'])}")
    else:
        parts.append(f"time {f['time_expr']}")
    return "#   closed form: " + " | ".join(parts)
