"""Collective fingerprints: a 64-byte header on every message, checked on receipt.

Stands in for the desync checks of the production stacks: torch's
``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (``ProcessGroupWrapper`` compares each
collective's ``CollectiveFingerPrint`` -- op, shapes, dtypes -- across ranks
before running it) and NCCL's flight recorder, which names the collective each
rank was in when a job hung. Here the check rides on the data itself, so it is
always on: the first piece of every message starts with the sender's fingerprint
of the call it is in, and the receiver compares it with its own before a single
byte lands. Ranks that disagree on the op, algorithm, count, dtype, root, reduce
op, group or how many calls came before fail with :class:`CollectiveMismatch`
naming both calls -- never a wrong result. Ranks that disagree without a
receive ever seeing the other's header (each sends where the other does not
receive: ``broadcast(x, src=own rank)``) are found when a rank goes to sleep with a
message of a call it has moved past still unread, when all ranks have returned
and one is left in a channel, or at a timeout, by walking who waits for whom
(:mod:`netmorph.runtime.transport.blame`): two ranks of one group at one call
index with different fingerprints are a mismatch; ranks in different groups only
wait on each other.

Eight int64 words: ``[op | algo << 8, seq, count, dtype, root | group size << 32,
redop, group hash, message bytes]``. ``seq`` counts the calls on the group (per
ordered pair for point-to-point), as torch counts per process group. There is no
round number: per-pair FIFO order already places a message within its call, and
an uneven all-to-all's ranks build schedules that skip different empty rounds. Schedules count payload only; the ledger reports the header bytes
apart (:data:`HEADER_BYTES` per message).
"""

from __future__ import annotations

import zlib
from functools import lru_cache

import numpy as np

from netmorph.collectives import ALGORITHMS, NAMES
from netmorph.runtime.transport.errors import FabricError
from netmorph.units import numpy_dtype

HEADER_BYTES = 64
WORDS = HEADER_BYTES // 8
OPS = ("p2p", *ALGORITHMS)


def algos() -> tuple:
    """Every algorithm name in the order the registry first saw it: an algorithm registered later takes the
    next code and leaves every earlier one's as it was (a cached header template keeps meaning the same)."""
    return ("p2p", *NAMES)


REDOPS = ("sum", "prod", "max", "min", "none", "avg")
UNEVEN = -1  # all-to-all with per-rank split sizes: the count differs by rank


class CollectiveMismatch(FabricError):
    """Ranks disagree on the call they are in (op, count, dtype, root, reduce op, algorithm, group
    or sequence): raised instead of reducing mismatched bytes, naming both ranks' calls. ``mine``
    None: the receiver never made a call at that index (it returned, or skipped one)."""

    def __init__(self, rank: int, peer: int, mine, theirs, sent: bool = True, text: str | None = None):
        self.rank = peer  # whom this rank blames: the peer whose message disagreed
        self.receiver, self.sender, self.sent = rank, peer, sent
        self.mine = None if mine is None else np.asarray(mine).copy()
        self.theirs = None if theirs is None else np.asarray(theirs).copy()
        if text is not None:  # found by torch's own check (torch-native): its words
            text = f"collective mismatch: {text}"
        elif self.mine is None:
            text = (
                f"collective mismatch: rank {peer} sent rank {rank} {describe(self.theirs)}, which rank {rank} "
                f"never received: it made no such call"
            )
        else:
            verb = "sent it" if sent else "is in"
            text = (
                f"collective mismatch: rank {rank} is in {describe(self.mine)} but rank {peer} {verb} "
                f"{describe(self.theirs)}"
            )
        super().__init__(text)


def same_call(a, b) -> bool:
    """Two fingerprints of the same call (the per-message byte count aside)."""
    return np.asarray(a)[:7].tobytes() == np.asarray(b)[:7].tobytes()


def conflict(a, b) -> bool:
    """Two ranks disagree on a call: the same group (its members' hash and size) at the same call index,
    with different fingerprints. Ranks in different groups, or at different calls of one group, are
    only waiting on each other (a chain or a deadlock), never a mismatch."""
    a, b = np.asarray(a), np.asarray(b)
    return slot(a) == slot(b) and a[1] == b[1] and not same_call(a, b)


