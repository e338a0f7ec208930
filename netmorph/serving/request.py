"""A request and its life (vLLM v1's ``Request`` and ``RequestStatus``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class RequestStatus(str, Enum):
    """Where a request is: queued, in the batch, its blocks on the host, done, or refused at admission."""

    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"

    def __str__(self) -> str:
        return self.value


@dataclass
class Request:
    rid: int
    prompt: list
    output_len: int
    arrival: float
    tokens: list = field(default_factory=list)  # prompt + generated
    computed: int = 0  # tokens whose KV is in the cache
    status: RequestStatus = RequestStatus.WAITING
    first_token_at: float | None = None
    finished_at: float | None = None
    swapped: int = 0  # blocks it holds in the host pool while swapped out
    reason: str = ""
    n: int = 1  # parallel samples (vLLM's SamplingParams.n)
    parent: int | None = None  # a sample forked from this request id
    priority: int = 0  # lower served first under the priority policy (vLLM's)

    @property
    def generated(self) -> int:
        return len(self.tokens) - len(self.prompt)


def sample_id(rid: int, k: int) -> int:
    """The id of request ``rid``'s k-th parallel sample (k = 0 is the request itself)."""
    return rid + k * 1_000_000_000
