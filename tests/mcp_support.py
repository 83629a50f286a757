"""Shared helpers of the MCP front door's tests: a `ringfence serve` config with the ledger as an
egress service, the MCP SDK's own client over stdio (`stdio_session`) and over Streamable HTTP
(`http_session`), the session's run found by its goal, its log read to the end,
and the progress notifications a call received.

Everything a test starts is stopped by the context manager that started it, also on failure.
"""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio
import httpx2
from mcp import ClientSession, Implementation, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from ringfence import Client
from ringfence.model import Event

ROOT = Path(__file__).resolve().parents[1]
AGENT = "demo-agent-token"  # the embedded defaults' demo tenant (public dev tokens)
APPROVER = "demo-approver-token"
HELLO = "hello from /input\n"
"""What /input/hello.txt holds (hello_inputs)."""

LEDGER_HOST = "ledger.ringfence.internal"
APPROVAL_ID = re.compile(r"\bapr-[0-9a-z]+")


def hello_inputs(root: Path) -> Path:
    """`root`/input holding hello.txt (HELLO), readable by the sandbox user through a read-only
    bind mount: the folder a config maps to /input."""
    inputs = root / "input"
    inputs.mkdir()
    inputs.chmod(0o755)
    (inputs / "hello.txt").write_text(HELLO)
    (inputs / "hello.txt").chmod(0o644)
    return inputs


def write_config(path: Path, *, inputs: Path, ledger_services: dict[str, tuple[str, ...]] | None = None,
                 ledger_network: str | None = None) -> Path:
    """A config merged over the embedded defaults (their demo tenant and rules: read_file and echo
    allowed, credit asked up to 100 and denied above): /input mapped to `inputs`, and, given the
    ledger's services and network, `credit` granted the ledger, which the egress proxy knows at its
    pinned address."""
    text = "[inputs]\n" f'"/input" = "{inputs}"\n'
    if ledger_services is not None and ledger_network is not None:
        services = ", ".join(f'"{name}" = [{", ".join(f"{a!r}" for a in addrs)}]'.replace("'", '"')
                             for name, addrs in ledger_services.items())
        text += ("[policy.egress]\n"
                 f'credit = ["{LEDGER_HOST}"]\n'
                 "[egress]\n"
                 f"services = {{ {services} }}\n"
                 f'networks = ["{ledger_network}"]\n')
    path.write_text(text)
    return path


def client_name(label: str) -> str:
    """A clientInfo name unique to one test's session (the session's run is found by it)."""
    return f"mcp-test-{label}-{uuid.uuid4().hex[:8]}"


@asynccontextmanager
async def stdio_session(address: str, name: str, *, token: str = AGENT, errlog: TextIO | None = None,
                        extra_args: tuple[str, ...] = ()) -> AsyncIterator[ClientSession]:
    """An initialized MCP session with `ringfence mcp --server address`, launched by the MCP SDK's
    stdio client as a host would (the token in the environment); closed (and the process stopped)
    on exit, whatever happened."""
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "ringfence.cli", "mcp", "--server", address, *extra_args],
                                   env={"RINGFENCE_TOKEN": token, "PYTHONUNBUFFERED": "1"}, cwd=ROOT)
    async with stdio_client(params, errlog=errlog or sys.stderr) as (read, write), ClientSession(
            read, write, client_info=Implementation(name=name, version="1.2.3")) as session:
        await session.initialize()
        yield session


def session_run_id(client: Client, name: str) -> str:
    """The run of the MCP session whose client called itself `name`."""
    [run] = [r for r in client.list_runs() if r.goal == f"MCP session: {name} 1.2.3"]
    return run.run_id


def run_events(client: Client, run_id: str) -> list[Event]:
    """The run's whole log; the run must be finished (the stream ends at run_finished)."""
    return list(client.watch_run(run_id, timeout=60))


def events_of(events: list[Event], call_id: str) -> list[str]:
    """The types of the events about one call, in order."""
    return [e.type for e in events if e.data.get("call_id") == call_id]


def text_of(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def observation_meta(result: Any) -> dict[str, Any]:
    """The front door's account of the call in the result's _meta (call id, status, run id ...)."""
    meta: dict[str, Any] = result.meta["io.ringfence/observation"]
    return meta


@dataclass
class Progress:
    """The progress notifications one tools/call received; `first` is set at the first."""

    messages: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    first: anyio.Event = field(default_factory=anyio.Event)

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.values.append(progress)
        self.messages.append(message or "")
        self.first.set()

    def approval_id(self) -> str:
        """The approval id the first notification names."""
        match = APPROVAL_ID.search(self.messages[0])
        assert match, self.messages
        return match.group(0)


@asynccontextmanager
async def http_session(url: str, name: str, *, token: str = AGENT, session_ids: list[str] | None = None,
                       terminate_on_close: bool = True) -> AsyncIterator[ClientSession]:
    """An initialized MCP session over the SDK's Streamable HTTP client with `Authorization: Bearer
    token`; its session id appended to `session_ids`. Closed at exit (DELETE, unless
    terminate_on_close is False)."""
    async def remember(response: httpx2.Response) -> None:
        sid = response.headers.get("mcp-session-id")
        if session_ids is not None and sid and sid not in session_ids:
            session_ids.append(sid)

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    http.event_hooks["response"].append(remember)
    async with http, streamable_http_client(url, http_client=http, terminate_on_close=terminate_on_close) as (
            read, write), ClientSession(read, write, client_info=Implementation(name=name, version="1.2.3")) as s:
        await s.initialize()
        yield s
