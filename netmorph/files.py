"""Files in and out: a user's JSON file read safely, and every output file written atomically.

Reading: a regular file, at most 1 MiB, UTF-8, one JSON object.

Topologies (``--topology FILE``) and hardware (``--hardware FILE``) come from files a
user names; a device (``/dev/zero``), a binary file or a list must be one clear line
naming the flag, never a traceback or an unbounded read. Writing: figures, traces
and reports go to a temporary file beside the target, then ``os.replace``.
"""

from __future__ import annotations

import json
import os
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
    except OSError as e:                     # a name too long for the file system, say
        raise UsageError(f"{where}: cannot open it ({type(e).__name__}: {e})", argument) from None
    if not regular:
        raise UsageError(f"{where} is not a regular file", argument)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise UsageError(f"{where} is {size:,} B; at most {max_bytes:,} B", argument)
        return path.read_bytes()[:max_bytes + 1].decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{where} is not UTF-8 text", argument) from None
    except OSError as e:
        raise UsageError(f"{where}: cannot read it ({type(e).__name__}: {e})", argument) from None


def read_json_object(path: Path, argument: str) -> dict:
    """The JSON object in ``path``; UsageError naming ``argument`` for anything else."""
    where = f"{{{argument}}}: {printable(path)}"
    text = read_text_limited(path, argument)
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise UsageError(f"{where}: cannot read it as JSON ({type(e).__name__}: {e})", argument) from None
    if not isinstance(data, dict):
        raise UsageError(f"{where} must hold one JSON object of fields, got a {type(data).__name__}", argument)
    return data


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
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".netmorph-",
                               suffix=os.path.splitext(path)[1])
    os.close(fd)
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)              # what open(path, "w") would have made
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        fh.write(text)


def write_json(path, obj, **kw) -> None:
    write_text(path, json.dumps(obj, **kw))


def save_figure(fig, path, dpi: int = 110) -> None:
    """``fig.savefig(path)``, atomically (the format from the suffix, as matplotlib does)."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi)
