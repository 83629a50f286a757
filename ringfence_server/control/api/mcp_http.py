"""`ringfence serve --mcp-listen HOST:PORT`: the MCP front door over Streamable HTTP, at `/mcp`.

    uvicorn (a task of serve's event loop)  ->  Starlette, one route: /mcp
      -> McpGate: `Authorization: Bearer TOKEN` checked against the control plane (mcp_auth),
         before any MCP processing: missing or malformed 401 + `WWW-Authenticate: Bearer`,
         unknown 401; then a protocol version without sessions 400 and a POST body that is not
         application/json 415; the request's principal is the token's digest
      -> TokenBoundSessions (the MCP SDK's stateful session manager, mcp_sessions): session ids
         bound to that digest (another token: 404), at most N sessions per token (429), the idle
         timeout, bodies over 4 MiB (413), unparseable JSON (400)
      -> FrontDoor (ringfence.mcp): one MCP session = one run, every call ONE SubmitBatch

The listener is only a client of the control plane's own gRPC listener, with the caller's token
(an AsyncClient per session): it has no authority of its own and no second admission path.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ringfence.aio import AsyncClient
from ringfence.errors import ControlError
from ringfence.mcp import FrontDoor
from ringfence.options import TlsConfig
from ringfence_server.control.api.mcp_auth import BearerError, TokenCheck, bearer_token, token_digest
from ringfence_server.control.api.mcp_sessions import TokenBoundSessions, TooManySessions

__all__ = ["DEFAULT_IDLE_TIMEOUT_S", "DEFAULT_SESSIONS_PER_TOKEN", "McpListener", "McpSettings", "build_app"]

log = logging.getLogger("ringfence.mcp.http")

PATH = "/mcp"
DEFAULT_IDLE_TIMEOUT_S = 30 * 60.0
DEFAULT_SESSIONS_PER_TOKEN = 16
MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class McpSettings:
    """The MCP listener: where it listens, the gRPC listener it is a client of, and its bounds."""

    host: str
    port: int
    grpc_target: str
    """host:port of serve's own gRPC listener (a loopback address when it listens on all)."""
    tls_cert: Path | None = None
    """PEM certificate chain served on both listeners (with tls_key); also the roots this listener
    trusts for its own connection to the gRPC listener, so the chain must verify against itself: a
    self-signed certificate, or a chain file that ends with its CA. Its names must cover
    grpc_target's host (e.g. IP:127.0.0.1 when serve listens on loopback or on every address)."""
    tls_key: Path | None = None
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    sessions_per_token: int = DEFAULT_SESSIONS_PER_TOKEN
    progress_every_s: float = 1.0

    @functools.cached_property
    def client_tls(self) -> TlsConfig | None:
        """TLS of the connection to the gRPC listener: the served certificate trusted as its root
        (read once: every session and every token check connects with it)."""
        if self.tls_cert is None:
            return None
        return TlsConfig.from_files(self.tls_cert)

    def client(self, token: str) -> AsyncClient:
        """An AsyncClient of the gRPC listener with `token`. Streams without a deadline: a call that
        waits for approval follows the run's log as long as it waits."""
        return AsyncClient(self.grpc_target, token, tls=self.client_tls, stream_timeout=None)


