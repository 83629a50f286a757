"""MCP servers in session sandboxes: one hardened container per (run, server), spoken to over
its stdio with the MCP SDK's client.

An MCP server is a long-lived process, so it cannot live in a call's container. It gets a
container of its own that lives for the run: the same hardening as every call (the backend's
own settings, ringfence_server.sandbox.host_config: uid 10001, read-only root, no capabilities,
seccomp, memory / CPU / pids / disk ceilings, no network but the egress proxy with the
server's grant, the run's workspace if it declared one), never warm, never shared by two runs.

    McpSessions   the sessions of one backend, by (run, server, profile): started on a run's
                  first call to the server, closed with the run (end_run), killed with it
                  (kill_run, kill_all), closed after `idle_s` unused (an instance that lost the
                  run to another keeps no container for it), reaped by label if we die
    McpSession    one container, its attach socket, the SDK's ClientSession on an event loop
                  of its own (anyio's blocking portal: the control plane's threads are sync)
    the transport the attach socket as the SDK's streams: Docker's multiplexing undone, tini's
                  lines taken out (ringfence_server.sandbox.witness), one JSON-RPC message per
                  line; a line over the cap, or one that is not JSON-RPC, ends the session

How a call ends, as a SandboxResult, so the dispatcher retries and records it like any call:

    a result, isError false      ok: stdout holds the runner's success line (runner_protocol)
                                 with the content (`content_of`)
    a result, isError true       tool_error, fatal: the server's text is the message
    a JSON-RPC error answer      tool_error, fatal (the server refused the call)
    past the call's wall time    timeout: the container is killed; the next call starts afresh
    a message over the cap       output_limit: killed likewise
    a malformed message          a read: tool_error, fatal; a mutation: uncertain (it may have
                                 acted before it garbled its answer)
    the server died mid-call     oom when the engine says so, killed when we killed it
                                 (kill_run, kill_all), otherwise uncertain (dispatch retries a
                                 read as transient; a mutation is reconciled)
    it could not start           start_failed (nothing was sent to a server): transient

The server's own claims (a tool's annotations, "read-only") are never read here: what a call
may do was decided by the operator's declaration before it got this far.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import docker.errors
from anyio.from_thread import BlockingPortal, start_blocking_portal
from docker.models.containers import Container
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import CONNECTION_CLOSED, Implementation, jsonrpc_message_adapter

from ringfence_server.sandbox import engine
from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.egress.channel import EgressError
from ringfence_server.sandbox.engine import ENGINE_ERRORS
from ringfence_server.sandbox.errors import ProfileError
from ringfence_server.sandbox.result import Outcome, SandboxResult, ToolErrorClass
from ringfence_server.sandbox.streams import Demuxer, close_attach, open_attach
from ringfence_server.sandbox.witness import InitWitness

if TYPE_CHECKING:
    from ringfence_server.sandbox.backend import SandboxRequest
    from ringfence_server.sandbox.docker_backend import DockerBackend
    from ringfence_server.sandbox.egress.proxy import CallEgress

log = logging.getLogger(__name__)

SERVER_LABEL = "ringfence.mcp-server"
PURPOSE = "mcp-session"
START_TIMEOUT_S = 60.0
"""From the container's start to the server's answer to `initialize` (an interpreter that
imports pydantic on a busy host takes seconds, not minutes)."""
IDLE_S = 600.0
"""A session nobody called for this long is closed (its run may be served by another instance
now, or its agent went away without ending it); its next call starts a fresh one."""
STDERR_KEEP = 16 * 1024
"""The last bytes of the server's stderr kept for the messages of its failures."""
CLIENT_INFO = Implementation(name="ringfence", version="1")
MAX_ENDED_RUNS = 10_000
"""Ended runs remembered, so a session whose start raced its run's end is not kept."""
IDEMPOTENCY_META = "io.ringfence/idempotency-key"
"""The `_meta` key a server receives a mutation's idempotency key under (as the front door
takes it from a client)."""


