"""`ringfence demo mcp` end to end, as a user runs it (`make demo` runs it too): the official MCP
SDK's client launches `ringfence mcp` over stdio against a real control plane on a loopback port;
the closing line is checked byte for byte, and what it claims is checked again in the run's own
event log (kept with --workdir): echo was dispatched to a sandbox, credit was decided `deny` and
never dispatched, and the session's end finished the run. And the README's host configuration,
as written, reaches a real `ringfence serve`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from docs_support import README, blocks, section
from mcp import ClientSession, StdioServerParameters, stdio_client
from serve_support import Served

from ringfence_server.control.store import SqliteEventStore

pytestmark = pytest.mark.docker

RINGFENCE = str(Path(sys.executable).with_name("ringfence"))
LAST = re.compile(r"^mcp: tools=(\d+) echo=executed credit=denied run=finished$")


def test_the_mcp_demo_runs_end_to_end(pinned_images, docker_client, tmp_path):
    proc = subprocess.run([RINGFENCE, "demo", "mcp", "--workdir", str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = proc.stdout.splitlines()
    match = LAST.match(line)
    assert match, line
    # The session's tools/list: what ListTools gives the demo tenant (every tool of the registry).
    assert int(match.group(1)) > 2 and " echo " in proc.stderr and " credit " in proc.stderr

    store = SqliteEventStore(tmp_path / "state" / "events.sqlite3")
    try:
        [run_id] = store.runs("demo")  # the session's run, and nothing else
        events = store.read(run_id)
    finally:
        store.close()
    by_tool: dict[str, list[str]] = {}
    tool_of: dict[str, str] = {}
    for e in events:
        if "tool" in e.data and "call_id" in e.data:
            tool_of.setdefault(e.data["call_id"], e.data["tool"])
        if e.data.get("call_id") in tool_of:
            by_tool.setdefault(tool_of[e.data["call_id"]], []).append(e.type)
    assert by_tool["echo"] == ["call_decided", "dispatch_started", "attempt", "call_completed", "observation"]
    assert by_tool["credit"] == ["call_decided", "observation"]
    [denied] = [e for e in events if e.type == "call_decided" and e.data["tool"] == "credit"]
    assert denied.data["verdict"] == "deny"
    assert events[0].type == "run_started" and events[0].data["goal"].startswith("MCP session")
    assert events[-1].type == "run_finished"


def test_the_readmes_host_configuration_launches_a_working_front_door(pinned_images, docker_client, tmp_path):
    [(_lang, _file, text)] = [b for b in blocks(section(README, "Any MCP agent")) if b[0] == "json"]
    [entry] = json.loads(text)["mcpServers"].values()
    assert entry["command"] == "ringfence" and entry["args"][:2] == ["mcp", "--server"]
    served = Served(None, tmp_path / "state")
    try:
        # As written, but for the server's address (a free port here, not 50051) and the command's
        # path (this venv's `ringfence`, as a host with it on PATH would find it).
        params = StdioServerParameters(command=RINGFENCE, args=[*entry["args"][:2], served.address],
                                       env=entry["env"])

        async def session() -> tuple[list[str], bool, str]:
            async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                tools = [t.name for t in (await s.list_tools()).tools]
                result = await s.call_tool("echo", {"text": "from the README"})
                return tools, result.is_error, json.dumps(result.structured_content)

        tools, is_error, content = anyio.run(session)
    finally:
        served.stop()
    assert "echo" in tools and not is_error and "from the README" in content
