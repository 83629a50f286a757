"""The Attach service: sandbox workers hold one stream each to a control plane.

The hub authenticates a worker by its own token (the digests of `[workers] tokens`, each naming
one worker: no tenant token opens this service and a worker token opens nothing else), reads
its hello, records a new lease epoch for it in the event store (fencing every earlier
attachment of the worker, on any control plane sharing the store), registers the attachment for
placement, and then, until the stream ends:

- heartbeat  renews the lease in the store (by the store's clock); renewed: acknowledged; not
             renewed (another attachment took over, or it lapsed): the stream ends, fenced
- report     settles the calls it answers, after checking in the store that this attachment's
             epoch is still current; a report nothing waits for any more (the caller gave up at
             the envelope's deadline, the run ended, the attachment was fenced) is recorded as a
             late result, durable, and never applied
- silence    a watchdog ends the stream when no heartbeat renewed the lease for lease_s

When the stream ends, every call still out on it is lost (the remote backend answers UNCERTAIN:
reads run again elsewhere, mutations are reconciled) and its lease epoch is ended in the store.
Errors a worker causes (no token, another worker's hello, a malformed capacity) answer their
gRPC codes; anything else is a bug: INTERNAL with an incident id, counted (`unexpected_errors`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from ringfence import errors as E
from ringfence.v1 import workers_pb2
from ringfence_server.control.api.auth import bearer_digest, find_by_digest
from ringfence_server.control.api.status import code_for, to_grpc_status
from ringfence_server.control.config import WorkersConfig
from ringfence_server.control.store.base import LateResult, WorkerLease
from ringfence_server.control.workers.placement import Advertised
from ringfence_server.control.workers.registry import Attachment, Outcome, Pending, WorkerRegistry
from ringfence_server.sandbox.profile import LIMIT_RANGES, RUNTIMES
from ringfence_server.worker.envelope import SandboxSpec
from ringfence_server.worker.errors import WorkerError
from ringfence_server.worker.wire import decode_result, max_wire_bytes

__all__ = ["ATTACH_METHOD", "WorkerHub"]

log = logging.getLogger("ringfence.workers")

ATTACH_METHOD = "/ringfence.v1.WorkerHub/Attach"
_HELLO_TIMEOUT_S = 30.0
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./-]{0,62}")
_MAX_SLOTS = 1024
_MAX_IMAGES = 4096
_MAX_LABELS = 64
# A report nobody waits for any more is only hashed, so its cap is the largest result any call
# may have (every ceiling at its maximum), not a waiting call's own.
_MAX_ANY_RESULT = max_wire_bytes(SandboxSpec(stdout_limit=int(LIMIT_RANGES["stdout_limit"][1]),
                                             stderr_limit=int(LIMIT_RANGES["stderr_limit"][1])))
_MAX_PARTIAL_REPORTS = 1024
# The names a worker reports with a late result are kept at most this long (they are its words).
_MAX_REPORTED = 256
LATE_RESULTS_PER_WINDOW = 1000
"""Late results one worker may have recorded per LATE_WINDOW_S: far more than a fenced worker's
calls in flight (its slots, and the reports it held while cut off), far fewer than a flood."""
LATE_WINDOW_S = 600.0


@dataclass
class _Pieces:
    """A report's result arriving in pieces (WorkReport.more): joined while somebody waits for
    it, else only hashed (a late result is kept as its digest), never past `limit` bytes."""

    limit: int
    data: bytearray | None
    digest: Any = field(default_factory=hashlib.sha256)
    size: int = 0


@dataclass
class _Stream:
    """What one attachment's tasks share."""

    lease: WorkerLease
    last_renewed: float
    reason: str = "the worker closed the stream"
    pieces: dict[str, _Pieces] = field(default_factory=dict)


class _Budget:
    """At most `limit` takes per key in each `window_s` (a fixed window: simple, and enough to
    bound what one worker can make the store keep)."""

    def __init__(self, limit: int, window_s: float, clock: Any = time.monotonic) -> None:
        self._limit = limit
        self._window_s = window_s
        self._clock = clock
        self._windows: dict[str, tuple[float, int]] = {}

    def take(self, key: str) -> bool:
        now = self._clock()
        start, used = self._windows.get(key, (now, 0))
        if now - start >= self._window_s:
            start, used = now, 0
        if used >= self._limit:
            if used == self._limit:
                log.warning("worker %s: over %d late results in %g s; more are counted, not kept", key,
                            self._limit, self._window_s)
                self._windows[key] = (start, used + 1)
            return False
        self._windows[key] = (start, used + 1)
        return True


