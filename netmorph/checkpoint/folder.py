"""A checkpoint folder: ``DIR/step-N/`` per checkpoint, ``DIR/latest`` naming the newest complete one.

A checkpoint becomes visible only whole (torchtitan and Megatron write into the step's folder and trust the
last file; a crash mid-save then leaves a folder that looks like a checkpoint): every rank writes into
``DIR/.step-N.partial``, DCP's writer fsyncs each file, rank 0 writes ``checksums.json`` (sha256 of every file)
and fsyncs it, renames the folder to ``step-N``, fsyncs ``DIR``, and only then replaces ``latest`` (written
beside it, fsynced, renamed over it). A save killed at any point leaves the previous checkpoint loadable and
``latest`` naming it; the partial folder is removed by the next run (:func:`sweep`). A load checks every file
against its checksum before any rank reads (:func:`verify`): a truncated or altered shard is one line naming
the file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from netmorph.checkpoint.dcp import sha256
from netmorph.errors import UsageError

LATEST = "latest"
SUMS = "checksums.json"
STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step}"


def partial_dir(root: Path, step: int) -> Path:
    return Path(root) / f".step-{step}.partial"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def sweep(root: Path) -> list:
    """Remove what an interrupted save left in ``root`` (partial folders, a half-written ``latest``); the names."""
    root = Path(root)
    gone = []
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(".step-") and p.name.endswith(".partial") or p.name == LATEST + ".tmp":
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
                gone.append(p.name)
    return gone


def publish(root: Path, step: int, sums: dict) -> Path:
    """Make ``.step-N.partial`` the checkpoint ``step-N`` and point ``latest`` at it (rank 0, after every rank's
    shard and the metadata are written and synced)."""
    root, tmp, final = Path(root), partial_dir(root, step), step_dir(root, step)
    _write_synced(tmp / SUMS, json.dumps(sums, indent=1, sort_keys=True))
    _fsync_dir(tmp)
    if final.exists():  # a run resumed before this step saves it again
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    _write_synced(root / LATEST, final.name + "\n")
    _fsync_dir(root)
    return final


def steps(root: Path) -> list:
    """The complete checkpoints' steps in ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and (p / SUMS).is_file())


def prune(root: Path, keep: int) -> list:
    """Keep the newest ``keep`` checkpoints (0: all); the steps removed."""
    old = steps(root)[:-keep] if keep else []
    for s in old:
        shutil.rmtree(step_dir(root, s), ignore_errors=True)
    return old


def resolve(root: str) -> Path:
    """The checkpoint ``--load DIR`` means: ``DIR/latest``'s, or DIR itself when it is one ``step-N``."""
    root = Path(root)
    if (root / SUMS).is_file():
        return root
    if not root.is_dir():
        raise UsageError(f"--load {root}: no such folder", "load")
    latest = root / LATEST
    if latest.is_file():
        path = root / latest.read_text().strip()
        if (path / SUMS).is_file():
            return path
    done = steps(root)
    if not done:
        raise UsageError(f"--load {root}: no complete checkpoint in it (a step-N folder with {SUMS})", "load")
    return step_dir(root, done[-1])


def verify(path: Path) -> None:
    """Every file of the checkpoint ``path`` is there, whole and unaltered (its sha256), or the one line that
    names the first that is not."""
    path = Path(path)
    try:
        sums = json.loads((path / SUMS).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--load {path}: {SUMS} unreadable ({e})", "load") from None
    for name, want in sorted(sums.items()):
        f = path / name
        if not f.is_file():
            raise UsageError(f"--load {path}: {f} is missing: the checkpoint is incomplete", "load")
        if sha256(f) != want:
            raise UsageError(
                f"--load {path}: {f} is corrupt (its sha256 is not the one written with it): "
                f"load an older step-N folder, or start without --load",
                "load",
            )
