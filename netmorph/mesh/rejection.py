"""Why a layout cannot run a model: the typed rejection every rule of the vocabulary returns."""

from __future__ import annotations

from dataclasses import dataclass

from netmorph.errors import UsageError

LIMIT = 1 << 24  # the largest degree, batch or count a layout takes


@dataclass(frozen=True)
class Rejection:
    """Why a layout cannot run a model: a stable ``key`` (the planner tallies by it), the ``field`` and
    ``value`` at fault, the sentence, and ``flag``: what to change, in the library's parameter names as
    placeholders (``"{tp} or {heads}"``) that each command spells as its own flags
    (:meth:`netmorph.errors.UsageError.render`, :func:`netmorph.errors.spell`).

    ``soft``: a rule of thumb rather than a rule (``plan estimate`` still prices it, with a warning)."""

    key: str
    field: str
    value: object
    text: str
    flag: str = ""
    soft: bool = False

    def __str__(self) -> str:
        return self.text

    def error(self) -> UsageError:
        """The one line a command prints: the reason and what to change."""
        return UsageError(f"{self.text}; change {self.flag or '{' + self.field + '}'}", self.field)


def in_range(owner, names, low: int = 1) -> list:
    """A range :class:`Rejection` for each of ``owner``'s integer fields ``names`` outside low..LIMIT."""
    return [
        Rejection("range", k, getattr(owner, k), f"{k} must be in {low}..{LIMIT:,}, got {getattr(owner, k)}")
        for k in names
        if not low <= getattr(owner, k) <= LIMIT
    ]


def one_of(owner, choices: dict) -> list:
    """A range :class:`Rejection` for each of ``owner``'s fields whose value is not among its choices."""
    return [
        Rejection("range", k, getattr(owner, k), f"{k} must be one of {', '.join(allowed)}, got {getattr(owner, k)!r}")
        for k, allowed in choices.items()
        if getattr(owner, k) not in allowed
    ]
