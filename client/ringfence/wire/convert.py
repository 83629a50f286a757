"""Dataclass <-> proto conversion, at the edge only.

Requests are decoded strictly: every malformed field becomes a FieldViolation naming it
(`calls[2].arguments_json`), all of a request's violations are collected before anything is
raised, and nothing malformed reaches the core. JSON text fields are parsed with duplicate
keys, NaN and Infinity rejected: two readers of `{"amount": 5, "amount": 500}` could disagree
about which amount was approved.

Responses are encoded from the core's frozen dataclasses; the client (client/ringfence/client.py)
decodes them back into the same dataclasses.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from google.protobuf import timestamp_pb2
from google.protobuf.message import Message

from ringfence.errors import FieldViolation, Internal, InvalidArgument
from ringfence.model import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    AuditReport,
    Event,
    EventPage,
    Identity,
    Observation,
    ObservationStatus,
    PlanStep,
    Principal,
    ProposedCall,
    Role,
    RunOutcome,
    RunPage,
    RunStatus,
    RunView,
    ToolRisk,
    ToolView,
    Usage,
    WorkspaceRequest,
    WorkspaceView,
)
from ringfence.v1 import approvals_pb2, identity_pb2, runs_pb2, types_pb2

__all__ = [
    "ID_PATTERN",
    "MAX_GOAL_CHARS",
    "MAX_JSON_DEPTH",
    "MAX_QUERY_CHARS",
    "MAX_REASON_CHARS",
    "MAX_TOOL_NAME_CHARS",
    "Violations",
    "approval_from_proto",
    "approval_to_proto",
    "audit_report_from_proto",
    "audit_report_to_proto",
    "call_to_proto",
    "calls_from_proto",
    "check_id",
    "check_text",
    "decision_from_proto",
    "dump_json",
    "event_from_proto",
    "event_page_from_proto",
    "event_page_to_proto",
    "event_to_proto",
    "events_request_from_proto",
    "from_timestamp",
    "identity_from_proto",
    "identity_to_proto",
    "load_json",
    "observation_from_proto",
    "observation_to_proto",
    "parse_json_object",
    "run_filters_to_proto",
    "run_from_proto",
    "run_page_from_proto",
    "run_page_to_proto",
    "run_to_proto",
    "runs_request_from_proto",
    "step_to_proto",
    "steps_from_proto",
    "to_timestamp",
    "tool_from_proto",
    "tool_risk_from_proto",
    "tool_risk_to_proto",
    "tool_to_proto",
    "workspace_from_proto",
    "workspace_to_proto",
]

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")  # as the core's ids
MAX_GOAL_CHARS = 4096
MAX_QUERY_CHARS = 256
MAX_REASON_CHARS = 1024
MAX_TOOL_NAME_CHARS = 64
# Deeper arguments are refused at the edge (see _shape_problem); real tool arguments are flat.
MAX_JSON_DEPTH = 32
RUNS_PAGE_DEFAULT, RUNS_PAGE_MAX = 50, 500
"""ListRunsRequest.page_size: 0 means the default; above the maximum is refused, never clipped
(a caller asking for 10 000 would otherwise believe it had them all)."""
EVENTS_PAGE_DEFAULT, EVENTS_PAGE_MAX = 500, 1000
"""ListEventsRequest.page_size, by the same rule."""
MAX_PAGE_TOKEN_CHARS = 512


class Violations:
    """Collects the violations of one request; `raise_if_any` raises them all at once."""

    def __init__(self) -> None:
        self.items: list[FieldViolation] = []

    def add(self, field: str, description: str) -> None:
        self.items.append(FieldViolation(field, description))

    def raise_if_any(self, message: str = "the request is invalid") -> None:
        if self.items:
            raise InvalidArgument(message, self.items)


# --- JSON text ---------------------------------------------------------------------------


class _JsonError(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JsonError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise _JsonError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e999 parses to inf: not a number any tool could be given
        raise _JsonError(f"{text} is out of range")
    return value


def parse_json_object(text: str, field: str, max_bytes: int, v: Violations) -> dict[str, Any] | None:
    """`text` as a JSON object ("" means {}), or None after recording why not."""
    if text == "":
        return {}
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        v.add(field, f"{size} bytes is over the {max_bytes}-byte limit for arguments")
        return None
    try:
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
            parse_float=_finite_float,
        )
    except _JsonError as e:
        v.add(field, f"invalid JSON: {e}")
        return None
    except json.JSONDecodeError as e:
        v.add(field, f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}")
        return None
    except (ValueError, RecursionError):
        v.add(field, "invalid JSON (too deeply nested or unparseable)")
        return None
    if not isinstance(value, dict):
        v.add(field, f"must be a JSON object, not {type(value).__name__}")
        return None
    problem = _shape_problem(value)
    if problem is not None:
        v.add(field, problem)
        return None
    return value


def _shape_problem(value: Any) -> str | None:
    """What makes a parsed JSON value unusable as arguments, or None. Iterative on purpose.

    - nesting deeper than MAX_JSON_DEPTH: validators, canonicalizers and loggers downstream
      recurse, and a 60 KiB `[[[[...` would exhaust their stack;
    - a lone surrogate escape ("\\ud800"): JSON allows one half of a surrogate pair, but it
      is not a Unicode character, cannot be encoded as UTF-8, and no tool could be given it.
    """
    stack = [(value, "arguments", 0)]
    while stack:
        item, at, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"nested deeper than {MAX_JSON_DEPTH} levels (at {at})"
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return f"invalid JSON: {at} holds a lone surrogate escape (not a Unicode character)"
        elif isinstance(item, dict):
            for key, child in item.items():
                printable = key.encode("utf-8", "backslashreplace").decode("utf-8")
                stack.append((key, f"{at} (the key {printable!r})", depth + 1))
                stack.append((child, f"{at}.{printable}", depth + 1))
        elif isinstance(item, list):
            stack.extend((child, f"{at}[{i}]", depth + 1) for i, child in enumerate(item))
    return None


def dump_json(value: Any) -> str:
    """Compact JSON for the wire. Core values are JSON already; `default=str` keeps an odd one
    (a Path, a datetime) from turning a successful call into a server error, and ASCII output
    keeps any string the core holds (even one that is not valid Unicode) encodable."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True, default=str)


