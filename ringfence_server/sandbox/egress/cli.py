"""`ringfence sandbox exec --egress-allow HOST[:PORT],... -- CMD`: run through the egress proxy.

    add_exec_arguments(parser)        adds --egress-allow, --egress-max-bytes, --egress-max-connections
    profile_egress_from_args(args)    -> EgressGrant | None (None when --egress-allow is absent)

Without --egress-allow the command has no network at all, as always.
"""

from __future__ import annotations

import argparse

from ringfence_server.sandbox.egress.grant import EgressGrant, MiB


def _size(text: str) -> int:
    units = {"k": 1024, "kib": 1024, "m": MiB, "mib": MiB, "g": 1024 * MiB, "gib": 1024 * MiB, "": 1}
    t = text.strip().lower()
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):]
    if not num or unit not in units:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 64m or 1048576")
    return int(float(num) * units[unit])


def add_exec_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("egress (default: no network at all)")
    group.add_argument(
        "--egress-allow", action="append", default=None, metavar="HOST[:PORT],...",
        help="hosts the command may reach through the egress proxy: exact names or *.suffix; "
             "no port = 80 and 443 (repeatable, comma-separated)")
    group.add_argument("--egress-max-bytes", type=_size, default=None, metavar="SIZE",
                       help="byte ceiling over all connections, up+down (default 64MiB)")
    group.add_argument("--egress-max-connections", type=int, default=None, metavar="N",
                       help="connection ceiling (default 32)")


def profile_egress_from_args(args: argparse.Namespace) -> EgressGrant | None:
    """The EgressGrant the flags describe (ProfileError when malformed), or None."""
    entries = getattr(args, "egress_allow", None)
    max_bytes = getattr(args, "egress_max_bytes", None)
    max_conns = getattr(args, "egress_max_connections", None)
    if not entries:
        if max_bytes is not None or max_conns is not None:
            raise argparse.ArgumentTypeError("--egress-max-* need --egress-allow")
        return None
    patterns = tuple(p.strip() for entry in entries for p in entry.split(",") if p.strip())
    kwargs = {}
    if max_bytes is not None:
        kwargs["max_bytes"] = max_bytes
    if max_conns is not None:
        kwargs["max_connections"] = max_conns
    return EgressGrant(allow=patterns, **kwargs)
