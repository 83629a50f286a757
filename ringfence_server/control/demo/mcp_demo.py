"""`ringfence demo mcp`: an MCP client calls ringfence's tools through the whole admission path.

The client is the official MCP Python SDK's (`mcp.ClientSession`), written by nobody here. It
launches `ringfence mcp --server ADDR` as an MCP host would (stdio, the agent's token in the
environment) against a real control plane on a loopback port (the embedded defaults, a
temporary state directory, the Docker engine's sandboxes):

    initialize                 the session becomes one ringfence run
    tools/list                 the tenant's tools, their schemas and honest hints
    tools/call echo            allowed: admitted, run in a fresh container, its result as content
    tools/call credit 500      denied by the policy (amount > 100): an isError result naming the
                               verdict path, which the model can read and adapt to; never run
    (session closed)           the run is finished

Then the run's own log, read over gRPC, shows what happened: the echo call was dispatched to a
sandbox, the credit call was decided `deny` and never dispatched. The narration goes to stderr;
stdout is the one closing line, byte for byte.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ringfence import Client
from ringfence.model import Event, RunView

AGENT = "demo-agent-token"
CLIENT_NAME = "ringfence-demo-mcp-client"
CREDIT = {"account": "acme-9", "amount": 500}


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _text(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


async def _mcp_session(address: str) -> dict[str, Any]:
    """One MCP session, as an MCP host runs it; what it saw."""
    from mcp import ClientSession, Implementation, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "ringfence.cli", "mcp", "--server", address],
                                   env={"RINGFENCE_TOKEN": AGENT})
    seen: dict[str, Any] = {}
    async with stdio_client(params) as (read, write), ClientSession(
            read, write, client_info=Implementation(name=CLIENT_NAME, version="1.0")) as session:
        init = await session.initialize()
        _say(f"initialize      -> {init.server_info.name} {init.server_info.version}")
        tools = (await session.list_tools()).tools
        seen["tools"] = tools
        _say(f"tools/list      -> {len(tools)} tools")
        for tool in tools:
            hints = tool.annotations
            flags = [name for name, on in (("read-only", hints and hints.read_only_hint),
                                           ("destructive", hints and hints.destructive_hint)) if on]
            _say(f"  {tool.name:<20} {', '.join(flags) or '-'}")
        echo = await session.call_tool("echo", {"text": "hello through MCP"})
        seen["echo"] = echo
        _say(f"tools/call echo -> isError={echo.is_error}: {_text(echo)}")
        credit = await session.call_tool("credit", dict(CREDIT))
        seen["credit"] = credit
        _say(f"tools/call credit {CREDIT} -> isError={credit.is_error}: {_text(credit)}")
    return seen


def _session_run(client: Client) -> RunView:
    """The run the MCP session was (its goal names the client), the newest if several."""
    runs = [r for r in client.list_runs() if CLIENT_NAME in r.goal]
    if not runs:
        raise LookupError("no run of the MCP session was found")
    return runs[-1]


def _calls(events: list[Event]) -> Mapping[str, list[str]]:
    """Each tool's event types, in log order (by the call id the events share)."""
    tool_of: dict[str, str] = {}
    by_tool: dict[str, list[str]] = {}
    for event in events:
        call_id, tool = event.data.get("call_id"), event.data.get("tool")
        if isinstance(call_id, str) and isinstance(tool, str):
            tool_of.setdefault(call_id, tool)
        if isinstance(call_id, str) and call_id in tool_of:
            by_tool.setdefault(tool_of[call_id], []).append(event.type)
    return by_tool


def run(workdir: Path | None = None) -> int:
    import anyio

    from ringfence_server.control.demo.features import _server

    with _server(workdir) as address:
        _say(f"control plane on {address}; MCP client: the official SDK's, over stdio "
             f"(`ringfence mcp --server {address}`)")
        seen = anyio.run(_mcp_session, address)
        with Client(address, AGENT) as client:
            view = _session_run(client)
            events = list(client.watch_run(view.run_id, timeout=30))
    calls = _calls(events)
    _say(f"run {view.run_id} ({view.goal}): {view.status.value}")
    for tool, types in calls.items():
        _say(f"  {tool:<7} {' -> '.join(types)}")
    echo_ran = not seen["echo"].is_error and "dispatch_started" in calls.get("echo", [])
    credit_denied = (seen["credit"].is_error and "dispatch_started" not in calls.get("credit", [])
                     and any(e.type == "call_decided" and e.data.get("verdict") == "deny" for e in events))
    print(f"mcp: tools={len(seen['tools'])} echo={'executed' if echo_ran else 'NOT-EXECUTED'} "
          f"credit={'denied' if credit_denied else 'NOT-DENIED'} run={view.status.value}", flush=True)
    return 0 if echo_ran and credit_denied and view.status.value != "running" else 1