def _text(value: Any) -> str:
    """A string for a proto string field, which must be valid UTF-8: tool error messages and
    the like come from outside, and a lone surrogate in one must not fail the whole response."""
    text = str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def load_json(text: str) -> Any:
    return json.loads(text) if text else None


# --- field checks --------------------------------------------------------------------------


def check_id(value: str, field: str, v: Violations, *, required: bool = True) -> None:
    if not value:
        if required:
            v.add(field, "is required")
        return
    if not ID_PATTERN.fullmatch(value):
        v.add(field, "must be 1-100 characters of [A-Za-z0-9_.:-], starting with a letter or digit")


def check_text(value: str, field: str, max_chars: int, v: Violations, *, required: bool = False) -> None:
    if required and not value.strip():
        v.add(field, "is required")
    elif len(value) > max_chars:
        v.add(field, f"is {len(value)} characters; at most {max_chars}")
    elif "\x00" in value:
        v.add(field, "must not contain NUL")


def _check_tool(value: str, field: str, v: Violations) -> None:
    # Only the shape: whether the name resolves is the registry's answer (an unknown_tool
    # observation for a batch, a violation for a plan), not the edge's.
    if not value:
        v.add(field, "is required")
    elif len(value) > MAX_TOOL_NAME_CHARS or not value.isprintable():
        v.add(field, f"must be a printable tool name of at most {MAX_TOOL_NAME_CHARS} characters")


def calls_from_proto(
    calls: Sequence[types_pb2.ProposedCall], *, max_calls: int, max_argument_bytes: int, v: Violations
) -> tuple[ProposedCall, ...]:
    if not calls:
        v.add("calls", "a batch needs at least one call")
    elif len(calls) > max_calls:
        v.add("calls", f"{len(calls)} calls is over the limit of {max_calls} per batch")
    seen: set[str] = set()
    out = []
    for i, call in enumerate(calls):
        at = f"calls[{i}]"
        check_id(call.call_id, f"{at}.call_id", v)
        if call.call_id and call.call_id in seen:
            v.add(f"{at}.call_id", f"duplicate call id {call.call_id!r} in the batch")
        seen.add(call.call_id)
        _check_tool(call.tool, f"{at}.tool", v)
        arguments = parse_json_object(call.arguments_json, f"{at}.arguments_json", max_argument_bytes, v)
        key = call.idempotency_key if call.HasField("idempotency_key") else None
        if key is not None:
            check_text(key, f"{at}.idempotency_key", 200, v, required=True)
        if arguments is not None and not v.items:
            out.append(ProposedCall(call.call_id, call.tool, arguments, idempotency_key=key))
    return tuple(out)


