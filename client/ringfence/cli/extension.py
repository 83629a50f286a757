"""What a package that adds commands to `ringfence` is given: `CommandLine`.

The client owns the one `ringfence` command. A distribution installed beside it (the server:
`serve`, `sandbox`, `images`, the event store's actions) declares an entry point in the group
`ringfence.cli` naming a function `extend(cli: CommandLine) -> None`; main.py calls each one
after adding the client's own commands. Without such a distribution, `ringfence --help` lists
only what the client can do.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from ringfence.cli.errors import EXIT_USAGE
from ringfence.cli.options import CONNECTION_DESTS, SubParsers, wrap

ENTRY_POINT_GROUP = "ringfence.cli"

Command = Callable[[argparse.Namespace], int]
AddParser = Callable[[SubParsers, str], argparse.ArgumentParser]


@dataclass
class CommandLine:
    """The parser being built, and the places an extension may add to."""

    commands: SubParsers
    """`ringfence COMMAND`: add commands of your own here."""
    runs: argparse.ArgumentParser
    """`ringfence runs`: lists runs over gRPC; extend_runs adds local actions under it."""
    runs_actions: SubParsers
    tools: argparse.ArgumentParser
    """`ringfence tools [QUERY]`: lists a server's tools; add_tool_action adds `tools ACTION`."""
    tool_actions: dict[str, argparse.ArgumentParser] = field(default_factory=dict)

    def extend_runs(self, add_actions: Callable[[SubParsers], dict[str, argparse.ArgumentParser]],
                    description: str) -> None:
        """Actions under `ringfence runs` that read local state, not a server (the event store's).

        The connection options are taken at `runs` level too (`ringfence runs --json`), so each
        action is wrapped to refuse them: it would otherwise silently ignore them."""
        for name, parser in add_actions(self.runs_actions).items():
            parser.set_defaults(func=_local_only(name, parser.get_default("func")))
        self.runs.description = (self.runs.description or "") + "\n\n" + wrap(description)

    def add_tool_action(self, name: str, add_parser: AddParser, description: str = "") -> None:
        """`ringfence tools NAME ...`. argparse cannot give one command both an optional
        positional and sub-commands, so the action is a parser of its own named "tools NAME"
        (which no one types as one word, and which carries no help line, so `ringfence --help`
        lists `tools` once); `route` sends `tools NAME ...` to it. A query that is literally
        NAME is `ringfence tools -- NAME`."""
        self.tool_actions[name] = add_parser(self.commands, f"tools {name}")
        if description:
            self.tools.description = (self.tools.description or "") + "\n\n" + wrap(description)

    def route(self, argv: list[str]) -> list[str]:
        """["tools", "new", ...] -> ["tools new", ...] for a registered action; else unchanged."""
        if len(argv) >= 2 and argv[0] == "tools" and argv[1] in self.tool_actions:
            return [f"tools {argv[1]}", *argv[2:]]
        return argv


def _local_only(name: str, original: Command) -> Command:
    """The local action `name`'s func, refusing the connection options (given at `runs` level)."""

    def run(args: argparse.Namespace) -> int:
        given = [f"--{d.replace('_', '-')}" for d in CONNECTION_DESTS if hasattr(args, d)]
        if given:
            print(f"error: `ringfence runs {name}` reads the event store directly and takes no {', '.join(given)}; "
                  f"to ask a server, use `ringfence run RUN_ID` (or `ringfence runs` to list)", file=sys.stderr)
            return EXIT_USAGE
        return original(args)

    return run
