"""A run's state is the fold of its events. This module is the one reducer.

The orchestrator never changes a run's state except by appending an event and applying it
here, so the live state and a replay of the log are equal at every prefix by construction;
what the replay test guards is that everything a decision needs is IN the event (the stored
JSON), not in some side variable. `apply` must stay a pure function of (state, event): no
clock, no randomness, no lookups.

Event types and their data:
    run_started       run_id, tenant, goal, created_at, deadline_at, policy_version, trace, by,
                      workspace ({bytes, inodes} asked for at StartRun, or null)
    batch_started     batch_id, turn, calls[{call_id, tool, arguments}], fingerprint (of the client's batch)
    call_decided      call_id, tool, arguments (canonical or raw), signature|null, verdict (AdmissionVerdict),
                      verdict_path, reason, proposed_by, client_key
    approval_requested approval_id, call_id, tool, arguments, digest, created_at, expires_at,
                      mutates, idempotency_key, image_digest, policy_version, proposed_by,
                      client_key, kind (call | reconcile)
    approval_decided  approval_id, approved, by, reason
    approval_expired  approval_id
    approval_used     approval_id
    grant_added       tool, arguments, signature, by
    dispatch_started  call_id, tool, mutates, idempotency_key, arguments, signature, client_key
    attempt           call_id, attempt, failure_class|null, outcome, message, retry_after_s, duration_ms
    call_completed    call_id, tool, mutates, idempotency_key, ok, content, error, error_class, attempts, cost,
                      executed (false: no attempt reached a container, the call never ran and its
                      client key is free again; absent in older logs: true)
    observation       the Observation's fields
    run_finished      outcome, reason

Workspaces, files and live output (a run's workspace: sandbox.workspace; files: control.files):
    workspace_created  volume, bytes, inodes
                       the run's workspace exists (made at StartRun, before its reply)
    workspace_removed  volume, reason
                       the workspace and its files are gone; reason: the run's outcome
                       (completed, cancelled, deadline_exceeded, error, ...), written just before
                       run_finished. A finished run's workspace counts as removed even without
                       it (the engine failed at the end and the reaper removes it later: nothing
                       is appended after run_finished)
    call_output        call_id, attempt, stream ("stdout" | "stderr"), seq (1.. per attempt and
                       stream), text (UTF-8 decoded with replacement, AFTER the secret scanner's
                       redaction), bytes (raw bytes of the chunk), redacted (the scanner changed
                       it): a piece of a call's output while it runs (whole lines; a line over
                       16 KiB is cut), written before that attempt's `attempt` event. No state.
    files_uploaded     dest, files [{path, size, sha256}], by                       No state.
    files_downloaded   files [{path, size, sha256}], artifacts (bool), by           No state.
    artifact_collected call_id, files [{path, size, sha256, revision}], missing [paths]
                       the declared outputs of a successful call, kept as artifacts (the store's
                       records); `missing`: declared but not collected (absent, a link, too big)

`RunState.workspace` ({volume, bytes, inodes, removed} or None) and `RunState.artifacts`
(path -> {size, sha256, revision, call_id}: the latest collection of each path) are their fold.
"""

from __future__ import annotations

