"""The argparse types every command's flags share: a flag's own range or syntax, refused at parse time with one
line naming the range (an int in lo..hi, a finite float, a timeout, an emulated link's rate, a seed, a pipeline
schedule, a file the command will write), before any work starts."""

from __future__ import annotations

import argparse
import math


def output_file(suffixes):
    """An argparse type for a file the command writes (``--plot``, ``--trace``): checked at parse time,
    before any work (:func:`netmorph.files.output_problem`). ``suffixes``: the extensions the writer
    produces, or a function giving them (matplotlib's formats are only looked up when a plot is asked for)."""

    def check(text: str) -> str:
        from netmorph.files import output_problem

        problem = output_problem(text, suffixes() if callable(suffixes) else suffixes)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return text

    check.__name__ = "output_file"
    return check


def plot_file(text: str) -> str:
    """``--plot FILE``: any format matplotlib can save here, named by its extension."""
    from netmorph.files import plot_suffixes

    return output_file(plot_suffixes)(text)


def trace_file(text: str) -> str:
    """``--trace FILE.json``: a Trace Event Format file (Perfetto, chrome://tracing)."""
    from netmorph.files import TRACE_SUFFIXES

    return output_file(TRACE_SUFFIXES)(text)


EMPTY = "an empty value; give one, or leave the flag out"


def given(text: str) -> str:
    """A typed flag's value, refused when empty as the post-parse check (:func:`_check_arity`) refuses an untyped
    one: "" is not the flag left out."""
    if not text.strip():
        raise argparse.ArgumentTypeError(EMPTY)
    return text


def finite_float(text: str) -> float:
    """A float flag: finite (NaN would disable a comparison, inf a bound)."""
    try:
        x = float(given(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return x


def pipeline_schedule(text: str) -> str:
    """``--schedule``: afab, 1f1b or interleaved; ``gpipe`` is afab by its paper's name (Huang et al. 2019)."""
    return {"gpipe": "afab"}.get(text.lower(), text.lower())


def schedule_list(text: str) -> tuple:
    """``--schedules``: ``all``, or schedule names (``gpipe`` is afab); 1f1b stands for Megatron's default, 1F1B
    and with v > 1 interleaved."""
    names = (
        ("1f1b", "zb-h1", "zbv", "dualpipev")
        if text.strip().lower() == "all"
        else tuple(pipeline_schedule(x.strip()) for x in text.split(",") if x.strip())
    )
    from netmorph.mesh.settings import SCHEDULES

    bad = [x for x in names if x not in SCHEDULES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"schedules are all or a list of {', '.join(SCHEDULES)}; got {text!r}")
    return tuple(dict.fromkeys("" if x == "1f1b" else x for x in names))


def timeout_seconds(text: str) -> float:
    """A ``--timeout``: seconds a rank waits on a silent peer, the same bounds on every command that
    starts ranks (:data:`netmorph.runtime.launch.TIMEOUT_RANGE`: 0.1 s .. one day)."""
    from netmorph.runtime.launch import TIMEOUT_RANGE

    x = finite_float(text)
    lo, hi = TIMEOUT_RANGE
    if not lo <= x <= hi:
        raise argparse.ArgumentTypeError(f"a timeout is {lo:g}..{hi:g} seconds, got {text}")
    return x


def link_mbps(text: str) -> float:
    """An ``--inter-node-mbps``: the emulated link between two nodes, the same bounds on every command that
    emulates one (:data:`netmorph.cost.topology.INTER_MBPS_RANGE`)."""
    from netmorph.cost.topology import INTER_MBPS_RANGE

    x = finite_float(text)
    lo, hi = INTER_MBPS_RANGE
    if not lo <= x <= hi:
        raise argparse.ArgumentTypeError(f"an emulated link is {lo:g}..{hi:g} MB/s, got {text}")
    return x


def add_timeout(p, default: float) -> None:
    """The ``--timeout`` flag of a command that starts ranks."""
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=default,
        help=f"seconds a rank waits on a silent peer before naming it (0.1..86400, default {default:g})",
    )


def exact_int(text: str) -> int:
    """An int flag: decimal digits, at most 2**53 in size (past that no count here is meaningful)."""
    try:
        x = int(given(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if abs(x) > 1 << 53:
        raise argparse.ArgumentTypeError(f"{text} is out of range (at most 2**53)")
    return x


def int_in(lo: int, hi: int, shown: str | None = None):
    """An argparse type: an int flag in lo..hi, refused at parse time with its range (``shown``: the range as
    the help writes it, e.g. ``1..2**30``)."""

    def check(text: str) -> int:
        x = exact_int(text)
        if not lo <= x <= hi:
            raise argparse.ArgumentTypeError(f"must be in {shown or f'{lo}..{hi}'}, got {text}")
        return x

    check.__name__ = "int"
    return check


def float_in(lo: float, hi: float, open_low: bool = False):
    """An argparse type: a finite float flag in [lo, hi] (``open_low``: (lo, hi]), refused at parse time."""

    def check(text: str) -> float:
        x = finite_float(text)
        if not (lo < x if open_low else lo <= x) or x > hi:
            raise argparse.ArgumentTypeError(f"must be in {'(' if open_low else '['}{lo:g}, {hi:g}], got {text}")
        return x

    check.__name__ = "float"
    return check


def seed_int(text: str) -> int:
    """A --seed: what numpy's and torch's generators take, 0..2**32-1."""
    x = exact_int(text)
    if not 0 <= x < 1 << 32:
        raise argparse.ArgumentTypeError(f"a seed is in 0..2**32-1, got {text}")
    return x
