"""The parser pieces every gRPC command shares: the connection options, the epilog with the
defaults and exit codes, and `add_command`, which adds a command with both and its examples."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any, TypeAlias

from ringfence.cli.connection import DEFAULT_SERVER, DEFAULT_TIMEOUT_S, SERVER_ENV, TLS_CA_ENV, TOKEN_ENV

SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What `add_subparsers` returns: where a command (or a command's action) is added."""

COMMON_EPILOG = """
defaults:
  the server is --server, else $RINGFENCE_SERVER, else 127.0.0.1:50051; the bearer token is
  read from $RINGFENCE_TOKEN (or the variable --token-env names), never from the command line.

exit codes: 0 done; 1 the server answered with an error or could not be reached;
  2 bad usage, a missing token, or a request the server refused as invalid.
"""
"""The end of every command's --help: where the server and the token come from, the exit codes."""

CONNECTION_DESTS = ("server", "token_env", "tls", "tls_ca", "tls_cert", "tls_key", "tls_server_name", "timeout",
                    "json")
"""Where connection_options() stores each option: present in the parsed arguments only when given."""


def connection_options() -> argparse.ArgumentParser:
    """The common options. Defaults are SUPPRESSed so that an option given at `approvals` or
    `runs` level is not reset by the same option's default at the action's level; the real
    defaults (environment, then built-in) are applied in settings_from."""
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("connection")
    S = argparse.SUPPRESS
    g.add_argument("--server", metavar="HOST:PORT", default=S,
                   help=f"the ringfence server (default: ${SERVER_ENV}, else {DEFAULT_SERVER})")
    g.add_argument("--token-env", metavar="NAME", default=S,
                   help=f"environment variable holding the bearer token (default {TOKEN_ENV}); "
                        "the token is never taken from the command line")
    g.add_argument("--tls", action="store_true", default=S, help="use TLS with the system's CA roots")
    g.add_argument("--tls-ca", metavar="CA.pem", default=S,
                   help=f"use TLS, trusting this PEM CA (default: ${TLS_CA_ENV} if set)")
    g.add_argument("--tls-cert", metavar="CERT.pem", default=S, help="client certificate for mTLS (with --tls-key)")
    g.add_argument("--tls-key", metavar="KEY.pem", default=S, help="client private key for mTLS")
    g.add_argument("--tls-server-name", metavar="NAME", default=S,
                   help="the name to check the server's certificate against (when it differs from HOST)")
    g.add_argument("--timeout", metavar="SECONDS", type=float, default=S,
                   help=f"per request, not for followed streams (default {DEFAULT_TIMEOUT_S:g})")
    g.add_argument("--json", action="store_true", default=S,
                   help="machine-readable output: one JSON object per line (errors: one on stderr)")
    return common


def wrap(text: str) -> str:
    """Paragraphs wrapped to 88 columns; indented blocks (examples) kept as they are."""
    out = []
    for para in text.split("\n\n"):
        out.append(para if para.startswith(" ") else textwrap.fill(" ".join(para.split()), 88))
    return "\n\n".join(out)


def add_command(sub: SubParsers, name: str, common: argparse.ArgumentParser, *, help: str, description: str,
                examples: str, **kw: Any) -> argparse.ArgumentParser:
    """Add the command `name` to `sub` with the options `common`, its `description` wrapped, and an
    epilog of its `examples` and COMMON_EPILOG; abbreviated options are refused (a prefix of
    --token-env must not be taken for another option)."""
    return sub.add_parser(
        name, parents=[common], help=help, description=wrap(description), allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n" + examples.rstrip() + "\n" + COMMON_EPILOG, **kw)
