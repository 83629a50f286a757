"""The ringfence.v1 services on grpc.aio, calling the Orchestrator's synchronous methods.

Every RPC goes through one wrapper (`Edge._unary` / `Edge._stream` / `Edge._client_stream`)
that, in this order:
  1. continues the caller's W3C trace (traceparent in metadata) with a SERVER span,
  2. authenticates the bearer token (ringfence_server/control/api/auth.py), then reads the version
     the client announces (`ringfence-client-version`; client/ringfence/wire/version.py has the
     rule): one this server does not serve is FAILED_PRECONDITION naming both versions and what to
     upgrade, one that is not a version INVALID_ARGUMENT, none at all served (grpcurl, other
     languages); then checks the method's role,
  3. rejects a request body that did not even parse as its protobuf (INVALID_ARGUMENT); for a
     client stream (UploadFiles) every message as it arrives, and the stream's total size is
     capped as it arrives (RESOURCE_EXHAUSTED past `EdgeOptions.max_client_stream_bytes`),
     after the caller was authenticated and authorized, before any message was read,
  4. runs the method, which decodes the request strictly (client/ringfence/wire/convert.py) and calls the
     Orchestrator in a worker thread,
  5. maps any exception through the one table in ringfence_server/control/api/status.py; an unexpected one is
     logged, counted (`Edge.unexpected_errors`) and answered INTERNAL with an incident id, never
     UNKNOWN.
The handlers are built from the proto descriptors, so a method added to the protos cannot
bypass the wrapper (and without an entry in auth.METHOD_ROLES nobody may call it).

Threads: the Orchestrator is synchronous and a batch can wait seconds on containers, so calls
run in the edge's own pool (asyncio's default pool has cpu+4 workers: six on these machines,
fewer than one tenant's batch limit times two tenants). The pool is shared fairly: every limit
is per tenant (most also per role), never server-wide, and one tenant's calls in one role hold at most
`worker_share` of the threads, its other calls waiting in their own queue (TenantShares), so
another tenant's GetRun, or the same tenant's approver, finds a free thread during a burst.
Calls that hold a per-tenant slot (batches, plans, transfers: they can wait on containers for
seconds) run in a lane of their own, bounded per tenant by that slot's limit. A client stream
is received on the event loop (the messages are small and arrive at the network's pace), and
the core call it ends in runs on a worker thread like any other. Streams (ExecutePlan, WatchRun,
WatchApprovals) each get one pump thread that iterates the core's iterator from start to end,
so any span or lock the core holds across yields stays on one thread; a bounded semaphore
gives backpressure when the client reads slowly.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import message_factory
from google.protobuf.message import Message
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from ringfence._version import __version__
from ringfence.errors import FieldViolation, InvalidArgument, ResourceExhausted, Unavailable, VersionMismatch
from ringfence.model import Principal, Role, RunView
from ringfence.v1 import (
    approvals_pb2,
    files_pb2,
    identity_pb2,
    plans_pb2,
    routing_pb2,
    runs_pb2,
    tools_pb2,
    types_pb2,
)
from ringfence.wire import convert, version
from ringfence_server.control.api.auth import Authenticator
from ringfence_server.control.api.core import Core
from ringfence_server.control.api.files_methods import FileMethods
from ringfence_server.control.api.plan_methods import PlanMethods
from ringfence_server.control.api.routing_methods import RoutingMethods
from ringfence_server.control.api.status import code_for, to_grpc_status
from ringfence_server.control.config import Config

log = logging.getLogger(__name__)

T = TypeVar("T")
Context = grpc.aio.ServicerContext[Any, Any]
"""A request's grpc.aio context; the handlers are generic (built from descriptors), so untyped."""
UnaryImpl = Callable[[Any, "Call"], Awaitable[Any]]
StreamImpl = Callable[[Any, "Call"], AsyncIterator[Any]]
ClientStreamImpl = Callable[[AsyncIterator[Any], "Call"], Awaitable[Any]]