async def _respond(send: Send, status: int, error: str, description: str,
                   headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """A small JSON error body (RFC 6750's field names) with `status`."""
    body = json.dumps({"error": error, "error_description": description}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def _is_json(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


class McpGate:
    """The ASGI app of /mcp: the bearer token, then the session manager (module docstring)."""

    def __init__(self, manager: TokenBoundSessions, tokens: TokenCheck) -> None:
        self._manager = manager
        self._tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # pragma: no cover - uvicorn sends lifespan to Starlette, not here
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            token = bearer_token(headers.get("authorization"))
        except BearerError as e:
            await _respond(send, 401, "invalid_request", str(e), ((b"www-authenticate", b"Bearer"),))
            return
        try:
            known = await self._tokens.known(token)
        except ControlError as e:
            # The control plane did not answer (it is shutting down, or overloaded): not the caller's fault.
            log.warning("MCP request refused: the token could not be checked: %s", e)
            await _respond(send, 503, "temporarily_unavailable", "the control plane could not check the token")
            return
        if not known:
            await _respond(send, 401, "invalid_token", "the token is not known to this server",
                           ((b"www-authenticate", b'Bearer error="invalid_token"'),))
            return
        version = headers.get("mcp-protocol-version")
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            # The SDK would serve it statelessly, one exchange at a time: each request its own run,
            # outside the session bound. One MCP session is one run here, so only the session era.
            await _respond(send, 400, "unsupported_protocol_version",
                           f"MCP-Protocol-Version {version!r} is not served here; this endpoint serves sessions "
                           f"({', '.join(HANDSHAKE_PROTOCOL_VERSIONS)})")
            return
        if scope["method"] == "POST" and not _is_json(headers.get("content-type", "")):
            # The SDK answers 400 here; 415 says which part of the request is wrong.
            await _respond(send, 415, "unsupported_media_type", "an MCP request body is application/json")
            return
        digest = token_digest(token)
        # The SDK binds a session to this principal: a request for it with another token gets 404.
        # The AccessToken carries the digest, never the token (FrontDoor's connect reads the header).
        scope["user"] = AuthenticatedUser(AccessToken(token=digest, client_id=digest, scopes=[]))
        try:
            await self._manager.handle_request(scope, receive, send)
        except TooManySessions as e:
            # Raised at admission, under the manager's lock and before any response was started.
            await _respond(send, 429, "too_many_sessions", str(e))


def build_app(settings: McpSettings) -> tuple[Starlette, FrontDoor, TokenBoundSessions]:
    """The Starlette app of the MCP listener, its FrontDoor and its session manager. The manager
    runs in the app's lifespan: its end ends every session (their runs finished by FrontDoor)."""

    async def connect(request: Any) -> AsyncClient:
        if request is None:  # pragma: no cover - the HTTP transport always passes its request
            raise RuntimeError("an MCP session over HTTP without its HTTP request")
        return settings.client(bearer_token(request.headers.get("authorization")))

    door = FrontDoor(connect, progress_every_s=settings.progress_every_s)
    manager = TokenBoundSessions(door, per_token=settings.sessions_per_token,
                                 session_idle_timeout=settings.idle_timeout_s, max_request_body_size=MAX_BODY_BYTES)
    gate: ASGIApp = McpGate(manager, TokenCheck(settings.client))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            async with manager.run():
                yield
        finally:
            await door.aclose()  # any session the manager's end did not reach

    app = Starlette(routes=[Route(PATH, endpoint=gate, methods=["GET", "POST", "DELETE"])], lifespan=lifespan)
    return app, door, manager


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: `ringfence serve` owns SIGINT/SIGTERM and stops
    the MCP listener before the gRPC one."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: one the kernel picks); OSError when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class McpListener:
    """The MCP listener's lifetime in serve's event loop: bind() (the port is known at once),
    start(), and stop() before the gRPC server stops (the sessions' runs are finished over it)."""

    def __init__(self, settings: McpSettings, *, shutdown_grace_s: float = 5.0) -> None:
        self.settings = settings
        self._app, self.front_door, self.manager = build_app(settings)
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._server = _Server(uvicorn.Config(
            self._app, lifespan="on", log_level="warning", access_log=False,
            ssl_certfile=str(settings.tls_cert) if settings.tls_cert else None,
            ssl_keyfile=str(settings.tls_key) if settings.tls_key else None,
            timeout_graceful_shutdown=int(shutdown_grace_s) or 1,
        ))

    @property
    def url(self) -> str:
        """http(s)://HOST:PORT/mcp, with the port bound (bind() first)."""
        if self._sock is None:
            raise RuntimeError("bind() first")
        port = self._sock.getsockname()[1]
        host = f"[{self.settings.host}]" if ":" in self.settings.host else self.settings.host
        return f"{'https' if self.settings.tls_cert else 'http'}://{host}:{port}{PATH}"

    def bind(self) -> None:
        self._sock = _bind(self.settings.host, self.settings.port)

    async def start(self) -> None:
        """Serve on the bound socket; returns once the app's lifespan (the session manager) runs."""
        if self._sock is None:
            raise RuntimeError("bind() first")
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]), name="rf-mcp-http")
        while not self._server.started:
            if self._task.done():  # startup failed (uvicorn logged why); surface it
                self._task.result()
                raise OSError("the MCP listener did not start")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop accepting, end every session (their runs finished), close the socket."""
        try:
            if self._task is not None:
                # Sessions first: their open GET streams would otherwise hold uvicorn's graceful
                # shutdown for its whole timeout before the lifespan (the manager) ends them.
                await self.manager.end_all()
                self._server.should_exit = True
                await self._task
        finally:
            if self._sock is not None:
                self._sock.close()


def connect_target(listen_host: str, port: int) -> str:
    """Where the MCP listener reaches serve's gRPC listener: the listen host itself, or loopback
    when the gRPC listener listens on every address."""
    if listen_host in ("", "0.0.0.0"):
        return f"127.0.0.1:{port}"
    if listen_host in ("::", "[::]"):
        return f"[::1]:{port}"
    host = f"[{listen_host}]" if ":" in listen_host and not listen_host.startswith("[") else listen_host
    return f"{host}:{port}"

