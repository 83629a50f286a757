"""The `ringfence` command: the client's commands, and those of what is installed beside it.

The client alone gives the commands that talk to a running server over gRPC. A distribution
that extends the command (the server: serve, sandbox, images, conformance, the event store's
actions, trace, demo, eval) declares an entry point in the group `ringfence.cli`
(extension.py); each is loaded here, so there is one `ringfence` script whatever is installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from importlib import metadata

from ringfence._version import __version__
from ringfence.cli import approvals, files, mcp, runs, submit, tools
from ringfence.cli.extension import ENTRY_POINT_GROUP, CommandLine
from ringfence.cli.options import connection_options


def build() -> tuple[argparse.ArgumentParser, CommandLine]:
    """The parser with the client's commands and every installed extension's."""
    # `ringfence mcp` needs the MCP SDK (the `mcp` extra): without it the command is not listed
    # (the help lists only what works) and the epilog says how to get it.
    has_mcp = importlib.util.find_spec("mcp") is not None
    parser = argparse.ArgumentParser(
        prog="ringfence",
        description=("ringfence admits, authorizes and runs AI agents' tool calls in hardened, "
                     "single-use containers. These commands talk to a ringfence server over gRPC."),
        epilog=None if has_mcp else ("`ringfence mcp` (the MCP front door over stdio, for MCP hosts) comes with "
                                     "pip install 'ringfence[mcp]'."),
    )
    parser.add_argument("--version", action="version", version=f"ringfence {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = connection_options()
    submit.register(commands, common)
    files.register(commands, common)
    approvals.register(commands, common)
    approvals.register_whoami(commands, common)
    runs_parser, runs_actions = runs.register_runs(commands, common)
    runs.register_run(commands, common)
    tools_parser = tools.register(commands, common)
    if has_mcp:
        mcp.register(commands, common)
    cli = CommandLine(commands=commands, runs=runs_parser, runs_actions=runs_actions, tools=tools_parser)
    for entry in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            extend = entry.load()
        except ImportError as e:  # a broken install beside us must not take the client's commands down
            print(f"ringfence: the commands of {entry.value} could not be loaded ({e}); "
                  "reinstall that distribution", file=sys.stderr)
            continue
        extend(cli)
    return parser, cli


def main(argv: list[str] | None = None) -> int:
    parser, cli = build()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["mcp"] and importlib.util.find_spec("mcp") is None:
        # Not a typo but a missing extra: say how to get the command rather than "invalid choice".
        parser.error(f"`ringfence mcp` needs the MCP SDK: {mcp.EXTRA_HINT}")
    args = parser.parse_args(cli.route(argv))
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
