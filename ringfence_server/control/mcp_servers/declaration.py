"""A declared MCP server: its folder, parsed into the manifests of the tools it exposes.

A declaration is a folder named after the server, holding two files:

    server.toml   the operator's: what runs and what each tool may do
    tools.json    the server's tools/list, pinned (`ringfence mcp-servers pin`): the names,
                  descriptions and input schemas calls are validated against. A server that
                  changes its tools later does not change what we check; `ringfence tools
                  check` reports the drift.

server.toml (every key but `[tools]` is required; docs/mcp-servers.md):

    name = "time"                     [a-z][a-z0-9_]{0,31}, the folder's name; tools are
                                      registered as time.<tool>
    image = "mcp-time"                an image of the images dir ([images] dir), pinned in its lock
    command = ["python3", ...]        the server's command in the image (stdio transport)
    egress_hosts = []                 hosts the server may reach, through the egress proxy;
                                      empty: no network at all
    workspace = ""                    "", "read" or "write": the run's workspace at /workspace
    runtime = "runc"                  optional: "runc" or "gvisor" (no egress under gvisor)
    [limits]                          the session sandbox's ceilings, within the [tools] caps;
                                      timeout_s is each call's wall time, stdout_limit each
                                      message's (and result's) size
    [tools.get_current_time]          one table per tool the operator has judged:
    mutates = false                   required: risk metadata is never defaulted, and never
    reversible = true                 taken from the server (its annotations, "read-only",
    cost = 0.0                        are ignored)
    expose = true                     optional (default true): false keeps it out of the registry
    description = "..."               optional: replaces the server's own
    url_arguments = ["url"]           optional: arguments checked against egress_hosts at
                                      admission, before the call reaches the server
    paths = {repo_path = ["/workspace"]}  optional: arguments that are paths, and the roots
                                      they must stay under (resource policy, at admission)

Only the tools with a table and `expose` true are registered: a tool the server lists and the
operator did not judge cannot be called (it is unknown to the registry, so refused at step 1).
Every check of a tool manifest applies (registry.parse_manifest: schema, limits, egress,
workspace), then the tool is renamed SERVER.TOOL and bound to the server (registry.McpBinding).
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringfence.errors import ConfigError
from ringfence_server.control.config import Config, ToolsConfig
from ringfence_server.control.registry import McpBinding, ToolManifest, parse_manifest

SERVER_FILE = "server.toml"
TOOLS_FILE = "tools.json"
SERVER_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
# What MCP allows in a tool's name (the spec: 1-128 of A-Z a-z 0-9 _ - .); the registered name
# SERVER.TOOL must also fit the wire's 64 characters.
MCP_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
MAX_REGISTERED_NAME = 64
_SERVER_KEYS = {"name", "image", "command", "egress_hosts", "workspace", "runtime", "limits", "tools"}
_TOOL_KEYS = {"mutates", "reversible", "cost", "expose", "description", "url_arguments", "paths"}
WORKSPACE_MODES = ("", "read", "write")


@dataclass(frozen=True)
class ServerDeclaration:
    name: str
    image: str
    command: tuple[str, ...]
    folder: Path
    manifests: tuple[ToolManifest, ...]
    """The exposed tools, registered as SERVER.TOOL."""
    listed: Mapping[str, Mapping[str, Any]]
    """tools.json: the server's tools as pinned, by their own names."""
    judged: tuple[str, ...]
    """The tools the operator gave a table (exposed or not)."""

    @property
    def source(self) -> Path:
        return self.folder / SERVER_FILE


def registered_name(server: str, tool: str) -> str:
    return f"{server}.{tool}"


def server_folders(folder: Path) -> list[Path]:
    """The declarations under `folder`: itself when it holds a server.toml, else each sub-folder
    that does (sorted; hidden folders ignored)."""
    folder = Path(folder)
    if (folder / SERVER_FILE).is_file():
        return [folder]
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and (p / SERVER_FILE).is_file())


def read_listing(folder: Path) -> dict[str, dict[str, Any]]:
    """tools.json: {"tools": [the server's tools/list entries]} -> by name."""
    path = Path(folder) / TOOLS_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ConfigError(str(path), "missing: pin the server's tools with `ringfence mcp-servers pin "
                                     f"{folder}`") from e
    except (OSError, ValueError) as e:
        raise ConfigError(str(path), f"cannot load: {e}") from e
    tools = doc.get("tools") if isinstance(doc, dict) else None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools):
        raise ConfigError(str(path), 'must be {"tools": [{"name": ..., "inputSchema": {...}}, ...]}')
    return {t["name"]: t for t in tools}


