"""Value objects shared by the control-plane core and its gRPC edge.

All are frozen; the edge converts them to and from protos (ringfence_server/control/api), the core never sees a
protobuf. Mappings held by a value are copied on construction so a caller's later mutation
cannot change a value that was already admitted.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = [
    "Approval",
    "ApprovalKind",
    "ApprovalStatus",
    "AuditReport",
    "Event",
    "EventPage",
    "Identity",
    "Observation",
    "ObservationStatus",
    "PlanStep",
    "Principal",
    "ProposedCall",
    "Role",
    "RunOutcome",
    "RunPage",
    "RunStatus",
    "RunView",
    "ToolRisk",
    "ToolView",
    "Usage",
    "WorkspaceRequest",
    "WorkspaceView",
]


def _frozen_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


class Role(enum.StrEnum):
    AGENT = "agent"
    APPROVER = "approver"
    VERIFIER = "verifier"
    ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant scopes everything they can see."""

    tenant: str
    role: Role
    subject: str


@dataclass(frozen=True)
class Identity:
    """The caller as the server authenticated its token (IdentityService.WhoAmI)."""

    tenant: str
    principal: str
    """The token's subject: what `Approval.proposer` holds for the calls this caller proposed
    (four eyes: the server refuses to let it decide those) and `Approval.decided_by` for the
    approvals it decided."""
    role: Role

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", Role(self.role))

    def proposed(self, approval: Approval) -> bool:
        """Whether this caller proposed `approval`'s call, so the server will not let it decide it."""
        return bool(approval.proposer) and approval.proposer == self.principal


@dataclass(frozen=True)
class ToolRisk:
    """What a tool may do, as its manifest declares it (docs/TOOLS.md): for the people who judge
    its calls (approvers, admins), never shown to an agent."""

    mutates: bool = False
    irreversible: bool = False
    cost: float = 0.0
    image_digest: str = ""
    """The pinned image ID its calls run in; "" when the server has no pinned image for it."""
    egress_hosts: tuple[str, ...] = ()
    """Hosts (or *.suffix) it may reach; empty: no network."""
    timeout_s: float = 0.0
    memory_bytes: int = 0
    cpus: float = 0.0
    pids: int = 0
    stdout_limit: int = 0
    stderr_limit: int = 0
    runtime: str = ""
    image: str = ""
    workspace: str = ""
    """"read" or "write" when it mounts the run's workspace; "" when it does not."""
    paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Argument name -> the container roots its value must stay under."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "egress_hosts", tuple(self.egress_hosts))
        object.__setattr__(self, "paths", MappingProxyType({k: tuple(v) for k, v in dict(self.paths).items()}))


@dataclass(frozen=True)
class ToolView:
    """What a caller may learn about a tool: its schema and two hints derived from its risk
    metadata (so an MCP front door can annotate it honestly); the metadata itself (cost,
    limits, roots, hosts) only as `risk`, which the server fills for approvers and admins and
    never for an agent."""

    name: str
    description: str
    schema: Mapping[str, Any]
    read_only_hint: bool = False
    """The tool does not mutate the world (its manifest's `mutates` is false)."""
    destructive_hint: bool = True
    """The tool mutates the world and its effect cannot be undone (`mutates` and not
    `reversible`). The defaults are the cautious reading (as MCP's): a view that was not told
    otherwise may mutate, irreversibly."""
    risk: ToolRisk | None = None
    """The tool's risk metadata: set only for an approver or an admin (None for an agent)."""