class _Violation(Exception):
    """A worker broke the stream's rules: its attachment ends (its calls are lost)."""


class WorkerHub:
    """The servicer of ringfence.v1.WorkerHub (grpc.aio)."""

    def __init__(self, registry: WorkerRegistry, store: Any, config: WorkersConfig, holder: str) -> None:
        self.registry = registry
        self.store = store
        self.config = config
        self.holder = holder
        self.unexpected_errors = 0
        self.late_results = 0
        self.late_results_dropped = 0
        self._late_budget = _Budget(LATE_RESULTS_PER_WINDOW, LATE_WINDOW_S)
        self._digests = dict(config.tokens)

    # -- the RPC ----------------------------------------------------------------------------

    async def Attach(self, requests: AsyncIterator[workers_pb2.WorkerMessage],
                     context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[workers_pb2.HubMessage]:
        try:
            worker_id = self._authenticate(context.invocation_metadata())
            hello = await self._hello(requests, worker_id)
            advertised = _advertised(hello.capacity)
            lease = await asyncio.to_thread(self.store.acquire_worker_lease, worker_id, self.holder,
                                            self.config.lease_s)
        except Exception as e:  # noqa: BLE001 - mapped to a status (a bug: INTERNAL, counted)
            await self._fail(e, context)
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[workers_pb2.HubMessage | None] = asyncio.Queue()

        def send(message: workers_pb2.HubMessage) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, message)

        attachment = Attachment(worker_id=worker_id, epoch=lease.epoch, holder=self.holder, advertised=advertised,
                                send=send)
        state = _Stream(lease=lease, last_renewed=loop.time())
        self.registry.attach(attachment)
        log.info("worker %s attached (epoch %d, %d slots, runtimes %s, %d images, version %s)", worker_id,
                 lease.epoch, advertised.slots, ",".join(sorted(advertised.runtimes)),
                 len(advertised.image_digests), hello.version or "?")
        tasks = [asyncio.create_task(self._read(requests, attachment, state, queue)),
                 asyncio.create_task(self._watch(state, queue))]
        try:
            yield workers_pb2.HubMessage(welcome=workers_pb2.HubWelcome(
                epoch=lease.epoch, lease_s=self.config.lease_s, heartbeat_s=self.config.heartbeat_s,
                control_plane=self.holder))
            while True:
                message = await queue.get()
                if message is None:
                    break
                yield message
        finally:
            for task in tasks:
                task.cancel()
            lost = self.registry.detach(attachment, f"worker {worker_id} (epoch {lease.epoch}): {state.reason}")
            log.info("worker %s detached (epoch %d): %s; %d calls lost", worker_id, lease.epoch, state.reason, lost)
            # Not awaited: the handler may be cancelled already (the worker hung up); the store
            # call finishes on its thread either way, and an unended lease lapses by itself.
            loop.run_in_executor(None, self._end_lease, state.lease)

    # -- its parts --------------------------------------------------------------------------

    def _authenticate(self, metadata: Any) -> str:
        """The worker id the bearer token names (the tenants' header rules and comparison)."""
        found = find_by_digest(bearer_digest(metadata), ((d, w) for w, d in self._digests.items()))
        if found is None:
            raise E.Unauthenticated("the worker token is not one of [workers] tokens")
        return found

    async def _hello(self, requests: AsyncIterator[workers_pb2.WorkerMessage],
                     worker_id: str) -> workers_pb2.WorkerHello:
        try:
            first = await asyncio.wait_for(anext(requests), _HELLO_TIMEOUT_S)
        except (StopAsyncIteration, TimeoutError):
            raise E.InvalidArgument("a worker's first message must be its hello") from None
        if first.WhichOneof("kind") != "hello":
            raise E.InvalidArgument("a worker's first message must be its hello",
                                    [E.FieldViolation("hello", "missing")])
        if first.hello.worker_id != worker_id:
            raise E.PermissionDenied(f"this token is worker {worker_id}'s, not {first.hello.worker_id!r}'s")
        return first.hello

    async def _read(self, requests: AsyncIterator[workers_pb2.WorkerMessage], attachment: Attachment,
                    state: _Stream, queue: asyncio.Queue[workers_pb2.HubMessage | None]) -> None:
        try:
            async for message in requests:
                kind = message.WhichOneof("kind")
                if kind == "heartbeat":
                    renewed = await asyncio.to_thread(self.store.renew_worker_lease, state.lease, self.config.lease_s)
                    if renewed is None:
                        state.reason = "fenced: its lease could not be renewed (lapsed, or a newer attachment)"
                        break
                    state.lease = renewed
                    state.last_renewed = asyncio.get_running_loop().time()
                    queue.put_nowait(workers_pb2.HubMessage(ack=workers_pb2.HeartbeatAck(seq=message.heartbeat.seq)))
                elif kind == "report":
                    joined = self._join(attachment, state, message.report)
                    if joined is None:
                        continue  # more pieces to come
                    report, digest = joined
                    if not await self._report(attachment, state, report, digest):
                        break
                else:
                    state.reason = f"protocol error: a {kind} after the hello"
                    break
            else:
                state.reason = "the worker closed the stream"
        except asyncio.CancelledError:
            raise
        except _Violation as e:
            state.reason = f"protocol error: {e}"
        except grpc.aio.AioRpcError as e:
            state.reason = f"the stream failed: {e.code().name}"
        except Exception as e:  # noqa: BLE001 - a bug: logged with an incident id and counted
            if code_for(e) is None:
                self.unexpected_errors += 1
            state.reason = to_grpc_status(e, method=ATTACH_METHOD).details
        queue.put_nowait(None)

    async def _watch(self, state: _Stream, queue: asyncio.Queue[workers_pb2.HubMessage | None]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            if loop.time() - state.last_renewed > self.config.lease_s:
                state.reason = f"lease lapsed: no heartbeat renewed it for {self.config.lease_s:g} s"
                queue.put_nowait(None)
                return

    def _join(self, attachment: Attachment, state: _Stream,
              piece: workers_pb2.WorkReport) -> tuple[workers_pb2.WorkReport, str | None] | None:
        """The whole report once its last piece is in, with its result's sha256 when the result
        was only hashed (nobody waited for it: it is not in the report); None before.
        _Violation for a result past what its call's output caps allow (any call's, for one
        nobody waits for), or too many reports in pieces at once."""
        pieces = state.pieces.get(piece.envelope_id)
        if pieces is None:
            if not piece.more:
                return piece, None  # one piece: the usual case
            if len(state.pieces) >= _MAX_PARTIAL_REPORTS:
                raise _Violation(f"more than {_MAX_PARTIAL_REPORTS} reports in pieces at once")
            waiting = self.registry.same_call(attachment, piece)
            limit = max((max_wire_bytes(p.placed.envelope.profile) for p in waiting), default=_MAX_ANY_RESULT)
            pieces = state.pieces[piece.envelope_id] = _Pieces(limit, bytearray() if waiting else None)
        pieces.size += len(piece.result)
        if pieces.size > pieces.limit:
            raise _Violation(f"the result of envelope {piece.envelope_id} is over {pieces.limit} bytes, "
                             "more than its call's output caps allow")
        if pieces.data is not None:
            pieces.data += piece.result
        else:
            pieces.digest.update(piece.result)
        if piece.more:
            return None
        del state.pieces[piece.envelope_id]
        whole = workers_pb2.WorkReport()
        whole.CopyFrom(piece)
        whole.result = bytes(pieces.data) if pieces.data is not None else b""
        whole.more = False
        return whole, pieces.digest.hexdigest() if pieces.data is None else None

    async def _report(self, attachment: Attachment, state: _Stream, report: workers_pb2.WorkReport,
                      digest: str | None) -> bool:
        """Settle what `report` answers; False when the attachment turned out to be fenced."""
        if report.kind == "in_progress":
            return True  # the running delivery's own report settles this one too (same_call)
        waiting = self.registry.same_call(attachment, report)
        if not waiting:
            if self.registry.was_fenced(report.envelope_id):
                reason = "fenced"
            elif self.registry.run_ended(f"{report.tenant}:{report.run_id}"):
                reason = "run_ended"
            else:
                reason = "unknown_envelope"
            await self._late(attachment, report, reason, digest)
            return True
        current = await asyncio.to_thread(self.store.worker_lease_current, attachment.worker_id, attachment.epoch)
        if not current:
            await self._late(attachment, report, "fenced", digest)
            state.reason = "fenced: a report arrived after its lease epoch ended"
            return False
        applied = False
        for pending in waiting:
            applied |= pending.settle(_outcome(report, pending))
        if not applied and any(p.future.result().kind == "lost" for p in waiting):
            # Given up on (its deadline passed) while it still ran: fenced, kept as evidence.
            await self._late(attachment, report, "fenced", digest)
        # Otherwise a second report of a call already settled (a redelivery answered from the
        # worker's record): the same result again, nothing to apply or keep.
        return True

    async def _late(self, attachment: Attachment, report: workers_pb2.WorkReport, reason: str,
                    digest: str | None) -> None:
        """Record `report` as late. `digest`: its result's sha256 when the result was only hashed
        on arrival; otherwise it is computed here, for late results only, never on a result's
        usual way."""
        self.late_results += 1
        if not report.envelope_id:
            # An envelope the worker could not even read: nothing to name, nothing to keep.
            log.warning("worker %s refused an unreadable envelope: %s", attachment.worker_id, report.detail[:200])
            return
        if not self._late_budget.take(attachment.worker_id):
            # What a worker reports is its own to say: a flood of made-up late results must not
            # fill the store. Counted and logged (once per window), not kept.
            self.late_results_dropped += 1
            return
        late = LateResult(worker_id=attachment.worker_id, epoch=attachment.epoch,
                          envelope_id=report.envelope_id[:_MAX_REPORTED], tenant=report.tenant[:_MAX_REPORTED],
                          run_id=report.run_id[:_MAX_REPORTED], call_id=report.call_id[:_MAX_REPORTED],
                          attempt=int(report.attempt), reason=reason,
                          result_sha256=digest or hashlib.sha256(report.result).hexdigest())
        log.warning("late result from worker %s (epoch %d): envelope %s, %s/%s/%s attempt %d: %s; not applied",
                    attachment.worker_id, attachment.epoch, report.envelope_id, report.tenant, report.run_id,
                    report.call_id, report.attempt, reason)
        await asyncio.to_thread(self.store.record_late_result, late)

    def _end_lease(self, lease: WorkerLease) -> None:
        try:
            self.store.end_worker_lease(lease)
        except Exception:
            log.warning("could not end worker %s's lease (epoch %d); it lapses by itself", lease.worker_id,
                        lease.epoch, exc_info=True)

    async def _fail(self, exc: BaseException, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if code_for(exc) is None:
            self.unexpected_errors += 1
        status = to_grpc_status(exc, method=ATTACH_METHOD)
        await context.abort(status.code, status.details, status.trailing_metadata)


def _outcome(report: workers_pb2.WorkReport, pending: Pending) -> Outcome:
    if report.kind == "result":
        try:
            return Outcome("result", decode_result(report.result, limits=pending.placed.envelope.profile))
        except WorkerError as e:
            # The worker ran something and sent what we cannot read: it may have had effects.
            return Outcome("lost", message=f"its result could not be read: {e}")
    if report.kind == "uncertain":
        return Outcome("uncertain", message=report.detail or "its restart could not say how the call ended")
    if report.kind == "refused":
        return Outcome("refused", message=f"{report.refusal}: {report.detail}" if report.detail else report.refusal)
    return Outcome("lost", message=f"an unknown report kind {report.kind!r}")


def _advertised(capacity: workers_pb2.WorkerCapacity) -> Advertised:
    """The hello's capacity, checked (INVALID_ARGUMENT naming the field)."""
    def bad(field: str, why: str) -> E.InvalidArgument:
        return E.InvalidArgument(f"hello.capacity.{field}: {why}", [E.FieldViolation(f"hello.capacity.{field}", why)])

    if not 1 <= capacity.slots <= _MAX_SLOTS:
        raise bad("slots", f"must be 1 to {_MAX_SLOTS}")
    if not math.isfinite(capacity.cpus) or capacity.cpus <= 0:
        raise bad("cpus", "must be a positive number")
    runtimes = frozenset(capacity.runtimes)
    if not runtimes or not runtimes <= set(RUNTIMES):
        raise bad("runtimes", f"must name some of {', '.join(RUNTIMES)}")
    digests = frozenset(capacity.image_digests)
    if len(digests) > _MAX_IMAGES or not all(_DIGEST.fullmatch(d) for d in digests):
        raise bad("image_digests", f"at most {_MAX_IMAGES} image IDs, each sha256: and 64 hex digits")
    labels: Mapping[str, str] = dict(capacity.labels)
    if len(labels) > _MAX_LABELS or not all(_LABEL.fullmatch(k) and len(v) <= 256 for k, v in labels.items()):
        raise bad("labels", f"at most {_MAX_LABELS} labels, names of [A-Za-z0-9_./-]")
    return Advertised(slots=capacity.slots, cpus=capacity.cpus, runtimes=runtimes, image_digests=digests,
                      egress=capacity.egress, labels=labels)
