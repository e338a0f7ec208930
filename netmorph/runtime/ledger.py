"""Every message: source, destination, bytes, round and phase -- the run's wire record.

NCCL has no such record (``NCCL_DEBUG=INFO`` prints setup, the profiler plugin
API gives per-op events); the closest everyday tool is the PyTorch profiler's
Chrome trace. This ledger is kept per rank (sends only, so nothing is counted
twice), merged by the launcher, summarised per phase and per link, and exported
as a Chrome trace that Perfetto or ``chrome://tracing`` opens.

``bytes`` are payload, what the schedules and closed forms count; each message
also carries a fingerprint header (``header_bytes``, 64 B, 0 with fingerprints
off), reported apart as ``overhead_bytes``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from netmorph.files import write_json


class Record(NamedTuple):
    """One message: who sent how many payload bytes to whom, in which call (seq), round and phase, by which
    operation and algorithm, from ``t0`` to ``t1`` (``time.perf_counter`` of the sender)."""

    src: int
    dst: int
    bytes: int
    seq: int
    round: int
    phase: str
    op: str
    algo: str
    t0: float
    t1: float


FIELDS = Record._fields


class Ledger:
    def __init__(self, rank: int = -1, records=None, header_bytes: int = 0):
        self.rank = rank
        self.records = list(records or [])
        self.header_bytes = header_bytes  # per message on the wire, beside its payload

    def add(self, src, dst, nbytes, seq, rnd, phase, op, algo, t0, t1) -> None:
        self.records.append(Record(src, dst, int(nbytes), seq, rnd, phase, op, algo, t0, t1))

    @classmethod
    def merge(cls, ledgers) -> Ledger:
        recs = [r for led in ledgers if led is not None for r in led.records]
        recs.sort(key=lambda r: (r.t0, r.src))
        return cls(-1, recs, max((led.header_bytes for led in ledgers if led is not None), default=0))

    def __len__(self) -> int:
        return len(self.records)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.records)

    @property
    def overhead_bytes(self) -> int:
        """Fingerprint headers: one per message that carried payload (empty messages are not sent)."""
        return self.header_bytes * sum(1 for r in self.records if r.bytes)

    def by_phase(self) -> dict:
        """phase -> {"messages", "bytes"}."""
        out = defaultdict(lambda: {"messages": 0, "bytes": 0})
        for r in self.records:
            d = out[r.phase or "(untagged)"]
            d["messages"] += 1
            d["bytes"] += r.bytes
        return dict(out)

    def by_link(self) -> dict:
        """(src, dst) -> {"messages", "bytes"}."""
        out = defaultdict(lambda: {"messages": 0, "bytes": 0})
        for r in self.records:
            d = out[(r.src, r.dst)]
            d["messages"] += 1
            d["bytes"] += r.bytes
        return dict(out)

    def summary(self) -> str:
        lines = [f"{'phase':<20} {'messages':>9} {'bytes':>15}"]
        for ph, d in sorted(self.by_phase().items()):
            lines.append(f"{ph:<20} {d['messages']:>9} {d['bytes']:>15,}")
        if self.header_bytes:
            lines.append(
                f"{'+ fingerprints':<20} {'':>9} {self.overhead_bytes:>15,}  "
                f"({self.header_bytes} B per message, not in the payload counts)"
            )
        return "\n".join(lines)

    def chrome_trace(self) -> dict:
        """Trace Event Format: one complete ("X") event per message on its sender's row."""
        t_min = min((r.t0 for r in self.records), default=0.0)
        events = []
        for r in self.records:
            src, dst, nb, seq, rnd, phase, op, algo, t0, t1 = r
            events.append(
                {
                    "name": f"{op} -> {dst}",
                    "cat": phase or op,
                    "ph": "X",
                    "pid": 0,
                    "tid": src,
                    "ts": (t0 - t_min) * 1e6,
                    "dur": max((t1 - t0) * 1e6, 0.01),
                    "args": {
                        "src": src,
                        "dst": dst,
                        "bytes": nb,
                        "seq": seq,
                        "round": rnd,
                        "phase": phase,
                        "algo": algo,
                    },
                }
            )
        for rank in sorted({r.src for r in self.records}):
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": rank, "args": {"name": f"rank {rank}"}})
        return {"traceEvents": events, "displayTimeUnit": "ns"}

    def write_chrome_trace(self, path) -> None:
        write_json(path, self.chrome_trace())