PROTO_MODULES = (tools_pb2, runs_pb2, approvals_pb2, plans_pb2, routing_pb2, files_pb2, identity_pb2)
# What one message of a client stream costs beyond its fields: grpc's 5-byte frame header,
# rounded up. Charged so that a flood of empty messages reaches the stream's cap too.
_FRAME_BYTES = 8
SERVER_VERSION = version.parse(__version__)
"""This server's version: the client distribution's, which the server's pins exactly."""
SERVICE_NAMES = tuple(
    service.full_name for module in PROTO_MODULES for service in module.DESCRIPTOR.services_by_name.values()
)


@dataclass(frozen=True)
class EdgeOptions:
    """Limits the edge enforces itself (the rest are the core's)."""

    max_message_bytes: int = 1024 * 1024
    """Largest request accepted (grpc max_receive_message_length); past it RESOURCE_EXHAUSTED."""
    max_argument_bytes: int = 64 * 1024
    """Largest `arguments_json` of one call or step, as sent; past it INVALID_ARGUMENT."""
    max_batch_calls: int = 32
    max_plan_steps: int = 100
    """A caller's max_steps above this is refused at the edge; the core checks it again."""
    max_concurrent_batches: int = 32
    """Per tenant: SubmitBatch and ExecutePlan in flight at once; past it RESOURCE_EXHAUSTED."""
    max_in_flight: int = 128
    """Per tenant and role: core calls admitted at once (running or waiting for a worker);
    past it RESOURCE_EXHAUSTED (edge.max_in_flight)."""
    max_watch_streams: int = 16
    """Per tenant and role: WatchRun and WatchApprovals streams open at once; past it
    RESOURCE_EXHAUSTED (edge.max_watch_streams)."""
    worker_threads: int = 64
    """Threads running Orchestrator calls; bounded so a flood queues instead of spawning."""
    worker_share: int = 4
    """Per tenant and role: worker threads its calls may hold at once; its other calls wait
    their turn (edge.worker_share)."""
    slot_threads: int = 1024
    """Threads running the calls that hold a per-tenant slot (batches, plans, verifications,
    routings, file transfers): those limits bound them, tenant by tenant; this only backstops
    a deployment of very many tenants, whose slot calls then queue."""
    stream_buffer: int = 64
    """Events a stream's pump thread may run ahead of a slow client."""
    max_upload_bytes: int = 16 * 1024 * 1024
    """files.max_upload_bytes: the tar bytes one UploadFiles may carry; counted as they arrive,
    RESOURCE_EXHAUSTED past it (the whole archive is held in memory until it is checked)."""
    max_files: int = 1000
    """files.max_files: paths one DownloadFiles may name."""
    max_transfers: int = 4
    """Per tenant: UploadFiles and DownloadFiles in flight at once (each holds up to its cap in
    memory); past it RESOURCE_EXHAUSTED."""

    @property
    def max_client_stream_bytes(self) -> int:
        """The most a client stream may send in all (its messages' fields and frames): the
        upload cap plus one message of room for the first message's run id and destination."""
        return self.max_upload_bytes + self.max_message_bytes

    @classmethod
    def from_config(cls, config: Config, **overrides: int) -> EdgeOptions:
        limits = config.limits
        values = dict(
            max_message_bytes=limits.max_message_bytes,
            max_argument_bytes=limits.max_argument_bytes,
            max_batch_calls=limits.max_batch_calls,
            max_plan_steps=limits.max_plan_steps,
            max_concurrent_batches=limits.max_concurrent_batches,
            max_upload_bytes=config.files.max_upload_bytes,
            max_files=config.files.max_files,
            max_in_flight=config.edge.max_in_flight,
            max_watch_streams=config.edge.max_watch_streams,
            worker_threads=config.edge.worker_threads,
            worker_share=config.edge.worker_share,
        )
        values.update(overrides)
        return cls(**values)


