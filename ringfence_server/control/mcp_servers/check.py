"""`ringfence tools check DIR` for a declared MCP server (a folder with a server.toml): is the
declaration ready to serve? One line per check, like a tool package's:

    declaration  server.toml parses, and every judged tool is a valid manifest within the caps
                 (declaration.load_server: the same checks the server runs when it starts)
    judged       which of the pinned tools are exposed, which are judged and kept out, and which
                 the operator has not judged yet (those are not exposed: listed, not a failure)
    image        the declaration's image is pinned (the images dir's lock over the built-in one)
    tools        the server, started in a session sandbox, lists exactly the pinned tools, with
                 the pinned schemas and descriptions (pinning.drift); a difference fails: calls
                 are validated against the pinned schemas, so a changed server must be looked at
                 and pinned again (`ringfence mcp-servers pin`)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ringfence.errors import ConfigError
from ringfence_server.control.config import ToolsConfig
from ringfence_server.control.mcp_servers.declaration import SERVER_FILE, ServerDeclaration, load_server
from ringfence_server.control.mcp_servers.pinning import drift, list_live
from ringfence_server.control.toolpkg.check import Images, Report
from ringfence_server.sandbox.errors import SandboxError

CHECKS = ("declaration", "judged", "image", "tools")


def check_server(folder: Path, *, caps: ToolsConfig, images: Images,
                 backend: Callable[[], object] | None) -> Report:
    """The checks of one declaration; `backend` (a DockerBackend factory) None: `tools` not run."""
    report = Report(Path(folder))
    try:
        decl = load_server(folder, caps)
    except ConfigError as e:
        report.add("declaration", False, str(e))
        for name in CHECKS[1:]:
            report.add(name, False, "not checked: the declaration does not load")
        return report
    report.name = decl.name
    report.add("declaration", True, f"{Path(folder) / SERVER_FILE}: {len(decl.manifests)} tool(s) exposed, "
                                    f"each a valid manifest within the caps")
    _judged(decl, report)
    pinned = _image(decl, images, report)
    if not pinned:
        report.add("tools", False, "not checked: the image is not pinned")
        return report
    if backend is None:
        report.add("tools", False, "not checked: no sandbox")
        return report
    try:
        live = list_live(folder, backend())  # type: ignore[arg-type]
    except (SandboxError, ConfigError) as e:
        report.add("tools", False, f"the server could not be listed in its sandbox: {e}")
        return report
    differences = drift(decl.listed, live)
    report.add("tools", not differences,
               f"the server lists the {len(live)} pinned tool(s) as pinned" if not differences
               else "; ".join(differences) + " (pin again: ringfence mcp-servers pin " + str(folder) + ")")
    return report


def _judged(decl: ServerDeclaration, report: Report) -> None:
    exposed = sorted(m.mcp.tool for m in decl.manifests if m.mcp is not None)
    kept_out = sorted(set(decl.judged) - set(exposed))
    unjudged = sorted(set(decl.listed) - set(decl.judged))
    detail = f"exposed: {', '.join(exposed) or 'none'}"
    if kept_out:
        detail += f"; kept out: {', '.join(kept_out)}"
    if unjudged:
        detail += f"; not judged, so not exposed: {', '.join(unjudged)}"
    report.add("judged", True, detail)


def _image(decl: ServerDeclaration, images: Images, report: Report) -> bool:
    found = images.spec(decl.image)
    if found is None:
        return report.add("image", False, f"{decl.image!r} is not an image of the images dir or the built-in ones")
    _spec, own = found
    entry = images.entry(decl.image, own)
    if entry is None:
        return report.add("image", False, f"{decl.image} is not pinned in {images.where}: {images.build_hint()} "
                                          f"{decl.image}")
    return report.add("image", True, f"{decl.image} pinned as {entry.id[:19]}")
