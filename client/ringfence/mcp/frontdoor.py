"""FrontDoor: the MCP lowlevel Server whose handlers make one MCP session one ringfence run.

    notifications/initialized   the session's run starts (goal "MCP session: NAME VERSION" from the
                                client's clientInfo); a session whose client never sends it (or
                                whose start failed) starts it at its first request instead
    tools/list                  ListTools, mapped (mapping.tool_of)
    tools/call                  ONE SubmitBatch of ONE call in the session's run: no checks of our
                                own, the server's admission path is the only one. An ASK waits for
                                the decision (following the run's log, DecisionWait's rule) while
                                progress notifications say which approval it waits for; a cancelled
                                request withdraws the approval, so the call never runs
    resources/list, /read       the run's artifacts (DownloadFiles), ringfence://runs/RUN/artifacts/PATH
    the session's end           FinishRun, then the session's AsyncClient is closed

A session is the SDK's per-client Connection: its `exit_stack` is unwound when the connection
ends, whichever transport drove it (Server.run under stdio, the Streamable HTTP manager's
serve_loop under HTTP), so the run is finished there. `aclose()` finishes every session still open.

FrontDoor IS the lowlevel Server (a subclass): the Streamable HTTP session manager calls more of
its `app` than a few methods (serve_loop reads its handlers, middleware, lifespan and identity),
and a subclass provides all of it. Its `run` (the lowlevel Server's) serves one connection; when it
returns, the connection's exit stack has finished the session's run and closed its client.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import anyio
import grpc
import mcp_types as types
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, ErrorData
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from ringfence._loop import DecisionWait
from ringfence._version import __version__
from ringfence.aio import AsyncClient
from ringfence.errors import ControlError, FailedPrecondition, NotFound
from ringfence.mcp.mapping import IDEMPOTENCY_KEY_META, STATUS_META, error_of, internal_error, result_of, tool_of
from ringfence.mcp.resources import artifact_uri, parse_artifact_uri, resource_contents
from ringfence.model import ApprovalStatus, Observation, ObservationStatus, ProposedCall

__all__ = ["FrontDoor"]

log = logging.getLogger("ringfence.mcp")

T = TypeVar("T")

Connect = Callable[[Any | None], Awaitable[AsyncClient]]

WITHDRAW_REASON = "the MCP client cancelled the request"

INSTRUCTIONS = (
    "ringfence admits every tool call through its policy: a call may be denied (the result says why, "
    "with its verdict path), or wait for a person's approval (progress notifications name the approval). "
    "One MCP session is one ringfence run: its budget, approvals remembered for the run and idempotency "
    f"keys (_meta {IDEMPOTENCY_KEY_META!r}) hold across the session's calls."
)


class _Session:
    """One MCP session's state: its client, its run, the number of its calls (for call ids)."""

    def __init__(self) -> None:
        self.client: AsyncClient | None = None
        self.run_id: str | None = None
        self.calls = 0
        self.lock = anyio.Lock()  # one start at a time: initialized and a first request may race
        self.ended = False

    def next_call_id(self) -> str:
        # Unique in the run: a session numbers its own calls, and a run is one session's.
        self.calls += 1
        return f"mcp-{self.calls}"


def _connection_of(ctx: ServerRequestContext[Any, Any]) -> Connection:
    """The SDK's per-client Connection behind a request's context. mcp 2.3.0 hands lowlevel handlers
    a ServerRequestContext whose ServerSession is per request and keeps the connection private;
    the connection is the one per-session object (its exit_stack is the session's end). Checked,
    so that an SDK that moved it fails loudly here rather than mixing sessions."""
    connection = getattr(ctx.session, "_connection", None)
    if not isinstance(connection, Connection):
        raise RuntimeError("the MCP SDK's ServerSession no longer carries its Connection (mcp==2.3.0 expected)")
    return connection


def _goal(connection: Connection) -> str:
    params = connection.client_params
    if params is None:
        return "MCP session: unknown client"
    info = params.client_info
    return f"MCP session: {info.name} {info.version}".strip()


@contextmanager
def _trace_parent(meta: Mapping[str, Any] | None) -> Iterator[None]:
    """`traceparent`/`tracestate` from a request's `_meta` as the parent of the gRPC calls made
    inside (the client injects the current context into each call's metadata), so the server's
    spans join the MCP client's trace. The SDK's own OpenTelemetry middleware already runs the
    handler under a span of that trace when a tracer is configured; then nothing is changed."""
    carrier = {k: v for k, v in (meta or {}).items() if k in ("traceparent", "tracestate") and isinstance(v, str)}
    parent = propagate.extract(carrier) if carrier else None
    remote = trace.get_current_span(parent).get_span_context() if parent is not None else None
    current = trace.get_current_span().get_span_context()
    if remote is None or not remote.is_valid or (current.is_valid and current.trace_id == remote.trace_id):
        yield
        return
    token = otel_context.attach(parent)  # type: ignore[arg-type] # parent is a Context when remote is set
    try:
        yield
    finally:
        otel_context.detach(token)


