"""``netmorph`` command line: one module per subcommand, argparse.

Bad input is one line on stderr naming the flag to change, exit code 2, never a
traceback; a missing package is one line saying what to install, exit code 3; a
failed rank or a wrong result exits 1; Ctrl-C exits 130 without a traceback. Library errors name a parameter
(:class:`~netmorph.errors.UsageError`); each subcommand's ``FLAGS`` table says
which flag sets which parameter where the names differ (``count`` -> ``--bytes``),
and every other parameter ``x_y`` is the flag ``--x-y``.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
from contextlib import contextmanager

from netmorph.cli.flags import EMPTY, exact_int, finite_float, seed_int
from netmorph.errors import INSTALL, MissingPackage, Terminated, UsageError
from netmorph.runtime.launch import LaunchError


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (prog: error: ...) and exit 2, with a "did you mean" where a
    choice or a flag is one typo away."""

    def error(self, message):
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            guess = difflib.get_close_matches(m.group(1), re.findall(r"'([^']*)'", m.group(2)), n=1)
            if guess:
                message += f"; did you mean {guess[0]!r}?"
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)

    def unrecognized(self, extras) -> None:
        """Flags this command does not have: one line from the command's own parser, with the nearest flag."""
        first = extras[0]
        flags = [o for a in self._actions for o in a.option_strings if o not in ("-h", "--help")]
        guess = difflib.get_close_matches(first.split("=")[0], flags, n=1) if first.startswith("-") else []
        self.error(
            f"unrecognized argument{'s' if len(extras) > 1 else ''}: {' '.join(extras)}"
            + (f"; did you mean {guess[0]}?" if guess else "")
        )

    def first_unknown_flag(self, tokens):
        """The first token that argparse will read as a flag this parser does not have (``--flag``,
        ``--flag=value``, ``-x``), or None. argparse itself would first hand the value after an unknown flag
        to an optional positional (``serve --scheduling-policy x`` read ``x`` as serve's action and said
        ``invalid choice: 'x'``), so the flag is found before it parses; a ``--`` ends the flags."""
        flags = [o for a in self._actions for o in a.option_strings]
        for tok in tokens:
            if tok == "--":
                return None
            if not re.match(r"-{1,2}[A-Za-z]", tok) or (" " in tok and "=" not in tok.split(" ", 1)[0]):
                continue  # a value, as argparse reads it ("--a 1" with a space)
            name = tok.split("=", 1)[0]
            if name in flags or (not tok.startswith("--") and tok[:2] in flags):
                continue
            if tok.startswith("--") and sum(f.startswith(name) for f in flags if f.startswith("--")) == 1:
                continue  # argparse's unambiguous abbreviation
            return tok
        return None


def action_only(p, action: str, dests) -> None:
    """Mark ``p``'s flags ``dests`` as belonging to its action word ``action`` alone: given with another action
    (``morph reshard --plot x.png``) they are one line naming them, not silently ignored (:func:`check_action`)."""
    defaults = {a.dest: (a.option_strings[0], a.default) for a in p._actions if a.dest in dests}
    owned = dict(p.get_default("action_owned") or {})
    owned.update({d: (action, *defaults[d]) for d in dests})
    p.set_defaults(action_owned=owned)


def check_action(args) -> None:
    """A flag :func:`action_only` marked for another action than ``args.action``: UsageError naming it."""
    for dest, (action, flag, default) in (getattr(args, "action_owned", None) or {}).items():
        if args.action != action and getattr(args, dest, default) != default:
            raise UsageError(f"{flag} is for `netmorph {args.command} {action}`, not {args.action}; leave it out")


def json_text(obj, indent: int | None = None) -> str:
    """What ``--json`` prints for ``obj``: numpy values as numbers, sets as sorted lists."""
    return json.dumps(obj, indent=indent, default=_plain)


def print_json(obj, indent: int | None = None) -> None:
    """``--json``: the whole object encoded first, then written in one piece (an object that cannot be
    encoded raises before anything reaches stdout, never a half-written document)."""
    sys.stdout.write(json_text(obj, indent) + "\n")


def _plain(o):
    if hasattr(o, "tolist"):  # numpy scalars and arrays
        return o.tolist()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    if hasattr(o, "__float__"):
        return float(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def job_split(args, inner: tuple, cap: int) -> int | None:
    """The processes of a run split ``inner`` (flag names whose product is one model replica: ``("tp", "pp")``)
    times ``args.dp``. Under torchrun the job is the run: its WORLD_SIZE sets ``--dp`` when not given and must
    equal the product, and ``--backend`` defaults to torch (local, which forks its own ranks, is refused);
    outside it ``--dp`` defaults to 1, the backend to local, and at most ``cap`` processes run on this machine.
    Sets ``args.dp`` and ``args.backend``; returns torchrun's WORLD_SIZE, or None."""
    from netmorph.runtime.env import torchrun_world

    job = torchrun_world()
    names = " x ".join(f"--{k}" for k in inner)
    for k in inner:
        if getattr(args, k) < 1:
            raise UsageError(f"--{k} must be >= 1, got {getattr(args, k)}")
    size = math.prod(getattr(args, k) for k in inner)
    if job is not None:
        if args.backend == "local":
            raise UsageError("--backend local cannot span torchrun's processes; use torch or torch-native")
        args.backend = args.backend or "torch"
        if job % size:
            raise UsageError(f"{names} = {size} does not divide torchrun's WORLD_SIZE {job}")
        if args.dp is None:
            args.dp = job // size
        if size * args.dp != job:
            raise UsageError(f"{names} x --dp = {size * args.dp} != torchrun's WORLD_SIZE {job}")
    args.backend = args.backend or "local"
    args.dp = 1 if args.dp is None else args.dp
    if job is None and size * args.dp > cap:
        raise UsageError(f"{names} x --dp = {size * args.dp} processes; keep it <= {cap} on one machine")
    return job


def _subparsers(p: argparse.ArgumentParser):
    return next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)


