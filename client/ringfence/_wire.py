"""What the sync and the async client share: each RPC as a value (request, decoder, whether it
may be retried), the metadata every call carries, the error translation and the retry loop's
stop and wait rules. Neither client builds a request or decodes a response itself.

File transfers: `pack_files` builds an uncompressed tar in memory (regular files only, modes
0644, no owners or times), `upload` streams an archive as UploadFilesRequests of
UPLOAD_CHUNK_BYTES, and `Assembler` turns a DownloadFiles stream back into files, checking
every path (relative, no `..`), every file's size and sha256, and the chunks' order."""

from __future__ import annotations

import hashlib
import io
import logging
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
from opentelemetry import propagate
from tenacity import RetryCallState, retry_if_exception_type, wait_exponential_jitter

from ringfence._version import __version__
from ringfence.errors import FieldViolation, Internal, InvalidArgument, Unavailable
from ringfence.model import (
    Approval,
    AuditReport,
    Event,
    EventPage,
    Identity,
    Observation,
    PlanStep,
    ProposedCall,
    RunOutcome,
    RunPage,
    RunStatus,
    RunView,
    ToolView,
    WorkspaceRequest,
)
from ringfence.options import DownloadedFiles, RetryPolicy, UploadedFile, UploadResult, WorkspaceOptions
from ringfence.plans import Claim, EvidenceRecord, PlanView, Report, Verdict
from ringfence.routing import Decision
from ringfence.v1 import (
    approvals_pb2,
    approvals_pb2_grpc,
    files_pb2,
    files_pb2_grpc,
    identity_pb2,
    identity_pb2_grpc,
    plans_pb2,
    plans_pb2_grpc,
    routing_pb2,
    routing_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
    tools_pb2,
    tools_pb2_grpc,
)
from ringfence.wire import convert, plans_convert, routing_convert, version
from ringfence.wire.status import from_rpc_error
from ringfence.workspace_paths import path_problem

log = logging.getLogger("ringfence")

T = TypeVar("T")
E = TypeVar("E", RunStatus, RunOutcome)

TOOLS, RUNS, APPROVALS, PLANS, EVIDENCE, ROUTING = "tools", "runs", "approvals", "plans", "evidence", "routing"
FILES, IDENTITY = "files", "identity"

RUNS_PAGE_MAX = convert.RUNS_PAGE_MAX
"""list_runs follows pages of the largest size the server serves: the fewest round trips."""

UPLOAD_CHUNK_BYTES = 256 * 1024
"""Bytes of the archive per UploadFilesRequest (grpc's messages are capped at 1 MiB by the server)."""


@dataclass(frozen=True)
class Stubs:
    """One generated stub per service, on one channel: `client.stubs.runs.GetRun(request, ...)`
    for a raw call (a message the typed methods would not send), with `client.metadata()`.

    Typed Any: the generated classes serve a grpc and a grpc.aio channel alike, but their .pyi
    stubs describe the sync calls only (an AsyncClient's return awaitables)."""

    tools: Any  # tools_pb2_grpc.ToolServiceStub
    runs: Any  # runs_pb2_grpc.RunServiceStub
    approvals: Any  # approvals_pb2_grpc.ApprovalServiceStub
    plans: Any  # plans_pb2_grpc.PlanServiceStub
    evidence: Any  # plans_pb2_grpc.EvidenceServiceStub
    routing: Any  # routing_pb2_grpc.RoutingServiceStub
    files: Any  # files_pb2_grpc.FileServiceStub
    identity: Any  # identity_pb2_grpc.IdentityServiceStub


def make_stubs(channel: Any) -> Stubs:
    """One stub per service on `channel` (a grpc or a grpc.aio channel: the stubs are the same)."""
    return Stubs(
        tools=tools_pb2_grpc.ToolServiceStub(channel),
        runs=runs_pb2_grpc.RunServiceStub(channel),
        approvals=approvals_pb2_grpc.ApprovalServiceStub(channel),
        plans=plans_pb2_grpc.PlanServiceStub(channel),
        evidence=plans_pb2_grpc.EvidenceServiceStub(channel),
        routing=routing_pb2_grpc.RoutingServiceStub(channel),
        files=files_pb2_grpc.FileServiceStub(channel),
        identity=identity_pb2_grpc.IdentityServiceStub(channel),
    )