def steps_from_proto(
    steps: Sequence[types_pb2.PlanStep], *, max_argument_bytes: int, v: Violations
) -> tuple[PlanStep, ...]:
    """Shape only (ids, JSON); count, unique keys, tools and schemas are the core's plan
    validation, which reports its violations in the same field-path form."""
    out = []
    for i, step in enumerate(steps):
        at = f"steps[{i}]"
        check_id(step.key, f"{at}.key", v)
        _check_tool(step.tool, f"{at}.tool", v)
        arguments = parse_json_object(step.arguments_json, f"{at}.arguments_json", max_argument_bytes, v)
        out.append(PlanStep(step.key, step.tool, arguments or {}))
    return tuple(out)


def workspace_from_proto(request: runs_pb2.StartRunRequest) -> WorkspaceRequest | None:
    """StartRunRequest.workspace: absent = no workspace; its caps as sent (0 = the server's
    default). Whether they fit the server's maximums is the core's check (workspace.bytes,
    workspace.inodes), which knows the configuration."""
    if not request.HasField("workspace"):
        return None
    return WorkspaceRequest(bytes=request.workspace.bytes, inodes=request.workspace.inodes)


def workspace_to_proto(workspace: WorkspaceRequest) -> runs_pb2.WorkspaceRequest:
    """Client side: StartRunRequest.workspace (set only when the run asks for one)."""
    return runs_pb2.WorkspaceRequest(bytes=max(0, int(workspace.bytes)), inodes=max(0, int(workspace.inodes)))


def decision_from_proto(value: approvals_pb2.Decision.ValueType, v: Violations) -> bool | None:
    if value == approvals_pb2.DECISION_APPROVE:
        return True
    if value == approvals_pb2.DECISION_DECLINE:
        return False
    name = approvals_pb2.Decision.Name(value) if value in approvals_pb2.Decision.values() else str(value)
    v.add("decision", f"must be DECISION_APPROVE or DECISION_DECLINE, not {name}")
    return None


def _page_size(value: int, default: int, maximum: int, v: Violations) -> int:
    if value > maximum:
        v.add("page_size", f"is {value}; at most {maximum} (0 = {default})")
    return value or default


def runs_request_from_proto(
    request: runs_pb2.ListRunsRequest, v: Violations
) -> tuple[RunStatus | None, RunOutcome | None, int, str]:
    """ListRunsRequest as (status, outcome, page size, page token): the filters None for
    UNSPECIFIED (any), the size defaulted. Whether the token is one this server issued for
    these filters and this tenant is the core's check (it made the token)."""
    status = _filter_enum(request.status, _RUN_BACK, types_pb2.RunStatus, "status", v)
    outcome = _filter_enum(request.outcome, _OUTCOME_BACK, types_pb2.RunOutcome, "outcome", v)
    if outcome is RunOutcome.MODEL_TRUNCATED:
        v.add("outcome", "RUN_OUTCOME_MODEL_TRUNCATED is the agent loop's, never a stored outcome")
    size = _page_size(request.page_size, RUNS_PAGE_DEFAULT, RUNS_PAGE_MAX, v)
    token = request.page_token
    if len(token) > MAX_PAGE_TOKEN_CHARS or not token.isascii() or not token.isprintable():
        v.add("page_token", "is not a token this server issued")
    return status, outcome, size, token


def _filter_enum(value: int, back: Mapping[Any, _E], enum_type: Any, field: str, v: Violations) -> _E | None:
    if value == 0:  # *_UNSPECIFIED: no filter
        return None
    found = back.get(value)
    if found is None:
        v.add(field, f"{value} is not a value of {enum_type.DESCRIPTOR.name}")
    return found


def events_request_from_proto(request: runs_pb2.ListEventsRequest, v: Violations) -> tuple[str, int, int]:
    """ListEventsRequest as (run id, first seq, page size)."""
    check_id(request.run_id, "run_id", v)
    if request.from_seq > 2**62:  # SQLite's integers are 64-bit signed; no run has 2**62 events
        v.add("from_seq", f"is {request.from_seq}; at most {2**62}")
    size = _page_size(request.page_size, EVENTS_PAGE_DEFAULT, EVENTS_PAGE_MAX, v)
    return request.run_id, max(1, request.from_seq), size


