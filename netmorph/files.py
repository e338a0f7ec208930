"""Reading a user's JSON file safely: a regular file, at most 1 MiB, UTF-8, one JSON object.

Topologies (``--topology FILE``) and hardware (``--hardware FILE``) come from files a
user names; a device (``/dev/zero``), a binary file or a list must be one clear line
naming the flag, never a traceback or an unbounded read.
"""

from __future__ import annotations

import json
from pathlib import Path

from netmorph.errors import UsageError

MAX_BYTES = 1 << 20


def read_json_object(path: Path, argument: str) -> dict:
    """The JSON object in ``path``; UsageError naming ``argument`` for anything else."""
    where = f"{{{argument}}}: {path}"
    if not path.is_file():
        raise UsageError(f"{where} is not a regular file", argument)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise UsageError(f"{where} is {size:,} B; a description file is at most {MAX_BYTES:,} B", argument)
        text = path.read_bytes()[:MAX_BYTES + 1].decode("utf-8")
        data = json.loads(text)
    except UnicodeDecodeError:
        raise UsageError(f"{where} is not UTF-8 text", argument) from None
    except (OSError, json.JSONDecodeError, RecursionError) as e:
        raise UsageError(f"{where}: cannot read it as JSON ({type(e).__name__}: {e})", argument) from None
    if not isinstance(data, dict):
        raise UsageError(f"{where} must hold one JSON object of fields, got a {type(data).__name__}", argument)
    return data
