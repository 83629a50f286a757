"""Every event a run's log may hold, as one frozen dataclass per event type.

A run's log is append-only and lives for years: the JSON written by an older ringfence must
still fold to the same run. So this module is the one place that knows each event's shape:

- writers construct a payload (`RunStarted(...)`, `CallCompleted(...)`) and hand it to the run
  repository, which stores `event_data(payload)` under `payload.TYPE`;
- readers turn a stored `Event` back into its payload with `parse_event(event.type,
  event.data)` (or `payload_of(event)`) and pattern-match on it.

`event_data` writes exactly the JSON the dict literals of the previous schema wrote (the
store sorts the keys, so only which keys are present matters): a field marked `_OMIT_IF_NONE`
is left out when it is None, as the writers that did not know it left it out. `parse_event`
accepts every log those writers produced: a field a log may lack has the default that log
meant (`CallCompleted.executed` missing means the call ran). What it refuses (ValueError) is
exactly what the fold could not take, so refusing an event before it is durable
(`check_event`) is parsing it.

Nested JSON the control plane passes through without reading it (a tool's arguments and
result, the egress proxy's decisions, the trace ids) stays a JSON mapping (`JsonObject`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, TypeAlias

# The event types and admission's verdicts are the wire's vocabulary too (a client renders a
# run's events by type): the client package owns them, and they are re-exported here.
from ringfence.model import AdmissionVerdict as AdmissionVerdict
from ringfence.model import ApprovalKind, Event, Observation, ObservationStatus, RunOutcome
from ringfence.model import EventType as EventType

__all__ = [
    "OUTPUT_STREAMS",
    "AdmissionVerdict",
    "ApprovalDecided",
    "ApprovalExpired",
    "ApprovalRequested",
    "ApprovalUsed",
    "ApprovalWithdrawn",
    "ArtifactCollected",
    "ArtifactFile",
    "AttemptFinished",
    "BatchCall",
    "BatchStarted",
    "CallCompleted",
    "CallDecided",
    "CallObserved",
    "CallOutput",
    "DispatchStarted",
    "EgressDecided",
    "EventPayload",
    "EventType",
    "FileEntry",
    "FilesDownloaded",
    "FilesUploaded",
    "GrantAdded",
    "JsonObject",
    "ResultGuard",
    "RunFinished",
    "RunStarted",
    "WorkspaceCreated",
    "WorkspaceRemoved",
    "check_event",
    "event_data",
    "parse_event",
    "payload_of",
]

JsonObject: TypeAlias = Mapping[str, object]
"""A JSON object the control plane stores as it came (a tool's arguments, the trace ids)."""


OUTPUT_STREAMS = ("stdout", "stderr")

# Field metadata: the key is written only when the value is not None (the previous schema's
# writers that did not know the field did not write it, and the JSON stays theirs).
_OMIT_IF_NONE = {"omit_if_none": True}


# -- nested values -------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchCall:
    """One call of a batch as the client proposed it (arguments redacted by the scanner)."""

    call_id: str
    tool: str = ""
    arguments: JsonObject = field(default_factory=dict)


@dataclass(frozen=True)
class FileEntry:
    """A file moved in or out of a run's workspace."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class ResultGuard:
    """The result guardrail's verdict on a call's result (ringfence_server.control.guardrails.check_result)."""

    action: str
    """A ringfence_server.control.guardrails.Action value: BLOCK withholds the result."""
    redacted: tuple[str, ...] = ()
    """What the scanner redacted (the kinds of secret)."""
    reason: str = ""


@dataclass(frozen=True)
class ArtifactFile:
    """A declared output kept as an artifact: `revision` is the store record's revision."""

    path: str
    size: int
    sha256: str
    revision: int


# -- the events ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunStarted:
    """The run exists (StartRun). The first event of every run."""

    TYPE: ClassVar[EventType] = EventType.RUN_STARTED
    tenant: str
    created_at: float
    run_id: str = ""
    """The caller's id ("" in the oldest logs: the store key is the id then)."""
    goal: str = ""
    deadline_at: float | None = None
    policy_version: str = ""
    trace: JsonObject = field(default_factory=dict)
    """The W3C trace ids the run's spans hang under ({} when there were none)."""
    by: str | None = None
    """The subject that started the run."""
    workspace: Mapping[str, int] | None = None
    """{bytes, inodes} asked for at StartRun, or None: the run has no workspace."""


@dataclass(frozen=True)
class BatchStarted:
    """A batch of proposed calls entered admission (one turn of the run)."""

    TYPE: ClassVar[EventType] = EventType.BATCH_STARTED
    calls: tuple[BatchCall, ...]
    batch_id: str | None = None
    """The client's batch id: a batch sent again answers from the log."""
    turn: int | None = None
    """1.. per run (None in a log that did not record it)."""
    fingerprint: str | None = None
    """Of the client's batch: the same id with other calls is refused."""


@dataclass(frozen=True)
class CallDecided:
    """Admission's verdict on one call of a batch."""

    TYPE: ClassVar[EventType] = EventType.CALL_DECIDED
    call_id: str
    tool: str
    verdict: AdmissionVerdict
    arguments: JsonObject = field(default_factory=dict)
    """Canonical when they validated, else as sent; redacted by the scanner either way."""
    signature: str | None = None
    """The call's signature (tool + canonical arguments): loops and grants count it."""
    verdict_path: tuple[str, ...] = ()
    reason: str = ""
    proposed_by: str | None = None
    client_key: str | None = None
    """The client's idempotency key, as sent."""


@dataclass(frozen=True)
class ApprovalRequested:
    """A person must approve this exact call (kind CALL), or say whether a call interrupted
    mid-effect happened (kind RECONCILE)."""

    TYPE: ClassVar[EventType] = EventType.APPROVAL_REQUESTED
    approval_id: str
    call_id: str
    tool: str
    arguments: JsonObject
    digest: str
    """Binds the approval to the call, the image and the policy: any change voids it."""
    created_at: float
    expires_at: float
    mutates: bool = False
    idempotency_key: str | None = None
    client_key: str | None = None
    image_digest: str = ""
    policy_version: str = ""
    verdict_path: tuple[str, ...] = ()
    proposed_by: str | None = None
    """Never the one who may decide it (four eyes)."""
    kind: ApprovalKind | None = field(default=None, metadata=_OMIT_IF_NONE)
    """None (written only for reconciliations): CALL."""
    reason: str | None = field(default=None, metadata=_OMIT_IF_NONE)
    """Why a reconciliation is asked (written only for them)."""

    @property
    def approval_kind(self) -> ApprovalKind:
        return self.kind or ApprovalKind.CALL


@dataclass(frozen=True)
class ApprovalDecided:
    """A person (or the system, at the run's end) approved or declined."""

    TYPE: ClassVar[EventType] = EventType.APPROVAL_DECIDED
    approval_id: str
    approved: bool
    by: str | None = None
    reason: str | None = None
    remember: bool | None = field(default=None, metadata=_OMIT_IF_NONE)
    """The approver granted the exact call for the rest of the run (a `grant_added` follows);
    written only by a person's decision."""


@dataclass(frozen=True)
class ApprovalExpired:
    """The approval's time ran out before anyone decided."""

    TYPE: ClassVar[EventType] = EventType.APPROVAL_EXPIRED
    approval_id: str


@dataclass(frozen=True)
class ApprovalUsed:
    """The approved call was dispatched: the approval cannot run it again."""

    TYPE: ClassVar[EventType] = EventType.APPROVAL_USED
    approval_id: str


@dataclass(frozen=True)
class ApprovalWithdrawn:
    """The call's proposer (or an admin) took it back while its approval was pending: nobody
    may decide it any more, and the call never runs."""

    TYPE: ClassVar[EventType] = EventType.APPROVAL_WITHDRAWN
    approval_id: str
    by: str
    reason: str = ""


@dataclass(frozen=True)
class GrantAdded:
    """The exact call (its signature) is allowed for the rest of the run without an ask."""

    TYPE: ClassVar[EventType] = EventType.GRANT_ADDED
    signature: str
    tool: str = ""
    arguments: JsonObject = field(default_factory=dict)
    by: str | None = None
    approval_id: str | None = field(default=None, metadata=_OMIT_IF_NONE)
    """The approval that granted it (written only when an approver remembered one)."""


@dataclass(frozen=True)
class DispatchStarted:
    """The call is about to reach a container. Durable BEFORE any container exists: without
    it a crash proves the call never ran."""

    TYPE: ClassVar[EventType] = EventType.DISPATCH_STARTED
    call_id: str
    tool: str
    mutates: bool = False
    idempotency_key: str | None = None
    """The derived key (scoped to the tenant) that deduplicates a mutating call."""
    arguments: JsonObject = field(default_factory=dict)
    signature: str | None = None
    client_key: str | None = None
    verdict_path: tuple[str, ...] = ()
    approval_id: str | None = None


@dataclass(frozen=True)
class AttemptFinished:
    """One attempt of a call ended (its `call_output` events precede it)."""

    TYPE: ClassVar[EventType] = EventType.ATTEMPT
    call_id: str
    attempt: int
    """1.. per call."""
    failure_class: str | None = None
    """ringfence_server.control.retry.FailureClass, None: it succeeded."""
    outcome: str | None = None
    message: str = ""
    retry_after_s: float | None = None
    duration_ms: float | None = None
    setup_ms: float | None = None
    image_id: str | None = None
    runtime: str | None = None
    worker: str | None = field(default=None, metadata=_OMIT_IF_NONE)
    """The sandbox worker that ran it (docs/workers.md); None (left out): this control plane's
    own engine."""


@dataclass(frozen=True)
class EgressDecided:
    """The egress proxy's decisions for one attempt: a record for the log, no state."""

    TYPE: ClassVar[EventType] = EventType.EGRESS
    call_id: str
    attempt: int = 0
    decisions: tuple[JsonObject, ...] = ()


@dataclass(frozen=True)
class CallCompleted:
    """The call's dispatch ended: its result (or error), after every attempt."""

    TYPE: ClassVar[EventType] = EventType.CALL_COMPLETED
    call_id: str
    tool: str
    ok: bool
    mutates: bool = False
    idempotency_key: str | None = None
    content: object = None
    """The tool's result, as the result guardrail left it."""
    guard: ResultGuard | None = None
    """The result guardrail's verdict; None: not checked yet (a reconciled call, an error)."""
    error: str | None = None
    error_class: str | None = None
    attempts: int = 0
    cost: float = 0.0
    executed: bool = True
    """False: no attempt reached a container, the call never ran and its client key is free
    again. Absent in logs older than the field: the call ran."""


@dataclass(frozen=True)
class CallObserved:
    """What the caller learns about one call (the trajectory): an Observation's fields."""

    TYPE: ClassVar[EventType] = EventType.OBSERVATION
    call_id: str
    tool: str
    status: ObservationStatus
    executed: bool
    content: object = None
    error: str | None = None
    error_class: str | None = None
    verdict_path: tuple[str, ...] = ()
    approval_id: str | None = None
    attempts: int = 0

    @classmethod
    def of(cls, o: Observation) -> CallObserved:
        return cls(call_id=o.call_id, tool=o.tool, status=o.status, executed=o.executed, content=o.content,
                   error=o.error, error_class=o.error_class, verdict_path=tuple(o.verdict_path),
                   approval_id=o.approval_id, attempts=o.attempts)

    def observation(self) -> Observation:
        return Observation(call_id=self.call_id, tool=self.tool, status=self.status, executed=self.executed,
                           content=self.content, error=self.error, error_class=self.error_class,
                           verdict_path=self.verdict_path, approval_id=self.approval_id, attempts=self.attempts)


@dataclass(frozen=True)
class RunFinished:
    """The run ended. Nothing is appended after it."""

    TYPE: ClassVar[EventType] = EventType.RUN_FINISHED
    outcome: RunOutcome
    reason: str = ""


@dataclass(frozen=True)
class WorkspaceCreated:
    """The run's workspace exists (made at StartRun, before its reply)."""

    TYPE: ClassVar[EventType] = EventType.WORKSPACE_CREATED
    volume: str
    bytes: int
    inodes: int


@dataclass(frozen=True)
class WorkspaceRemoved:
    """The workspace and its files are gone, written just before `run_finished`. A finished
    run's workspace counts as removed even without it (the engine failed at the end and the
    reaper removes it later: nothing is appended after run_finished)."""

    TYPE: ClassVar[EventType] = EventType.WORKSPACE_REMOVED
    volume: str
    reason: str
    """The run's outcome (completed, cancelled, deadline_exceeded, error, ...)."""


@dataclass(frozen=True)
class CallOutput:
    """A piece of a call's output while it runs (whole lines; a line over 16 KiB is cut),
    written before that attempt's `attempt` event. No state."""

    TYPE: ClassVar[EventType] = EventType.CALL_OUTPUT
    call_id: str
    attempt: int
    stream: str
    """One of OUTPUT_STREAMS."""
    seq: int
    """1.. per attempt and stream."""
    text: str
    """UTF-8 decoded with replacement, AFTER the secret scanner's redaction."""
    bytes: int
    """Raw bytes of the chunk."""
    redacted: bool
    """The scanner changed it."""


@dataclass(frozen=True)
class FilesUploaded:
    """Files copied into the run's workspace (UploadFiles). No state."""

    TYPE: ClassVar[EventType] = EventType.FILES_UPLOADED
    dest: str
    files: tuple[FileEntry, ...]
    by: str
    incomplete: str | None = field(default=None, metadata=_OMIT_IF_NONE)
    """The copy stopped part way (why): `files` are the ones that arrived. Written only then."""


@dataclass(frozen=True)
class FilesDownloaded:
    """Files copied out of the workspace, or artifacts (`artifacts`) downloaded. No state."""

    TYPE: ClassVar[EventType] = EventType.FILES_DOWNLOADED
    files: tuple[FileEntry, ...]
    artifacts: bool
    by: str


@dataclass(frozen=True)
class ArtifactCollected:
    """The declared outputs of a successful call, kept as artifacts (the store's records)."""

    TYPE: ClassVar[EventType] = EventType.ARTIFACT_COLLECTED
    call_id: str
    files: tuple[ArtifactFile, ...]
    missing: tuple[str, ...]
    """Declared but not collected (absent, a link, too big)."""


EventPayload: TypeAlias = (
    RunStarted | BatchStarted | CallDecided | ApprovalRequested | ApprovalDecided | ApprovalExpired
    | ApprovalUsed | ApprovalWithdrawn | GrantAdded | DispatchStarted | AttemptFinished | EgressDecided | CallCompleted
    | CallObserved | RunFinished | WorkspaceCreated | WorkspaceRemoved | CallOutput | FilesUploaded
    | FilesDownloaded | ArtifactCollected
)


# -- writing ---------------------------------------------------------------------------------


def _plain(value: object) -> object:
    """A field's value as JSON data: enums by value, tuples as lists, nested payloads as
    objects; a mapping is copied (its content is JSON already)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return dict(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _object(value)
    return value


def _object(value: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in dataclasses.fields(value):  # type: ignore[arg-type]  # a dataclass instance, checked by callers
        v = getattr(value, f.name)
        if v is None and f.metadata.get("omit_if_none"):
            continue
        out[f.name] = _plain(v)
    return out


def event_data(payload: EventPayload) -> dict[str, object]:
    """The JSON object the store keeps for `payload` (under `payload.TYPE`)."""
    return _object(payload)


# -- reading ---------------------------------------------------------------------------------


class _Fields:
    """Typed reads of one event's data; a missing required field or a wrong shape is a
    ValueError naming the event type."""

    def __init__(self, type_: EventType, data: Mapping[str, object]) -> None:
        self.type = type_
        self.data = data

    def fail(self, why: str) -> ValueError:
        return ValueError(f"{self.type}: {why}")

    def need(self, *keys: str) -> None:
        missing = [k for k in keys if k not in self.data]
        if missing:
            raise self.fail(f"missing {', '.join(missing)}")

    def raw(self, key: str) -> object:
        return self.data.get(key)

    def text(self, key: str, default: str = "") -> str:
        v = self.data.get(key)
        return default if v is None else str(v)

    def opt_text(self, key: str) -> str | None:
        v = self.data.get(key)
        return None if v is None else str(v)

    def integer(self, key: str, default: int = 0) -> int:
        v = self.data.get(key)
        return default if v is None else int(v)  # type: ignore[call-overload]  # JSON: a number

    def opt_integer(self, key: str) -> int | None:
        v = self.data.get(key)
        return None if v is None else int(v)  # type: ignore[call-overload]  # JSON: a number

    def number(self, key: str, default: float = 0.0) -> float:
        v = self.data.get(key)
        return default if v is None else float(v)  # type: ignore[arg-type]  # JSON: a number

    def opt_number(self, key: str) -> float | None:
        v = self.data.get(key)
        return None if v is None else float(v)  # type: ignore[arg-type]  # JSON: a number

    def flag(self, key: str, default: bool = False) -> bool:
        v = self.data.get(key)
        return default if v is None else bool(v)

    def opt_flag(self, key: str) -> bool | None:
        v = self.data.get(key)
        return None if v is None else bool(v)

    def obj(self, key: str) -> JsonObject:
        v = self.data.get(key)
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            raise self.fail(f"{key} must be an object")
        return dict(v)

    def seq(self, key: str) -> Sequence[object]:
        v = self.data.get(key)
        if v is None:
            return ()
        if not isinstance(v, list | tuple):
            raise self.fail(f"{key} must be a list")
        return v

    def texts(self, key: str) -> tuple[str, ...]:
        return tuple(str(v) for v in self.seq(key))

    def objs(self, key: str) -> tuple[Mapping[str, object], ...]:
        items = self.seq(key)
        if not all(isinstance(i, Mapping) for i in items):
            raise self.fail(f"every item of {key} must be an object")
        return tuple(dict(i) for i in items)  # type: ignore[call-overload]  # checked just above


def _run_started(f: _Fields) -> RunStarted:
    f.need("tenant", "created_at")
    ws = None if f.raw("workspace") is None else _Fields(f.type, f.obj("workspace"))
    return RunStarted(tenant=f.text("tenant"), created_at=f.number("created_at"), run_id=f.text("run_id"),
                      goal=f.text("goal"), deadline_at=f.opt_number("deadline_at"),
                      policy_version=f.text("policy_version"), trace=f.obj("trace"), by=f.opt_text("by"),
                      workspace=None if ws is None else {"bytes": ws.integer("bytes"), "inodes": ws.integer("inodes")})


def _batch_started(f: _Fields) -> BatchStarted:
    f.need("calls")
    calls = f.objs("calls")
    if not all("call_id" in c for c in calls):
        raise f.fail("every call needs a call_id")
    return BatchStarted(
        calls=tuple(BatchCall(call_id=str(c["call_id"]), tool=str(c.get("tool") or ""),
                              arguments=_Fields(f.type, c).obj("arguments")) for c in calls),
        batch_id=f.opt_text("batch_id"), turn=f.opt_integer("turn"), fingerprint=f.opt_text("fingerprint"))


def _call_decided(f: _Fields) -> CallDecided:
    f.need("call_id", "tool", "verdict")
    return CallDecided(call_id=f.text("call_id"), tool=f.text("tool"), verdict=AdmissionVerdict(f.text("verdict")),
                       arguments=f.obj("arguments"), signature=f.opt_text("signature"),
                       verdict_path=f.texts("verdict_path"), reason=f.text("reason"),
                       proposed_by=f.opt_text("proposed_by"), client_key=f.opt_text("client_key"))


def _approval_requested(f: _Fields) -> ApprovalRequested:
    f.need("approval_id", "call_id", "tool", "arguments", "digest", "created_at", "expires_at")
    kind = f.opt_text("kind")
    return ApprovalRequested(
        approval_id=f.text("approval_id"), call_id=f.text("call_id"), tool=f.text("tool"),
        arguments=f.obj("arguments"), digest=f.text("digest"), created_at=f.number("created_at"),
        expires_at=f.number("expires_at"), mutates=f.flag("mutates"), idempotency_key=f.opt_text("idempotency_key"),
        client_key=f.opt_text("client_key"), image_digest=f.text("image_digest"),
        policy_version=f.text("policy_version"), verdict_path=f.texts("verdict_path"),
        proposed_by=f.opt_text("proposed_by"), kind=None if kind is None else ApprovalKind(kind),
        reason=f.opt_text("reason"))


def _approval_decided(f: _Fields) -> ApprovalDecided:
    f.need("approval_id", "approved")
    return ApprovalDecided(approval_id=f.text("approval_id"), approved=f.flag("approved"), by=f.opt_text("by"),
                           reason=f.opt_text("reason"), remember=f.opt_flag("remember"))


def _approval_expired(f: _Fields) -> ApprovalExpired:
    f.need("approval_id")
    return ApprovalExpired(approval_id=f.text("approval_id"))


def _approval_used(f: _Fields) -> ApprovalUsed:
    f.need("approval_id")
    return ApprovalUsed(approval_id=f.text("approval_id"))


def _approval_withdrawn(f: _Fields) -> ApprovalWithdrawn:
    f.need("approval_id", "by")
    return ApprovalWithdrawn(approval_id=f.text("approval_id"), by=f.text("by"), reason=f.text("reason"))


def _grant_added(f: _Fields) -> GrantAdded:
    f.need("signature")
    return GrantAdded(signature=f.text("signature"), tool=f.text("tool"), arguments=f.obj("arguments"),
                      by=f.opt_text("by"), approval_id=f.opt_text("approval_id"))


def _dispatch_started(f: _Fields) -> DispatchStarted:
    f.need("call_id", "tool")
    return DispatchStarted(call_id=f.text("call_id"), tool=f.text("tool"), mutates=f.flag("mutates"),
                           idempotency_key=f.opt_text("idempotency_key"), arguments=f.obj("arguments"),
                           signature=f.opt_text("signature"), client_key=f.opt_text("client_key"),
                           verdict_path=f.texts("verdict_path"), approval_id=f.opt_text("approval_id"))


def _attempt(f: _Fields) -> AttemptFinished:
    f.need("call_id", "attempt")
    return AttemptFinished(call_id=f.text("call_id"), attempt=f.integer("attempt"),
                           failure_class=f.opt_text("failure_class"), outcome=f.opt_text("outcome"),
                           message=f.text("message"), retry_after_s=f.opt_number("retry_after_s"),
                           duration_ms=f.opt_number("duration_ms"), setup_ms=f.opt_number("setup_ms"),
                           image_id=f.opt_text("image_id"), runtime=f.opt_text("runtime"),
                           worker=f.opt_text("worker"))


def _egress(f: _Fields) -> EgressDecided:
    f.need("call_id")
    return EgressDecided(call_id=f.text("call_id"), attempt=f.integer("attempt"), decisions=f.objs("decisions"))


def _result_guard(f: _Fields) -> ResultGuard | None:
    if f.raw("guard") is None:
        return None
    g = _Fields(f.type, f.obj("guard"))
    return ResultGuard(action=g.text("action"), redacted=g.texts("redacted"), reason=g.text("reason"))


def _call_completed(f: _Fields) -> CallCompleted:
    f.need("call_id", "tool", "ok")
    return CallCompleted(call_id=f.text("call_id"), tool=f.text("tool"), ok=f.flag("ok"), mutates=f.flag("mutates"),
                         idempotency_key=f.opt_text("idempotency_key"), content=f.raw("content"),
                         guard=_result_guard(f), error=f.opt_text("error"), error_class=f.opt_text("error_class"),
                         attempts=f.integer("attempts"), cost=f.number("cost"),
                         executed=f.flag("executed", default=True))


def _observation(f: _Fields) -> CallObserved:
    f.need("call_id", "tool", "status", "executed")
    return CallObserved(call_id=f.text("call_id"), tool=f.text("tool"), status=ObservationStatus(f.text("status")),
                        executed=f.flag("executed"), content=f.raw("content"), error=f.opt_text("error"),
                        error_class=f.opt_text("error_class"), verdict_path=f.texts("verdict_path"),
                        approval_id=f.opt_text("approval_id"), attempts=f.integer("attempts"))


def _run_finished(f: _Fields) -> RunFinished:
    f.need("outcome")
    return RunFinished(outcome=RunOutcome(f.text("outcome")), reason=f.text("reason"))


def _workspace_created(f: _Fields) -> WorkspaceCreated:
    f.need("volume", "bytes", "inodes")
    volume, size, inodes = f.raw("volume"), f.raw("bytes"), f.raw("inodes")
    if not (isinstance(volume, str) and volume and isinstance(size, int) and isinstance(inodes, int)
            and not isinstance(size, bool) and not isinstance(inodes, bool)):
        raise f.fail("volume must be a name, bytes and inodes integers")
    return WorkspaceCreated(volume=volume, bytes=size, inodes=inodes)


def _workspace_removed(f: _Fields) -> WorkspaceRemoved:
    f.need("volume", "reason")
    return WorkspaceRemoved(volume=f.text("volume"), reason=f.text("reason"))


def _call_output(f: _Fields) -> CallOutput:
    f.need("call_id", "attempt", "stream", "seq", "text", "bytes", "redacted")
    stream = f.text("stream")
    if stream not in OUTPUT_STREAMS:
        raise f.fail(f"stream must be one of {', '.join(OUTPUT_STREAMS)}")
    return CallOutput(call_id=f.text("call_id"), attempt=f.integer("attempt"), stream=stream, seq=f.integer("seq"),
                      text=f.text("text"), bytes=f.integer("bytes"), redacted=f.flag("redacted"))


def _file_entries(f: _Fields) -> tuple[FileEntry, ...]:
    return tuple(FileEntry(path=str(e.get("path", "")), size=_Fields(f.type, e).integer("size"),
                           sha256=str(e.get("sha256", ""))) for e in f.objs("files"))


def _files_uploaded(f: _Fields) -> FilesUploaded:
    f.need("dest", "files", "by")
    return FilesUploaded(dest=f.text("dest"), files=_file_entries(f), by=f.text("by"),
                         incomplete=f.opt_text("incomplete"))


def _files_downloaded(f: _Fields) -> FilesDownloaded:
    f.need("files", "artifacts", "by")
    return FilesDownloaded(files=_file_entries(f), artifacts=f.flag("artifacts"), by=f.text("by"))


def _artifact_collected(f: _Fields) -> ArtifactCollected:
    f.need("call_id", "files", "missing")
    if not isinstance(f.raw("files"), list) or not isinstance(f.raw("missing"), list):
        raise f.fail("files must be [{path, size, sha256, revision}] and missing a list")
    files = f.objs("files")
    if not all({"path", "size", "sha256", "revision"} <= set(e) for e in files):
        raise f.fail("files must be [{path, size, sha256, revision}] and missing a list")
    return ArtifactCollected(
        call_id=f.text("call_id"),
        files=tuple(ArtifactFile(path=str(e["path"]), size=_Fields(f.type, e).integer("size"), sha256=str(e["sha256"]),
                                 revision=_Fields(f.type, e).integer("revision")) for e in files),
        missing=f.texts("missing"))


_PARSERS: dict[EventType, Callable[[_Fields], EventPayload]] = {
    EventType.RUN_STARTED: _run_started,
    EventType.BATCH_STARTED: _batch_started,
    EventType.CALL_DECIDED: _call_decided,
    EventType.APPROVAL_REQUESTED: _approval_requested,
    EventType.APPROVAL_DECIDED: _approval_decided,
    EventType.APPROVAL_EXPIRED: _approval_expired,
    EventType.APPROVAL_USED: _approval_used,
    EventType.APPROVAL_WITHDRAWN: _approval_withdrawn,
    EventType.GRANT_ADDED: _grant_added,
    EventType.DISPATCH_STARTED: _dispatch_started,
    EventType.ATTEMPT: _attempt,
    EventType.EGRESS: _egress,
    EventType.CALL_COMPLETED: _call_completed,
    EventType.OBSERVATION: _observation,
    EventType.RUN_FINISHED: _run_finished,
    EventType.WORKSPACE_CREATED: _workspace_created,
    EventType.WORKSPACE_REMOVED: _workspace_removed,
    EventType.CALL_OUTPUT: _call_output,
    EventType.FILES_UPLOADED: _files_uploaded,
    EventType.FILES_DOWNLOADED: _files_downloaded,
    EventType.ARTIFACT_COLLECTED: _artifact_collected,
}


def parse_event(type_: str, data: object) -> EventPayload:
    """The payload of a stored event (its `type` and `data`); ValueError when the fold could
    not take it (an unknown type, a required field missing, a value out of its enum)."""
    try:
        t = EventType(type_)
    except ValueError:
        raise ValueError(f"unknown event type {type_!r}") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"{t}: data must be an object")
    return _PARSERS[t](_Fields(t, data))


def payload_of(event: Event) -> EventPayload:
    """`parse_event` of a stored event."""
    return parse_event(event.type, event.data)


def check_event(type_: str, data: object) -> None:
    """Refuse (ValueError) an event the fold would not take, before it is made durable."""
    parse_event(type_, data)
