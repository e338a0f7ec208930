"""Errors a user can fix by changing an argument (a flag, on the command line).

Library code raises :class:`UsageError` with ``argument`` naming the parameter at
fault (``world``, ``nbytes``, ``root``) and a text in which ``{name}`` placeholders
stand for parameters. ``str(e)`` spells them as the library's parameter names
("world must be >= 1"); the CLI calls :meth:`UsageError.render` with its own
flag table ("--world must be >= 1") and prints one line, exit code 2, never a
traceback. Library callers get an ordinary ``ValueError`` subclass.
"""

from __future__ import annotations

import importlib.util
import re
import sys

_PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_]*)\}")


class UsageError(ValueError):
    """Bad input: ``argument`` is the parameter to change; the text says what is wrong with it."""

    def __init__(self, text: str, argument: str | None = None):
        self.text, self.argument = text, argument
        super().__init__(self.render())

    def render(self, flags: dict | None = None) -> str:
        """The message with each ``{name}`` spelled as a parameter (``flags`` None) or as a flag:
        ``flags.get(name)``, else ``--name`` with dashes."""
        return spell(self.text, flags)


def spell(text: str, flags: dict | None = None) -> str:
    """``text`` with each ``{name}`` placeholder as a parameter name (``flags`` None) or a command's flag:
    ``flags.get(name)``, else ``--name`` with dashes (the one place a parameter becomes a flag)."""

    def one(m):
        name = m.group(1)
        if flags is None:
            return name
        return flags.get(name, "--" + name.replace("_", "-"))

    return _PLACEHOLDER.sub(one, text)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread by the CLI's handler so that every ``finally`` runs (ranks
    stopped, temporary files and store folders removed) before the command exits 143, as a shell
    reports a process SIGTERM ended (128 + 15). A KeyboardInterrupt, so every Ctrl-C path covers it."""


# what to install for each package an optional part of netmorph imports
INSTALL = {
    "torch": "pip install torch (the CPU build: pip install torch --index-url https://download.pytorch.org/whl/cpu)"
}


class MissingPackage(ImportError):
    """A package a part of netmorph needs is not installed: one line saying what to install.
    The CLI prints it and exits 3 (2 is bad input, 1 a wrong result)."""

    def __init__(self, package: str, what: str):
        self.package, self.what = package, what
        super().__init__(
            f"{what} needs {package}, which is not installed: {INSTALL.get(package, 'pip install ' + package)}"
        )


def require(package: str, what: str) -> None:
    """Raise :class:`MissingPackage` unless ``package`` can be imported (without importing it)."""
    if package in sys.modules:
        if sys.modules[package] is None:  # import blocked (python -X importtime tests, sys.modules poke)
            raise MissingPackage(package, what)
        return
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingPackage(package, what)
