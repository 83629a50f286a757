"""`ringfence tools [QUERY]`: a server's tools, over gRPC. Actions beside it (`tools new|check`,
your own tools, from the server's distribution) are added by an extension:
extension.CommandLine.add_tool_action."""

from __future__ import annotations

import argparse
import json

from ringfence.cli.connection import Settings, connect
from ringfence.cli.errors import EXIT_OK
from ringfence.cli.failures import guarded
from ringfence.cli.options import SubParsers, add_command
from ringfence.cli.output import Output, jsonable


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


def register(subparsers: SubParsers, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`tools [QUERY]`, with the connection options `common`; returns its parser."""
    p = add_command(
        subparsers, "tools", common,
        help="the tools: names, descriptions, JSON Schemas (gRPC)",
        description=("List the tools an agent may propose, with each one's description and the JSON Schema "
                     "its arguments must satisfy. QUERY narrows the list to the tools that match it."),
        examples="  ringfence tools\n  ringfence tools credit --json")
    p.add_argument("query", metavar="QUERY", nargs="?", default="", help="narrow to tools matching this text")
    p.set_defaults(func=guarded("tools", cmd_tools))
    return p
