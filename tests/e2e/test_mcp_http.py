"""What the MCP front door's Streamable HTTP listener (`ringfence serve --mcp-listen`) adds to the
MCP path, with real parts only: a real `ringfence serve` on loopback ports (two tenants: the demo
one and `other`; /input), real containers, the MCP SDK's own client (ClientSession over
mcp.client.streamable_http) with a bearer header, and raw HTTP (httpx2) only for what no MCP client
would send (no token, another token on a session, bad bodies). The MCP path itself (tools/list,
allowed, denied, asked, declined, cancelled, deduplicated) runs over this transport too, in
tests/e2e/test_mcp_calls.py.

What is asserted is meaning: the HTTP status a refused request gets, that an intruder's request
reached nothing in the run's log, that an idle or shut-down session's run is finished.

Red checks (each done by hand, see the report): McpGate's token check removed -> the 401 tests
fail; the session's binding to the token digest removed -> the other-principal and other-tenant
tests fail; the non-loopback refusal removed -> its test fails.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession, Implementation
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_support import (
    APPROVER,
    client_name,
    hello_inputs,
    http_session,
    observation_meta,
    run_events,
    session_run_id,
    write_config,
)
from serve_support import ROOT, Served

from ringfence import Client
from ringfence.model import RunStatus

pytestmark = pytest.mark.docker

AGENT = "demo-agent-token"
ADMIN = "demo-admin-token"
OTHER = "other-tenant-agent-token"  # the agent of the second tenant, `other`
MCP_LINE = "ringfence: MCP (Streamable HTTP) on "
SESSIONS_PER_TOKEN = 3
# What a raw client sends with a JSON-RPC request to a session (the protocol's own headers).
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def tenants_table() -> str:
    """[tenants]: the demo tenant's agent, approver and admin (a user table replaces the embedded
    one), and a second tenant with an agent of its own."""
    demo = ", ".join(f'{{ sha256 = "{_sha(t)}", role = "{role}", subject = "demo-{role}" }}'
                     for t, role in ((AGENT, "agent"), (APPROVER, "approver"), (ADMIN, "admin")))
    return (f"[tenants.demo]\ntokens = [{demo}]\n"
            f'[tenants.other]\ntokens = [{{ sha256 = "{_sha(OTHER)}", role = "agent", subject = "other-agent" }}]\n')


def serve_mcp(config: Path | None, state: Path, *extra: str) -> tuple[Served, str]:
    """`ringfence serve --mcp-listen 127.0.0.1:0`, and the MCP endpoint's URL from its line."""
    served = Served(config, state, "--mcp-listen", "127.0.0.1:0", *extra)
    try:
        line = served.line_starting(MCP_LINE)
    except BaseException:
        served.stop()
        raise
    return served, line[len(MCP_LINE):].split()[0]


@pytest.fixture(scope="module")
def world(docker_client, pinned_images, tmp_path_factory):
    """(served, url): serve with the MCP listener and two tenants; removed at the end."""
    tmp = tmp_path_factory.mktemp("mcp-http")
    config = write_config(tmp / "ringfence.toml", inputs=hello_inputs(tmp))
    config.write_text(config.read_text() + tenants_table())
    served, url = serve_mcp(config, tmp / "state", "--mcp-sessions-per-token", str(SESSIONS_PER_TOKEN))
    try:
        yield served, url
    finally:
        served.stop()


def run(coro_fn: Any, *args: Any) -> Any:
    return anyio.run(coro_fn, *args)


def _rpc(method: str, params: dict[str, Any] | None = None, rid: int = 1) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}).encode()


def initialize_body() -> bytes:
    return _rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                               "clientInfo": {"name": "raw", "version": "0"}})


# --- the token -----------------------------------------------------------------------------------


