"""Errors a user can fix by changing a flag or an argument.

The CLI turns a :class:`UsageError` into one line on stderr and exit code 2
(never a traceback); library callers get an ordinary ``ValueError`` subclass.
"""


class UsageError(ValueError):
    """Bad input: the message names what to change (a flag, an argument)."""