def load_server(folder: Path, caps: ToolsConfig | None = None) -> ServerDeclaration:
    """One declaration, checked as the server checks it (ConfigError naming the file and key)."""
    folder = Path(folder)
    source = folder / SERVER_FILE
    try:
        doc = tomllib.loads(source.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(str(source), f"cannot load: {e}") from e
    for key in doc:
        if key not in _SERVER_KEYS:
            raise ConfigError(f"{source}:{key}", "unknown key")
    name = doc.get("name")
    if not isinstance(name, str) or not SERVER_NAME.fullmatch(name):
        raise ConfigError(f"{source}:name", "must match [a-z][a-z0-9_]{0,31}")
    if name != folder.name:
        raise ConfigError(f"{source}:name", f"{name!r}: a server's folder is named after it "
                                            f"(this one is {folder.name!r})")
    command = doc.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) and "\0" not in a
                                                               for a in command):
        raise ConfigError(f"{source}:command", "must be a non-empty array of strings (the server's command)")
    workspace = doc.get("workspace", "")
    if workspace not in WORKSPACE_MODES:
        raise ConfigError(f"{source}:workspace", 'must be "", "read" or "write"')
    for key in ("image", "egress_hosts", "limits"):
        if key not in doc:
            raise ConfigError(f"{source}:{key}", "is required")
    tools = doc.get("tools", {})
    if not isinstance(tools, dict):
        raise ConfigError(f"{source}:tools", "must be a table of tool tables")
    listed = read_listing(folder)
    binding_command = tuple(command)
    manifests = []
    for tool, judged in tools.items():
        manifest = _tool_manifest(doc, source, name, tool, judged, listed, workspace, caps)
        if manifest is not None:
            manifests.append(dataclasses.replace(
                manifest, name=registered_name(name, tool),
                mcp=McpBinding(server=name, tool=tool, command=binding_command)))
    return ServerDeclaration(name=name, image=str(doc["image"]), command=binding_command, folder=folder,
                             manifests=tuple(manifests), listed=listed, judged=tuple(tools))


def _tool_manifest(doc: Mapping[str, Any], source: Path, server: str, tool: str, judged: Any,
                   listed: Mapping[str, Mapping[str, Any]], workspace: str,
                   caps: ToolsConfig | None) -> ToolManifest | None:
    """One judged tool's manifest (checked as any manifest is); None when it is not exposed."""
    from ringfence_server.control.toolpkg.packages import limit_problems

    where = f"{source}:tools.{tool}"
    if not isinstance(judged, dict):
        raise ConfigError(where, "must be a table")
    for key in judged:
        if key not in _TOOL_KEYS:
            raise ConfigError(f"{where}.{key}", "unknown key")
    expose = judged.get("expose", True)
    if not isinstance(expose, bool):
        raise ConfigError(f"{where}.expose", "must be true or false")
    if not MCP_TOOL_NAME.fullmatch(tool) or len(registered_name(server, tool)) > MAX_REGISTERED_NAME:
        raise ConfigError(where, f"{tool!r}: a tool's name is 1-128 of [A-Za-z0-9_.-], and "
                                 f"{registered_name(server, tool)!r} must fit {MAX_REGISTERED_NAME} characters")
    server_tool = listed.get(tool)
    if server_tool is None:
        raise ConfigError(where, f"the server does not list {tool!r} (tools.json); "
                                 "pin its tools again, or remove the table")
    if not expose:
        return None
    if "cost" not in judged:
        raise ConfigError(f"{where}.cost", "is required (risk metadata is never defaulted)")
    manifest_doc: dict[str, Any] = {
        "name": "mcp_tool",  # checked as any manifest is, then renamed SERVER.TOOL
        "description": judged.get("description") or server_tool.get("description") or tool,
        "schema": server_tool.get("inputSchema", {"type": "object"}),
        "mutates": judged.get("mutates"), "reversible": judged.get("reversible"), "cost": judged["cost"],
        "egress_hosts": doc.get("egress_hosts"), "limits": doc.get("limits"),
        "image": doc.get("image"), "runtime": doc.get("runtime", "runc"),
    }
    for key in ("url_arguments", "paths"):
        if key in judged:
            manifest_doc[key] = judged[key]
    if workspace:
        manifest_doc["workspace"] = workspace
    manifest = parse_manifest(manifest_doc, source=where)
    problems = limit_problems(manifest.limits, caps or ToolsConfig())
    if problems:
        key, why = problems[0]
        raise ConfigError(f"{source}:{key}", why)
    return manifest


def load_servers(config: Config) -> list[ServerDeclaration]:
    """Every declaration of `[mcp] servers`; a server declared twice is a ConfigError naming both."""
    seen: dict[str, ServerDeclaration] = {}
    for folder in config.mcp.servers:
        for path in server_folders(folder):
            decl = load_server(path, config.tools)
            if decl.name in seen:
                raise ConfigError(f"mcp.servers.{decl.name}", f"declared twice: in {seen[decl.name].source} "
                                                              f"and in {decl.source}")
            seen[decl.name] = decl
    return list(seen.values())