@dataclass(frozen=True)
class Unary(Generic[T]):
    """One unary RPC, ready to send."""

    service: str
    """Which stub: a field of Stubs (TOOLS, RUNS, ...)."""
    method: str
    """The proto method name, e.g. "GetRun"."""
    request: Any
    """The request message."""
    decode: Callable[[Any], T]
    """Response message -> ringfence.model value."""
    retryable: bool = False
    """Safe to send again after UNAVAILABLE: a read, or a batch that carries its id."""


@dataclass(frozen=True)
class ServerStream(Generic[T]):
    """One server-streaming RPC, ready to send; streams are never retried (a replay would
    repeat what the caller has already seen)."""

    service: str
    method: str
    request: Any
    decode: Callable[[Any], T]


# -- the RPCs ---------------------------------------------------------------------------------


def list_tools(query: str) -> Unary[list[ToolView]]:
    return Unary(TOOLS, "ListTools", tools_pb2.ListToolsRequest(query=query),
                 lambda r: [convert.tool_from_proto(t) for t in r.tools], retryable=True)


def start_run(goal: str, run_id: str | None, workspace: bool | WorkspaceOptions = False) -> Unary[RunView]:
    request = runs_pb2.StartRunRequest(goal=goal, run_id=run_id or "")
    wanted = workspace_request(workspace)
    if wanted is not None:
        request.workspace.CopyFrom(convert.workspace_to_proto(wanted))
    return Unary(RUNS, "StartRun", request, convert.run_from_proto)


def workspace_request(workspace: bool | WorkspaceOptions) -> WorkspaceRequest | None:
    """start_run's `workspace`: False = none, True = the server's default caps, or the caps."""
    if workspace is False:
        return None
    if workspace is True:
        return WorkspaceRequest()
    if isinstance(workspace, WorkspaceOptions):
        return WorkspaceRequest(bytes=workspace.bytes, inodes=workspace.inodes)
    raise TypeError(f"workspace must be a bool or a WorkspaceOptions, not {type(workspace).__name__}")


def get_run(run_id: str) -> Unary[RunView]:
    return Unary(RUNS, "GetRun", runs_pb2.GetRunRequest(run_id=run_id), convert.run_from_proto, retryable=True)


def list_runs_page(status: RunStatus | str | None, outcome: RunOutcome | str | None, page_size: int,
                   page_token: str) -> Unary[RunPage]:
    request = convert.run_filters_to_proto(runs_pb2.ListRunsRequest(page_size=page_size, page_token=page_token),
                                           _enum_or_none(RunStatus, status), _enum_or_none(RunOutcome, outcome))
    return Unary(RUNS, "ListRuns", request, convert.run_page_from_proto, retryable=True)


def _enum_or_none(kind: type[E], value: E | str | None) -> E | None:
    return None if value is None else kind(value)


def list_events(run_id: str, from_seq: int, page_size: int) -> Unary[EventPage]:
    request = runs_pb2.ListEventsRequest(run_id=run_id, from_seq=from_seq, page_size=page_size)
    return Unary(RUNS, "ListEvents", request, convert.event_page_from_proto, retryable=True)


def verify_run(run_id: str) -> Unary[AuditReport]:
    return Unary(RUNS, "VerifyRun", runs_pb2.VerifyRunRequest(run_id=run_id), convert.audit_report_from_proto,
                 retryable=True)


def finish_run(run_id: str) -> Unary[RunView]:
    return Unary(RUNS, "FinishRun", runs_pb2.FinishRunRequest(run_id=run_id), convert.run_from_proto)


def cancel_run(run_id: str) -> Unary[RunView]:
    return Unary(RUNS, "CancelRun", runs_pb2.CancelRunRequest(run_id=run_id), convert.run_from_proto)


def is_wire_id(value: str) -> bool:
    """Whether the server takes `value` as a run, call or batch id."""
    return bool(convert.ID_PATTERN.fullmatch(value))


def new_batch_id() -> str:
    return "b-" + uuid.uuid4().hex[:20]


