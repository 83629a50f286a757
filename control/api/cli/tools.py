"""`ringfence tools [QUERY]` (a server's tools, over gRPC) and, composed under the same command,
`ringfence tools new|check` (your own tools, without a server: control.toolpkg.cli).

argparse cannot give one command both an optional positional and sub-commands, so `new` and
`check` are parsers of their own, registered under the names "tools new" and "tools check" (which
no one types as one word, and which carry no help line, so `ringfence --help` lists `tools` once);
`route` sends `tools new ...` and `tools check ...` to them. A query that is literally "new" or
"check" is `ringfence tools -- new`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from control.api.cli.connection import Settings, connect
from control.api.cli.errors import EXIT_OK
from control.api.cli.failures import guarded
from control.api.cli.options import SubParsers, add_command
from control.api.cli.output import Output, jsonable
from control.toolpkg import cli as toolpkg_cli

OWN_TOOL_ACTIONS: dict[str, Callable[[SubParsers, str], argparse.ArgumentParser]] = {
    "new": toolpkg_cli.add_new_parser,
    "check": toolpkg_cli.add_check_parser,
}
"""`tools ACTION`: the parser of each action on your own tools, added under "tools ACTION"."""


def route(argv: list[str]) -> list[str]:
    """["tools", "new", ...] -> ["tools new", ...]; anything else unchanged."""
    if len(argv) >= 2 and argv[0] == "tools" and argv[1] in OWN_TOOL_ACTIONS:
        return [f"tools {argv[1]}", *argv[2:]]
    return argv


def cmd_tools(args: argparse.Namespace, s: Settings, out: Output) -> int:
    """The server's tools matching QUERY, each with its description and JSON Schema."""
    with connect(s) as client:
        tools = client.list_tools(args.query or "")
    if out.json:
        for t in tools:
            out.obj(jsonable(t))
        return EXIT_OK
    for i, t in enumerate(tools):
        if i:
            out.line()
        out.line(f"{t.name}: {t.description}")
        schema = json.dumps(jsonable(t.schema), indent=2, ensure_ascii=False)
        out.line("  schema: " + schema.replace("\n", "\n  "))
    return EXIT_OK


def register(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    """`tools [QUERY]`, with the connection options `common`, and `tools new|check` beside it."""
    p = add_command(
        subparsers, "tools", common,
        help="the tools: names, descriptions, JSON Schemas (gRPC); `tools new|check`: your own tools",
        description=("List the tools an agent may propose, with each one's description and the JSON Schema "
                     "its arguments must satisfy. QUERY narrows the list to the tools that match it. Your own "
                     "tools, without a server: `ringfence tools new NAME` scaffolds a tool package, `ringfence "
                     "tools check DIR...` checks one (each has --help; docs/TOOLS.md). A QUERY that is "
                     "literally new or check: `ringfence tools -- new`."),
        examples="  ringfence tools\n  ringfence tools credit --json\n  ringfence tools new jq_table\n"
                 "  ringfence tools check tools/jq_table --config ringfence.toml")
    p.add_argument("query", metavar="QUERY", nargs="?", default="", help="narrow to tools matching this text")
    p.set_defaults(func=guarded("tools", cmd_tools))
    for action, add_parser in OWN_TOOL_ACTIONS.items():
        add_parser(subparsers, f"tools {action}")