@dataclass(frozen=True)
class ProposedCall:
    call_id: str
    tool: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    """The client's key for a mutating call, scoped to the tenant (ringfence_server.control.idempotency)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "arguments", _frozen_mapping(self.arguments))


class ObservationStatus(enum.StrEnum):
    EXECUTED = "executed"
    DENIED = "denied"
    BLOCKED = "blocked"
    DECLINED = "declined"
    UNKNOWN_TOOL = "unknown_tool"
    PENDING_APPROVAL = "pending_approval"
    DEDUPLICATED = "deduplicated"
    HALTED = "halted"
    WITHHELD = "withheld"  # the tool ran; the result guardrail withheld its result
    INVALID = "invalid"  # the agent loop's, never the server's: refused before admission, never ran


@dataclass(frozen=True)
class Observation:
    """What the caller learns about one call. `executed` says whether a tool actually ran."""

    call_id: str
    tool: str
    status: ObservationStatus
    executed: bool
    content: Any | None = None
    error: str | None = None
    error_class: str | None = None
    verdict_path: tuple[str, ...] = ()
    approval_id: str | None = None
    attempts: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", ObservationStatus(self.status))
        object.__setattr__(self, "verdict_path", tuple(self.verdict_path))


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    FINISHED = "finished"


class RunOutcome(enum.StrEnum):
    COMPLETED = "completed"
    LOOP_DETECTED = "loop_detected"
    GUARDRAIL_STOP = "guardrail_stop"
    BUDGET_EXHAUSTED = "budget_exhausted"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CANCELLED = "cancelled"
    ERROR = "error"
    UNCERTAIN = "uncertain"
    MODEL_TRUNCATED = "model_truncated"  # the agent loop's: the model's response was cut by its length limit


@dataclass(frozen=True)
class Usage:
    turns: int = 0
    calls: int = 0
    cost: float = 0.0


class ApprovalStatus(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DECLINED = "declined"
    EXPIRED = "expired"
    USED = "used"
    WITHDRAWN = "withdrawn"  # its proposer (or an admin) took the call back before anyone decided


class ApprovalKind(enum.StrEnum):
    CALL = "call"  # may this call run?
    RECONCILE = "reconcile"  # did this call (interrupted mid-effect) happen? approve = run it once now


@dataclass(frozen=True)
class Approval:
    approval_id: str
    tenant: str
    run_id: str
    call_id: str
    tool: str
    arguments: Mapping[str, Any]
    digest: str
    status: ApprovalStatus
    created_at: float
    expires_at: float
    decided_by: str | None = None
    reason: str | None = None
    kind: ApprovalKind = ApprovalKind.CALL
    proposer: str = ""
    """Who proposed the call (the token's subject); "" for a reconciliation task or when unknown."""
    policy_rule: str = ""
    """The verdict-path step that asked (e.g. "policy:rule[2]:ask"); "recovery:reconcile" for a
    reconciliation task; "" when unknown."""
    tool_risk: ToolRisk | None = None
    """The tool's risk as the registry knows it (from ApprovalService only, for approvers)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "arguments", _frozen_mapping(self.arguments))
        object.__setattr__(self, "status", ApprovalStatus(self.status))
        object.__setattr__(self, "kind", ApprovalKind(self.kind))


@dataclass(frozen=True)
class WorkspaceRequest:
    """A run's request for a workspace (StartRun): its caps, 0 meaning the server's default
    (config workspace.default_bytes / default_inodes); above the server's maximums the run is
    refused (InvalidArgument)."""

    bytes: int = 0
    inodes: int = 0


@dataclass(frozen=True)
class WorkspaceView:
    """A run's workspace as the caller sees it: its caps, and whether it is gone (the run
    ended, or it was reaped). Its files are reached with UploadFiles / DownloadFiles."""

    bytes: int
    inodes: int
    removed: bool = False


@dataclass(frozen=True)
class RunView:
    run_id: str
    tenant: str
    goal: str
    status: RunStatus
    outcome: RunOutcome | None
    turns: int
    trajectory: tuple[Observation, ...]
    usage: Usage
    pending_approvals: tuple[Approval, ...] = ()
    workspace: WorkspaceView | None = None
    """None: the run was started without a workspace."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "trajectory", tuple(self.trajectory))
        object.__setattr__(self, "pending_approvals", tuple(self.pending_approvals))


@dataclass(frozen=True)
class RunPage:
    """One page of ListRuns, newest first; `next_page_token` "" when it is the last."""

    runs: tuple[RunView, ...]
    next_page_token: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "runs", tuple(self.runs))


@dataclass(frozen=True)
class AuditReport:
    """The server's check of a run's audit hash chain (VerifyRun)."""

    ok: bool
    """Every event links to its predecessor and its hash matches its content."""
    first_bad_seq: int = 0
    """The seq of the first event that fails a check; 0 when ok."""
    problem: str = ""
    """Why it fails, for a person; "" when ok."""
    events: int = 0
    """Events checked."""
    head_hash: str = ""
    """The hash of the run's last stored event (record it to detect a cut-off tail later)."""


class EventType(enum.StrEnum):
    """Every event a run's log may hold; the value is `Event.type` (what the store keeps)."""

    RUN_STARTED = "run_started"
    BATCH_STARTED = "batch_started"
    CALL_DECIDED = "call_decided"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_DECIDED = "approval_decided"
    APPROVAL_EXPIRED = "approval_expired"
    APPROVAL_USED = "approval_used"
    APPROVAL_WITHDRAWN = "approval_withdrawn"
    GRANT_ADDED = "grant_added"
    DISPATCH_STARTED = "dispatch_started"
    ATTEMPT = "attempt"
    EGRESS = "egress"
    CALL_COMPLETED = "call_completed"
    OBSERVATION = "observation"
    RUN_FINISHED = "run_finished"
    WORKSPACE_CREATED = "workspace_created"
    WORKSPACE_REMOVED = "workspace_removed"
    CALL_OUTPUT = "call_output"
    FILES_UPLOADED = "files_uploaded"
    FILES_DOWNLOADED = "files_downloaded"
    ARTIFACT_COLLECTED = "artifact_collected"


class AdmissionVerdict(enum.StrEnum):
    """Admission's verdict on one call (the server's admission), as `call_decided`
    records it in the log."""

    UNKNOWN = "unknown"  # no such tool
    INVALID = "invalid"  # arguments do not validate
    HALT = "halt"  # a guardrail ends the run
    BLOCK = "block"  # a guardrail refuses this call
    DENY = "deny"  # resource or contextual policy refuses it
    ASK = "ask"  # a person must approve this exact call first
    ALLOW = "allow"  # admitted


@dataclass(frozen=True)
class Event:
    """One durable fact in a run's append-only log; `seq` is monotonic per run from 1."""

    run_id: str
    seq: int
    type: str
    data: Mapping[str, Any]
    schema_version: int
    at: float
    prev_hash: str = ""
    """The `hash` of the run's previous event ("" for seq 1): the audit chain (ringfence_server.control.store.audit)."""
    hash: str = ""
    """sha256 hex of prev_hash and this event's canonical content, computed by the store on append."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", _frozen_mapping(self.data))


@dataclass(frozen=True)
class EventPage:
    """One page of a run's log (ListEvents): `next_seq` is where the next page starts, 0 when
    this page reached the log's current end."""

    events: tuple[Event, ...]
    next_seq: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", tuple(self.events))


@dataclass(frozen=True)
class PlanStep:
    key: str
    tool: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "arguments", _frozen_mapping(self.arguments))
