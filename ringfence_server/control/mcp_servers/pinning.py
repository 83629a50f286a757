"""A declared server's tools, from the server itself: pinned into tools.json, and checked for
drift against it.

The server runs for this in a session sandbox like a run's (the declaration's image, command
and limits; no network and no workspace: listing tools must not need either), is asked for
tools/list (every page), and is removed. `pin` writes what it listed; `drift` says how the
live listing differs from the pinned one (a tool added, removed, or with another schema or
description), which `ringfence tools check` reports as a failure: calls are validated against
the pinned schema, so a server that changed must be looked at and pinned again.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ringfence.errors import ConfigError
from ringfence_server.control.mcp_servers.declaration import SERVER_FILE, TOOLS_FILE, read_listing
from ringfence_server.control.registry import parse_limits
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.mcp_session import McpCall, start_for_listing
from ringfence_server.sandbox.profile import SandboxProfile

PIN_RUN_ID = "mcp-pin"
"""The sessions started for pinning and checking belong to no run (the label says which)."""


def listing_request(folder: Path) -> SandboxRequest:
    """The session sandbox a server is listed in, from its server.toml alone."""
    source = Path(folder) / SERVER_FILE
    try:
        doc = tomllib.loads(source.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(str(source), f"cannot load: {e}") from e
    name, image, command = doc.get("name"), doc.get("image"), doc.get("command")
    if not isinstance(name, str) or not isinstance(image, str) or not isinstance(command, list) or not command:
        raise ConfigError(str(source), "needs name, image and command")
    limits = parse_limits(doc, str(source))
    profile = SandboxProfile(image=image, runtime=str(doc.get("runtime", "runc")), memory_bytes=limits.memory_bytes,
                             cpus=limits.cpus, pids=limits.pids, timeout_s=limits.timeout_s,
                             stdout_limit=limits.stdout_limit, stderr_limit=limits.stderr_limit)
    return SandboxRequest(profile=profile, argv=tuple(str(a) for a in command), run_id=PIN_RUN_ID,
                          warm=False, mcp=McpCall(server=name, tool=""))


def list_live(folder: Path, backend: DockerBackend) -> list[dict[str, Any]]:
    """The server's tools/list now, from a session sandbox started (and removed) for it."""
    session = start_for_listing(backend, listing_request(folder))
    try:
        return session.list_tools()
    finally:
        session.close()


def pin(folder: Path, backend: DockerBackend) -> list[dict[str, Any]]:
    """Write tools.json from the server's own listing; returns the tools."""
    tools = list_live(folder, backend)
    write_listing(folder, tools)
    return tools


def judgement_template(folder: Path, tools: list[dict[str, Any]]) -> str:
    """What `pin` appends to server.toml for each listed tool the operator has not judged yet: a
    commented [tools.NAME] table to fill in (risk metadata is never defaulted, so a tool stays
    unexposed until its table is uncommented), with what the server says of it, marked as not
    trusted."""
    try:
        judged = set(tomllib.loads((Path(folder) / SERVER_FILE).read_text(encoding="utf-8")).get("tools") or {})
    except (OSError, tomllib.TOMLDecodeError):
        judged = set()
    text = (Path(folder) / SERVER_FILE).read_text(encoding="utf-8")
    from ringfence_server.control.mcp_servers.scaffold import toml_key

    out = []
    for tool in sorted(tools, key=lambda t: str(t["name"])):
        name = str(tool["name"])
        if name in judged or f"# [tools.{toml_key(name)}]" in text:
            continue
        says = {k: v for k, v in (tool.get("annotations") or {}).items() if k.endswith("Hint")}
        out.append(f"\n# {name}: {' '.join(str(tool.get('description') or '').split())[:150]}\n"
                   + (f"# (the server says {json.dumps(says, sort_keys=True)}: not trusted, judge for yourself)\n"
                      if says else "")
                   + f"# [tools.{toml_key(name)}]\n# mutates = true\n# reversible = false\n# cost = 0.0\n")
    return "".join(out)


def pin_and_template(folder: Path, backend: DockerBackend) -> tuple[list[dict[str, Any]], int]:
    """`pin`, then the judgement template of the tools not judged yet appended to server.toml;
    returns the tools and how many templates were added."""
    tools = pin(folder, backend)
    template = judgement_template(folder, tools)
    if template:
        path = Path(folder) / SERVER_FILE
        from ringfence_server.control.mcp_servers.judging import TEMPLATE_HEADER

        text = path.read_text(encoding="utf-8").rstrip("\n")
        header = "" if TEMPLATE_HEADER in text else "\n\n" + TEMPLATE_HEADER.rstrip("\n")
        path.write_text(text + header + "\n" + template, encoding="utf-8")
    return tools, template.count("# [tools.")


def write_listing(folder: Path, tools: list[dict[str, Any]]) -> Path:
    path = Path(folder) / TOOLS_FILE
    path.write_text(json.dumps({"tools": sorted(tools, key=lambda t: str(t["name"]))}, indent=2,
                               ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
    return path


def drift(pinned: Mapping[str, Mapping[str, Any]], live: list[dict[str, Any]]) -> list[str]:
    """How the live listing differs from the pinned one, one line per difference (empty: none)."""
    now = {str(t["name"]): t for t in live}
    out = [f"{name}: the server no longer lists it" for name in sorted(set(pinned) - set(now))]
    out += [f"{name}: new, not pinned (pin again to see it; it stays unexposed until judged)"
            for name in sorted(set(now) - set(pinned))]
    for name in sorted(set(now) & set(pinned)):
        for key in ("inputSchema", "description"):
            if pinned[name].get(key) != now[name].get(key):
                out.append(f"{name}: its {key} changed")
    return out


def check_drift(folder: Path, backend: DockerBackend) -> list[str]:
    return drift(read_listing(folder), list_live(folder, backend))
