"""Regenerate every command transcript in docs/ from real runs, or check them.

    python scripts/transcripts.py                  # rerun every transcript of README.md and docs/ (not the
                                                   # slow ones) and rewrite the pages
    python scripts/transcripts.py --slow           # the benchmarks' transcripts too (tens of minutes)
    python scripts/transcripts.py --check          # rerun and compare: exit 1 where a deterministic field moved
    python scripts/transcripts.py --check --max-seconds 3 docs/commands/plan.md
    python scripts/transcripts.py --slow --only benchmarks/scale.py docs/benchmarks.md

A transcript is a fenced block whose first line starts with ``$ ``: each ``$ COMMAND`` line is followed by
what the command printed (stdout and stderr as a terminal shows them, progress lines left out). The comment
line just above a block says how it was made and is rewritten with each run:

    <!-- transcript: 1.4 s -->                     regenerated; took 1.4 s
    <!-- transcript: 52 s, slow -->                regenerated only with --slow
    <!-- transcript: 3 s, compare numbers -->      --check compares only the text, every number masked
    <!-- transcript: 3 s, timing -->               every field is a measurement or follows one (a race of two
                                                   timings, a calibrated twin's ranking, a detection's step, the
                                                   units a rate is printed in): --check reruns it and asks only that
                                                   it prints; --skip-timing (the suite) leaves it
    <!-- transcript: manual: needs a second terminal -->   never rerun (the reason is the documentation)

Every page runs its blocks in order in one fresh folder (a checkpoint saved in one block is loaded in the
next) that holds links to the repository's examples/, benchmarks/ and scripts/; ``netmorph`` and
``python`` are this interpreter's.

What --check calls deterministic: a line that holds no measured time or rate (a number followed by ns, us,
ms, s, min, GB/s, tokens/s, ...) must come back identical -- bytes, rounds, closed forms, losses of a
deterministic run, a layout's predicted time, an error line; a line that holds one is compared with its
numbers masked, as is a number in a table under a column headed by a time or a rate. ``compare numbers`` masks
every number of the block.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LINKED = ("examples", "benchmarks", "scripts")
MARK = re.compile(r"^<!-- transcript: (.*) -->$")
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")
TIMED = re.compile(
    r"\d(?:[\d,]*\.?\d*)(?:e[-+]?\d+)?\s*(?:ns|us|µs|ms|s|sec|min|h|GB/s|MB/s|Gb/s|Mb/s|"
    r"tokens/s|tok/s|steps/s|samples/s|req/s|TFLOP/s)(?![\w/])"
)
PROGRESS = re.compile(r"^netmorph [\w-]+: .*\(\d+ s\)$")
VOLATILE = re.compile(r"(?<=--port )\d+|(?<=127\.0\.0\.1:)\d+|(?<=pid )\d+|^[WIEF]\d{4} [\d:.]+ +\d+")  # a free port, a
# pid, a log's clock
MEASURED = re.compile(r"\bmeasured \d")  # "bubble: measured 17.5% ..."
HEADER_VOLATILE = re.compile(r"time|wall|\((?:ms|us|s)\)|/s\b|busbw|algbw|^(?:ms|us)$")


@dataclass
class Block:
    """One transcript: where it sits in its page, its directive and its commands with their outputs."""

    start: int  # index of the opening fence's line
    end: int  # index of the closing fence's line
    mark: int | None  # index of the directive line, if any
    options: dict = field(default_factory=dict)
    runs: list = field(default_factory=list)  # [(command, [output lines])]

    @property
    def manual(self) -> str:
        return self.options.get("manual", "")

    def directive(self, seconds: float) -> str:
        parts = [f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"]
        parts += [k for k in ("slow", "timing") if k in self.options]
        parts += [f"compare {self.options['compare']}"] if "compare" in self.options else []
        return f"<!-- transcript: {', '.join(parts)} -->"


def parse_options(text: str) -> dict:
    """``"1.4 s, slow, compare numbers"`` -> {"seconds": 1.4, "slow": True, "compare": "numbers"}."""
    if text.startswith("manual"):
        return {"manual": text.partition(":")[2].strip() or "not rerun"}
    out = {}
    for part in (p.strip() for p in text.split(",")):
        if part.endswith(" s") and NUMBER.fullmatch(part[:-2]):
            out["seconds"] = float(part[:-2])
        elif part in ("slow", "timing"):
            out[part] = True
        elif part.startswith("compare "):
            out["compare"] = part.split(" ", 1)[1]
        elif part:
            raise ValueError(f"unknown transcript option {part!r}")
    return out


def blocks(lines: list) -> list:
    """Every transcript block of a page's lines."""
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            body = lines[i + 1 : j]
            if body and body[0].startswith("$ "):
                k = i - 1
                mark = k if k >= 0 and MARK.match(lines[k]) else None
                b = Block(i, j, mark, parse_options(MARK.match(lines[mark]).group(1)) if mark is not None else {})
                for line in body:
                    if line.startswith("$ "):
                        b.runs.append((line[2:], []))
                    else:
                        b.runs[-1][1].append(line)
                out.append(b)
            i = j + 1
            continue
        i += 1
    return out


