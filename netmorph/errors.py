"""Errors a user can fix by changing an argument (a flag, on the command line).

Library code raises :class:`UsageError` with ``argument`` naming the parameter at
fault (``world``, ``nbytes``, ``root``) and a text in which ``{name}`` placeholders
stand for parameters. ``str(e)`` spells them as the library's parameter names
("world must be >= 1"); the CLI calls :meth:`UsageError.render` with its own
flag table ("--world must be >= 1") and prints one line, exit code 2, never a
traceback. Library callers get an ordinary ``ValueError`` subclass.
"""

from __future__ import annotations

import re

_PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_]*)\}")


class UsageError(ValueError):
    """Bad input: ``argument`` is the parameter to change; the text says what is wrong with it."""

    def __init__(self, text: str, argument: str | None = None):
        self.text, self.argument = text, argument
        super().__init__(self.render())

    def render(self, flags: dict | None = None) -> str:
        """The message with each ``{name}`` spelled as a parameter (``flags`` None) or as a flag:
        ``flags.get(name)``, else ``--name`` with dashes."""
        def spell(m):
            name = m.group(1)
            if flags is None:
                return name
            return flags.get(name, "--" + name.replace("_", "-"))
        return _PLACEHOLDER.sub(spell, self.text)