@dataclass(frozen=True)
class McpSettings:
    """How many session sandboxes may live at once, and for how long unused."""

    max_per_owner: int = 16
    """Live sessions of one owner (a tenant: McpCall.owner) at once. A session lives for its
    run, not for a call, and a tenant's open runs are not otherwise bounded: without this, one
    tenant could hold a container per run per server until the host is full. A call past it is
    `start_failed` (retried, then failed), saying so; ending runs frees the slots."""
    idle_s: float = IDLE_S
    """A session unused this long is closed (its next call starts a fresh one)."""

    def __post_init__(self) -> None:
        if self.max_per_owner < 1 or not self.idle_s > 0:
            raise ValueError("max_per_owner must be at least 1 and idle_s positive")


@dataclass(frozen=True)
class McpCall:
    """One tools/call for a session sandbox (SandboxRequest.mcp): the request's profile is the
    session's sandbox and its argv the server's command."""

    server: str
    """The declared server's name: with the run and the profile, which session serves it."""
    tool: str
    """The tool's name as the server knows it (without the `server.` prefix)."""
    arguments: Mapping[str, Any] = field(default_factory=dict)
    mutates: bool = False
    """From the operator's declaration: a broken answer to a mutation is uncertain, not fatal."""
    idempotency_key: str | None = None
    owner: str = ""
    """Whose sessions this call's counts against (the run's tenant): McpSettings.max_per_owner."""


def content_of(result: Any) -> Any:
    """What a model sees of a CallToolResult: its structured content when it is an object, else
    {"text": the text blocks joined}; other blocks are named, never inlined (an image's bytes
    are not a model's input here)."""
    if isinstance(result.structured_content, dict):
        return result.structured_content
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "?")
        if kind == "text":
            parts.append(str(block.text))
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        else:
            mime = getattr(block, "mime_type", None) or getattr(getattr(block, "resource", None), "mime_type", None)
            parts.append(f"[{kind} {mime or ''}]".replace(" ]", "]"))
    return {"text": "\n".join(parts)}


def _text_of(result: Any) -> str:
    content = content_of(result)
    return content["text"] if isinstance(content, dict) and isinstance(content.get("text"), str) \
        else json.dumps(content)


@dataclass
class _Broken:
    """Why the transport ended the session (set once, by the reader), for the calls it failed."""

    outcome: Outcome
    message: str