@pytest.mark.parametrize("authorization", [None, "Basic ZGVtbzpkZW1v", "Bearer", "Bearer two words"])
def test_a_missing_or_malformed_token_is_401_with_www_authenticate(world, authorization):
    _, url = world
    headers = {**ACCEPT, **({"authorization": authorization} if authorization else {})}
    response = httpx2.post(url, content=initialize_body(), headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert "mcp-session-id" not in response.headers


def test_an_unknown_token_is_401_before_any_mcp_processing(world):
    served, url = world
    response = httpx2.post(url, content=initialize_body(),
                           headers={**ACCEPT, "authorization": "Bearer not-a-token-of-this-server"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert response.json()["error"] == "invalid_token" and "mcp-session-id" not in response.headers
    with Client(served.address, AGENT) as client:
        assert not [r for r in client.list_runs() if r.goal == "MCP session: raw 0"]  # no session, no run

    name = client_name("http-bad")

    async def go():
        # The SDK's own client is refused too: its initialize fails with the HTTP error.
        with pytest.raises(ExceptionGroup) as refused:
            async with http_session(url, name, token="not-a-token-of-this-server"):
                pass
        assert refused.group_contains(MCPError)

    run(go)
    with Client(served.address, AGENT) as client:
        assert not [r for r in client.list_runs() if r.goal == f"MCP session: {name} 1.2.3"]


def _use_session_with(url: str, session_id: str, token: str) -> httpx2.Response:
    """tools/list on `session_id`, sent with `token` (raw: no MCP client would switch tokens)."""
    return httpx2.post(url, content=_rpc("tools/list", rid=7),
                       headers={**ACCEPT, "authorization": f"Bearer {token}", "mcp-session-id": session_id,
                                "mcp-protocol-version": "2025-06-18"}, timeout=30)


@pytest.mark.parametrize("intruder", [ADMIN, OTHER], ids=["another-principal", "another-tenant"])
def test_a_session_used_with_another_token_is_404_as_if_it_did_not_exist(world, intruder):
    served, url = world
    name = client_name("http-bound")

    async def go():
        ids: list[str] = []
        async with http_session(url, name, session_ids=ids) as session:
            await session.list_tools()
            [sid] = ids
            intruded = await anyio.to_thread.run_sync(_use_session_with, url, sid, intruder)
            unknown = await anyio.to_thread.run_sync(_use_session_with, url, "0" * 32, AGENT)
            owner = await anyio.to_thread.run_sync(_use_session_with, url, sid, AGENT)
            still = await session.call_tool("read_file", {"path": "/input/hello.txt"})
        return intruded, unknown, owner, still

    intruded, unknown, owner, still = run(go)
    assert owner.status_code == 200  # the session exists and answers its own token
    assert intruded.status_code == 404 and unknown.status_code == 404
    assert intruded.json() == unknown.json()  # the same answer as a session that does not exist
    assert not still.is_error  # the owner's session goes on, unharmed
    with Client(served.address, AGENT) as client:
        events = run_events(client, observation_meta(still)["run_id"])
    # Exactly one call in the run: the intruder's request reached nothing.
    assert [e.type for e in events].count("call_decided") == 1


def test_sessions_per_token_are_bounded_with_429(world):
    _, url = world

    async def go():
        async with http_session(url, client_name("http-cap-0")) as a, http_session(url, client_name("http-cap-1")):
            async with http_session(url, client_name("http-cap-2")):
                over = await anyio.to_thread.run_sync(lambda: httpx2.post(
                    url, content=initialize_body(), headers={**ACCEPT, "authorization": f"Bearer {AGENT}"}))
                other = await anyio.to_thread.run_sync(lambda: httpx2.post(
                    url, content=initialize_body(), headers={**ACCEPT, "authorization": f"Bearer {OTHER}"}))
                await a.list_tools()
            return over, other

    over, other = run(go)
    assert over.status_code == 429 and over.json()["error"] == "too_many_sessions"
    assert f"{SESSIONS_PER_TOKEN} open MCP sessions" in over.json()["error_description"]
    assert other.status_code == 200 and other.headers.get("mcp-session-id")  # another token's own bound
    httpx2.delete(url, headers={"authorization": f"Bearer {OTHER}", "mcp-session-id": other.headers["mcp-session-id"]})


# --- bad requests --------------------------------------------------------------------------------


@pytest.mark.parametrize("body, content_type, status", [
    (b"{not json", "application/json", 400),
    (b"hello", "text/plain", 415),
    (b"[" + b" " * (5 * 1024 * 1024) + b"]", "application/json", 413),
])
def test_a_bad_request_is_a_clear_4xx_without_a_stack_trace(world, body, content_type, status):
    _, url = world
    response = httpx2.post(url, content=body, timeout=60, headers={
        "accept": "application/json, text/event-stream", "content-type": content_type,
        "authorization": f"Bearer {AGENT}"})
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text and "File \"" not in response.text
    # No session is left behind: an id the refused request may carry answers 404.
    sid = response.headers.get("mcp-session-id")
    assert sid is None or _use_session_with(url, sid, AGENT).status_code == 404


def test_a_sessionless_protocol_version_is_refused_with_400(world):
    _, url = world
    response = httpx2.post(url, content=_rpc("tools/list"), headers={
        **ACCEPT, "authorization": f"Bearer {AGENT}", "mcp-protocol-version": "2026-07-28"})
    assert response.status_code == 400 and response.json()["error"] == "unsupported_protocol_version"
    assert "2025-06-18" in response.json()["error_description"]


# --- listening -----------------------------------------------------------------------------------


def _serve_refused(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "ringfence.toml"
    config.write_text(f'[tenants.acme]\ntokens = [{{ sha256 = "{_sha("acme-agent")}", role = "agent" }}]\n')
    return subprocess.run([sys.executable, "-m", "ringfence.cli", "serve", "--listen", "127.0.0.1:0",
                           "--config", str(config), "--state-dir", str(tmp_path / "state"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_non_loopback_mcp_listen_without_tls_is_refused(tmp_path):
    done = _serve_refused(tmp_path, "--mcp-listen", "0.0.0.0:0")
    assert done.returncode == 2, done.stderr
    assert "refusing --mcp-listen 0.0.0.0:0 without TLS" in done.stderr and "--tls-cert" in done.stderr
    assert "ringfence: serving" not in done.stdout and "Traceback" not in done.stderr


def test_an_idle_session_ends_and_its_run_is_finished(docker_client, pinned_images, tmp_path):
    served, url = serve_mcp(None, tmp_path / "state", "--mcp-idle-timeout", "1")
    try:
        name = client_name("http-idle")

        async def go():
            ids: list[str] = []
            async with http_session(url, name, session_ids=ids, terminate_on_close=False) as session:
                await session.list_tools()
            return ids[0]

        sid = run(go)  # left without DELETE: only the idle timeout ends it
        with Client(served.address, AGENT) as client:
            run_id = session_run_id(client, name)
            events = run_events(client, run_id)  # waits for run_finished (the stream ends there)
        assert events[-1].type == "run_finished"
        assert _use_session_with(url, sid, AGENT).status_code == 404  # the session is gone
    finally:
        assert served.stop() == 0


def test_shutdown_ends_the_open_sessions_and_finishes_their_runs(docker_client, pinned_images, tmp_path):
    served, url = serve_mcp(None, tmp_path / "state")
    name = client_name("http-shutdown")
    opened, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def hold_a_session() -> None:
        async def go() -> None:
            async with http_session(url, name, terminate_on_close=False) as session:
                await session.list_tools()
                opened.set()
                await anyio.to_thread.run_sync(release.wait)

        try:
            anyio.run(go)
        except BaseException as e:  # noqa: BLE001 - the server went away under the client: expected
            failures.append(e)
        finally:
            opened.set()

    holder = threading.Thread(target=hold_a_session, daemon=True)
    holder.start()
    try:
        assert opened.wait(60)
        with Client(served.address, AGENT) as client:
            run_id = session_run_id(client, name)
            assert client.get_run(run_id).status is RunStatus.RUNNING
    finally:
        code = served.stop()  # SIGTERM while the session is open
        release.set()
        holder.join(60)
    assert code == 0
    assert "ringfence: stopped" in served.lines
    again = Served(None, tmp_path / "state")  # the same event log, read by a new process
    try:
        with Client(again.address, AGENT) as client:
            events = run_events(client, run_id)
            view = client.get_run(run_id)
    finally:
        again.stop()
    assert view.status is RunStatus.FINISHED and events[-1].type == "run_finished"


def test_tls_serves_mcp_over_https_and_reaches_grpc_over_tls(docker_client, pinned_images, tmp_path):
    """--tls-cert/--tls-key serve both listeners; the MCP listener's own gRPC connection trusts the
    served certificate (self-signed here, for 127.0.0.1)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", "server.key",
                    "-out", "server.pem"], cwd=tmp_path, check=True, capture_output=True, timeout=60)
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    served, url = serve_mcp(None, tmp_path / "state", "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        assert url.startswith("https://127.0.0.1:")
        name = client_name("http-tls")

        async def go():
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {AGENT}"},
                                      verify=ssl.create_default_context(cafile=str(cert)),
                                      timeout=httpx2.Timeout(30, read=300))
            async with http, streamable_http_client(url, http_client=http) as (read, write), ClientSession(
                    read, write, client_info=Implementation(name=name, version="1.2.3")) as session:
                await session.initialize()
                return await session.call_tool("read_file", {"path": "/etc/passwd"})

        result = run(go)
        assert result.is_error and observation_meta(result)["status"] == "denied"  # admitted by the server, over TLS
    finally:
        assert served.stop() == 0
