"""A run's state is the fold of its events. This module is the one reducer.

The orchestrator never changes a run's state except by appending an event and applying it
here, so the live state and a replay of the log are equal at every prefix by construction;
what the replay test guards is that everything a decision needs is IN the event (the stored
JSON), not in some side variable. `apply` must stay a pure function of (state, event): no
clock, no randomness, no lookups.

Every event and its fields: ringfence_server.control.events (one frozen dataclass per event type; `apply`
matches on them). `RunState.workspace` ({volume, bytes, inodes, removed} or None) and
`RunState.artifacts` (path -> {size, sha256, revision, call_id}: the latest collection of each
path) are the fold of the workspace and artifact events.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ringfence.model import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Event,
    Observation,
    ObservationStatus,
    RunOutcome,
    RunStatus,
    RunView,
    Usage,
    WorkspaceView,
)

# EventType and AdmissionVerdict are named here too: readers that import them from the fold
# (the CLI, the event log printer, metrics) keep working while they move to ringfence_server.control.events.
from ringfence_server.control.events import AdmissionVerdict as AdmissionVerdict
from ringfence_server.control.events import (
    ApprovalDecided,
    ApprovalExpired,
    ApprovalRequested,
    ApprovalUsed,
    ApprovalWithdrawn,
    ArtifactCollected,
    AttemptFinished,
    BatchStarted,
    CallCompleted,
    CallDecided,
    CallObserved,
    CallOutput,
    DispatchStarted,
    EgressDecided,
    FilesDownloaded,
    FilesUploaded,
    GrantAdded,
    RunFinished,
    RunStarted,
    WorkspaceCreated,
    WorkspaceRemoved,
    payload_of,
)
from ringfence_server.control.events import EventType as EventType


@dataclass
class PendingCall:
    """A call admitted as ASK: waiting for its approval, or approved and not yet dispatched."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    approval_id: str
    mutates: bool
    idempotency_key: str | None
    verdict_path: tuple[str, ...]
    proposed_by: str | None = None
    """The subject that proposed the call: never the one who may decide its approval."""
    client_key: str | None = None
    """The client's idempotency key, as sent (the derived one is `idempotency_key`)."""
    kind: ApprovalKind = ApprovalKind.CALL
    """CALL: waiting to run. RECONCILE: interrupted mid-effect, waiting for a person to say
    whether it happened (approve = it did not: run it once)."""


def asking_step(verdict_path: Sequence[str], kind: ApprovalKind) -> str:
    """The verdict-path step that asked for an approval, for the person deciding it: the last
    step whose verdict is ask (policy words it "rule[2]:ask" or "risk:irreversible->ask"), or
    the recovery step that asks about an interrupted call; "" when the path has none (a log
    written before verdict paths were recorded)."""
    wanted = ("recovery:reconcile",) if kind is ApprovalKind.RECONCILE else ()
    for step in reversed(verdict_path):
        if step in wanted or (kind is ApprovalKind.CALL and step.endswith((":ask", "->ask"))):
            return step
    return ""


def sandbox_run_id(state: RunState) -> str:
    """The run's label on its sandboxes (cancel and deadlines kill by it): unique across
    tenants (tenant names have no ':')."""
    return f"{state.tenant}:{state.run_id}"