def submit_batch(run_id: str, calls: Sequence[ProposedCall | Mapping[str, Any]],
                 batch_id: str | None) -> Unary[list[Observation]]:
    # The id is fixed here, once per call of the method, so every retry of it resends the same
    # id and the server answers a resend with the recorded observations instead of running
    # anything twice.
    request = runs_pb2.SubmitBatchRequest(run_id=run_id, calls=[convert.call_to_proto(c) for c in calls],
                                          batch_id=batch_id or new_batch_id())
    return Unary(RUNS, "SubmitBatch", request,
                 lambda r: [convert.observation_from_proto(o) for o in r.observations], retryable=True)


def execute_plan(run_id: str, steps: Sequence[PlanStep | Mapping[str, Any]],
                 max_steps: int | None) -> ServerStream[Event]:
    request = runs_pb2.ExecutePlanRequest(run_id=run_id, steps=[convert.step_to_proto(s) for s in steps],
                                          max_steps=max_steps or 0)
    return ServerStream(RUNS, "ExecutePlan", request, convert.event_from_proto)


def watch_run(run_id: str, from_seq: int) -> ServerStream[Event]:
    return ServerStream(RUNS, "WatchRun", runs_pb2.WatchRunRequest(run_id=run_id, from_seq=from_seq),
                        convert.event_from_proto)


def list_approvals(run_id: str | None) -> Unary[list[Approval]]:
    return Unary(APPROVALS, "ListApprovals", approvals_pb2.ListApprovalsRequest(run_id=run_id or ""),
                 lambda r: [convert.approval_from_proto(a) for a in r.approvals], retryable=True)


def get_approval(approval_id: str) -> Unary[Approval]:
    return Unary(APPROVALS, "GetApproval", approvals_pb2.GetApprovalRequest(approval_id=approval_id),
                 convert.approval_from_proto, retryable=True)


def whoami() -> Unary[Identity]:
    return Unary(IDENTITY, "WhoAmI", identity_pb2.WhoAmIRequest(), convert.identity_from_proto, retryable=True)


def watch_approvals() -> ServerStream[Approval]:
    return ServerStream(APPROVALS, "WatchApprovals", approvals_pb2.WatchApprovalsRequest(),
                        convert.approval_from_proto)


def withdraw_approval(run_id: str, approval_id: str, reason: str) -> Unary[Observation]:
    # Not retried: a withdrawal that took effect answers a resend FAILED_PRECONDITION (it is
    # withdrawn), so a retry after a lost response would turn success into an error.
    request = runs_pb2.WithdrawApprovalRequest(run_id=run_id, approval_id=approval_id, reason=reason)
    return Unary(RUNS, "WithdrawApproval", request, convert.observation_from_proto)


def decide_approval(approval_id: str, approve: bool, reason: str, remember: bool,
                    digest: str | None) -> Unary[Approval]:
    decision = approvals_pb2.DECISION_APPROVE if approve else approvals_pb2.DECISION_DECLINE
    request = approvals_pb2.DecideApprovalRequest(approval_id=approval_id, decision=decision, reason=reason,
                                                  remember=remember, digest=digest or "")
    return Unary(APPROVALS, "DecideApproval", request, convert.approval_from_proto)


def run_evidence_plan(steps: Sequence[tuple[str, str]], max_steps: int, plan_id: str | None) -> Unary[Report]:
    # Retry-safe: the plan id is fixed here, and a resent plan id resumes or returns its report.
    request = plans_pb2.RunEvidencePlanRequest(
        max_steps=max_steps, plan_id=plan_id or "plan-" + uuid.uuid4().hex[:20],
        steps=[plans_pb2.EvidenceStep(key=k, evidence_ref=r) for k, r in steps])
    return Unary(PLANS, "RunEvidencePlan", request, plans_convert.report_from_proto, retryable=True)


def verify_report(plan_id: str, claims: Sequence[Claim]) -> Unary[Verdict]:
    request = plans_pb2.VerifyReportRequest(plan_id=plan_id, claims=[plans_convert.claim_to_proto(c) for c in claims])
    return Unary(PLANS, "VerifyReport", request, plans_convert.verdict_from_proto)


def get_plan(plan_id: str) -> Unary[PlanView]:
    return Unary(PLANS, "GetPlan", plans_pb2.GetPlanRequest(plan_id=plan_id), plans_convert.plan_from_proto,
                 retryable=True)