class TenantLimiter:
    """Counts in-flight work per tenant, or per tenant and role when `acquire` names the role;
    refuses (never queues) past the limit.

    Thread-safe, because a slot is released by the worker thread when the work really ends,
    not when the client stops waiting: cancelling and resubmitting must not beat the limit.
    """

    def __init__(self, limit: int, what: str) -> None:
        self._limit = limit
        self._what = what
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, Role | None], int] = {}

    def acquire(self, tenant: str, role: Role | None = None) -> Callable[[], None]:
        key = (tenant, role)
        with self._lock:
            n = self._counts.get(key, 0)
            if n >= self._limit:
                who = f"tenant {tenant!r}" + (f" as {role.value}" if role is not None else "")
                per = " per tenant and role" if role is not None else ""
                raise ResourceExhausted(
                    f"{who} already has {n} {self._what} in flight (limit {self._limit}{per}); retry later")
            self._counts[key] = n + 1
        released = threading.Event()

        def release() -> None:
            with self._lock:
                if released.is_set():
                    return
                released.set()
                self._counts[key] -= 1

        return release

    def in_flight(self, tenant: str, role: Role | None = None) -> int:
        """The tenant's count for `role`; without a role, for all of its roles together."""
        with self._lock:
            if role is not None:
                return self._counts.get((tenant, role), 0)
            return sum(n for (t, _), n in self._counts.items() if t == tenant)


class TenantShares:
    """At most `share` worker threads per tenant and role at once.

    A call past its share waits on the event loop, in its own tenant's and role's FIFO, until
    one of that tenant's and role's calls ends: a burst queues behind itself, never in front of
    another tenant's calls in the pool's one queue, nor in front of its own approvers'. Acquired
    on the event loop only; released from any thread (the worker that ran the call, or the loop).
    """

    def __init__(self, share: int) -> None:
        self._share = share
        # One per configured tenant and role: bounded by the config, not by the callers.
        self._semaphores: dict[tuple[str, Role], asyncio.Semaphore] = {}

    async def acquire(self, tenant: str, role: Role) -> Callable[[], None]:
        semaphore = self._semaphores.get((tenant, role))
        if semaphore is None:
            semaphore = self._semaphores[(tenant, role)] = asyncio.Semaphore(self._share)
        await semaphore.acquire()
        loop = asyncio.get_running_loop()

        def release() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed (the server stopped): nobody waits any more
                loop.call_soon_threadsafe(semaphore.release)

        return release


