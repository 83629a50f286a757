"""The worker's executor: from a sealed envelope to a result on the worker's own engine.

`WorkerExecutor.handle` is what the worker's process calls for each delivered envelope (from one
thread per envelope; everything it holds is safe to share). It runs the call with exactly the
sandbox a control plane runs it with today: the same backend (`DockerBackend` on the worker's
engine), the same profile, the same request on the tool runner's stdin, and it keeps the results
store's state machine (ringfence_server.worker.results) around the run. In this order:

1. admit       admission (ringfence_server.worker.admission) decides. Refuse: a report of its
               reason, and nothing else happens (no claim, no container). ReturnRecorded: the
               recorded result's bytes, or that the call is uncertain. InProgress: so reported.
               Run: this delivery holds the call's claim, and the steps below run.
2. request     the SandboxRequest is built (`sandbox_request`). If it cannot be (a call id the
               sandbox refuses, a request over its stdin cap), nothing has started: the claim is
               released and a START_FAILED result reported, so the control plane's retry may
               run it elsewhere.
3. mark        `mark_started`, BEFORE the engine is asked: from here a crash leaves the call
               started (uncertain after the worker's restart), never run twice.
4. run         the backend runs it (`runs_started` counts these).
5. settle      a START_FAILED result (nothing ran), or EngineError or ImageError raised by the
               backend (the sandbox raises them only before any container existed; reported as a
               START_FAILED result with the message): `release_not_started`, so a retry runs it.
               Any other result: `record`ed in its wire form (ringfence_server.worker.wire), which
               is what this and every later delivery of the call is answered with.

An unexpected exception after step 3 (the backend raising anything else, the store failing to
record) propagates and leaves the call started: it may have run, so it is never released on a
guess; the worker's restart makes it uncertain. A bug is a bug, not a result.

Not built yet (docs/workers.md): workspaces and input folders (admission refuses a call that
needs them: EngineCapabilities says the worker has neither), the call's live output, tracing
under the envelope's traceparent, and kills (cancel, a run's deadline).
"""

from __future__ import annotations

import enum
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ringfence_server.sandbox.backend import SandboxBackend, SandboxRequest
from ringfence_server.sandbox.errors import EngineError, ImageError, ProfileError
from ringfence_server.sandbox.profile import SandboxProfile
from ringfence_server.sandbox.result import Outcome, SandboxResult
from ringfence_server.worker.admission import (
    Capabilities,
    InProgress,
    RecordedResult,
    Refuse,
    ReturnRecorded,
    admit,
)
from ringfence_server.worker.engine import NamedImages
from ringfence_server.worker.envelope import Envelope, LogicalKey, SealedEnvelope
from ringfence_server.worker.errors import ExecutorError
from ringfence_server.worker.keys import TrustedKeys
from ringfence_server.worker.results import SqliteResults
from ringfence_server.worker.wire import encode_result

__all__ = [
    "Report",
    "ReportKind",
    "WorkerExecutor",
    "request_body",
    "sandbox_call_id",
    "sandbox_run_id",
]


class ReportKind(enum.StrEnum):
    """What a worker answers a delivery with."""

    RESULT = "result"
    """`Report.result` holds a result's wire form (encode_result)."""
    UNCERTAIN = "uncertain"
    """The call started on this worker and its result was never recorded (recovery after a
    crash): it may have run. The control plane reconciles it."""
    IN_PROGRESS = "in_progress"
    """Another delivery of the call is running it; its result comes with that delivery."""
    REFUSED = "refused"
    """Nothing ran: `Report.reason` says why (admission's reason)."""


@dataclass(frozen=True)
class Report:
    """The executor's answer to one delivered envelope."""

    kind: ReportKind
    envelope_id: str | None
    """The delivery's envelope id; None when the envelope did not open (nothing of an unverified
    envelope is repeated)."""
    key: LogicalKey | None
    """The logical call (one attempt of one call); None when the envelope did not open."""
    result: bytes | None = None
    """RESULT: the result's wire form (ringfence_server.worker.wire); None otherwise."""
    reason: str | None = None
    """REFUSED: the refusal's reason (an envelope.Refusal or admission.WorkRefusal value)."""
    detail: str = ""
    """For people: why refused, who holds an uncertain call."""
    recorded_by: str | None = None
    """The delivery whose recorded result (or uncertain record) this is: this envelope's id when
    this delivery ran it, an earlier delivery's when it answers a redelivery; None when nothing is
    recorded (refused, in progress, or a container that never started: its claim was released)."""


def sandbox_run_id(envelope: Envelope) -> str:
    """The run's label on its sandboxes, as the control plane gives it
    (ringfence_server.control.state.sandbox_run_id): tenant names have no ':'."""
    return f"{envelope.tenant}:{envelope.run_id}"


def sandbox_call_id(envelope: Envelope) -> str:
    """The sandbox call of this attempt, as the control plane names it: `{call_id}.a{attempt}`."""
    return f"{envelope.call_id}.a{envelope.attempt}"


def request_body(envelope: Envelope) -> bytes:
    """The tool runner's request on stdin, built exactly as the control plane's dispatch builds
    it: the logical call id (whichever attempt this is) and the idempotency key."""
    return json.dumps({"tool": envelope.tool, "arguments": envelope.arguments(), "call_id": envelope.call_id,
                       "idempotency_key": envelope.idempotency_key}, separators=(",", ":")).encode()