def put_evidence(store: str, ref: str, value: str) -> Unary[EvidenceRecord]:
    request = plans_pb2.PutEvidenceRequest(store=store, evidence_ref=ref, value=value)
    return Unary(EVIDENCE, "PutEvidence", request, plans_convert.evidence_from_proto)


def get_evidence(store: str, ref: str) -> Unary[list[EvidenceRecord]]:
    return Unary(EVIDENCE, "GetEvidence", plans_pb2.GetEvidenceRequest(store=store, evidence_ref=ref),
                 lambda r: [plans_convert.evidence_from_proto(x) for x in r.revisions], retryable=True)


def route_ticket(ticket_id: str, incident: str, service: str, symptom: str, correlation_id: str | None,
                 reclassify: bool) -> Unary[Decision]:
    # Retry-safe without reclassify: a resent ticket id gets the decision recorded for it.
    request = routing_pb2.RouteTicketRequest(
        ticket=routing_pb2.Ticket(id=ticket_id, incident=incident, service=service, symptom=symptom),
        correlation_id=correlation_id or "", reclassify=reclassify)
    return Unary(ROUTING, "RouteTicket", request, routing_convert.decision_from_proto, retryable=not reclassify)


def get_routing(ticket_id: str) -> Unary[list[Decision]]:
    return Unary(ROUTING, "GetRouting", routing_pb2.GetRoutingRequest(ticket_id=ticket_id),
                 lambda r: [routing_convert.decision_from_proto(d) for d in r.decisions], retryable=True)


# -- what every call carries --------------------------------------------------------------------


CLIENT_VERSION = __version__
"""The version every call announces (ringfence/wire/version.py's handshake); read at each call."""


def call_metadata(token: str | None, extra: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The bearer token, this client's version, the caller's own metadata, and the current trace
    context.

    The version lets a server that cannot serve this client refuse it with FAILED_PRECONDITION
    naming what to upgrade (ringfence.errors.VersionMismatch) instead of failing in a way that
    hides the cause; a server predating the handshake ignores it.

    The trace context goes through OpenTelemetry's configured propagator (W3C `traceparent`
    by default): it writes nothing when no span is current, and whatever propagator the
    application set up is honoured, as the server reads it with the same API.
    """
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    auth = (("authorization", f"Bearer {token}"),) if token is not None else ()
    return (*auth, (version.KEY, CLIENT_VERSION), *extra, *((k.lower(), v) for k, v in carrier.items()))


def translate(error: grpc.RpcError) -> BaseException:
    """The ringfence.errors exception a failed call stands for (ringfence/wire/status.py's table);
    codes with no counterpart (DEADLINE_EXCEEDED, CANCELLED, UNKNOWN) stay grpc.RpcError."""
    translated = from_rpc_error(error)
    if translated is not error:
        translated.__cause__ = error
    return translated


# -- retries ---------------------------------------------------------------------------------------


class Deadline:
    """One deadline shared by every attempt of a call: retries never extend it."""

    def __init__(self, timeout: float) -> None:
        self.at = time.monotonic() + timeout

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def attempt_timeout(self) -> float:
        # grpc refuses a non-positive timeout; an already spent deadline fails at once instead.
        return max(self.remaining(), 0.001)


def retry_kwargs(policy: RetryPolicy, deadline: Deadline, what: str) -> dict[str, Any]:
    """Keyword arguments for tenacity's Retrying / AsyncRetrying."""
    backoff = wait_exponential_jitter(multiplier=policy.initial_backoff_s, max=policy.max_backoff_s,
                                      jitter=policy.jitter_s)

    def stop(state: RetryCallState) -> bool:
        return state.attempt_number >= policy.attempts or deadline.remaining() <= 0

    def wait(state: RetryCallState) -> float:
        return max(0.0, min(backoff(state), deadline.remaining()))

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        log.info("%s: %s; attempt %d of %d", what, error, state.attempt_number + 1, policy.attempts)

    return dict(retry=retry_if_exception_type(Unavailable), stop=stop, wait=wait, before_sleep=before_sleep,
                reraise=True)


# -- files ------------------------------------------------------------------------------------------


def check_paths(paths: Sequence[str], field: str) -> None:
    """InvalidArgument naming `field[i]` for every bad path, before anything is sent."""
    if isinstance(paths, str):
        raise TypeError(f"{field} must be a sequence of paths, not one string")
    bad = [FieldViolation(f"{field}[{i}]", problem) for i, p in enumerate(paths)
           if (problem := path_problem(p)) is not None]
    if bad:
        raise InvalidArgument(f"a path in {field} cannot name a workspace file", bad)


def pack_files(files: Mapping[str, bytes]) -> bytes:
    """An uncompressed tar (PAX) of `files` (relative path -> content), sorted, with modes 0644
    and no owners or times: the same bytes for the same files."""
    check_paths(list(files), "files")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(files):
            data = files[path]
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(f"files[{path!r}] must be bytes, not {type(data).__name__}")
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(bytes(data)))
    return buf.getvalue()