class McpSession:
    """One server process in one container, for one run."""

    def __init__(self, backend: DockerBackend, request: SandboxRequest, *,
                 on_end: Callable[[McpSession], None]) -> None:
        assert request.mcp is not None
        self.backend = backend
        self.run_id = request.run_id
        self.server = request.mcp.server
        self.profile = request.profile
        self.argv = tuple(request.argv)
        self.id = uuid.uuid4().hex[:10]
        self.last_used = time.monotonic()
        self._on_end = on_end
        self._container: Container | None = None
        self._attach: Any = None
        self._sock: Any = None
        self._egress: CallEgress | None = None
        self._portal_cm: Any = None
        self._portal: BlockingPortal | None = None
        self._client: ClientSession | None = None
        self._stop: anyio.Event | None = None
        self._main: Any = None
        self.broken: _Broken | None = None
        self.killed_reason: str | None = None
        self.stderr = bytearray()
        self.image_id = ""
        self.setup_ms = 0
        self.ended = False
        self._end_lock = threading.Lock()
        self._egress_seen = 0  # how many of the proxy's decisions earlier calls took

    # -- start -------------------------------------------------------------------------

    def start(self) -> None:
        """Create, start and initialize the server's container; raises _StartFailed (nothing ran)
        or ImageError / ProfileError (the request cannot run at all)."""
        started = time.monotonic()
        profile = self.profile
        if profile.runtime == "gvisor" and profile.egress is not None:
            raise ProfileError("egress", "egress tools run on runc only")
        self.image_id = self.backend._image_id(profile.image)
        settings = self.backend._container_settings(profile)
        command = list(self.argv)
        if not command:
            raise ProfileError("argv", "an MCP server's command is required")
        try:
            if profile.egress is not None:
                try:
                    self._egress = self.backend._egress().open_call(f"mcp-{self.id}", profile.egress)
                except EgressError as e:
                    raise _StartFailed(f"egress: {e}") from e
                settings = self.backend._apply_egress(settings, self._egress)
                command = self._egress.relay_argv() + command
            if profile.workspace is not None:
                missing = self.backend._workspace_missing(profile.workspace)
                if missing:
                    raise _StartFailed(missing)
            labels = L.base_labels(PURPOSE)
            labels.update({L.RUN_LABEL: self.run_id, SERVER_LABEL: self.server})
            name = f"rf-mcp-{self.server[:20]}-{self.run_id[:24]}-{self.id}".replace(":", "_")
            try:
                self._container = self.backend._create(self.image_id, command=command, name=name, labels=labels,
                                                       **settings)
            except docker.errors.APIError as e:
                raise _StartFailed(f"create failed: {e}") from e
            self._attach, self._sock = open_attach(self.backend.client, self._container)
            self._container.start()
            self._portal_cm = start_blocking_portal()
            self._portal = self._portal_cm.__enter__()
            try:
                self._main, _ = self._portal.start_task(self._serve, name=f"mcp-session-{self.id}")
            except (MCPError, TimeoutError, anyio.EndOfStream, anyio.ClosedResourceError,
                    anyio.BrokenResourceError, OSError) as e:
                raise _StartFailed(f"the MCP server did not initialize: {self._why(e)}") from e
        except BaseException as e:
            self.close()  # whatever stopped the start, nothing of it is left
            if isinstance(e, ENGINE_ERRORS):
                raise _StartFailed(f"engine error: {type(e).__name__}: {e}") from e
            raise
        self.setup_ms = int((time.monotonic() - started) * 1000)

    async def _serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The session's life on the portal's loop: the transport, the client, until closed."""
        self._stop = anyio.Event()
        stream = await anyio.abc.SocketStream.from_socket(self._sock.dup())
        read_w, read_r = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_w, write_r = anyio.create_memory_object_stream[SessionMessage](0)
        async with stream, anyio.create_task_group() as tg:
            tg.start_soon(self._read, stream, read_w)
            tg.start_soon(self._write, stream, write_r)
            async with ClientSession(read_r, write_w, client_info=CLIENT_INFO) as client:
                with anyio.fail_after(START_TIMEOUT_S):
                    await client.initialize()
                self._client = client
                task_status.started()
                await self._stop.wait()
            tg.cancel_scope.cancel()

    async def _read(self, stream: anyio.abc.SocketStream, out: Any) -> None:
        """The server's stdout as JSON-RPC messages; its stderr kept (the tail) for errors."""
        demux, witness, line = Demuxer(), InitWitness(), bytearray()
        cap = self.profile.stdout_limit
        async with out:
            try:
                while True:
                    data = await stream.receive(65536)
                    for kind, payload in demux.feed(data):
                        if kind == 2:
                            self.stderr += payload
                            del self.stderr[:-STDERR_KEEP]
                            continue
                        line += witness.feed(payload)
                        while (end := line.find(b"\n")) >= 0:
                            message, line = bytes(line[:end]), line[end + 1:]
                            if message.strip() and not await self._deliver(message, out):
                                return
                        if len(line) > cap:
                            self._break(Outcome.OUTPUT_LIMIT, f"the MCP server sent a message over the "
                                                              f"{cap}-byte cap (stdout_limit)")
                            return
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                return  # the server's stdout ended: the session sees the connection close

    async def _deliver(self, message: bytes, out: Any) -> bool:
        if len(message) > self.profile.stdout_limit:
            self._break(Outcome.OUTPUT_LIMIT, f"the MCP server sent a message of {len(message)} bytes, over the "
                                              f"{self.profile.stdout_limit}-byte cap (stdout_limit)")
            return False
        try:
            parsed = jsonrpc_message_adapter.validate_json(message, by_name=False)
        except ValueError as e:
            self._break(None, f"the MCP server sent a malformed message ({str(e).splitlines()[0][:200]}): "
                              f"{message[:200]!r}")
            return False
        await out.send(SessionMessage(parsed))
        return True

    def _break(self, outcome: Outcome | None, message: str) -> None:
        if self.broken is None:
            self.broken = _Broken(outcome or Outcome.TOOL_ERROR, message)
            log.warning("MCP session %s (%s, run %s) ends: %s", self.id, self.server, self.run_id, message)

    async def _write(self, stream: anyio.abc.SocketStream, messages: Any) -> None:
        async with messages:
            try:
                async for item in messages:
                    body = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await stream.send(body.encode() + b"\n")
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                return

    # -- calls -------------------------------------------------------------------------

    def call(self, request: SandboxRequest) -> SandboxResult:
        """One tools/call, with the egress proxy's decisions taken while it ran."""
        result = self._call_once(request)
        decisions = self._egress_since()
        return dataclasses.replace(result, egress_events=decisions) if decisions else result

    def _egress_since(self) -> tuple[dict[str, Any], ...]:
        """The proxy's decisions for this session since the last call asked (a call's, when
        calls come one at a time; with parallel calls of one session, the first to finish
        takes what happened while they ran)."""
        if self._egress is None or self.backend.egress_proxy is None:
            return ()
        channel = self.backend.egress_proxy.channel
        if channel is None:
            return ()
        try:
            summary = channel.events(self._egress.username)
        except EgressError:
            return ()  # the grant is gone (the session ended): close_call has them
        events = summary.get("events")
        found = [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []
        with self._end_lock:
            fresh, self._egress_seen = found[self._egress_seen:], max(self._egress_seen, len(found))
        return tuple(fresh)

    def _call_once(self, request: SandboxRequest) -> SandboxResult:
        assert request.mcp is not None and self._portal is not None
        mcp = request.mcp
        self.last_used = time.monotonic()
        started = time.monotonic()
        meta: dict[str, Any] = {}
        if mcp.idempotency_key:
            meta[IDEMPOTENCY_META] = mcp.idempotency_key
        if self.ended:
            return self._not_sent(request, started)
        try:
            result = self._portal.call(self._call, mcp.tool, dict(mcp.arguments), meta or None,
                                       request.profile.timeout_s)
        except RuntimeError:
            # The portal stopped under us: another call's kill ended the session between our
            # look-up and the send. Anything else is a bug, and stays one.
            if not self._has_ended():
                raise
            return self._not_sent(request, started)
        except TimeoutError:
            self.kill(f"wall time of {request.profile.timeout_s}s reached")
            return self._result(request, Outcome.TIMEOUT, started,
                                f"wall time of {request.profile.timeout_s}s reached; the MCP server's "
                                "container was killed (the next call starts a new session)")
        except MCPError as e:
            if e.code != CONNECTION_CLOSED:
                # The server answered with a JSON-RPC error (an unknown tool, arguments it
                # refused): it refused the call, which is the tool's failure, not transient.
                return self._result(request, Outcome.TOOL_ERROR, started,
                                    f"the MCP server answered error {e.code}: {e.message}"[:2000],
                                    error_class=ToolErrorClass.FATAL)
            return self._lost(request, started)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            return self._lost(request, started)
        finally:
            self.last_used = time.monotonic()
        if result.is_error:
            return self._result(request, Outcome.TOOL_ERROR, started, _text_of(result)[:2000],
                                error_class=ToolErrorClass.FATAL)
        line = json.dumps({"ok": True, "content": content_of(result)}, ensure_ascii=False,
                          separators=(",", ":"), allow_nan=False).encode()
        if len(line) > request.profile.stdout_limit:
            return self._result(request, Outcome.OUTPUT_LIMIT, started,
                                f"the result is {len(line)} bytes, over the {request.profile.stdout_limit}-byte "
                                "cap (stdout_limit)")
        return self._result(request, Outcome.OK, started, "", stdout=line + b"\n", exit_code=0)

    async def _call(self, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None,
                    timeout_s: float) -> Any:
        assert self._client is not None
        with anyio.fail_after(timeout_s):
            return await self._client.call_tool(tool, arguments, meta=meta)  # type: ignore[arg-type]

    def list_tools(self, timeout_s: float = START_TIMEOUT_S) -> list[dict[str, Any]]:
        """The server's tools/list, every page, as JSON objects (for pinning a declaration)."""
        assert self._portal is not None

        async def everything() -> list[dict[str, Any]]:
            assert self._client is not None
            tools: list[dict[str, Any]] = []
            cursor: str | None = None
            with anyio.fail_after(timeout_s):
                while True:
                    from mcp_types import PaginatedRequestParams

                    page = await self._client.list_tools(
                        params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                    tools += [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in page.tools]
                    cursor = page.next_cursor
                    if not cursor:
                        return tools

        return self._portal.call(everything)

    def _has_ended(self) -> bool:
        """`ended`, read again (another thread may have ended the session meanwhile)."""
        return self.ended

    def _not_sent(self, request: SandboxRequest, started: float) -> SandboxResult:
        """The session ended before this call was sent: nothing reached a server (retried)."""
        return self._result(request, Outcome.START_FAILED, started,
                            f"the MCP session ended before the call was sent ({self.killed_reason or 'closed'})")

    def _lost(self, request: SandboxRequest, started: float) -> SandboxResult:
        """The connection closed under a call: say why, from what we know and the engine."""
        assert request.mcp is not None
        broken = self.broken
        if broken is not None and broken.outcome is Outcome.OUTPUT_LIMIT:
            self.kill(broken.message)
            return self._result(request, Outcome.OUTPUT_LIMIT, started, broken.message)
        if broken is not None:
            self.kill(broken.message)
            if request.mcp.mutates:
                return self._result(request, Outcome.UNCERTAIN, started,
                                    f"{broken.message}; whether the mutation took effect is unknown")
            return self._result(request, Outcome.TOOL_ERROR, started, broken.message,
                                error_class=ToolErrorClass.FATAL)
        if self.killed_reason is not None:
            return self._result(request, Outcome.KILLED, started, f"session killed: {self.killed_reason}")
        oom = self._oom_killed()
        self.kill("the MCP server's connection closed")
        if oom:
            return self._result(request, Outcome.OOM, started,
                                f"memory limit of {request.profile.memory_bytes} bytes reached; the MCP server died")
        tail = bytes(self.stderr[-400:]).decode("utf-8", "replace").strip()
        return self._result(request, Outcome.UNCERTAIN, started,
                            "the MCP server's session ended during the call (the next call starts a new session)"
                            + (f"; its stderr ends: {tail}" if tail else ""))

    def _oom_killed(self) -> bool:
        if self._container is None:
            return False
        with contextlib.suppress(*ENGINE_ERRORS):
            self._container.wait(timeout=5)
            self._container.reload()
            return bool((self._container.attrs.get("State") or {}).get("OOMKilled"))
        return False

    def _result(self, request: SandboxRequest, outcome: Outcome, started: float, message: str, *,
                stdout: bytes = b"", exit_code: int | None = None,
                error_class: ToolErrorClass | None = None) -> SandboxResult:
        return SandboxResult(outcome=outcome, exit_code=exit_code, stdout=stdout,
                             stderr=bytes(self.stderr[-request.profile.stderr_limit:]) if outcome is not Outcome.OK
                             else b"",
                             stdout_truncated=False, stderr_truncated=False,
                             duration_ms=int((time.monotonic() - started) * 1000), image_id=self.image_id,
                             runtime=request.profile.runtime, error_class=error_class, message=message,
                             container_name=self._container.name or "" if self._container is not None else "",
                             setup_ms=0)

    @staticmethod
    def _why(e: BaseException) -> str:
        if isinstance(e, TimeoutError):
            return f"no answer to initialize within {START_TIMEOUT_S:g}s"
        return f"{type(e).__name__}: {e}"

    # -- end ---------------------------------------------------------------------------

    def kill(self, reason: str) -> None:
        """Kill the container now (its calls end; the session is over)."""
        if self.killed_reason is None:
            self.killed_reason = reason
        if self._container is not None:
            with contextlib.suppress(*ENGINE_ERRORS):
                engine.kill(self._container)
        self.close()

    def close(self) -> None:
        """End the session: the client, the container (removed), the egress grant. Idempotent."""
        with self._end_lock:
            if self.ended:
                return
            self.ended = True
        if self._portal is not None and self._stop is not None:
            with contextlib.suppress(Exception):
                self._portal.call(self._stop.set)
        if self._container is not None:
            with contextlib.suppress(*ENGINE_ERRORS):
                engine.kill(self._container)
        if self._attach is not None:
            close_attach(self._attach, self._sock)
        if self._main is not None:
            with contextlib.suppress(BaseException):
                self._main.result(timeout=10)
        if self._portal_cm is not None:
            with contextlib.suppress(BaseException):
                self._portal_cm.__exit__(None, None, None)
        if self._container is not None:
            engine.remove(self._container)
        if self._egress is not None:
            with contextlib.suppress(Exception):
                self.backend._egress().close_call(self._egress)
        self._on_end(self)


class _StartFailed(Exception):
    """The session could not start; nothing reached a server."""


@dataclass(frozen=True)
class _Key:
    owner: str
    run_id: str
    server: str
    profile: str
    """The profile's repr (a profile holds mappings, so is not hashable): another sandbox (say,
    another egress grant for another tool of the server) is another session."""


class McpSessions:
    """The backend's session sandboxes."""

    def __init__(self, backend: DockerBackend, settings: McpSettings | None = None) -> None:
        self._backend = backend
        self.settings = settings or McpSettings()
        self._idle_s = self.settings.idle_s
        self._sessions: dict[_Key, McpSession] = {}
        self._starting: dict[_Key, threading.Lock] = {}
        self._lock = threading.Lock()
        self._stopping: str | None = None
        self._ended_runs: dict[str, None] = {}  # insertion-ordered, the last MAX_ENDED_RUNS
        self._sweeper: threading.Timer | None = None
        self.started = 0
        """How many sessions were started (the tests count fresh sessions by it)."""

    def call(self, request: SandboxRequest) -> SandboxResult:
        assert request.mcp is not None
        key = _Key(request.mcp.owner, request.run_id, request.mcp.server, repr(request.profile))
        started = time.monotonic()
        try:
            session = self._session(key, request)
        except _StartFailed as e:
            return SandboxResult(outcome=Outcome.START_FAILED, exit_code=None, stdout=b"", stderr=b"",
                                 stdout_truncated=False, stderr_truncated=False,
                                 duration_ms=int((time.monotonic() - started) * 1000), image_id="",
                                 runtime=request.profile.runtime, message=f"MCP session: {e}")
        result = session.call(request)
        if session.ended:
            self._forget(session)
        return result

    def _session(self, key: _Key, request: SandboxRequest) -> McpSession:
        with self._lock:
            if self._stopping is not None:
                raise _StartFailed(f"the sandbox is stopping: {self._stopping}")
            found = self._sessions.get(key)
            if found is not None and not found.ended:
                found.last_used = time.monotonic()
                return found
            gate = self._starting.setdefault(key, threading.Lock())
        with gate:  # one start per key: a batch's parallel reads share the session they wait for
            with self._lock:
                found = self._sessions.get(key)
                if found is not None and not found.ended:
                    return found
            with self._lock:
                held = sum(1 for k, s in self._sessions.items() if k.owner == key.owner and not s.ended)
            if held >= self.settings.max_per_owner:
                raise _StartFailed(f"{held} sessions are live for this tenant, its cap "
                                   f"(mcp.max_sessions_per_tenant {self.settings.max_per_owner}): "
                                   "finish runs that hold them")
            session = McpSession(self._backend, request, on_end=self._forget)
            session.start()
            with self._lock:
                # A kill_run, end_run or kill_all that came while it started finds it no more
                # than it found its container: it is ended here, never kept.
                refused = self._stopping or ("the run ended" if key.run_id in self._ended_runs else None)
                if refused is None:
                    self._sessions[key] = session
                    self.started += 1
            if refused is not None:
                session.kill(refused)
                raise _StartFailed(f"not started: {refused}")
            self._arm_sweeper()
            return session

    def _forget(self, session: McpSession) -> None:
        with self._lock:
            for key, found in list(self._sessions.items()):
                if found is session:
                    del self._sessions[key]

    def of_run(self, run_id: str) -> list[McpSession]:
        with self._lock:
            return [s for k, s in self._sessions.items() if k.run_id == run_id]

    def end_run(self, run_id: str) -> int:
        """The run ended: its sessions close (their containers removed). Returns how many."""
        with self._lock:
            self._ended_runs[run_id] = None
            while len(self._ended_runs) > MAX_ENDED_RUNS:
                del self._ended_runs[next(iter(self._ended_runs))]
        sessions = self.of_run(run_id)
        for s in sessions:
            s.close()
        return len(sessions)

    def kill_run(self, run_id: str, reason: str) -> int:
        sessions = self.of_run(run_id)
        for s in sessions:
            s.kill(reason)
        return len(sessions)

    def kill_all(self, reason: str) -> int:
        with self._lock:
            self._stopping = reason
            sessions = list(self._sessions.values())
        for s in sessions:
            s.kill(reason)
        return len(sessions)

    def close(self) -> None:
        with self._lock:
            self._stopping = self._stopping or "the backend closed"
            sessions = list(self._sessions.values())
            sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
        for s in sessions:
            s.close()

    def sweep(self, now: float | None = None) -> int:
        """Close the sessions unused for `idle_s`; returns how many."""
        now = time.monotonic() if now is None else now
        with self._lock:
            idle = [s for s in self._sessions.values() if now - s.last_used >= self._idle_s]
        for s in idle:
            s.close()
        return len(idle)

    def _arm_sweeper(self) -> None:
        with self._lock:
            if self._sweeper is not None or self._stopping is not None:
                return
            self._sweeper = threading.Timer(min(self._idle_s, 60.0), self._sweep_tick)
            self._sweeper.daemon = True
            self._sweeper.start()

    def _sweep_tick(self) -> None:
        with self._lock:
            self._sweeper = None
        self.sweep()
        with self._lock:
            more = bool(self._sessions)
        if more:
            self._arm_sweeper()


def start_for_listing(backend: DockerBackend, request: SandboxRequest) -> McpSession:
    """A session outside any run, for `ringfence mcp-servers` (pinning and checking a
    declaration's tool list): the caller closes it."""
    session = McpSession(backend, request, on_end=lambda _s: None)
    try:
        session.start()
    except _StartFailed as e:
        raise ProfileError("mcp", str(e)) from e
    return session


__all__ = ["IDEMPOTENCY_META", "McpCall", "McpSession", "McpSessions", "McpSettings", "content_of",
           "start_for_listing"]