@dataclass
class RunState:
    run_id: str = ""  # the caller's id
    key: str = ""  # the id in the store: run_id, or tenant/run_id when another tenant had taken it
    tenant: str = ""
    goal: str = ""
    created_at: float = 0.0
    deadline_at: float | None = None
    policy_version: str = ""
    trace: dict[str, Any] = field(default_factory=dict)
    outcome: RunOutcome | None = None
    finish_reason: str = ""
    turns: int = 0
    calls: int = 0
    cost: float = 0.0
    trajectory: dict[str, Observation] = field(default_factory=dict)  # by call_id, first-seen order
    approvals: dict[str, Approval] = field(default_factory=dict)
    pending: dict[str, PendingCall] = field(default_factory=dict)
    signatures: Counter[str] = field(default_factory=Counter)
    completions: dict[str, dict[str, Any]] = field(default_factory=dict)  # idempotency key -> {content, call_id}
    inflight: dict[str, DispatchStarted] = field(default_factory=dict)  # call_id -> its dispatch, not completed
    call_ids: set[str] = field(default_factory=set)
    call_order: dict[str, int] = field(default_factory=dict)  # the trajectory is in proposal order
    grants: set[str] = field(default_factory=set)
    attempts: dict[str, int] = field(default_factory=dict)
    unobserved: dict[str, CallCompleted] = field(default_factory=dict)  # completed, no observation yet
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)  # batch id -> fingerprint, call ids
    admitted: dict[str, CallDecided] = field(default_factory=dict)  # decided `allow`, not yet dispatched
    asked: dict[str, CallDecided] = field(default_factory=dict)  # decided `ask`, no approval yet
    workspace: dict[str, Any] | None = None  # {volume, bytes, inodes, removed}; None: the run has none
    artifacts: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> {size, sha256, revision, call_id}
    last_seq: int = 0

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    @property
    def live_volume(self) -> str | None:
        """The volume of the run's workspace while its calls may use it; None when the run has
        none, or it was removed (the run ended)."""
        ws = self.workspace
        if ws is None or ws.get("removed"):
            return None
        return str(ws["volume"])

    @property
    def status(self) -> RunStatus:
        if self.outcome is not None:
            return RunStatus.FINISHED
        if self.pending:
            return RunStatus.WAITING_APPROVAL
        return RunStatus.RUNNING

    def view(self) -> RunView:
        return RunView(
            run_id=self.run_id,
            tenant=self.tenant,
            goal=self.goal,
            status=self.status,
            outcome=self.outcome,
            turns=self.turns,
            trajectory=tuple(sorted(self.trajectory.values(), key=lambda o: self.call_order[o.call_id])),
            usage=Usage(turns=self.turns, calls=self.calls, cost=round(self.cost, 9)),
            pending_approvals=tuple(a for a in self.approvals.values() if a.status is ApprovalStatus.PENDING),
            workspace=None if self.workspace is None else WorkspaceView(
                bytes=int(self.workspace["bytes"]), inodes=int(self.workspace["inodes"]),
                removed=bool(self.workspace["removed"])),
        )

    def snapshot(self) -> dict[str, Any]:
        """Everything, as a deep copy comparable with ==."""
        snap = {k: copy.deepcopy(v) for k, v in self.__dict__.items() if k != "approvals"}
        snap["trajectory"] = list(self.trajectory.items())
        snap["approvals"] = [
            (k, {f: (dict(v) if f == "arguments" else v) for f, v in a.__dict__.items()})
            for k, a in self.approvals.items()
        ]
        snap["status"] = self.status
        return snap


def _set_approval(state: RunState, approval_id: str, **changes: Any) -> None:
    a = state.approvals.get(approval_id)
    if a is not None:
        state.approvals[approval_id] = replace(a, **changes)


