"""Serving policy as one object (vLLM v1's ``SchedulingPolicy`` and its request queues): the order the waiting
queue is served in, which waiting request is tried next for admission, which running request gives way when the
pool is full, and which swapped-out request comes back first.

- ``fcfs`` -- first come, first served (vLLM's default): the oldest arrival first; a request preempted by
  recompute goes back to the head of the queue (``prepend_request``), and the latest arrival is preempted first,
  so the oldest keep their progress.
- ``priority`` -- vLLM's ``--scheduling-policy priority``: each request's ``priority`` (lower served first, ties
  by arrival); the waiting queue is a heap on (priority, arrival) -- a preempted request goes back in at its
  place there -- and the victim is the running request with the largest (priority, arrival).

A policy is one class and one :func:`register` line; :class:`~netmorph.serving.scheduler.Scheduler` and
:class:`~netmorph.serving.engine.Engine` ask it and name none.
"""

from __future__ import annotations

from netmorph.errors import UsageError


class Policy:
    """The FCFS order; a subclass changes :meth:`key` (and where a preempted request goes back)."""

    name = "fcfs"
    help = "first come, first served (vLLM's default)"

    def key(self, r) -> tuple:
        """The order requests are served in: lower first."""
        return r.arrival, r.rid

    def order(self, waiting: list) -> None:
        """Sort the waiting queue in place: a preempted request (it has computed or generated tokens before)
        ahead of new ones, each group by :meth:`key`."""
        waiting.sort(key=lambda r: (r.computed == 0 and r.generated == 0, *self.key(r)))

    def next_to_admit(self, waiting: list):
        """The waiting request admission tries next (head-of-line: nothing behind it jumps the queue)."""
        return waiting[0] if waiting else None

    def victim(self, running: list):
        """The running request that gives way when the pool cannot hold the batch."""
        return max(running, key=self.key)

    def requeue(self, waiting: list, r) -> None:
        """A request preempted by recompute goes back to the waiting queue."""
        waiting.insert(0, r)

    def next_to_swap_in(self, swapped: list):
        """The swapped-out request brought back first."""
        return min(swapped, key=self.key)


class PriorityPolicy(Policy):
    name = "priority"
    help = "each request's priority, lower first, ties by arrival (vLLM's --scheduling-policy priority)"

    def key(self, r) -> tuple:
        return r.priority, r.arrival, r.rid

    def order(self, waiting: list) -> None:
        waiting.sort(key=self.key)

    def requeue(self, waiting: list, r) -> None:
        waiting.append(r)
        self.order(waiting)


POLICIES: dict = {}


def register(cls) -> type:
    """Make a policy class known by its ``name`` (``serve --scheduling-policy NAME``)."""
    POLICIES[cls.name] = cls
    return cls


register(Policy)
register(PriorityPolicy)


def policy(name: str) -> Policy:
    """The policy called ``name``, or the one line listing the known ones."""
    if name not in POLICIES:
        raise UsageError(
            f"{{scheduling_policy}} must be one of {', '.join(POLICIES)}, got {name!r}", "scheduling_policy"
        )
    return POLICIES[name]()
