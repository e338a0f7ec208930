"""Files in and out: a user's JSON file read safely, and every output file written atomically.

Reading: a regular file, at most 1 MiB, UTF-8, one JSON object.

Topologies (``--topology FILE``) and hardware (``--hardware FILE``) come from files a
user names; a device (``/dev/zero``), a binary file or a list must be one clear line
naming the flag, never a traceback or an unbounded read.

Writing: every output path a user names (``--plot``, ``--trace``, the tour's folder)
is checked by :func:`output_problem` before any work starts -- an empty name, a name
too long for the file system, an extension the writer cannot produce, a missing or
unwritable folder, and anything that exists and is not a regular file (a device
node, a FIFO, a socket, a folder) are refused. Figures, traces and reports then go
to a temporary ``.netmorph-*`` file beside the target and ``os.replace`` it, which
refuses once more, at the last moment, to put a file where something that is not a
regular file stands: ``--trace /dev/null`` run as root must never turn the device
node into a file.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

from netmorph.errors import UsageError

MAX_BYTES = 1 << 20


def printable(text) -> str:
    """``text`` as it reads on one line: itself, or its repr when it holds a line break or other control."""
    text = str(text)
    return text if text.isprintable() else repr(text)


def path_exists(path) -> bool:
    """``path.exists()``, False for a name the file system cannot even look up (too long, say)."""
    try:
        return Path(path).exists()
    except OSError:
        return False


def read_text_limited(path, argument: str, max_bytes: int = MAX_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes``; UsageError naming ``argument`` otherwise."""
    path = Path(path)
    where = f"{{{argument}}}: {printable(path)}"
    try:
        regular = path.is_file()
    except OSError as e:  # a name too long for the file system, say
        raise UsageError(f"{where}: cannot open it ({type(e).__name__}: {e})", argument) from None
    if not regular:
        raise UsageError(f"{where} is not a regular file", argument)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise UsageError(f"{where} is {size:,} B; at most {max_bytes:,} B", argument)
        return path.read_bytes()[: max_bytes + 1].decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{where} is not UTF-8 text", argument) from None
    except OSError as e:
        raise UsageError(f"{where}: cannot read it ({type(e).__name__}: {e})", argument) from None


class _NotANumber:
    """What a JSON number that is not a finite float parses to (NaN, Infinity, 1e400), until it is named."""

    def __init__(self, text):
        self.text = text


def _number(text: str):
    x = float(text)
    return x if math.isfinite(x) else _NotANumber(text)


def _first_bad(obj, path=""):
    """The dotted path of the first non-finite number in ``obj`` and its text, or None."""
    if isinstance(obj, _NotANumber):
        return path or "(the value)", obj.text
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        found = _first_bad(v, f"{path}.{k}" if path and isinstance(k, str) else f"{path}[{k}]" if path else str(k))
        if found:
            return found
    return None


def loads_strict(text: str):
    """``json.loads``, but NaN, Infinity and numbers past a float's range (1e400) are errors naming where
    they are (ValueError): strict JSON has no such numbers, and every reader here would compute with them."""
    data = json.loads(text, parse_constant=_NotANumber, parse_float=_number)
    bad = _first_bad(data)
    if bad:
        raise ValueError(f"{bad[0]} must be a finite number, got {bad[1]}")
    return data


def read_json_object(path: Path, argument: str) -> dict:
    """The JSON object in ``path``; UsageError naming ``argument`` for anything else (NaN, Infinity and
    1e400 included, naming the field)."""
    where = f"{{{argument}}}: {printable(path)}"
    text = read_text_limited(path, argument)
    try:
        data = loads_strict(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise UsageError(f"{where}: cannot read it as JSON ({type(e).__name__}: {e})", argument) from None
    except ValueError as e:
        raise UsageError(f"{where}: {printable(e)}", argument) from None
    if not isinstance(data, dict):
        raise UsageError(f"{where} must hold one JSON object of fields, got a {type(data).__name__}", argument)
    return data


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)
TRACE_SUFFIXES = ("json",)


def _not_regular(mode: int) -> str | None:
    """What a file of ``mode`` is when it is not a regular file ("a character device"), else None."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _standing(path) -> tuple[bool, bool, str | None]:
    """What stands at ``path``: (anything?, a link?, what it is -- through a link -- when that is not a
    regular file, else None). A dangling link is a link to nothing. OSError when it cannot be looked up."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False, False, None
    if not stat.S_ISLNK(mode):
        return True, False, _not_regular(mode)
    try:
        return True, True, _not_regular(os.stat(path).st_mode)
    except OSError:
        return True, True, None