def apply(state: RunState, event: Event) -> RunState:  # noqa: C901 - one match arm per event type: the table is the fold
    """Fold one stored event into `state` (in place; returned for chaining). ValueError: an
    event out of sequence, or one the fold cannot take (ringfence_server.control.events.parse_event)."""
    payload = payload_of(event)
    if event.seq != state.last_seq + 1:
        raise ValueError(f"run {event.run_id}: event seq {event.seq} after {state.last_seq}")
    state.last_seq = event.seq
    match payload:
        case RunStarted():
            state.key = event.run_id
            state.run_id = payload.run_id or event.run_id
            state.tenant = payload.tenant
            state.goal = payload.goal
            state.created_at = payload.created_at
            state.deadline_at = payload.deadline_at
            state.policy_version = payload.policy_version
            state.trace = dict(payload.trace)
        case BatchStarted(batch_id=batch_id, calls=calls):
            state.turns += 1
            if batch_id:
                state.batches[batch_id] = {"fingerprint": payload.fingerprint, "call_ids": [c.call_id for c in calls]}
            for c in calls:
                state.call_ids.add(c.call_id)
                state.call_order.setdefault(c.call_id, len(state.call_order))
        case CallDecided(call_id=call_id, signature=sig, verdict=verdict):
            if sig:
                state.signatures[sig] += 1
            if verdict is AdmissionVerdict.ALLOW:
                # Admitted: until its dispatch starts (or it is observed otherwise) a crash leaves a
                # call that provably never reached a container (recovery runs it).
                state.admitted[call_id] = payload
            elif verdict is AdmissionVerdict.ASK:
                state.asked[call_id] = payload  # until its approval is requested
        case ApprovalRequested(call_id=call_id):
            kind = payload.approval_kind
            state.approvals[payload.approval_id] = Approval(
                approval_id=payload.approval_id, tenant=state.tenant, run_id=state.run_id, call_id=call_id,
                tool=payload.tool, arguments=payload.arguments, digest=payload.digest,
                status=ApprovalStatus.PENDING, created_at=payload.created_at, expires_at=payload.expires_at,
                kind=kind, proposer=(payload.proposed_by or "") if kind is ApprovalKind.CALL else "",
                policy_rule=asking_step(payload.verdict_path, kind))
            state.pending[call_id] = PendingCall(
                call_id=call_id, tool=payload.tool, arguments=dict(payload.arguments),
                approval_id=payload.approval_id, mutates=payload.mutates, idempotency_key=payload.idempotency_key,
                verdict_path=payload.verdict_path, proposed_by=payload.proposed_by, client_key=payload.client_key,
                kind=kind)
            # A reconciliation task is for a call already in flight: it is no longer "in flight"
            # (nothing runs it now), it waits for a person.
            state.inflight.pop(call_id, None)
            state.asked.pop(call_id, None)
        case ApprovalDecided(approval_id=approval_id, approved=approved):
            _set_approval(state, approval_id,
                          status=ApprovalStatus.APPROVED if approved else ApprovalStatus.DECLINED,
                          decided_by=payload.by, reason=payload.reason)
        case ApprovalExpired(approval_id=approval_id):
            _set_approval(state, approval_id, status=ApprovalStatus.EXPIRED)
        case ApprovalUsed(approval_id=approval_id):
            _set_approval(state, approval_id, status=ApprovalStatus.USED)
        case ApprovalWithdrawn(approval_id=approval_id):
            # The call leaves `pending` with its observation (declined), as after a decline.
            _set_approval(state, approval_id, status=ApprovalStatus.WITHDRAWN, decided_by=payload.by,
                          reason=payload.reason)
        case GrantAdded(signature=sig):
            state.grants.add(sig)
        case DispatchStarted(call_id=call_id):
            state.inflight[call_id] = payload
            state.pending.pop(call_id, None)
            state.admitted.pop(call_id, None)
        case AttemptFinished(call_id=call_id, attempt=attempt):
            state.attempts[call_id] = attempt
        case CallCompleted(call_id=call_id):
            state.inflight.pop(call_id, None)
            state.unobserved[call_id] = payload
            state.calls += 1
            state.cost += payload.cost
            if payload.mutates and payload.ok and payload.idempotency_key:
                state.completions[payload.idempotency_key] = {"content": payload.content, "call_id": call_id}
        case CallObserved():
            obs = payload.observation()
            state.trajectory[obs.call_id] = obs
            state.admitted.pop(obs.call_id, None)
            state.asked.pop(obs.call_id, None)
            if obs.status is not ObservationStatus.PENDING_APPROVAL:
                state.pending.pop(obs.call_id, None)
                state.inflight.pop(obs.call_id, None)
                state.unobserved.pop(obs.call_id, None)
            state.call_ids.add(obs.call_id)
            state.call_order.setdefault(obs.call_id, len(state.call_order))
        case RunFinished(outcome=outcome, reason=reason):
            state.outcome = outcome
            state.finish_reason = reason
            if state.workspace is not None and not state.workspace["removed"]:
                # Removed at the run's end (workspace_removed, just before this) or, if the engine
                # failed then, by the reaper later: either way no call of the run can use it again.
                state.workspace = {**state.workspace, "removed": True}
        case WorkspaceCreated(volume=volume, bytes=size, inodes=inodes):
            state.workspace = {"volume": volume, "bytes": size, "inodes": inodes, "removed": False}
        case WorkspaceRemoved():
            if state.workspace is not None:
                state.workspace = {**state.workspace, "removed": True}
        case ArtifactCollected(call_id=call_id, files=files):
            for f in files:
                state.artifacts[f.path] = {"size": f.size, "sha256": f.sha256, "revision": f.revision,
                                           "call_id": call_id}
        case EgressDecided() | CallOutput() | FilesUploaded() | FilesDownloaded():
            pass  # a record for the log (and for WatchRun), no state
    return state


def fold(events: Iterable[Event]) -> RunState:
    state = RunState()
    for e in events:
        apply(state, e)
    return state