# --- enums -----------------------------------------------------------------------------------


_E = TypeVar("_E", bound=enum.Enum)
_V = TypeVar("_V", bound=int, covariant=True)


class _ProtoEnum(Protocol[_V]):
    """A generated protobuf enum's wrapper (types_pb2.RunStatus, ...) with values of type _V."""

    def Value(self, name: str) -> _V: ...


def _enum_table(enum_type: _ProtoEnum[_V], prefix: str, model_enum: type[_E]) -> tuple[dict[_E, _V], dict[_V, _E]]:
    to_proto = {m: enum_type.Value(f"{prefix}{m.name}") for m in model_enum}
    return to_proto, {v: k for k, v in to_proto.items()}


_OBS, _OBS_BACK = _enum_table(types_pb2.ObservationStatus, "OBSERVATION_STATUS_", ObservationStatus)
_KIND, _KIND_BACK = _enum_table(types_pb2.ApprovalKind, "APPROVAL_KIND_", ApprovalKind)
_RUN, _RUN_BACK = _enum_table(types_pb2.RunStatus, "RUN_STATUS_", RunStatus)
_OUTCOME, _OUTCOME_BACK = _enum_table(types_pb2.RunOutcome, "RUN_OUTCOME_", RunOutcome)
_APPROVAL, _APPROVAL_BACK = _enum_table(types_pb2.ApprovalStatus, "APPROVAL_STATUS_", ApprovalStatus)


def _ts(seconds: float) -> timestamp_pb2.Timestamp:
    # Split before scaling: seconds * 1e9 loses the fraction's last digits at today's epoch.
    whole = math.floor(seconds)
    nanos = min(round((seconds - whole) * 1e9), 999_999_999)
    return timestamp_pb2.Timestamp(seconds=whole, nanos=nanos)


def _seconds(ts: timestamp_pb2.Timestamp) -> float:
    return ts.seconds + ts.nanos / 1e9


# --- model -> proto (server side) -------------------------------------------------------------


def tool_to_proto(tool: ToolView) -> types_pb2.Tool:
    msg = types_pb2.Tool(
        name=tool.name, description=tool.description, arguments_schema_json=dump_json(dict(tool.schema)),
        read_only_hint=tool.read_only_hint, destructive_hint=tool.destructive_hint,
    )
    if tool.risk is not None:
        msg.risk.CopyFrom(tool_risk_to_proto(tool.risk))
    return msg


def tool_risk_to_proto(risk: ToolRisk) -> types_pb2.ToolRisk:
    return types_pb2.ToolRisk(
        mutates=risk.mutates, irreversible=risk.irreversible, cost=risk.cost, image_digest=risk.image_digest,
        egress_hosts=list(risk.egress_hosts), timeout_s=risk.timeout_s, memory_bytes=max(0, int(risk.memory_bytes)),
        cpus=risk.cpus, pids=max(0, int(risk.pids)), stdout_limit=max(0, int(risk.stdout_limit)),
        stderr_limit=max(0, int(risk.stderr_limit)), runtime=risk.runtime, image=risk.image,
        workspace=risk.workspace,
        paths={name: types_pb2.PathRoots(roots=list(roots)) for name, roots in risk.paths.items()},
    )


def observation_to_proto(o: Observation) -> types_pb2.Observation:
    msg = types_pb2.Observation(
        call_id=o.call_id,
        tool=o.tool,
        status=_OBS[o.status],
        executed=o.executed,
        verdict_path=list(o.verdict_path),
        attempts=max(0, int(o.attempts)),
    )
    if o.content is not None:
        msg.content_json = dump_json(o.content)
    for name in ("error", "error_class", "approval_id"):
        if getattr(o, name) is not None:
            setattr(msg, name, _text(getattr(o, name)))
    return msg


def approval_to_proto(a: Approval) -> types_pb2.Approval:
    msg = types_pb2.Approval(
        approval_id=a.approval_id,
        tenant=a.tenant,
        run_id=a.run_id,
        call_id=a.call_id,
        tool=a.tool,
        arguments_json=dump_json(dict(a.arguments)),
        digest=a.digest,
        status=_APPROVAL[a.status],
        created_at=_ts(a.created_at),
        expires_at=_ts(a.expires_at),
        kind=_KIND[a.kind],
        proposer=a.proposer,
        policy_rule=a.policy_rule,
    )
    if a.tool_risk is not None:
        msg.tool_risk.CopyFrom(tool_risk_to_proto(a.tool_risk))
    if a.decided_by is not None:
        msg.decided_by = a.decided_by
    if a.reason is not None:
        msg.reason = _text(a.reason)
    return msg