import copy
import enum
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from control.model import (
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


class AdmissionVerdict(enum.StrEnum):
    """Admission's verdict on one call (control.orchestration.admission), as `call_decided`
    records it in the log."""

    UNKNOWN = "unknown"  # no such tool
    INVALID = "invalid"  # arguments do not validate
    HALT = "halt"  # a guardrail ends the run
    BLOCK = "block"  # a guardrail refuses this call
    DENY = "deny"  # resource or contextual policy refuses it
    ASK = "ask"  # a person must approve this exact call first
    ALLOW = "allow"  # admitted


class EventType(enum.StrEnum):
    """Every event a run's log may hold (data fields in the module docstring)."""

    RUN_STARTED = "run_started"
    BATCH_STARTED = "batch_started"
    CALL_DECIDED = "call_decided"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_DECIDED = "approval_decided"
    APPROVAL_EXPIRED = "approval_expired"
    APPROVAL_USED = "approval_used"
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


OUTPUT_STREAMS = ("stdout", "stderr")


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
    completions: dict[str, dict[str, Any]] = field(default_factory=dict)  # idempotency key -> completion
    inflight: dict[str, dict[str, Any]] = field(default_factory=dict)  # call_id -> dispatch_started data
    call_ids: set[str] = field(default_factory=set)
    call_order: dict[str, int] = field(default_factory=dict)  # the trajectory is in proposal order
    grants: set[str] = field(default_factory=set)
    attempts: dict[str, int] = field(default_factory=dict)
    unobserved: dict[str, dict[str, Any]] = field(default_factory=dict)  # completed, no observation yet
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)  # batch id -> fingerprint, call ids
    admitted: dict[str, dict[str, Any]] = field(default_factory=dict)  # call_id -> decided `allow`, not yet dispatched
    asked: dict[str, dict[str, Any]] = field(default_factory=dict)  # call_id -> decided `ask`, no approval yet
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


def _observation(data: dict[str, Any]) -> Observation:
    return Observation(
        call_id=data["call_id"],
        tool=data["tool"],
        status=ObservationStatus(data["status"]),
        executed=bool(data["executed"]),
        content=data.get("content"),
        error=data.get("error"),
        error_class=data.get("error_class"),
        verdict_path=tuple(data.get("verdict_path") or ()),
        approval_id=data.get("approval_id"),
        attempts=int(data.get("attempts") or 0),
    )


def observation_data(o: Observation) -> dict[str, Any]:
    return {
        "call_id": o.call_id,
        "tool": o.tool,
        "status": o.status.value,
        "executed": o.executed,
        "content": o.content,
        "error": o.error,
        "error_class": o.error_class,
        "verdict_path": list(o.verdict_path),
        "approval_id": o.approval_id,
        "attempts": o.attempts,
    }


def _set_approval(state: RunState, approval_id: str, **changes: Any) -> None:
    from dataclasses import replace

    a = state.approvals.get(approval_id)
    if a is not None:
        state.approvals[approval_id] = replace(a, **changes)


# The fields each event must carry for `apply` to take it (the docstring lists all of them).
_REQUIRED: dict[EventType, tuple[str, ...]] = {
    EventType.RUN_STARTED: ("tenant", "created_at"),
    EventType.BATCH_STARTED: ("calls",),
    EventType.CALL_DECIDED: ("call_id", "tool", "verdict"),
    EventType.APPROVAL_REQUESTED: ("approval_id", "call_id", "tool", "arguments", "digest", "created_at",
                                   "expires_at"),
    EventType.APPROVAL_DECIDED: ("approval_id", "approved"),
    EventType.APPROVAL_EXPIRED: ("approval_id",),
    EventType.APPROVAL_USED: ("approval_id",),
    EventType.GRANT_ADDED: ("signature",),
    EventType.DISPATCH_STARTED: ("call_id", "tool"),
    EventType.ATTEMPT: ("call_id", "attempt"),
    EventType.EGRESS: ("call_id",),
    EventType.CALL_COMPLETED: ("call_id", "tool", "ok"),
    EventType.OBSERVATION: ("call_id", "tool", "status", "executed"),
    EventType.RUN_FINISHED: ("outcome",),
    EventType.WORKSPACE_CREATED: ("volume", "bytes", "inodes"),
    EventType.WORKSPACE_REMOVED: ("volume", "reason"),
    EventType.CALL_OUTPUT: ("call_id", "attempt", "stream", "seq", "text", "bytes", "redacted"),
    EventType.FILES_UPLOADED: ("dest", "files", "by"),
    EventType.FILES_DOWNLOADED: ("files", "artifacts", "by"),
    EventType.ARTIFACT_COLLECTED: ("call_id", "files", "missing"),
}


