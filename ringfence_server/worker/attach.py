"""The worker's side of the Attach stream: dial a control plane, say hello, keep the lease
alive, run what arrives, report each outcome, and fence itself when cut off.

A worker has no listening port: it dials out to each address in turn until one answers, holds
one stream, and dials again when it ends. On the stream:

- hello      its id and capacity (slots, CPUs, runtimes, the image IDs its engine holds, whether
             it runs an egress proxy, labels); the control plane answers with the lease epoch
             of this attachment and the heartbeat and lease lengths
- heartbeat  every heartbeat_s; each acknowledgement extends the worker's own view of its lease
             to (when that heartbeat was SENT) + lease_s, by the worker's monotonic clock. The
             control plane renewed the lease after it received the heartbeat, so the worker's
             view always ends before the store's: a worker never believes it holds a lease the
             control planes consider lost
- work       a sealed envelope, handed to the executor on one of `slots` threads; its report is
             sent on whatever stream is current when it is done (a report for an older
             attachment's call is recorded there as late, never applied)
- kill_run   kill that run's sandboxes now

**Fencing**: when its view of the lease ends without a newer acknowledgement (the control
plane is unreachable, the network is cut, the stream is stalled), the worker stops taking work,
kills every sandbox it runs (`on_fenced`), cancels the stream and dials again; work that arrives
after that on the old stream is never started. Results the killed calls record stay in the
results store (a redelivery gets them) and their reports arrive as late.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import grpc

from ringfence.v1 import workers_pb2, workers_pb2_grpc
from ringfence_server.worker.envelope import SealedEnvelope
from ringfence_server.worker.executor import Report

__all__ = ["Attacher", "Capacity", "Handler", "WorkerReport"]

log = logging.getLogger("ringfence.worker")

_WELCOME_TIMEOUT_S = 30.0
_MAX_HELD = 10_000
RESULT_CHUNK = 256 * 1024
"""The most result bytes one WorkReport carries (the stream's messages stay far under the 1 MiB
a control plane's API server accepts)."""


@dataclass(frozen=True)
class Capacity:
    """What this worker advertises in its hello."""

    slots: int
    cpus: float
    runtimes: tuple[str, ...]
    image_digests: tuple[str, ...]
    egress: bool
    labels: Mapping[str, str] = field(default_factory=dict)

    def to_proto(self) -> workers_pb2.WorkerCapacity:
        return workers_pb2.WorkerCapacity(slots=self.slots, cpus=self.cpus, runtimes=list(self.runtimes),
                                          image_digests=list(self.image_digests), egress=self.egress,
                                          labels=dict(self.labels))


@dataclass(frozen=True)
class WorkerReport:
    """How one delivered envelope ended (the executor's report, as it goes on the wire)."""

    envelope_id: str
    kind: str
    result: bytes = b""
    refusal: str = ""
    detail: str = ""
    tenant: str = ""
    run_id: str = ""
    call_id: str = ""
    attempt: int = 0

    @classmethod
    def of(cls, report: Report) -> WorkerReport:
        """The executor's report as it goes on the wire."""
        key = report.key
        return cls(envelope_id=report.envelope_id or "", kind=report.kind.value, result=report.result or b"",
                   refusal=report.reason or "", detail=report.detail, tenant=key.tenant if key else "",
                   run_id=key.run_id if key else "", call_id=key.call_id if key else "",
                   attempt=key.attempt if key else 0)

    def to_protos(self) -> list[workers_pb2.WorkReport]:
        """The report as it goes on the stream: its result in pieces of at most RESULT_CHUNK
        bytes (all but the last marked `more`), so that no message nears a server's cap."""
        pieces = [self.result[i:i + RESULT_CHUNK] for i in range(0, len(self.result), RESULT_CHUNK)] or [b""]
        return [workers_pb2.WorkReport(envelope_id=self.envelope_id, kind=self.kind, result=piece,
                                       refusal=self.refusal, detail=self.detail, tenant=self.tenant,
                                       run_id=self.run_id, call_id=self.call_id, attempt=self.attempt,
                                       more=n < len(pieces) - 1)
                for n, piece in enumerate(pieces)]


class Handler(Protocol):
    """What runs a delivered envelope (ringfence_server.worker.executor): never raises for a
    refused or failed call (that is a report); an exception is a bug."""

    def handle(self, sealed: SealedEnvelope) -> Report: ...


class _Session:
    """One attachment: its outgoing queue and the worker's view of its lease."""

    def __init__(self, epoch: int, lease_s: float, heartbeat_s: float, now: float) -> None:
        self.epoch = epoch
        self.lease_s = lease_s
        self.heartbeat_s = heartbeat_s
        self.outgoing: queue.Queue[workers_pb2.WorkerMessage | None] = queue.Queue()
        self.lease_until = now + lease_s  # the welcome came after the lease was recorded
        self.sent: dict[int, float] = {}
        self.fenced = threading.Event()
        self.ended = threading.Event()
        self.lock = threading.Lock()

    def acknowledged(self, seq: int) -> None:
        with self.lock:
            sent = self.sent.pop(seq, None)
            if sent is not None:
                self.lease_until = max(self.lease_until, sent + self.lease_s)
            for old in [s for s in self.sent if s < seq]:
                del self.sent[old]


class Attacher:
    """Holds this worker's attachment to the control planes until `stop` is set."""

    def __init__(self, *, worker_id: str, token: str, addresses: Sequence[str], capacity: Capacity,
                 handler: Handler, kill_run: Callable[[str, str], int], on_fenced: Callable[[str], int],
                 version: str = "", credentials: grpc.ChannelCredentials | None = None,
                 redial_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not addresses:
            raise ValueError("at least one control plane address")
        self.worker_id = worker_id
        self._token = token
        self._addresses = tuple(addresses)
        self._capacity = capacity
        self._handler = handler
        self._kill_run = kill_run
        self._on_fenced = on_fenced
        self._version = version
        self._credentials = credentials
        self._redial_s = redial_s
        self._clock = clock
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=capacity.slots,
                                                           thread_name_prefix="rf-worker-call")
        self._current: _Session | None = None
        self._current_lock = threading.Lock()
        # Reports made while no attachment could carry them (fenced, between streams): sent on
        # the next attachment, where the control plane records them as late (never applied).
        self._held: list[WorkerReport] = []
        self.attachments = 0
        """Streams this worker has held (tests read it)."""
        self.fencings = 0
        """Times it fenced itself."""
        self.epoch = 0
        """The epoch of the current (or last) attachment."""
        self.attached = threading.Event()
        """Set while an attachment is live."""

    def run(self, stop: threading.Event) -> None:
        """Dial, attach, serve; again after each end, trying the addresses in turn."""
        try:
            turn = 0
            while not stop.is_set():
                address = self._addresses[turn % len(self._addresses)]
                turn += 1
                try:
                    self._attach(address, stop)
                except grpc.RpcError as e:
                    code = e.code() if hasattr(e, "code") else None
                    log.warning("worker %s: control plane %s: %s %s", self.worker_id, address,
                                code.name if code else "error", e.details() if hasattr(e, "details") else e)
                    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                                grpc.StatusCode.INVALID_ARGUMENT):
                        # No second try will be accepted either: say so and stop.
                        raise
                stop.wait(self._redial_s)
        finally:
            # Calls still running go on (the process kills their sandboxes next, then drains).
            self._pool.shutdown(wait=False, cancel_futures=True)

    def drain(self) -> None:
        """Wait for the calls still running (after run() returned and their sandboxes were
        killed), so that their results are recorded before the results store closes."""
        self._pool.shutdown(wait=True)

    def _attach(self, address: str, stop: threading.Event) -> None:
        options = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
                   ("grpc.http2.max_pings_without_data", 0), ("grpc.keepalive_permit_without_calls", 1)]
        channel = (grpc.secure_channel(address, self._credentials, options=options) if self._credentials is not None
                   else grpc.insecure_channel(address, options=options))
        with channel:
            hello = workers_pb2.WorkerMessage(hello=workers_pb2.WorkerHello(
                worker_id=self.worker_id, capacity=self._capacity.to_proto(), version=self._version))
            # The request stream: the hello, then (once the welcome made a session) the
            # session's queue. `ready` releases the iterator's thread either way.
            ready = threading.Event()
            holder: dict[str, _Session] = {}

            def outgoing() -> Iterator[workers_pb2.WorkerMessage]:
                yield hello
                ready.wait()
                session = holder.get("session")
                if session is None:
                    return
                while True:
                    message = session.outgoing.get()
                    if message is None:
                        return
                    yield message

            stub = workers_pb2_grpc.WorkerHubStub(channel)
            # The lease is recorded after the hello is sent: counting from here keeps this
            # worker's view of it ending first.
            dialed = self._clock()
            responses = stub.Attach(outgoing(), metadata=(("authorization", f"Bearer {self._token}"),))
            # The welcome must come in time: a stalled path (a cut network that still accepts
            # connections) must not hold the worker in the dial forever.
            welcome_timer = threading.Timer(_WELCOME_TIMEOUT_S, responses.cancel)
            welcome_timer.start()
            try:
                reply = next(iter(responses))
                if reply.WhichOneof("kind") != "welcome":
                    raise RuntimeError(f"the control plane's first message was {reply.WhichOneof('kind')}, "
                                       "not its welcome")
                w = reply.welcome
                session = _Session(int(w.epoch), w.lease_s, w.heartbeat_s, dialed)
                holder["session"] = session
            finally:
                welcome_timer.cancel()
                ready.set()
            with self._current_lock:
                self._current = session
                held, self._held = self._held, []
            for report in held:
                self._put(session, report)
            self.attachments += 1
            self.epoch = session.epoch
            self.attached.set()
            log.info("worker %s attached to %s (%s, epoch %d)", self.worker_id, address, w.control_plane, w.epoch)
            beat = threading.Thread(target=self._heartbeats, args=(session, responses, stop),
                                    name="rf-worker-heartbeat", daemon=True)
            beat.start()
            try:
                for message in responses:
                    kind = message.WhichOneof("kind")
                    if kind == "ack":
                        session.acknowledged(message.ack.seq)
                    elif kind == "work":
                        self._take(session, message.work.sealed)
                    elif kind == "kill_run":
                        self._kill_run(message.kill_run.run_id, message.kill_run.reason or "the control plane asked")
            except grpc.RpcError as e:
                if not (session.fenced.is_set() or stop.is_set()) or e.code() != grpc.StatusCode.CANCELLED:
                    raise
            finally:
                self.attached.clear()
                session.ended.set()
                session.outgoing.put(None)
                beat.join()

    def _take(self, session: _Session, sealed_bytes: bytes) -> None:
        if session.fenced.is_set():
            return  # fenced: nothing more starts from this attachment
        try:
            sealed = SealedEnvelope.from_bytes(sealed_bytes)
        except Exception as e:  # noqa: BLE001 - the envelope layer's refusal of garbage
            log.warning("worker %s: an unreadable envelope (%s); refused", self.worker_id, e)
            self._send(WorkerReport(envelope_id="", kind="refused", refusal="malformed", detail=str(e)))
            return
        self._pool.submit(self._run_one, sealed)

    def _run_one(self, sealed: SealedEnvelope) -> None:
        try:
            report = self._handler.handle(sealed)
        except Exception:
            # A bug: logged loudly; no report (the control plane's deadline makes the call
            # uncertain, which is the truth: it may have started).
            log.exception("worker %s: unexpected error running an envelope", self.worker_id)
            return
        self._send(WorkerReport.of(report))

    def _send(self, report: WorkerReport) -> None:
        with self._current_lock:
            session = self._current
            if session is None or session.ended.is_set() or session.fenced.is_set():
                # Held for the next attachment (the results store keeps the result either way).
                self._held.append(report)
                if len(self._held) > _MAX_HELD:
                    dropped = self._held.pop(0)
                    log.warning("worker %s: too many reports held; %s's is dropped (its result stays in the "
                                "results store)", self.worker_id, dropped.envelope_id)
                return
            self._put(session, report)

    @staticmethod
    def _put(session: _Session, report: WorkerReport) -> None:
        # The pieces of one report go in together (under the session's lock): another report's
        # pieces never come between them, only heartbeats may.
        with session.lock:
            for piece in report.to_protos():
                session.outgoing.put(workers_pb2.WorkerMessage(report=piece))

    def _heartbeats(self, session: _Session, responses: grpc.Future, stop: threading.Event) -> None:  # type: ignore[type-arg]
        seq = 0
        while not session.ended.is_set():
            if stop.is_set():
                responses.cancel()
                return
            now = self._clock()
            if now >= session.lease_until:
                with self._current_lock:  # no report goes on this stream from now on
                    session.fenced.set()
                self.fencings += 1
                killed = self._on_fenced(f"lease of epoch {session.epoch} not renewed for {session.lease_s:g} s")
                log.warning("worker %s: fenced (epoch %d: no heartbeat acknowledged for %g s); killed %d sandboxes",
                            self.worker_id, session.epoch, session.lease_s, killed)
                responses.cancel()
                return
            seq += 1
            with session.lock:
                session.sent[seq] = now
            session.outgoing.put(workers_pb2.WorkerMessage(heartbeat=workers_pb2.WorkerHeartbeat(seq=seq)))
            session.ended.wait(min(session.heartbeat_s, max(0.01, session.lease_until - self._clock())))