def run_to_proto(r: RunView) -> types_pb2.Run:
    return types_pb2.Run(
        run_id=r.run_id,
        tenant=r.tenant,
        goal=r.goal,
        status=_RUN[r.status],
        outcome=_OUTCOME[r.outcome] if r.outcome is not None else types_pb2.RUN_OUTCOME_UNSPECIFIED,
        turns=max(0, int(r.turns)),
        trajectory=[observation_to_proto(o) for o in r.trajectory],
        usage=types_pb2.Usage(turns=max(0, r.usage.turns), calls=max(0, r.usage.calls), cost=r.usage.cost),
        pending_approvals=[approval_to_proto(a) for a in r.pending_approvals],
        workspace=(types_pb2.Workspace(bytes=max(0, int(r.workspace.bytes)), inodes=max(0, int(r.workspace.inodes)),
                                       removed=r.workspace.removed)
                   if r.workspace is not None else None),
    )


def event_to_proto(e: Event) -> types_pb2.Event:
    return types_pb2.Event(
        run_id=e.run_id,
        seq=e.seq,
        type=e.type,
        data_json=dump_json(dict(e.data)),
        schema_version=e.schema_version,
        at=_ts(e.at),
    )


def run_page_to_proto(page: RunPage) -> runs_pb2.ListRunsResponse:
    return runs_pb2.ListRunsResponse(runs=[run_to_proto(r) for r in page.runs], next_page_token=page.next_page_token)


def event_page_to_proto(page: EventPage) -> runs_pb2.ListEventsResponse:
    return runs_pb2.ListEventsResponse(events=[event_to_proto(e) for e in page.events],
                                       next_seq=max(0, page.next_seq))


def audit_report_to_proto(report: AuditReport) -> runs_pb2.AuditReport:
    return runs_pb2.AuditReport(ok=report.ok, first_bad_seq=max(0, report.first_bad_seq), problem=_text(report.problem),
                                events=max(0, report.events), head_hash=report.head_hash)


def identity_to_proto(p: Principal) -> identity_pb2.Identity:
    """The caller as the edge authenticated it: `principal` is its subject, the name a call it
    proposes is recorded under (Approval.proposer)."""
    return identity_pb2.Identity(tenant=p.tenant, principal=p.subject, role=Role(p.role).value)


# --- proto -> model (client side) -------------------------------------------------------------