def check_event(type_: str, data: Any) -> None:
    """Refuse (ValueError) an event `apply` would not take, before it is made durable."""
    try:
        t = EventType(type_)
    except ValueError:
        raise ValueError(f"unknown event type {type_!r}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{t}: data must be an object")
    missing = [f for f in _REQUIRED[t] if f not in data]
    if missing:
        raise ValueError(f"{t}: missing {', '.join(missing)}")
    if t is EventType.OBSERVATION:
        ObservationStatus(data["status"])
    elif t is EventType.RUN_FINISHED:
        RunOutcome(data["outcome"])
    elif t is EventType.BATCH_STARTED and not all(isinstance(c, dict) and "call_id" in c for c in data["calls"]):
        raise ValueError(f"{t}: every call needs a call_id")
    elif t is EventType.WORKSPACE_CREATED and not (
            isinstance(data["volume"], str) and data["volume"]
            and all(isinstance(data[k], int) and not isinstance(data[k], bool) for k in ("bytes", "inodes"))):
        raise ValueError(f"{t}: volume must be a name, bytes and inodes integers")
    elif t is EventType.CALL_OUTPUT and data["stream"] not in OUTPUT_STREAMS:
        raise ValueError(f"{t}: stream must be one of {', '.join(OUTPUT_STREAMS)}")
    elif t is EventType.ARTIFACT_COLLECTED and not (
            isinstance(data["files"], list) and isinstance(data["missing"], list)
            and all(isinstance(f, dict) and {"path", "size", "sha256", "revision"} <= set(f) for f in data["files"])):
        raise ValueError(f"{t}: files must be [{{path, size, sha256, revision}}] and missing a list")