def run(command: str, cwd: Path, timeout: float) -> tuple[list, float]:
    """What ``command`` prints at a terminal (stdout and stderr in order, progress lines left out), and its
    seconds."""
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        COLUMNS="120",
        PYTHONHASHSEED="0",
    )
    t0 = time.monotonic()
    p = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    seconds = time.monotonic() - t0
    text = p.stdout.replace(str(cwd) + os.sep, "").replace(str(cwd), ".")
    return [line.rstrip() for line in text.splitlines() if not PROGRESS.match(line)], seconds


def masked(lines: list, compare: str) -> list:
    """The deterministic content of output lines (see the module's docstring): in a table, the numbers under a
    column headed by a time or a rate (``time(ms)``, ``tokens/s``, ``busbw``, ``wall(s)``) are masked too."""
    out, header = [], None
    for line in lines:
        if compare == "numbers" or TIMED.search(line) or MEASURED.search(line):
            line = NUMBER.sub("#", line)
        elif not line.strip():
            header = None
        elif not re.search(r"\d", line) and len(line.split()) >= 2:
            header = line
        elif header is not None and not line.lstrip().startswith("#"):
            line = _mask_columns(line, header)
        out.append(" ".join(VOLATILE.sub("#", line).split()))  # a masked number's width moves the columns
    return out


def _mask_columns(row: str, header: str) -> str:
    """``row`` with each number masked whose nearest header cell (by where the two end: tables right-align)
    names a time or a rate."""
    cells = [(m.end(), m.group()) for m in re.finditer(r"\S+", header)]
    out, last = [], 0
    for m in NUMBER.finditer(row):
        end, name = min(cells, key=lambda c: abs(c[0] - m.end()))
        out.append(row[last : m.start()] + ("#" if HEADER_VOLATILE.search(name) else m.group()))
        last = m.end()
    return "".join(out) + row[last:]


def shown(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def workdir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="netmorph-transcripts-"))
    for name in LINKED:
        (d / name).symlink_to(ROOT / name)
    return d


def process(
    page: Path, check: bool, slow: bool, max_seconds: float, timeout: float, skip_timing: bool = False, only: str = ""
) -> list:
    """Rerun ``page``'s transcripts: rewrite the page, or (``check``) return the differences."""
    lines = page.read_text().split("\n")
    found, problems, ran = blocks(lines), [], []
    d = workdir()
    try:
        for b in found:
            if (
                b.manual
                or ("slow" in b.options and not slow)
                or b.options.get("seconds", 0) > max_seconds
                or "timing" in b.options
                and skip_timing
                or only not in b.runs[0][0]
            ):
                continue
            total, fresh = 0.0, []
            for command, old in b.runs:
                out, seconds = run(command, d, timeout)
                total += seconds
                fresh.append((command, out))
                if check and "timing" in b.options:
                    if not out:
                        problems.append(f"{shown(page)}:{b.start + 1}: `{command}` printed nothing")
                elif check:
                    compare = b.options.get("compare", "lines")
                    want, got = masked(old, compare), masked(out, compare)
                    if want != got:
                        diff = next((i for i, (w, g) in enumerate(zip(want, got)) if w != g), min(len(want), len(got)))
                        problems.append(
                            f"{shown(page)}:{b.start + 1}: `{command}` line {diff + 1}: "
                            f"documented {old[diff] if diff < len(old) else '(nothing)'!r}, now "
                            f"{out[diff] if diff < len(out) else '(nothing)'!r}"
                        )
            b.runs, b.options["seconds"] = fresh, total
            ran.append(b)
            print(f"{shown(page)}:{b.start + 1}: {total:.1f} s", file=sys.stderr)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if ran and not check:
        for b in reversed(ran):  # later blocks first, so the earlier indexes stay right
            body = [x for command, out in b.runs for x in [f"$ {command}", *out]]
            lines[b.start + 1 : b.end] = body
            if b.mark is not None:
                lines[b.mark] = b.directive(b.options["seconds"])
            else:
                lines.insert(b.start, b.directive(b.options["seconds"]))
        page.write_text("\n".join(lines))
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("pages", nargs="*", type=Path, help="markdown pages (default: README.md and every page under docs/)")
    p.add_argument("--check", action="store_true", help="compare instead of rewriting; exit 1 on a difference")
    p.add_argument("--slow", action="store_true", help="the transcripts marked slow too")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=float("inf"),
        help="only the transcripts whose last run took at most this long",
    )
    p.add_argument("--only", default="", metavar="TEXT", help="only the transcripts whose first command holds TEXT")
    p.add_argument("--skip-timing", action="store_true", help="leave out the transcripts marked timing")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one command may take")
    a = p.parse_args(argv)
    pages = [x.resolve() for x in a.pages] or [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    problems = []
    for page in pages:
        problems += process(page, a.check, a.slow, a.max_seconds, a.timeout, a.skip_timing, a.only)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
