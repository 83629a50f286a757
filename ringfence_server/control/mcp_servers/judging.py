"""`ringfence mcp-servers judge FOLDER TOOL ...`: the operator's judgement of one tool, written
into the server's declaration as its [tools.TOOL] table (the commented template `pin` left for
it goes). What a tool may do is the operator's to say: this is the one place it is said, and
nothing is defaulted (a read says so with --reads; a mutation says whether it can be undone).
A tool judged already is refused: its table is edited by hand, where the change is visible.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ringfence.errors import ConfigError
from ringfence_server.control.mcp_servers.declaration import SERVER_FILE, load_server, read_listing
from ringfence_server.control.mcp_servers.scaffold import toml_key

TEMPLATE_HEADER = ("# Judge each tool: uncomment its table and say what it does; a tool without a table is "
                   "never exposed.\n")
"""The line `pin` writes above the templates (ringfence_server.control.mcp_servers.pinning)."""


@dataclass(frozen=True)
class Judgement:
    mutates: bool
    reversible: bool
    cost: float = 0.0
    expose: bool = True

    def table(self, tool: str) -> str:
        from ringfence_server.control.mcp_servers.scaffold import tool_table

        return tool_table(tool, {"mutates": self.mutates, "reversible": self.reversible, "cost": float(self.cost),
                                 "expose": None if self.expose else False})


def judge(folder: Path, tool: str, judgement: Judgement) -> Path:
    """Write `judgement` as TOOL's table in FOLDER/server.toml; ConfigError when the tool is not
    pinned, already judged, or the result would not load."""
    folder = Path(folder)
    path = folder / SERVER_FILE
    if tool not in read_listing(folder):
        raise ConfigError(f"{folder}:tools.{tool}", "the server does not list it (tools.json); pin it first")
    text = path.read_text(encoding="utf-8")
    if tool in (tomllib.loads(text).get("tools") or {}):
        raise ConfigError(f"{path}:tools.{tool}", "is judged already: edit its table in server.toml")
    if judgement.cost < 0:
        raise ConfigError(f"{path}:tools.{tool}.cost", "must be a non-negative number")
    # The template `pin` wrote: the tool's description and the server's claims, "# [tools.TOOL]"
    # and its commented keys; and the header, once no template is left.
    template = re.compile(rf"^(?:# {re.escape(tool)}: .*\n)?(?:# \(the server says .*\n)?"
                          rf"# \[tools\.{re.escape(toml_key(tool))}\]\n(?:# .*\n)*\n?", re.M)
    text = template.sub("", text)
    if "# [tools." not in text:
        text = text.replace(TEMPLATE_HEADER, "")
    text = re.sub(r"\n{3,}", "\n\n", text).rstrip("\n")
    before = path.read_text(encoding="utf-8")
    path.write_text(text + "\n\n" + judgement.table(tool), encoding="utf-8")
    try:
        load_server(folder)
    except ConfigError:
        path.write_text(before, encoding="utf-8")
        raise
    return path