def _start_failed(envelope: Envelope, message: str) -> SandboxResult:
    """A result for a call whose container never started (nothing ran)."""
    return SandboxResult(outcome=Outcome.START_FAILED, exit_code=None, stdout=b"", stderr=b"",
                         stdout_truncated=False, stderr_truncated=False, duration_ms=0,
                         image_id=envelope.image_digest, runtime=envelope.profile.runtime, message=message)


class WorkerExecutor:
    """Runs admitted envelopes on this worker's backend (the module's docstring has the steps).

    `images` are the images this worker verified on its engine, with the names its backend runs
    them by (engine.VerifiedLockImages); `capabilities` what its sandbox can run
    (engine.EngineCapabilities); `clock` judges envelopes' deadlines (seconds, as time.time)."""

    def __init__(self, *, worker_id: str, trusted_keys: TrustedKeys, results: SqliteResults,
                 backend: SandboxBackend, images: NamedImages, capabilities: Capabilities,
                 clock: Callable[[], float] = time.time) -> None:
        self.worker_id = worker_id
        self._trusted_keys = trusted_keys
        self._results = results
        self._backend = backend
        self._images = images
        self._capabilities = capabilities
        self._clock = clock
        self._count_lock = threading.Lock()
        self._runs_started = 0

    @property
    def runs_started(self) -> int:
        """Containers asked of the backend so far (calls past their start mark)."""
        with self._count_lock:
            return self._runs_started

    def handle(self, sealed: SealedEnvelope) -> Report:
        """Admit `sealed` and, on Run, run it; what to answer the control plane with."""
        decision = admit(sealed, worker_id=self.worker_id, trusted_keys=self._trusted_keys, images=self._images,
                         capabilities=self._capabilities, results=self._results, now=self._clock())
        if isinstance(decision, Refuse):
            env = decision.envelope
            return Report(ReportKind.REFUSED, env.envelope_id if env else None, env.logical_key if env else None,
                          reason=decision.reason.value, detail=decision.detail)
        env = decision.envelope
        if isinstance(decision, ReturnRecorded):
            recorded = decision.recorded
            if isinstance(recorded, RecordedResult):
                return Report(ReportKind.RESULT, env.envelope_id, env.logical_key, result=recorded.result,
                              recorded_by=recorded.envelope_id)
            return Report(ReportKind.UNCERTAIN, env.envelope_id, env.logical_key, recorded_by=recorded.envelope_id,
                          detail=f"started by delivery {recorded.envelope_id}; its result was never recorded")
        if isinstance(decision, InProgress):
            return Report(ReportKind.IN_PROGRESS, env.envelope_id, env.logical_key,
                          detail="another delivery of the call is running it")
        return self._run(env)

    def sandbox_request(self, envelope: Envelope) -> SandboxRequest:
        """What this worker asks its backend for to run `envelope`: the profile of its SandboxSpec
        (the image by its lock name, the runtime, the ceilings, the egress grant, the warm flag)
        and the tool runner's request on stdin. ExecutorError for what this worker cannot mount
        (a workspace, input folders: admission refuses those first) or name (an image it did not
        verify); ProfileError for what the sandbox refuses (an id outside its alphabet, a request
        over its stdin cap)."""
        spec = envelope.profile
        if spec.workspace is not None:
            raise ExecutorError("this worker mounts no workspace")
        if spec.input_roots:
            raise ExecutorError("this worker mounts no input folders")
        profile = SandboxProfile(
            image=self._images.name_for(envelope.image_digest), runtime=spec.runtime, memory_bytes=spec.memory_bytes,
            cpus=spec.cpus, pids=spec.pids, timeout_s=spec.timeout_s, stdout_limit=spec.stdout_limit,
            stderr_limit=spec.stderr_limit, egress=envelope.egress.to_grant() if envelope.egress is not None else None)
        return SandboxRequest(profile=profile, argv=(), stdin=request_body(envelope), run_id=sandbox_run_id(envelope),
                              call_id=sandbox_call_id(envelope), warm=spec.warm)

    def _run(self, envelope: Envelope) -> Report:
        key, eid = envelope.logical_key, envelope.envelope_id
        try:
            request = self.sandbox_request(envelope)
        except (ExecutorError, ProfileError) as e:
            # Nothing started: give the claim back, so a retry (here or on another worker) runs it.
            self._results.release(key, eid, f"the worker cannot run it: {e}")
            return Report(ReportKind.RESULT, eid, key, result=encode_result(
                _start_failed(envelope, f"the worker cannot run it: {e}")))
        except BaseException:
            self._results.release(key, eid, "the worker failed to build the sandbox request")
            raise
        self._results.mark_started(key, eid)
        with self._count_lock:
            self._runs_started += 1
        try:
            result = self._backend.run(request)
        except EngineError as e:
            result = _start_failed(envelope, f"sandbox engine: {e}")
        except ImageError as e:
            result = _start_failed(envelope, f"image refused: {e}")
        data = encode_result(result)
        if result.outcome is Outcome.START_FAILED:
            # The sandbox's answer that no container started: the start mark is taken back.
            self._results.release_not_started(key, eid, (result.message or "start_failed")[:1000])
            return Report(ReportKind.RESULT, eid, key, result=data)
        self._results.record(key, eid, data)
        return Report(ReportKind.RESULT, eid, key, result=data, recorded_by=eid)