def apply(state: RunState, event: Event) -> RunState:
    d = event.data
    try:
        t = EventType(event.type)
    except ValueError:
        raise ValueError(f"unknown event type {event.type!r}") from None
    if event.seq != state.last_seq + 1:
        raise ValueError(f"run {event.run_id}: event seq {event.seq} after {state.last_seq}")
    state.last_seq = event.seq
    if t is EventType.RUN_STARTED:
        state.key = event.run_id
        state.run_id = d.get("run_id") or event.run_id
        state.tenant = d["tenant"]
        state.goal = d.get("goal", "")
        state.created_at = d["created_at"]
        state.deadline_at = d.get("deadline_at")
        state.policy_version = d.get("policy_version", "")
        state.trace = dict(d.get("trace") or {})
    elif t is EventType.BATCH_STARTED:
        state.turns += 1
        if d.get("batch_id"):
            state.batches[d["batch_id"]] = {"fingerprint": d.get("fingerprint"),
                                            "call_ids": [c["call_id"] for c in d["calls"]]}
        for c in d["calls"]:
            state.call_ids.add(c["call_id"])
            state.call_order.setdefault(c["call_id"], len(state.call_order))
    elif t is EventType.CALL_DECIDED:
        if d.get("signature"):
            state.signatures[d["signature"]] += 1
        if d.get("verdict") == AdmissionVerdict.ALLOW:
            # Admitted: until its dispatch starts (or it is observed otherwise) a crash leaves a
            # call that provably never reached a container (recovery runs it).
            state.admitted[d["call_id"]] = dict(d)
        elif d.get("verdict") == AdmissionVerdict.ASK:
            state.asked[d["call_id"]] = dict(d)  # until its approval is requested
    elif t is EventType.APPROVAL_REQUESTED:
        state.approvals[d["approval_id"]] = Approval(
            approval_id=d["approval_id"], tenant=state.tenant, run_id=state.run_id, call_id=d["call_id"],
            tool=d["tool"], arguments=d["arguments"], digest=d["digest"], status=ApprovalStatus.PENDING,
            created_at=d["created_at"], expires_at=d["expires_at"], kind=ApprovalKind(d.get("kind", "call")))
        state.pending[d["call_id"]] = PendingCall(
            call_id=d["call_id"], tool=d["tool"], arguments=dict(d["arguments"]), approval_id=d["approval_id"],
            mutates=bool(d.get("mutates")), idempotency_key=d.get("idempotency_key"),
            verdict_path=tuple(d.get("verdict_path") or ()), proposed_by=d.get("proposed_by"),
            client_key=d.get("client_key"), kind=ApprovalKind(d.get("kind", "call")))
        # A reconciliation task is for a call already in flight: it is no longer "in flight"
        # (nothing runs it now), it waits for a person.
        state.inflight.pop(d["call_id"], None)
        state.asked.pop(d["call_id"], None)
    elif t is EventType.APPROVAL_DECIDED:
        _set_approval(state, d["approval_id"],
                      status=ApprovalStatus.APPROVED if d["approved"] else ApprovalStatus.DECLINED,
                      decided_by=d.get("by"), reason=d.get("reason"))
    elif t is EventType.APPROVAL_EXPIRED:
        _set_approval(state, d["approval_id"], status=ApprovalStatus.EXPIRED)
    elif t is EventType.APPROVAL_USED:
        _set_approval(state, d["approval_id"], status=ApprovalStatus.USED)
    elif t is EventType.GRANT_ADDED:
        state.grants.add(d["signature"])
    elif t is EventType.DISPATCH_STARTED:
        state.inflight[d["call_id"]] = dict(d)
        state.pending.pop(d["call_id"], None)
        state.admitted.pop(d["call_id"], None)
    elif t is EventType.ATTEMPT:
        state.attempts[d["call_id"]] = int(d["attempt"])
    elif t is EventType.CALL_COMPLETED:
        state.inflight.pop(d["call_id"], None)
        state.unobserved[d["call_id"]] = dict(d)
        state.calls += 1
        state.cost += float(d.get("cost") or 0.0)
        if d.get("mutates") and d.get("ok") and d.get("idempotency_key"):
            state.completions[d["idempotency_key"]] = {"content": d.get("content"), "call_id": d["call_id"]}
    elif t is EventType.OBSERVATION:
        obs = _observation(dict(d))
        state.trajectory[obs.call_id] = obs
        state.admitted.pop(obs.call_id, None)
        state.asked.pop(obs.call_id, None)
        if obs.status is not ObservationStatus.PENDING_APPROVAL:
            state.pending.pop(obs.call_id, None)
            state.inflight.pop(obs.call_id, None)
            state.unobserved.pop(obs.call_id, None)
        state.call_ids.add(obs.call_id)
        state.call_order.setdefault(obs.call_id, len(state.call_order))
    elif t is EventType.EGRESS:
        pass  # the egress proxy's decisions for one attempt: a record for the log, no state
    elif t is EventType.RUN_FINISHED:
        state.outcome = RunOutcome(d["outcome"])
        state.finish_reason = d.get("reason", "")
        if state.workspace is not None and not state.workspace["removed"]:
            # Removed at the run's end (workspace_removed, just before this) or, if the engine
            # failed then, by the reaper later: either way no call of the run can use it again.
            state.workspace = {**state.workspace, "removed": True}
    elif t is EventType.WORKSPACE_CREATED:
        state.workspace = {"volume": d["volume"], "bytes": int(d["bytes"]), "inodes": int(d["inodes"]),
                           "removed": False}
    elif t is EventType.WORKSPACE_REMOVED:
        if state.workspace is not None:
            state.workspace = {**state.workspace, "removed": True}
    elif t is EventType.ARTIFACT_COLLECTED:
        for f in d["files"]:
            state.artifacts[f["path"]] = {"size": int(f["size"]), "sha256": f["sha256"],
                                          "revision": int(f["revision"]), "call_id": d["call_id"]}
    elif t in (EventType.CALL_OUTPUT, EventType.FILES_UPLOADED, EventType.FILES_DOWNLOADED):
        pass  # a record for the log (and for WatchRun), no state
    else:
        raise ValueError(f"unknown event type {t!r}")
    return state


def fold(events: Iterable[Event]) -> RunState:
    state = RunState()
    for e in events:
        apply(state, e)
    return state