class FrontDoor(Server[Any]):
    """The MCP front door over one ringfence server (module docstring). `connect(request)` is called
    once per MCP session with the transport's request (`server.request_context.request`: the
    Starlette Request under HTTP, None under stdio) and returns an AsyncClient that FrontDoor owns
    and closes when the session ends. `progress_every_s`: the interval of progress notifications
    while a call waits for approval (sent only when the request carried a progressToken)."""

    def __init__(self, connect: Connect, *, progress_every_s: float = 1.0, name: str = "ringfence") -> None:
        if not progress_every_s > 0:
            raise ValueError("progress_every_s must be positive")
        super().__init__(
            name, version=__version__, instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
            on_list_resources=self._list_resources, on_read_resource=self._read_resource,
        )
        self.add_notification_handler("notifications/initialized", types.NotificationParams, self._initialized)
        self._connect = connect
        self.progress_every_s = progress_every_s
        self._sessions: dict[Connection, _Session] = {}

    async def aclose(self) -> None:
        """Finish every open session's run and close its client (a server shutting down)."""
        with anyio.CancelScope(shield=True):
            for connection in list(self._sessions):
                try:
                    await self._end(connection)
                except Exception:  # one session's failure must not leave the others' runs open
                    log.exception("an MCP session could not be ended cleanly")

    # -- sessions ---------------------------------------------------------------------------

    def _session(self, ctx: ServerRequestContext[Any, Any]) -> tuple[Connection, _Session]:
        connection = _connection_of(ctx)
        session = self._sessions.get(connection)
        if session is None:
            # No await between the look-up and the insert: concurrent handlers get one session.
            session = self._sessions[connection] = _Session()
            connection.exit_stack.push_async_callback(self._end, connection)
        return connection, session

    async def _started(self, ctx: ServerRequestContext[Any, Any]) -> tuple[_Session, AsyncClient, str]:
        """The session's client and run, started now if they are not yet."""
        connection, session = self._session(ctx)
        async with session.lock:
            if session.ended:
                raise MCPError(code=INVALID_PARAMS, message="this MCP session has ended")
            if session.client is None:
                session.client = await self._connect(ctx.request)
            if session.run_id is None:
                view = await session.client.start_run(_goal(connection))
                session.run_id = view.run_id
                log.info("MCP session %s: run %s started", _goal(connection), view.run_id)
            return session, session.client, session.run_id

    async def _end(self, connection: Connection) -> None:
        session = self._sessions.pop(connection, None)
        if session is None:
            return
        session.ended = True  # a request still starting the session now finds it ended
        async with session.lock:  # a start in progress completes first, so its run is finished here
            client, run_id = session.client, session.run_id
        try:
            if client is not None and run_id is not None:
                await client.finish_run(run_id)
                log.info("MCP session ended: run %s finished", run_id)
        except ControlError as e:  # the session is over either way; say why its run was not finished
            log.warning("MCP session ended: run %s could not be finished: %s", run_id, e)
        finally:
            if client is not None:
                await client.close()

    # -- handlers ---------------------------------------------------------------------------

    async def _initialized(self, ctx: ServerRequestContext[Any, Any], params: types.NotificationParams) -> None:
        try:
            await self._started(ctx)
        except Exception as e:  # noqa: BLE001 - a notification has no answer: the first request retries and reports
            log.warning("MCP session: the run could not be started at initialized (%s); "
                        "the first request will try again", e)

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any],
                          params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        async def body() -> types.ListToolsResult:
            _, client, _ = await self._started(ctx)
            return types.ListToolsResult(tools=[tool_of(view) for view in await client.list_tools()])

        return await _guarded("tools/list", body)

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any],
                         params: types.CallToolRequestParams) -> types.CallToolResult:
        async def body() -> types.CallToolResult:
            session, client, run_id = await self._started(ctx)
            return await self._call(ctx, session, client, run_id, params)

        return await _guarded(f"tools/call {params.name}", body)

    async def _call(self, ctx: ServerRequestContext[Any, Any], session: _Session, client: AsyncClient, run_id: str,
                    params: types.CallToolRequestParams) -> types.CallToolResult:
        meta: Mapping[str, Any] = params.meta or {}
        key = meta.get(IDEMPOTENCY_KEY_META)
        if key is not None and (not isinstance(key, str) or not key.strip()):
            raise MCPError(code=INVALID_PARAMS, message=f"_meta {IDEMPOTENCY_KEY_META!r} must be a non-empty string")
        call = ProposedCall(session.next_call_id(), params.name, params.arguments or {}, idempotency_key=key)
        with _trace_parent(meta):
            try:
                [observation] = await client.submit_batch(run_id, [call])
            except anyio.get_cancelled_exc_class():
                # Cancelled while the batch was in flight: the server may have asked for approval
                # already, and nobody would see the answer. Withdraw whatever it asked.
                with anyio.CancelScope(shield=True):
                    await self._withdraw_pending(client, run_id, call.call_id)
                raise
            if observation.status is ObservationStatus.PENDING_APPROVAL:
                observation = await self._await_decision(ctx, client, run_id, observation)
        result = result_of(observation)
        if isinstance(result, ErrorData):
            raise MCPError.from_error_data(result)
        if result.meta is not None:  # which run the call is in: for the caller's own look-ups
            result.meta[STATUS_META]["run_id"] = run_id
        return result

    # -- ASK --------------------------------------------------------------------------------

    async def _await_decision(self, ctx: ServerRequestContext[Any, Any], client: AsyncClient, run_id: str,
                              pending: Observation) -> Observation:
        """Follow the run's log until the call's observation is final (DecisionWait's rule), with
        progress notifications; the final observation. A cancelled request withdraws the approval
        (shielded from the cancellation) so the call never runs, then the cancellation goes on."""
        approval_id = pending.approval_id
        waiter = DecisionWait(frozenset({pending.call_id}), 0)
        failure: Exception | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._progress, ctx, pending.tool, approval_id)
                try:
                    done = False
                    while not done:
                        done = await self._follow(client, run_id, waiter)
                except Exception as e:  # noqa: BLE001 - raised below as itself, not inside an ExceptionGroup
                    failure = e
                tg.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._withdraw(client, run_id, approval_id)
            raise
        if failure is not None:
            raise failure
        view = await client.get_run(run_id)
        final = [o for o in view.trajectory if o.call_id == pending.call_id]
        return final[-1] if final else pending

    @staticmethod
    async def _follow(client: AsyncClient, run_id: str, waiter: DecisionWait) -> bool:
        """Read the run's log from where `waiter` stopped; True when waiting is over. A stream that
        ends on its deadline (the client's stream_timeout) is followed again from where it was."""
        stream = client.watch_run(run_id, waiter.next_seq)
        try:
            async for event in stream:
                if waiter.see(event):
                    return True
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        finally:
            stream.cancel()
        return False

    async def _progress(self, ctx: ServerRequestContext[Any, Any], tool: str, approval_id: str | None) -> None:
        """A progress notification every progress_every_s while the call waits (the SDK sends
        nothing when the request carried no progressToken)."""
        started = anyio.current_time()
        while True:
            waited = anyio.current_time() - started
            try:
                await ctx.session.report_progress(
                    waited, None, f"{tool}: waiting for approval {approval_id} ({waited:.0f}s so far); "
                                  "an approver decides with `ringfence approvals`")
            except Exception as e:  # noqa: BLE001 - progress is advisory: a closed stream must not fail the call
                log.debug("progress notification not sent: %s", e)
            await anyio.sleep(self.progress_every_s)

    async def _withdraw(self, client: AsyncClient, run_id: str, approval_id: str | None) -> None:
        if approval_id is None:
            return
        try:
            await client.withdraw_approval(run_id, approval_id, reason=WITHDRAW_REASON)
            log.info("approval %s withdrawn: %s", approval_id, WITHDRAW_REASON)
        except ControlError as e:  # decided meanwhile, or the run ended: the server's log says which
            log.warning("approval %s could not be withdrawn: %s", approval_id, e)

    async def _withdraw_pending(self, client: AsyncClient, run_id: str, call_id: str) -> None:
        try:
            approvals = await client.list_approvals(run_id)
        except ControlError as e:
            log.warning("cancelled call %s: its approvals could not be listed: %s", call_id, e)
            return
        for approval in approvals:
            if approval.call_id == call_id and approval.status is ApprovalStatus.PENDING:
                await self._withdraw(client, run_id, approval.approval_id)

    # -- resources --------------------------------------------------------------------------

    async def _list_resources(self, ctx: ServerRequestContext[Any, Any],
                              params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        async def body() -> types.ListResourcesResult:
            _, client, run_id = await self._started(ctx)
            try:
                files = await client.download_files(run_id, artifacts=True)
            except (NotFound, FailedPrecondition):  # a run without a workspace has no artifacts
                return types.ListResourcesResult(resources=[])
            return types.ListResourcesResult(resources=[
                types.Resource(name=path, uri=artifact_uri(run_id, path), size=len(data))
                for path, data in sorted(files.items())])

        return await _guarded("resources/list", body)

    async def _read_resource(self, ctx: ServerRequestContext[Any, Any],
                             params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        async def body() -> types.ReadResourceResult:
            _, client, run_id = await self._started(ctx)
            path = parse_artifact_uri(str(params.uri), run_id)
            if path is None:
                raise MCPError(code=INVALID_PARAMS, message=f"not an artifact of this session's run: {params.uri}")
            files = await client.download_files(run_id, artifacts=True)
            data = files.get(path)
            if data is None:
                raise MCPError(code=INVALID_PARAMS, message=f"no artifact {path!r} in this session's run")
            return types.ReadResourceResult(contents=[resource_contents(str(params.uri), data)])

        return await _guarded("resources/read", body)


async def _guarded(what: str, body: Callable[[], Awaitable[T]]) -> T:
    """`body()`, with ringfence's errors as JSON-RPC errors and anything unexpected as an internal
    error with no stack trace on the wire (the trace goes to the log, on stderr)."""
    try:
        return await body()
    except MCPError:
        raise
    except ControlError as e:
        raise MCPError.from_error_data(error_of(e)) from None
    except Exception:
        log.exception("%s failed", what)
        raise MCPError.from_error_data(internal_error()) from None