@dataclass(frozen=True)
class Upload:
    """One UploadFiles, ready to send: `messages()` streams the archive; never retried (the
    server's answer is the record of what was copied)."""

    run_id: str
    dest: str
    tar_bytes: bytes

    def __post_init__(self) -> None:
        problem = path_problem(self.dest, allow_root=True)
        if problem is not None:
            raise InvalidArgument("dest cannot name a workspace directory", [FieldViolation("dest", problem)])

    def messages(self) -> Iterator[files_pb2.UploadFilesRequest]:
        data = memoryview(self.tar_bytes)
        yield files_pb2.UploadFilesRequest(run_id=self.run_id, dest=self.dest,
                                           tar_chunk=bytes(data[:UPLOAD_CHUNK_BYTES]))
        for offset in range(UPLOAD_CHUNK_BYTES, len(data), UPLOAD_CHUNK_BYTES):
            yield files_pb2.UploadFilesRequest(tar_chunk=bytes(data[offset:offset + UPLOAD_CHUNK_BYTES]))

    @staticmethod
    def decode(response: files_pb2.UploadFilesResponse) -> UploadResult:
        return UploadResult(tuple(UploadedFile(f.path, f.size, f.sha256) for f in response.files), response.seq)


def download_files(run_id: str, paths: Sequence[str], artifacts: bool) -> files_pb2.DownloadFilesRequest:
    check_paths(paths, "paths")
    return files_pb2.DownloadFilesRequest(run_id=run_id, paths=list(paths), artifacts=artifacts)


class Assembler:
    """Files from a DownloadFiles stream. Everything the server sends is checked before it is
    believed: each path relative without `..`; a file's chunks contiguous, then exactly one
    `eof` with the size and sha256 of what arrived; no path twice; no file left open at the end.
    A violation is Internal (the server, or what sits between, broke the protocol)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.skipped: dict[str, str] = {}
        self._path: str | None = None
        self._parts: list[bytes] = []

    def _broken(self, why: str) -> Internal:
        return Internal(f"the server's file stream is not trustworthy: {why}")

    def feed(self, chunk: files_pb2.FileChunk) -> None:
        path = chunk.path
        problem = path_problem(path)
        if problem is not None:
            raise self._broken(f"a file's path {path!r} {problem}")
        if self._path is not None and path != self._path:
            raise self._broken(f"{path!r} began before {self._path!r} ended")
        if self._path is None and (path in self.files or path in self.skipped):
            raise self._broken(f"{path!r} was sent twice")
        if chunk.skipped:
            if self._path is not None or chunk.data:
                raise self._broken(f"the skipped entry {path!r} carries data")
            self.skipped[path] = chunk.skipped
            return
        self._path = path
        self._parts.append(chunk.data)
        if chunk.eof:
            data = b"".join(self._parts)
            if len(data) != chunk.size or hashlib.sha256(data).hexdigest() != chunk.sha256:
                raise self._broken(f"{path!r} arrived as {len(data)} bytes that do not match the size "
                                   f"({chunk.size}) and sha256 the server sent")
            self.files[path] = data
            self._path = None
            self._parts = []

    def result(self) -> DownloadedFiles:
        if self._path is not None:
            raise self._broken(f"the stream ended inside {self._path!r}")
        return DownloadedFiles(self.files, self.skipped)