@dataclass
class Call:
    """What a method implementation gets besides its request."""

    principal: Principal
    method: str
    span_context: otel_context.Context
    edge: Edge

    def _context(self) -> contextvars.Context:
        ctx = contextvars.copy_context()
        ctx.run(otel_context.attach, self.span_context)  # never detached: ctx is thrown away
        return ctx

    async def run(self, fn: Callable[..., T], *args: Any, slot: Callable[[], None] | None = None) -> T:
        """`fn(*args)` on a worker thread, inside this RPC's span.

        Admitted first against the caller's tenant and role (RESOURCE_EXHAUSTED past
        `max_in_flight`), then run on one of its tenant's and role's share of the workers,
        waiting for one if that share is busy; a call holding a `slot` (already bounded per
        tenant by that slot's limit) runs in the slot lane instead. The admission, the share
        and `slot` are released when the work ends (not when the client stops waiting), or at
        once if it never starts.
        """
        edge = self.edge
        releases = [slot] if slot is not None else []

        def release_all(_future: object = None) -> None:
            for release in releases:
                release()

        tenant, role = self.principal.tenant, self.principal.role
        try:
            releases.append(edge.admitted.acquire(tenant, role))
            if slot is None:
                releases.append(await edge.shares.acquire(tenant, role))
                executor = edge.executor
            else:
                # A batch, a plan or a transfer can wait on containers for seconds: in the
                # shared pool it would hold a thread its own tenant's GetRuns need. It has its own
                # lane, bounded per tenant by the slot it holds.
                executor = edge.slot_executor
            try:
                future = executor.submit(self._context().run, fn, *args)
            except RuntimeError as e:  # the pool is closed: the server is stopping
                raise Unavailable("the server is shutting down") from e
        except BaseException:  # refused, stopping, or the client went away while it waited its turn
            release_all()
            raise
        future.add_done_callback(release_all)
        return await asyncio.wrap_future(future)

    async def stream(
        self,
        make_iter: Callable[[], Iterator[T]],
        stop: threading.Event,
        *,
        slot: Callable[[], None] | None = None,
        finish_when_abandoned: bool = False,
    ) -> AsyncIterator[T]:
        """Items of `make_iter()` iterated on one pump thread, as an async iterator.

        When the client goes away, `stop` is set; with `finish_when_abandoned` the pump still
        runs the iterator to its end (a plan that started keeps its effects and its log
        complete; the client can WatchRun to follow it again).
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        room = threading.BoundedSemaphore(self.edge.options.stream_buffer)
        abandoned = threading.Event()

        def put(kind: str, item: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone (server shut down): nobody to tell
                loop.call_soon_threadsafe(queue.put_nowait, (kind, item))

        def pump() -> None:
            try:
                iterator = make_iter()
                try:
                    for item in iterator:
                        while not abandoned.is_set() and not room.acquire(timeout=0.25):
                            pass
                        if abandoned.is_set():
                            if finish_when_abandoned:
                                continue
                            return
                        put("item", item)
                finally:
                    close = getattr(iterator, "close", None)
                    if close is not None:
                        close()
                put("end", None)
            except BaseException as exc:  # noqa: BLE001 - handed to the RPC, which maps it
                put("error", exc)
            finally:
                if slot is not None:
                    slot()

        thread = threading.Thread(
            target=self._context().run, args=(pump,), name=f"rf-stream{self.method}", daemon=True
        )
        thread.start()
        try:
            while True:
                kind, item = await queue.get()
                if kind == "item":
                    room.release()
                    yield item
                elif kind == "error":
                    raise item
                else:
                    return
        finally:
            abandoned.set()
            stop.set()


class _Malformed:
    """Stands in for a request whose bytes did not parse, so the wrapper can answer
    INVALID_ARGUMENT (grpc itself would answer INTERNAL)."""

    def __init__(self, type_name: str, error: str) -> None:
        self.type_name = type_name
        self.error = error


def _lenient(message_class: type[Message]) -> Callable[[bytes], Message | _Malformed]:
    def deserialize(data: bytes) -> Message | _Malformed:
        try:
            return message_class.FromString(data)
        except Exception as e:  # noqa: BLE001 - DecodeError and friends
            return _Malformed(message_class.DESCRIPTOR.full_name, str(e) or type(e).__name__)

    return deserialize


def _carrier(metadata: grpc.aio.Metadata | None) -> dict[str, str]:
    return {k: v for k, v in (metadata or ()) if isinstance(v, str)}


def client_version(metadata: grpc.aio.Metadata | None) -> version.Version | None:
    """The version the caller announced, None when it announced none; raises VersionMismatch for
    one this server does not serve, InvalidArgument (naming the key) for one it cannot read."""
    sent = [v for k, v in (metadata or ()) if k == version.KEY]
    if not sent:
        return None
    if len(sent) > 1:
        raise InvalidArgument(f"the metadata {version.KEY} was sent {len(sent)} times",
                              [FieldViolation(version.KEY, "send it once")])
    value = sent[0]
    try:
        if not isinstance(value, str):  # a -bin key's value is bytes; this key's never is
            raise ValueError("binary, not a version of the form X.Y.Z")
        client = version.parse(value)
    except ValueError as e:
        raise InvalidArgument(f"the metadata {version.KEY} is not a version",
                              [FieldViolation(version.KEY, str(e))]) from None
    if not version.serves(SERVER_VERSION, client):
        raise VersionMismatch(version.message(SERVER_VERSION, client), str(client), str(SERVER_VERSION),
                              version.advice(SERVER_VERSION, client))
    return client


class Edge:
    """The wrapper shared by every ringfence.v1 RPC, and the handler table built from it."""

    def __init__(
        self,
        orchestrator: Core,
        authenticator: Authenticator,
        options: EdgeOptions,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        self.orchestrator = orchestrator
        self.auth = authenticator
        self.options = options
        self.tracer = trace.get_tracer("ringfence.api", tracer_provider=tracer_provider)
        self.executor = ThreadPoolExecutor(options.worker_threads, thread_name_prefix="rf-api")
        self.slot_executor = ThreadPoolExecutor(options.slot_threads, thread_name_prefix="rf-api-slot")
        self.batches = TenantLimiter(options.max_concurrent_batches, "batches or plans")
        # Per tenant and role: an agent's burst or streams never refuse its approvers.
        self.admitted = TenantLimiter(options.max_in_flight, "calls")
        self.shares = TenantShares(options.worker_share)
        self.watches = TenantLimiter(options.max_watch_streams, "watch streams")
        self.transfers = TenantLimiter(options.max_transfers, "file transfers")
        self.unexpected_errors = 0
        self.methods = RingfenceMethods(self)
        # Each service's bodies live with their feature; the handler table looks them up by name.
        self.method_sets = (self.methods, PlanMethods(self), RoutingMethods(self), FileMethods(self))

    def close(self, wait: bool = False) -> None:
        """Refuse new work; with `wait`, block until the Orchestrator calls already running
        end (a batch whose client gave up still records its effects before shutdown)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.slot_executor.shutdown(wait=False, cancel_futures=True)
        if wait:
            self.executor.shutdown(wait=True)
            self.slot_executor.shutdown(wait=True)

    # -- the wrapper ------------------------------------------------------------------------

    def _begin(
        self, method: str, context: Context
    ) -> tuple[grpc.aio.Metadata | None, trace.Span, otel_context.Context]:
        metadata = context.invocation_metadata()
        parent = propagate.extract(carrier=_carrier(metadata))
        service, _, name = method.strip("/").partition("/")
        span = self.tracer.start_span(
            method.strip("/"),
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
        )
        return metadata, span, trace.set_span_in_context(span, parent)

    def _admit(self, method: str, metadata: grpc.aio.Metadata | None, request: Any, span: trace.Span,
               span_ctx: otel_context.Context) -> Call:
        principal = self.auth.authenticate(metadata)
        # Before the role: a client of another version may name a method whose role (or
        # existence) differs here, and "upgrade" is the answer that helps; after the token, so
        # only a caller who may talk to this server learns its version.
        announced = client_version(metadata)
        if announced is not None:
            span.set_attribute("ringfence.client_version", str(announced))
        self.auth.authorize(principal, method)
        span.set_attribute("ringfence.tenant", principal.tenant)
        span.set_attribute("enduser.id", principal.subject)
        if isinstance(request, _Malformed):
            raise InvalidArgument(
                "the request body is not a valid protobuf message",
                [FieldViolation("", f"cannot parse {request.type_name}: {request.error}")],
            )
        return Call(principal, method, span_ctx, self)

    async def _fail(self, exc: BaseException, method: str, span: trace.Span, context: Context) -> None:
        if code_for(exc) is None:
            self.unexpected_errors += 1
        status = to_grpc_status(exc, method=method)
        span.set_attribute("rpc.grpc.status_code", status.code.value[0])
        span.set_status(Status(StatusCode.ERROR, status.code.name))
        await context.abort(status.code, status.details, status.trailing_metadata)

    def _unary(self, method: str, impl: UnaryImpl) -> Callable[[Any, Context], Awaitable[Any]]:
        async def handler(request: Any, context: Context) -> Any:
            metadata, span, span_ctx = self._begin(method, context)
            try:
                call = self._admit(method, metadata, request, span, span_ctx)
                response = await impl(request, call)
                span.set_attribute("rpc.grpc.status_code", 0)
                return response
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except Exception as exc:  # noqa: BLE001 - every error leaves through the table
                await self._fail(exc, method, span, context)
            finally:
                span.end()

        return handler

    def _stream(self, method: str, impl: StreamImpl) -> Callable[[Any, Context], AsyncIterator[Any]]:
        async def handler(request: Any, context: Context) -> AsyncIterator[Any]:
            metadata, span, span_ctx = self._begin(method, context)
            try:
                call = self._admit(method, metadata, request, span, span_ctx)
                async for item in impl(request, call):
                    yield item
                span.set_attribute("rpc.grpc.status_code", 0)
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except Exception as exc:  # noqa: BLE001 - every error leaves through the table
                await self._fail(exc, method, span, context)
            finally:
                span.end()

        return handler

    def _client_stream(
        self, method: str, impl: ClientStreamImpl
    ) -> Callable[[AsyncIterator[Any], Context], Awaitable[Any]]:
        async def handler(requests: AsyncIterator[Any], context: Context) -> Any:
            metadata, span, span_ctx = self._begin(method, context)
            try:
                # Authenticated and authorized from the metadata alone, before a message is read:
                # a caller without the role never makes the server hold a byte of its stream.
                call = self._admit(method, metadata, None, span, span_ctx)
                response = await impl(self._received(requests), call)
                span.set_attribute("rpc.grpc.status_code", 0)
                return response
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except Exception as exc:  # noqa: BLE001 - every error leaves through the table
                await self._fail(exc, method, span, context)
            finally:
                span.end()

        return handler

    async def _received(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """A client stream's messages, each checked as it arrives: one that did not parse is
        INVALID_ARGUMENT, and past `max_client_stream_bytes` in all the stream is
        RESOURCE_EXHAUSTED before the next message is handed on, whatever the method does."""
        cap = self.options.max_client_stream_bytes
        total = 0
        index = 0
        async for message in requests:
            if isinstance(message, _Malformed):
                raise InvalidArgument(
                    f"message {index} of the request stream is not a valid protobuf message",
                    [FieldViolation("", f"cannot parse {message.type_name}: {message.error}")],
                )
            total += message.ByteSize() + _FRAME_BYTES
            if total > cap:
                raise ResourceExhausted(f"the request stream is over the server's limit of {cap} bytes; "
                                        "nothing was done")
            index += 1
            yield message

    def handlers(self) -> list[grpc.GenericRpcHandler[Any, Any]]:
        """One generic handler per service, every method wrapped; built from the descriptors."""
        out: list[grpc.GenericRpcHandler[Any, Any]] = []
        for module in PROTO_MODULES:
            for service in module.DESCRIPTOR.services_by_name.values():
                table: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
                for m in service.methods:
                    full = f"/{service.full_name}/{m.name}"
                    impl = next(getattr(s, m.name) for s in self.method_sets if hasattr(s, m.name))
                    request_class = message_factory.GetMessageClass(m.input_type)
                    response_class = message_factory.GetMessageClass(m.output_type)
                    deserialize = _lenient(request_class)
                    serialize = response_class.SerializeToString
                    if m.client_streaming and m.server_streaming:
                        raise RuntimeError(f"{full}: bidirectional streaming is not supported by the edge")
                    if m.client_streaming:
                        table[m.name] = grpc.stream_unary_rpc_method_handler(
                            self._client_stream(full, impl), request_deserializer=deserialize,
                            response_serializer=serialize)
                    elif m.server_streaming:
                        table[m.name] = grpc.unary_stream_rpc_method_handler(
                            self._stream(full, impl), request_deserializer=deserialize, response_serializer=serialize)
                    else:
                        table[m.name] = grpc.unary_unary_rpc_method_handler(
                            self._unary(full, impl), request_deserializer=deserialize, response_serializer=serialize)
                out.append(grpc.method_handlers_generic_handler(service.full_name, table))
        return out


class RingfenceMethods:
    """The method bodies: decode strictly, call the core, encode. Named as in the protos."""

    def __init__(self, edge: Edge) -> None:
        self.edge = edge

    @property
    def core(self) -> Core:
        return self.edge.orchestrator

    # ToolService

    async def ListTools(self, request: tools_pb2.ListToolsRequest, call: Call) -> tools_pb2.ListToolsResponse:
        v = convert.Violations()
        convert.check_text(request.query, "query", convert.MAX_QUERY_CHARS, v)
        v.raise_if_any()
        tools = await call.run(self.core.list_tools, call.principal, request.query)
        return tools_pb2.ListToolsResponse(tools=[convert.tool_to_proto(t) for t in tools])

    # RunService

    async def StartRun(self, request: runs_pb2.StartRunRequest, call: Call) -> types_pb2.Run:
        v = convert.Violations()
        convert.check_text(request.goal, "goal", convert.MAX_GOAL_CHARS, v, required=True)
        convert.check_id(request.run_id, "run_id", v, required=False)
        v.raise_if_any()
        workspace = convert.workspace_from_proto(request)
        # The keyword only when a workspace is asked for: a core (or a test's double) that
        # predates workspaces still serves every other StartRun.
        start = self.core.start_run if workspace is None else functools.partial(self.core.start_run,
                                                                                 workspace=workspace)
        run = await call.run(start, call.principal, request.goal, request.run_id or None)
        return convert.run_to_proto(run)

    async def _by_run_id(
        self,
        request: runs_pb2.GetRunRequest | runs_pb2.FinishRunRequest | runs_pb2.CancelRunRequest,
        call: Call,
        fn: Callable[[Principal, str], RunView],
    ) -> types_pb2.Run:
        v = convert.Violations()
        convert.check_id(request.run_id, "run_id", v)
        v.raise_if_any()
        return convert.run_to_proto(await call.run(fn, call.principal, request.run_id))

    async def GetRun(self, request: runs_pb2.GetRunRequest, call: Call) -> types_pb2.Run:
        return await self._by_run_id(request, call, self.core.get_run)

    async def FinishRun(self, request: runs_pb2.FinishRunRequest, call: Call) -> types_pb2.Run:
        return await self._by_run_id(request, call, self.core.finish_run)

    async def CancelRun(self, request: runs_pb2.CancelRunRequest, call: Call) -> types_pb2.Run:
        return await self._by_run_id(request, call, self.core.cancel_run)

    async def ListRuns(self, request: runs_pb2.ListRunsRequest, call: Call) -> runs_pb2.ListRunsResponse:
        v = convert.Violations()
        status, outcome, page_size, page_token = convert.runs_request_from_proto(request, v)
        v.raise_if_any()
        page = await call.run(self.core.list_runs_page, call.principal, status, outcome, page_size, page_token)
        return convert.run_page_to_proto(page)

    async def ListEvents(self, request: runs_pb2.ListEventsRequest, call: Call) -> runs_pb2.ListEventsResponse:
        v = convert.Violations()
        run_id, from_seq, page_size = convert.events_request_from_proto(request, v)
        v.raise_if_any()
        page = await call.run(self.core.list_events, call.principal, run_id, from_seq, page_size)
        return convert.event_page_to_proto(page)

    async def VerifyRun(self, request: runs_pb2.VerifyRunRequest, call: Call) -> runs_pb2.AuditReport:
        v = convert.Violations()
        convert.check_id(request.run_id, "run_id", v)
        v.raise_if_any()
        return convert.audit_report_to_proto(await call.run(self.core.verify_run, call.principal, request.run_id))

    async def SubmitBatch(self, request: runs_pb2.SubmitBatchRequest, call: Call) -> runs_pb2.SubmitBatchResponse:
        options = self.edge.options
        v = convert.Violations()
        convert.check_id(request.run_id, "run_id", v)
        convert.check_id(request.batch_id, "batch_id", v, required=False)
        calls = convert.calls_from_proto(
            request.calls,
            max_calls=options.max_batch_calls,
            max_argument_bytes=options.max_argument_bytes,
            v=v,
        )
        v.raise_if_any("the batch is invalid; nothing was run")
        slot = self.edge.batches.acquire(call.principal.tenant)
        observations = await call.run(self.core.submit_batch, call.principal, request.run_id, calls,
                                      request.batch_id or None, slot=slot)
        return runs_pb2.SubmitBatchResponse(observations=[convert.observation_to_proto(o) for o in observations])

    async def ExecutePlan(self, request: runs_pb2.ExecutePlanRequest, call: Call) -> AsyncIterator[types_pb2.Event]:
        options = self.edge.options
        v = convert.Violations()
        convert.check_id(request.run_id, "run_id", v)
        if request.max_steps > options.max_plan_steps:
            v.add("max_steps", f"{request.max_steps} is over the server's limit of {options.max_plan_steps} steps")
        steps = convert.steps_from_proto(request.steps, max_argument_bytes=options.max_argument_bytes, v=v)
        max_steps = request.max_steps or None
        # The core validates the plan's meaning (count, unique keys, known tools, schemas);
        # its violations and the edge's are reported together, so a client fixes a plan once.
        try:
            await call.run(self.core.validate_plan, call.principal, steps, max_steps)
        except InvalidArgument as e:
            _merge_core_violations(v, e.violations)
            if not v.items:
                raise
        v.raise_if_any("the plan is invalid; nothing was run")
        slot = self.edge.batches.acquire(call.principal.tenant)
        stop = threading.Event()  # the core's execute_plan has no stop: the plan runs to its end
        events = call.stream(
            lambda: self.core.execute_plan(call.principal, request.run_id, steps, max_steps),
            stop,
            slot=slot,
            finish_when_abandoned=True,
        )
        async for event in events:
            yield convert.event_to_proto(event)

    async def WatchRun(self, request: runs_pb2.WatchRunRequest, call: Call) -> AsyncIterator[types_pb2.Event]:
        v = convert.Violations()
        convert.check_id(request.run_id, "run_id", v)
        v.raise_if_any()
        slot = self.edge.watches.acquire(call.principal.tenant, call.principal.role)
        stop = threading.Event()
        events = call.stream(
            lambda: self.core.watch_run(call.principal, request.run_id, request.from_seq, stop), stop, slot=slot
        )
        async for event in events:
            yield convert.event_to_proto(event)

    async def WithdrawApproval(self, request: runs_pb2.WithdrawApprovalRequest, call: Call) -> types_pb2.Observation:
        v = convert.Violations()
        convert.check_id(request.run_id, "run_id", v)
        convert.check_id(request.approval_id, "approval_id", v)
        convert.check_text(request.reason, "reason", convert.MAX_REASON_CHARS, v)
        v.raise_if_any()
        observation = await call.run(self.core.withdraw_approval, call.principal, request.run_id,
                                     request.approval_id, request.reason)
        return convert.observation_to_proto(observation)

    # ApprovalService

    async def ListApprovals(
        self, request: approvals_pb2.ListApprovalsRequest, call: Call
    ) -> approvals_pb2.ListApprovalsResponse:
        v = convert.Violations()
        convert.check_id(request.run_id, "run_id", v, required=False)
        v.raise_if_any()
        approvals = await call.run(self.core.list_approvals, call.principal, request.run_id or None)
        return approvals_pb2.ListApprovalsResponse(approvals=[convert.approval_to_proto(a) for a in approvals])

    async def GetApproval(self, request: approvals_pb2.GetApprovalRequest, call: Call) -> types_pb2.Approval:
        v = convert.Violations()
        convert.check_id(request.approval_id, "approval_id", v)
        v.raise_if_any()
        return convert.approval_to_proto(await call.run(self.core.get_approval, call.principal, request.approval_id))

    async def WatchApprovals(
        self, request: approvals_pb2.WatchApprovalsRequest, call: Call
    ) -> AsyncIterator[types_pb2.Approval]:
        slot = self.edge.watches.acquire(call.principal.tenant, call.principal.role)
        stop = threading.Event()
        approvals = call.stream(lambda: self.core.watch_approvals(call.principal, stop), stop, slot=slot)
        async for approval in approvals:
            yield convert.approval_to_proto(approval)

    async def DecideApproval(self, request: approvals_pb2.DecideApprovalRequest, call: Call) -> types_pb2.Approval:
        v = convert.Violations()
        convert.check_id(request.approval_id, "approval_id", v)
        approve = convert.decision_from_proto(request.decision, v)
        convert.check_text(request.reason, "reason", convert.MAX_REASON_CHARS, v)
        if request.remember and not approve:
            v.add("remember", "only an approval can be remembered")
        v.raise_if_any()
        approval = await call.run(
            self.core.decide_approval, call.principal, request.approval_id, approve, request.reason,
            request.remember, request.digest or None,
        )
        return convert.approval_to_proto(approval)

    # IdentityService

    async def WhoAmI(self, request: identity_pb2.WhoAmIRequest, call: Call) -> identity_pb2.Identity:
        # The principal the edge authenticated: no core call, nothing the token does not say.
        return convert.identity_to_proto(call.principal)


def _merge_core_violations(v: convert.Violations, core: tuple[FieldViolation, ...]) -> None:
    """Add the core's violations, minus those about a field the edge already reported (the core
    saw `{}` in place of arguments the edge could not parse, and would complain about that)."""
    reported = [item.field for item in v.items]

    def covered(field: str) -> bool:
        for f in reported:
            if field == f or field.startswith(f + ".") or field.startswith(f + "["):
                return True
            # steps[2].arguments_json (edge) covers steps[2].arguments.* (core)
            if f.endswith(".arguments_json") and field.startswith(f[: -len("_json")]):
                return True
        return False

    for item in core:
        if not covered(item.field):
            v.add(item.field, item.description)