def plot_suffixes() -> tuple[str, ...]:
    """The extensions matplotlib can save here (``pgf`` only where its TeX is installed)."""
    import matplotlib
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = ["png", "pdf", "svg"] + sorted(set(FigureCanvasBase.get_supported_filetypes()) - {"png", "pdf", "svg"})
    if shutil.which(matplotlib.rcParams.get("pgf.texsystem", "xelatex")) is None:
        kinds.remove("pgf")
    return tuple(kinds)


def output_problem(path, suffixes=None) -> str | None:
    """Why ``path`` cannot be written as an output file, in words ("is a FIFO, not a regular file"),
    or None when it can. ``suffixes``: the extensions the writer produces (None: any). Nothing is
    written but a probe file, created fresh beside the target and removed at once."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(text, str) or not text.strip():
        return "is empty; name a file to write"
    shown = printable(text)
    if "\0" in text:
        return f"{shown} holds a NUL character"
    directory, name = os.path.split(os.path.abspath(text))
    if not name or text.endswith(("/", os.sep)):
        return f"{shown} names a folder; name a file to write"
    try:
        name_max = os.pathconf(directory, "PC_NAME_MAX") if os.path.isdir(directory) else 255
    except (OSError, ValueError):
        name_max = 255
    if len(os.fsencode(name)) > name_max:
        return (
            f"the file name in {shown[:60]}... is {len(os.fsencode(name))} bytes; the file system takes "
            f"at most {name_max}"
        )
    if len(os.fsencode(os.path.abspath(text))) >= 4096:
        return f"{shown[:60]}... is longer than the file system's 4096-byte path limit"
    try:
        exists, link, kind = _standing(text)
    except OSError as e:
        return f"{shown}: cannot look it up ({e.strerror or e})"
    if kind and link:  # a link is replaced, never followed -- unless it stands
        return f"{shown} is a link to {kind}, not to a regular file; name a file to write"  # for /dev/stdout
    if kind:
        return f"{shown} is {kind}, not a regular file; name a file to write"
    if exists and not link and not os.access(text, os.W_OK):
        return f"{shown} is read-only"
    if suffixes is not None:
        ext = os.path.splitext(name)[1][1:].lower()
        if not ext:
            return f"{shown} has no extension; end it in .{suffixes[0]}" + (
                f" (or {', '.join('.' + s for s in suffixes[1:])})" if len(suffixes) > 1 else ""
            )
        if ext not in suffixes:
            return f"cannot write a .{ext} file ({shown}); use one of {', '.join('.' + s for s in suffixes)}"
    if not os.path.isdir(directory):
        return f"the folder {printable(directory)} does not exist"
    try:
        probe_writable(directory)
    except OSError as e:
        return f"cannot write to {printable(directory)}: {e.strerror or e}"
    return None


def check_output(path, argument: str, suffixes=None) -> None:
    """:func:`output_problem` as a UsageError naming ``argument``."""
    problem = output_problem(path, suffixes)
    if problem:
        raise UsageError(f"{{{argument}}}: {problem}", argument)


def probe_writable(directory) -> None:
    """Prove a file can be created in ``directory`` (OSError if not): a fresh name created exclusively
    (``mkstemp``) and removed, so a link planted under a fixed name is never followed. (``os.access``
    is not enough: it says yes to root for ``/proc``.)"""
    fd, probe = tempfile.mkstemp(dir=directory, prefix=".netmorph-write-test-")
    os.close(fd)
    os.unlink(probe)


@contextmanager
def atomic_path(path):
    """A temporary path in ``path``'s directory, renamed onto ``path`` when the block succeeds and
    removed when it does not: a reader (or a crash, or Ctrl-C) never sees a half-written file, and
    nothing is written through a name planted in advance (``mkstemp`` creates a fresh file)."""
    path = os.fspath(path)
    ext = os.path.splitext(path)[1]
    fd, tmp = tempfile.mkstemp(
        dir=os.path.dirname(os.path.abspath(path)), prefix=".netmorph-", suffix=ext if len(ext) <= 16 else ""
    )
    os.close(fd)
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # what open(path, "w") would have made
        yield tmp
        _refuse_non_regular(path)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _refuse_non_regular(path: str) -> None:
    """The last look before ``os.replace``: never put a file where a device, FIFO, socket or folder is."""
    kind = _standing(path)[2]
    if kind:
        raise UsageError(f"{printable(path)} is {kind}, not a regular file; it was left as it is")


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        fh.write(text)


def write_json(path, obj, **kw) -> None:
    write_text(path, json.dumps(obj, **kw))


def save_figure(fig, path, dpi: int = 110) -> None:
    """``fig.savefig(path)``, atomically (the format from the suffix, as matplotlib does)."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi)