def slot(fp) -> tuple:
    """Where a call is counted: point-to-point or collective, the group's hash and size. (A pair's
    messages and a 2-rank group's collectives hash alike; the op class keeps them apart.)"""
    return (int(fp[0]) & 0xFF == 0, int(fp[6]), int(fp[4]) >> 32)


def dtype_code(dtype) -> int:
    """numpy's kind letter and the item size, for a numpy or a torch dtype (bfloat16: kind ``B``)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:  # a torch dtype: torch.float16 -> "float16"
        dt = numpy_dtype(str(dtype).replace("torch.", ""))
    if dt.name == "bfloat16":  # ml_dtypes' numpy type is kind V: name it apart
        return ord("B") | 2 << 8
    return ord(dt.kind) | dt.itemsize << 8


@lru_cache(maxsize=1024)
def _template(op: str, algo: str, count: int, dtype, root: int, redop: str, ranks: tuple) -> np.ndarray:
    return np.array(
        [
            OPS.index(op) | algos().index(algo) << 8,
            0,
            count,
            dtype_code(dtype),
            root | len(ranks) << 32,
            REDOPS.index(redop),
            zlib.crc32(np.asarray(ranks, dtype=np.int64).tobytes()),
            0,
        ],
        dtype=np.int64,
    )


def stamp(op: str, algo: str, seq: int, count: int, dtype, root: int, redop: str, ranks) -> np.ndarray:
    """The fingerprint of one call (message bytes 0: the transport fills them per message)."""
    fp = _template(op, algo, count, dtype, root, redop, tuple(ranks)).copy()
    fp[1] = seq
    return fp


def write(fp: np.ndarray, nbytes: int, out: np.ndarray) -> None:
    """Put the header of a message of ``nbytes`` payload bytes into ``out`` (64 bytes, 8-aligned)."""
    w = out.view(np.int64)
    w[:] = fp
    w[7] = nbytes


def header(fp: np.ndarray, nbytes: int) -> np.ndarray:
    """The 64 bytes that go on the wire in front of a message of ``nbytes`` payload bytes."""
    h = np.empty(HEADER_BYTES, np.uint8)
    write(fp, nbytes, h)
    return h


def check(fp: np.ndarray, nbytes: int, got: np.ndarray, me: int, peer: int) -> None:
    """Raise :class:`CollectiveMismatch` unless the header ``got`` (64 bytes) is ``fp`` for ``nbytes``."""
    theirs = got.view(np.int64)
    if theirs[7] == nbytes and got[:56].tobytes() == fp[:7].tobytes():
        return
    mine = fp.copy()
    mine[7] = nbytes
    raise CollectiveMismatch(me, peer, mine, theirs)


def describe(fp) -> str:
    """``allreduce(ring, 1024 x float32, op=sum, group of 4 #1a2b3c4d, call #3, 4096 B)``."""
    w = [int(x) for x in fp]
    op, algo = w[0] & 0xFF, w[0] >> 8
    if op >= len(OPS) or algo >= len(algos()) or not 0 <= w[5] < len(REDOPS):
        return f"something that is not a netmorph message (header words {w})"
    kind, isz = chr(w[3] & 0xFF), w[3] >> 8
    try:
        dtype = "bfloat16" if kind == "B" else np.dtype(f"{kind}{isz}").name
    except TypeError:
        dtype = f"{kind}{isz}"
    name = OPS[op]
    count = "uneven" if w[2] == UNEVEN else str(w[2])
    if name == "p2p":
        return f"send/recv({count} x {dtype}, message #{w[1]}" + (f", {w[7]:,} B)" if w[7] else ")")
    parts = [algos()[algo], f"{count} x {dtype}"]
    if name in ("broadcast", "reduce"):
        parts.append(f"root={w[4] & 0xFFFFFFFF}")
    if name in ("allreduce", "reduce", "reduce_scatter"):
        parts.append(f"op={REDOPS[w[5]]}")
    parts += [f"group of {w[4] >> 32} #{w[6]:08x}", f"call #{w[1]}"] + ([f"{w[7]:,} B"] if w[7] else [])
    return f"{name}({', '.join(parts)})"
