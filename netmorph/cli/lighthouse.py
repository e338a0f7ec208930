"""``netmorph lighthouse --port P``: the store a cluster's nodes agree through (torchft's lighthouse)."""

from __future__ import annotations

import socket
import sys

from netmorph.cli.flags import int_in
from netmorph.errors import UsageError, require


def add_parser(sub) -> None:
    p = sub.add_parser(
        "lighthouse",
        help="serve the store a cluster's nodes agree on membership through",
        description="Serve the lighthouse: the store every node's members meet in (membership views, "
        "heartbeats, each epoch's process group), torch's TCPStore, as torchft's "
        "lighthouse serves its quorum. It keeps nothing the members cannot give back: "
        "restarted, it is re-derived from them. Each node then runs torchrun ... -m "
        "netmorph elastic (or morph) --lighthouse HOST:PORT --node-index I --nodes N. "
        "Runs until SIGTERM or Ctrl-C.",
    )
    p.add_argument("--port", type=int_in(1, 65535), required=True, help="TCP port to listen on")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default all; 127.0.0.1: this host)")
    p.set_defaults(run=run)


def listenable(host: str) -> None:
    """``host`` names an address of this machine, or the one line that says so (before torch's store, which
    retries an address it cannot bind for half a minute)."""
    try:
        family, kind, _, _, addr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind) as s:
            s.bind(addr)
    except (OSError, UnicodeError, ValueError) as e:
        raise UsageError(
            f"--host {host!r} is not an address this machine can listen on ({e}); give one of its "
            f"addresses, 0.0.0.0 for all or 127.0.0.1 for this host only",
            "host",
        ) from None


def run(args) -> int:
    require("torch", "netmorph lighthouse")
    listenable(args.host)
    from netmorph.elastic.lighthouse import serve

    serve(
        args.port,
        args.host,
        ready=lambda: print(
            f"# netmorph lighthouse: listening on {args.host}:{args.port}", file=sys.stderr, flush=True
        ),
    )
    return 0
