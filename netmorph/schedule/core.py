"""A collective algorithm as data: rounds of point-to-point transfers.

This is how MSCCL / TACCL express collectives (an XML or Python program of
sends, receives and reduces per step) where NCCL hard-codes them in CUDA, and it
is the loop structure of MPICH's collectives (``MPIR_Allreduce_intra_ring``,
``..._recursive_doubling``, ``..._reduce_scatter_allgather``): one
``MPI_Sendrecv`` per rank per step.

Buffers. Every rank owns one flat workspace of ``buf_len[r]`` elements. The op's
input lies at ``[in_off[r], in_off[r] + in_len[r])`` and its output at
``[out_off[r], out_off[r] + out_len[r])`` (the same span for an in-place
all-reduce; send | receive | scratch regions for all-to-all).

Rounds. A :class:`Round` holds its transfers as parallel numpy arrays (one row
per contiguous segment), never one Python object per transfer, so a 4096-rank
ring (33 million transfers) is 8190 small array bundles. Row ``i`` moves
``length[i]`` elements from ``src[i]``'s workspace at ``src_off[i]`` to
``dst[i]``'s workspace at ``dst_off[i]``, either copying or reducing into what
is there. Rows that share a ``msg`` id form one message (a packed, non-contiguous
send, as Bruck's algorithms need). A row with ``src == dst`` is a local copy:
it costs nothing on the wire and is not a message. A reducing row may name an
*accumulator* (``acc_off``, -1 for none): the destination then starts from the
receiver's element at ``acc_off`` instead of what it held -- ``recvbuff =
sendbuff + incoming``, the three-operand reduction of an out-of-place
collective's first step in NCCL (:mod:`netmorph.schedule.out_of_place`).

Semantics of a round: every row reads its source as it was at the start of
the round, then all rows write. Under the cost model a rank's sends in round k
start only after its receives of rounds < k have landed (the
``MPI_Sendrecv``-loop dependency MPICH's implementations have).

The same object is validated (:meth:`Schedule.validate`), executed and counted
(:mod:`netmorph.schedule.execute`), timed (:mod:`netmorph.cost.simulate`) and
run on real ranks (:mod:`netmorph.runtime`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from netmorph.schedule.ranges import expand_ranges  # noqa: F401  (re-exported)
from netmorph.schedule.validate import validate as _validate

COPY, REDUCE = False, True


def _i64(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.int64).reshape(-1))


class Round:
    """One step: parallel arrays of segments ``(src, dst, src_off, dst_off, length)``.

    ``reduce`` is one bool for the whole round or a bool per row; ``msg`` (optional)
    groups rows into messages. Builders reuse the same ``src``/``dst`` array objects
    across rounds with the same pattern (a ring's 2(p-1) rounds share one pair),
    which lets the counter and the simulator work once per pattern.
    """

    __slots__ = ("src", "dst", "src_off", "dst_off", "length", "reduce", "msg", "acc_off", "_msgs")

    def __init__(self, src, dst, src_off, dst_off, length, reduce=COPY, msg=None, acc_off=None):
        self.src = src if isinstance(src, np.ndarray) and src.dtype == np.int64 else _i64(src)
        self.dst = dst if isinstance(dst, np.ndarray) and dst.dtype == np.int64 else _i64(dst)
        self.src_off = _i64(src_off)
        self.dst_off = _i64(dst_off)
        self.length = _i64(length)
        if isinstance(reduce, (bool, np.bool_)):
            self.reduce = bool(reduce)
        else:
            self.reduce = np.asarray(reduce, dtype=bool).reshape(-1)
        self.msg = None if msg is None else _i64(msg)
        self.acc_off = None if acc_off is None else _i64(acc_off)  # -1: the destination itself
        self._msgs = None
        n = len(self.src)
        for name in ("dst", "src_off", "dst_off", "length") + (("acc_off",) if acc_off is not None else ()):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Round: {name} has {len(getattr(self, name))} rows, src has {n}")

    def __len__(self) -> int:
        return len(self.src)

    def reduce_rows(self) -> np.ndarray:
        """The reduce flag per row."""
        if isinstance(self.reduce, bool):
            return np.full(len(self.src), self.reduce)
        return self.reduce

    def messages(self):
        """``(src, dst, elems, reduce)`` per wire message (local rows dropped).

        ``reduce`` is a bool when the round is uniform, else a bool array. When
        every row is its own remote message the round's own ``src``/``dst``
        arrays are returned, so identical patterns stay identical objects.
        """
        if self._msgs is None:
            src, dst, length, red = self.src, self.dst, self.length, self.reduce
            if self.msg is None:
                remote = src != dst
                if not remote.all():
                    src, dst, length = src[remote], dst[remote], length[remote]
                    if not isinstance(red, bool):
                        red = red[remote]
                self._msgs = (src, dst, length, red)
            else:
                remote = src != dst
                ids = self.msg[remote]
                uniq, first, inv = np.unique(ids, return_index=True, return_inverse=True)
                elems = np.bincount(inv, weights=length[remote], minlength=len(uniq)).astype(np.int64)
                rsrc, rdst = src[remote][first], dst[remote][first]
                if not isinstance(red, bool):
                    red = red[remote][first]
                self._msgs = (rsrc, rdst, elems, red)
        return self._msgs


@dataclass
class Schedule:
    """A collective on ``world`` ranks as an ordered list of :class:`Round`.

    ``count`` is the op's element count in nccl-tests' convention (the full
    vector for all-reduce / reduce-scatter / reduce / broadcast, the gathered
    total for all-gather, the per-rank send buffer for all-to-all); ``itemsize``
    turns elements into bytes. ``reduces`` says whether the op combines values.
    ``in_key``: where each rank's input would lie in the in-place layout (what the
    validator names its elements by); None: at ``in_off``, as in place.
    """

    op: str
    algo: str
    world: int
    count: int
    itemsize: int
    buf_len: np.ndarray
    in_off: np.ndarray
    in_len: np.ndarray
    out_off: np.ndarray
    out_len: np.ndarray
    reduces: bool
    rounds: list = field(default_factory=list)
    root: int | None = None
    meta: dict = field(default_factory=dict)
    in_key: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize

    def add(self, src, dst, src_off, dst_off, length, reduce=COPY, msg=None, acc_off=None) -> None:
        """Append one round (skipped when it has no rows)."""
        r = Round(src, dst, src_off, dst_off, length, reduce, msg, acc_off)
        if len(r):
            self.rounds.append(r)

    def extend(self, other: Schedule, rank_map=None, off_shift: int = 0) -> None:
        """Append ``other``'s rounds, renaming its ranks through ``rank_map``."""
        for r in other.rounds:
            src, dst = r.src, r.dst
            if rank_map is not None:
                src, dst = rank_map[src], rank_map[dst]
            acc = None if r.acc_off is None else np.where(r.acc_off >= 0, r.acc_off + off_shift, -1)
            self.rounds.append(
                Round(src, dst, r.src_off + off_shift, r.dst_off + off_shift, r.length, r.reduce, r.msg, acc)
            )

    def validate(self) -> Schedule:
        """Check the schedule symbolically and return it; raise ``ValueError`` naming the round.

        Checks: ranks and spans in bounds; rows of one message agree; no element is
        written twice in one round; no rank sends data it does not hold yet; a
        reduction never combines two different elements or counts a contribution
        twice; and at the end every output element holds exactly what the op
        promises (for all-reduce, every rank's contribution to that element).
        Symbolic state is a source index and a bitmask of contributing ranks per
        element, so this is for test-sized worlds and buffers.
        """
        _validate(self)
        return self