def _optional(msg: Message, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


def tool_from_proto(msg: types_pb2.Tool) -> ToolView:
    # A hint an older server did not send keeps ToolView's cautious default (may mutate,
    # irreversibly), never proto3's false.
    hints: dict[str, bool] = {name: getattr(msg, name) for name in ("read_only_hint", "destructive_hint")
                              if msg.HasField(name)}
    risk = tool_risk_from_proto(msg.risk) if msg.HasField("risk") else None
    return ToolView(msg.name, msg.description, json.loads(msg.arguments_schema_json or "{}"), **hints, risk=risk)


def tool_risk_from_proto(msg: types_pb2.ToolRisk) -> ToolRisk:
    return ToolRisk(
        mutates=msg.mutates, irreversible=msg.irreversible, cost=msg.cost, image_digest=msg.image_digest,
        egress_hosts=tuple(msg.egress_hosts), timeout_s=msg.timeout_s, memory_bytes=msg.memory_bytes, cpus=msg.cpus,
        pids=msg.pids, stdout_limit=msg.stdout_limit, stderr_limit=msg.stderr_limit, runtime=msg.runtime,
        image=msg.image, workspace=msg.workspace,
        paths={name: tuple(roots.roots) for name, roots in msg.paths.items()},
    )


def observation_from_proto(msg: types_pb2.Observation) -> Observation:
    return Observation(
        call_id=msg.call_id,
        tool=msg.tool,
        status=_OBS_BACK[msg.status],
        executed=msg.executed,
        content=load_json(msg.content_json) if msg.HasField("content_json") else None,
        error=_optional(msg, "error"),
        error_class=_optional(msg, "error_class"),
        verdict_path=tuple(msg.verdict_path),
        approval_id=_optional(msg, "approval_id"),
        attempts=msg.attempts,
    )


def approval_from_proto(msg: types_pb2.Approval) -> Approval:
    return Approval(
        approval_id=msg.approval_id,
        tenant=msg.tenant,
        run_id=msg.run_id,
        call_id=msg.call_id,
        tool=msg.tool,
        arguments=json.loads(msg.arguments_json or "{}"),
        digest=msg.digest,
        status=_APPROVAL_BACK[msg.status],
        created_at=_seconds(msg.created_at),
        expires_at=_seconds(msg.expires_at),
        decided_by=_optional(msg, "decided_by"),
        reason=_optional(msg, "reason"),
        kind=_KIND_BACK.get(msg.kind, ApprovalKind.CALL),
        proposer=msg.proposer,
        policy_rule=msg.policy_rule,
        tool_risk=tool_risk_from_proto(msg.tool_risk) if msg.HasField("tool_risk") else None,
    )


def identity_from_proto(msg: identity_pb2.Identity) -> Identity:
    try:
        role = Role(msg.role)
    except ValueError:
        raise Internal(f"the server answered WhoAmI with a role this client does not know: {msg.role!r}") from None
    return Identity(tenant=msg.tenant, principal=msg.principal, role=role)


def run_from_proto(msg: types_pb2.Run) -> RunView:
    return RunView(
        run_id=msg.run_id,
        tenant=msg.tenant,
        goal=msg.goal,
        status=_RUN_BACK[msg.status],
        outcome=_OUTCOME_BACK.get(msg.outcome),
        turns=msg.turns,
        trajectory=tuple(observation_from_proto(o) for o in msg.trajectory),
        usage=Usage(msg.usage.turns, msg.usage.calls, msg.usage.cost),
        pending_approvals=tuple(approval_from_proto(a) for a in msg.pending_approvals),
        workspace=(WorkspaceView(msg.workspace.bytes, msg.workspace.inodes, msg.workspace.removed)
                   if msg.HasField("workspace") else None),
    )


def event_from_proto(msg: types_pb2.Event) -> Event:
    return Event(
        run_id=msg.run_id,
        seq=msg.seq,
        type=msg.type,
        data=json.loads(msg.data_json or "{}"),
        schema_version=msg.schema_version,
        at=_seconds(msg.at),
    )


def run_page_from_proto(msg: runs_pb2.ListRunsResponse) -> RunPage:
    return RunPage(tuple(run_from_proto(r) for r in msg.runs), msg.next_page_token)


def event_page_from_proto(msg: runs_pb2.ListEventsResponse) -> EventPage:
    return EventPage(tuple(event_from_proto(e) for e in msg.events), msg.next_seq)


def audit_report_from_proto(msg: runs_pb2.AuditReport) -> AuditReport:
    return AuditReport(ok=msg.ok, first_bad_seq=msg.first_bad_seq, problem=msg.problem, events=msg.events,
                       head_hash=msg.head_hash)


def run_filters_to_proto(request: runs_pb2.ListRunsRequest, status: RunStatus | None,
                         outcome: RunOutcome | None) -> runs_pb2.ListRunsRequest:
    """Client side: set ListRunsRequest's status and outcome (None: any, left UNSPECIFIED)."""
    if status is not None:
        request.status = _RUN[RunStatus(status)]
    if outcome is not None:
        request.outcome = _OUTCOME[RunOutcome(outcome)]
    return request


def call_to_proto(call: ProposedCall | Mapping[str, Any]) -> types_pb2.ProposedCall:
    if isinstance(call, Mapping):
        call = ProposedCall(call["call_id"], call["tool"], call.get("arguments", {}),
                            idempotency_key=call.get("idempotency_key"))
    return types_pb2.ProposedCall(call_id=call.call_id, tool=call.tool, arguments_json=dump_json(dict(call.arguments)),
                                  idempotency_key=call.idempotency_key)


def step_to_proto(step: PlanStep | Mapping[str, Any]) -> types_pb2.PlanStep:
    if isinstance(step, Mapping):
        step = PlanStep(step["key"], step["tool"], step.get("arguments", {}))
    return types_pb2.PlanStep(key=step.key, tool=step.tool, arguments_json=dump_json(dict(step.arguments)))


# Public names for the feature modules' own converters (client/ringfence/wire/plans_convert.py, routing_convert.py).
to_timestamp = _ts
from_timestamp = _seconds
