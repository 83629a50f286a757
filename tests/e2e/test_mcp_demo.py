"""`ringfence demo mcp` end to end, as a user runs it (`make demo` runs it too): the official MCP
SDK's client launches `ringfence mcp` over stdio against a real control plane on a loopback port;
the closing line is checked byte for byte, and what it claims is checked again in the run's own
event log (kept with --workdir): echo was dispatched to a sandbox, credit was decided `deny` and
never dispatched, and the session's end finished the run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

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
