"""The README's "Third-party MCP servers, sandboxed", run as written in a project folder outside
the checkout: the page's ringfence.toml, then its lines in their order, by the installed
`ringfence` script (this checkout's code) in a subprocess, as a user would.

`ringfence mcp-servers add` resolves mcp-server-time offline, from the flat wheelhouse `make
mcp-wheels` filled (PIP_NO_INDEX=1, PIP_FIND_LINKS; the index and proxies pointed nowhere: no test
reaches the package index), builds and pins its image, and pins its tools from the server in a
session sandbox; `judge` says what each tool does; `tools check` passes every check; `serve`
serves it (port 0 for the page's default, as tests/e2e/test_doc_commands.py does). Then the MCP
host: the MCP SDK's stdio client launches `ringfence mcp --server ADDR` as "Any MCP agent"
configures it, lists `time.get_current_time` and `time.convert_time`, calls the first (it runs),
and calls the second, which waits with progress notifications naming its approval until the
page's approver line, with that approval's id, lets it run. The session's run ends when the host
leaves, and its session sandbox with it (no container of the run is left).

An image this test built that was not in the engine before is removed at the end (the same spec
as examples/mcp/images' gives the same ID: that one is left alone).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from docs_support import README, blocks, section, sh_lines
from image_support import remove_image
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import Implementation
from serve_support import ROOT, Served

from ringfence_server.sandbox import listing
from ringfence_server.sandbox.pinned_images import lock_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RINGFENCE = str(Path(sys.executable).with_name("ringfence"))
WHEELHOUSE = ROOT / "images" / ".build" / "mcp-wheelhouse"
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE), "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "no_proxy": ""}
SECTION = "Third-party MCP servers, sandboxed"


def run(project: Path, line: str, **env: str) -> subprocess.CompletedProcess[str]:
    """One of the page's lines: VAR=value prefixes and `ringfence ...`, run by the installed script."""
    words = shlex.split(line)
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    assert words[0] == "ringfence", line
    # Offline where the page fetches (`add`); nowhere else (gRPC honours http_proxy too).
    offline = OFFLINE if words[1:3] == ["mcp-servers", "add"] else {}
    proc = subprocess.run([RINGFENCE, *words[1:]], cwd=project, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **offline, **env})
    assert proc.returncode == 0, f"{line}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@dataclass
class Seen:
    """What the MCP host saw."""

    tools: list[str] = field(default_factory=list)
    now: Any = None
    converted: Any = None
    progress: list[str | None] = field(default_factory=list)
    approval_ids: list[str] = field(default_factory=list)


async def host(address: str, approve: Callable[[str], None]) -> Seen:
    """The MCP host of "Any MCP agent": list, call the allowed tool, call the asked one while
    `approve(approval_id)` (the page's approver line) runs once its approval is pending."""
    params = StdioServerParameters(command=RINGFENCE, args=["mcp", "--server", address],
                                   env={"RINGFENCE_TOKEN": "demo-agent-token", "PATH": os.environ["PATH"]},
                                   cwd=str(ROOT))
    seen = Seen()
    async with stdio_client(params) as (read, write), ClientSession(
            read, write, client_info=Implementation(name="readme-host", version="1")) as session:
        await session.initialize()
        seen.tools = sorted(t.name for t in (await session.list_tools()).tools)
        seen.now = await session.call_tool("time.get_current_time", {"timezone": "UTC"})

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            seen.progress.append(message)
            found = re.search(r"(apr-[0-9a-f]+)", message or "")
            if found and not seen.approval_ids:
                seen.approval_ids.append(found.group(1))
                await anyio.to_thread.run_sync(approve, found.group(1))

        seen.converted = await session.call_tool(
            "time.convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
            progress_callback=progress)
    return seen


def test_the_readme_adds_judges_checks_serves_and_an_mcp_host_calls_with_an_approval(
        docker_client, pinned_images, tmp_path):
    if not any(WHEELHOUSE.glob("mcp_server_time-2026.10.19-*.whl")):
        pytest.skip(f"no offline wheelhouse at {WHEELHOUSE}: run `make mcp-wheels`")
    text = section(README, SECTION)
    [(_lang, name, config)] = [b for b in blocks(text) if b[1] is not None]
    assert name == "ringfence.toml"
    project = tmp_path / "project"
    project.mkdir()
    (project / name).write_text(config)
    lines = sh_lines(text)
    *setup, serve, approve_line = lines
    assert serve == "ringfence serve --config ringfence.toml" and "APPROVAL_ID" in approve_line
    before = {image.id for image in docker_client.images.list(all=True)}
    built: str | None = None
    try:
        for line in setup:
            out = run(project, line)
            if " add " in line:
                built = lock_for(project / "images").image_id("mcp-time")
                assert "pinned 2 tool(s)" in out.stdout, out.stdout
            if " check " in line:
                assert "tools check: 1 package, every check passed" in out.stdout, out.stdout
        served = Served(project / "ringfence.toml", project / ".state", command=[RINGFENCE], cwd=project)
        try:
            def approve(approval_id: str) -> None:
                run(project, approve_line.replace("APPROVAL_ID", approval_id), RINGFENCE_SERVER=served.address)

            seen = anyio.run(host, served.address, approve)
        finally:
            assert served.stop() == 0, served.lines
        assert {"time.get_current_time", "time.convert_time"} <= set(seen.tools)
        assert not seen.now.is_error, seen.now
        when = json.loads(seen.now.content[0].text)
        assert when["timezone"] == "UTC" and datetime.fromisoformat(when["datetime"])
        assert not seen.converted.is_error, seen.converted
        result = json.loads(seen.converted.content[0].text)
        assert result["target"]["timezone"] == "Asia/Tokyo" and result["target"]["datetime"].endswith("+09:00")
        [approval_id] = seen.approval_ids
        assert any(approval_id in (m or "") for m in seen.progress)
        # The host left: its run ended, and its session sandbox with it.
        left = listing.containers(docker_client, {"label": "ringfence.mcp-server=time"})
        assert [c.name for c in left] == []
    finally:
        if built is not None and built not in before:
            remove_image(docker_client, built)
