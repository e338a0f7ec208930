"""``netmorph`` command line: one module per subcommand, argparse.

Bad input is one line on stderr naming the flag to change, exit code 2, never a
traceback; Ctrl-C exits 130 without one. Library errors name a parameter
(:class:`~netmorph.errors.UsageError`); each subcommand's ``FLAGS`` table says
which flag sets which parameter where the names differ (``count`` -> ``--bytes``),
and every other parameter ``x_y`` is the flag ``--x-y``.
"""

from __future__ import annotations

import argparse
import sys

from netmorph.errors import UsageError
from netmorph.runtime.launch import LaunchError


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (prog: error: ...) and exit 2."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def check_output_file(path: str, flag: str) -> None:
    """Before any work: the directory an output file goes to exists and is writable."""
    import os
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d) or not os.access(d, os.W_OK):
        raise UsageError(f"{flag}: cannot write to {d}")


def build_parser() -> Parser:
    from netmorph.cli import bench, collective, mesh, plan, sgd, tour, train
    p = Parser(prog="netmorph", description="See, measure and run the distributed system under a large model.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for mod in (collective, bench, train, sgd, plan, tour, mesh):
        mod.add_parser(sub)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except UsageError as e:
        sys.stderr.write(f"netmorph {args.command}: error: {e.render(getattr(args, 'flags', {}))}\n")
        return 2
    except LaunchError as e:         # a rank failed: the launcher's root cause, as torchrun prints it
        sys.stderr.write(f"netmorph {args.command}: {e}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("netmorph: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