COMMANDS = (
    "collective",
    "bench",
    "train",
    "moe",
    "elastic",
    "serve",
    "failures",
    "sgd",
    "plan",
    "simulate",
    "morph",
    "calibrate",
    "validate",
    "tour",
    "mesh",
    "lighthouse",
    "launch",
)


def build_parser() -> Parser:
    p = Parser(prog="netmorph", description="See, measure and run the distributed system under a large model.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name in COMMANDS:  # each netmorph.cli.<name> adds its subcommand, in --help's order
        importlib.import_module(f"netmorph.cli.{name}").add_parser(sub)
    for parser in sub.choices.values():  # every numeric flag: finite, bounded, one-line refusals
        for action in parser._actions:
            if action.type is float:
                action.type = finite_float
            elif action.type is int:
                action.type = seed_int if action.dest == "seed" else exact_int
    return p


def _check_arity(parser: Parser, args) -> None:
    """argparse drops a ``--`` given as a flag's value and stores an empty list: refuse it. An empty
    value (``--job-mtbf ''``) is an error too, not the flag left out: every reader of a flag here takes
    "" as absent."""
    sub = _subparsers(parser)
    parser = sub.choices[args.command]  # its errors say which command: netmorph failures: error: ...
    for action in parser._actions:
        if not action.option_strings:
            continue
        flag, value = action.option_strings[0], getattr(args, action.dest, None)
        values = value if isinstance(value, list) else [value]  # an append flag's, or the one
        if (action.nargs is None and value == [] and action.default != []) or any(isinstance(v, list) for v in values):
            parser.error(f"argument {flag}: expected one argument")  # --join=-- appends []
        if value != action.default and any(isinstance(v, str) and not v.strip() for v in values):
            parser.error(f"argument {flag}: {EMPTY}")


def _terminate(signum, frame):
    raise Terminated()


@contextmanager
def _private_torch_cache():
    """Importing ``torch._dynamo`` (a TorchDispatchMode, which calibrate and validate enter, needs it) makes
    torch's inductor cache folder in the temporary directory (``torchinductor_<user>``); a command keeps it in
    a folder of its own instead, removed on every exit path -- unless the user chose one
    (``TORCHINDUCTOR_CACHE_DIR``)."""
    key = "TORCHINDUCTOR_CACHE_DIR"
    if key in os.environ:
        yield
        return
    path = os.path.join(tempfile.gettempdir(), f".netmorph-inductor-{os.getpid()}")
    os.environ[key] = path
    try:
        yield
    finally:
        os.environ.pop(key, None)
        shutil.rmtree(path, ignore_errors=True)


def main(argv=None) -> int:
    """Run one command; SIGTERM unwinds it like Ctrl-C (every cleanup runs) and exits 143."""
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: leave signals to whoever runs us
        previous = None
    try:
        with _private_torch_cache():
            return _main(argv)
    except KeyboardInterrupt as e:  # before a command started, or while its error was being printed
        sys.stderr.write("netmorph: terminated (SIGTERM)\n" if isinstance(e, Terminated) else "netmorph: interrupted\n")
        return 143 if isinstance(e, Terminated) else 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main(argv=None) -> int:
    parser = build_parser()
    try:
        tokens = sys.argv[1:] if argv is None else list(argv)
        command = next((t for t in tokens if not t.startswith("-")), None)
        commands = _subparsers(parser).choices
        if command in commands:
            unknown = commands[command].first_unknown_flag(tokens[tokens.index(command) + 1 :])
            if unknown is not None:
                commands[command].unrecognized([unknown])
        args, extras = parser.parse_known_args(argv)
        if extras:
            _subparsers(parser).choices[args.command].unrecognized(extras)
        _check_arity(parser, args)
    except SystemExit as e:  # --help (0) and argparse's one-line refusals (2), as a return code
        return e.code if isinstance(e.code, int) else 2
    try:
        return int(args.run(args) or 0)
    except UsageError as e:
        sys.stderr.write(f"netmorph {args.command}: error: {e.render(getattr(args, 'flags', {}))}\n")
        return 2
    except MissingPackage as e:
        sys.stderr.write(f"netmorph {args.command}: {e}\n")
        return 3
    except ModuleNotFoundError as e:  # a missing package no require() anticipated: still one line
        if e.name is None or e.name.split(".")[0] not in INSTALL:
            raise
        sys.stderr.write(f"netmorph {args.command}: {MissingPackage(e.name.split('.')[0], 'this command')}\n")
        return 3
    except LaunchError as e:  # a rank failed: the launcher's root cause, as torchrun prints it
        sys.stderr.write(f"netmorph {args.command}: {e}\n")
        return 1
    except Terminated:
        sys.stderr.write(f"netmorph {args.command}: terminated (SIGTERM); every rank stopped, nothing left behind\n")
        return 143
    except KeyboardInterrupt:
        sys.stderr.write("netmorph: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
