"""The typed events (ringfence_server.control.events): a log written before them replays to the same run, the
JSON their writers keep is the JSON the dict literals wrote, and every event class survives
the store's JSON unchanged.

`data/events_before_typed_schema.jsonl` is a run's log written by ringfence just before the
events were typed (the control-plane harness of tests/unit: approvals approved, declined,
remembered, expired and one to reconcile; retries, a dedup, a blocked secret, a workspace),
with the events the emulated engine does not make (egress, call output, files, artifacts)
and a completion from before `executed` existed appended as that code's writers did. The
expected state below is what that code's fold gave it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ringfence.model import ApprovalKind, Event, ObservationStatus, RunOutcome
from ringfence_server.control.events import (
    AdmissionVerdict,
    ApprovalDecided,
    ApprovalExpired,
    ApprovalRequested,
    ApprovalUsed,
    ApprovalWithdrawn,
    ArtifactCollected,
    ArtifactFile,
    AttemptFinished,
    BatchCall,
    BatchStarted,
    CallCompleted,
    CallDecided,
    CallObserved,
    CallOutput,
    DispatchStarted,
    EgressDecided,
    EventPayload,
    EventType,
    FileEntry,
    FilesDownloaded,
    FilesUploaded,
    GrantAdded,
    ResultGuard,
    RunFinished,
    RunStarted,
    WorkspaceCreated,
    WorkspaceRemoved,
    check_event,
    event_data,
    parse_event,
)
from ringfence_server.control.state import fold
from ringfence_server.control.store.audit import canonical_json

LEGACY_LOG = Path(__file__).parent / "data" / "events_before_typed_schema.jsonl"
# Event types added after that log was written: it cannot hold them (SAMPLES below covers them).
ADDED_SINCE = {EventType.APPROVAL_WITHDRAWN}

# (call_id, status, executed, error_class, last verdict step, attempts) of the trajectory.
TRAJECTORY = [
    ("c1", "executed", True, None, "result:ok", 1),
    ("c2", "denied", False, "resource", "resource:deny", 0),
    ("c3", "unknown_tool", False, "unknown_tool", "registry:unknown", 0),
    ("c4", "executed", True, None, "result:ok", 1),
    ("c5", "declined", False, None, "approval:declined", 0),
    ("c6", "executed", True, None, "result:ok", 1),
    ("c7", "executed", True, None, "result:ok", 3),
    ("c8", "blocked", False, "secret", "guardrail:block:aws_access_key", 0),
    ("c9", "deduplicated", False, None, "idempotency:deduplicated", 0),
    ("c10", "deduplicated", False, None, "idempotency:deduplicated", 0),
    ("old1", "executed", True, "fatal", "executed:failed", 1),  # no `executed` in its completion: it ran
    ("c12", "declined", False, "approval_expired", "approval:expired", 0),
    ("c13", "executed", True, None, "result:ok", 1),
    ("rc1", "executed", True, "uncertain", "run:ended", 0),
]

SUMMARY = {
    "status": "finished", "outcome": "uncertain", "turns": 7, "calls": 6, "cost": 0.2,
    "finish_reason": "finished by the agent; whether these took effect is unknown: rc1",
    "grants": 1, "signatures": [1, 1, 1, 1, 1, 1, 2, 2], "completions": ["c4", "c6"],
    "attempts": {"c1": 1, "c7": 3, "c6": 1, "c4": 1, "c13": 1},
    "approvals": {"apr-aac0246410914e9fbdab": ("used", "call"), "apr-ceef3e44e2054a33aeeb": ("declined", "call"),
                  "apr-6d7bb3e2206243688008": ("expired", "call"), "apr-reconcile": ("declined", "reconcile")},
    "batches": ["b-4d8ca22b363a", "b-5390422844b8", "b-76dd07a19162", "b-a428c17cf817", "b-dc1b41710fff", "old",
                "rc"],
    "workspace": {"volume": "rf-ws-c49fea7425fa7f8699897a97c159c669", "bytes": 67108864, "inodes": 4096,
                  "removed": True},
    "artifacts": {"reports/out.txt": {"size": 3, "sha256": "ab" * 32, "revision": 1, "call_id": "c1"}},
    "last_seq": 74, "pending": [], "inflight": [], "admitted": [], "asked": [], "unobserved": [],
    "deadline_at": 1003600.0, "created_at": 1000000.0, "policy_version": "ec78add665076ad0",
}


def legacy_events() -> list[Event]:
    return [Event(**json.loads(line)) for line in LEGACY_LOG.read_text().splitlines()]


def test_a_log_of_the_previous_schema_folds_to_the_same_run():
    events = legacy_events()
    assert {e.type for e in events} == {t.value for t in EventType} - ADDED_SINCE  # every older event type is in it
    state = fold(events)
    view = state.view()
    assert [(o.call_id, o.status.value, o.executed, o.error_class, o.verdict_path[-1], o.attempts)
            for o in view.trajectory] == TRAJECTORY
    assert {
        "status": view.status.value, "outcome": view.outcome.value if view.outcome else None, "turns": state.turns,
        "calls": state.calls, "cost": round(state.cost, 9), "finish_reason": state.finish_reason,
        "grants": len(state.grants), "signatures": sorted(state.signatures.values()),
        "completions": sorted(c["call_id"] for c in state.completions.values()), "attempts": state.attempts,
        "approvals": {k: (a.status.value, a.kind.value) for k, a in state.approvals.items()},
        "batches": sorted(state.batches), "workspace": state.workspace, "artifacts": state.artifacts,
        "last_seq": state.last_seq, "pending": sorted(state.pending), "inflight": sorted(state.inflight),
        "admitted": sorted(state.admitted), "asked": sorted(state.asked), "unobserved": sorted(state.unobserved),
        "deadline_at": state.deadline_at, "created_at": state.created_at, "policy_version": state.policy_version,
    } == SUMMARY


def test_the_typed_writers_keep_the_json_the_previous_writers_wrote():
    # Parsed and written again, every event of the old log is the same JSON, but the one
    # completion older than `executed` (it gains the field's meaning, written out).
    for e in legacy_events():
        again = json.loads(canonical_json(event_data(parse_event(e.type, e.data))))
        if e.data.get("call_id") == "old1" and e.type == EventType.CALL_COMPLETED:
            assert again == {**e.data, "executed": True}
        else:
            assert again == e.data, (e.seq, e.type)


SAMPLES: list[EventPayload] = [
    RunStarted(tenant="acme", created_at=1.5, run_id="r", goal="g", deadline_at=9.0, policy_version="p",
               trace={"trace_id": "t", "span_id": "s"}, by="agent", workspace={"bytes": 1024, "inodes": 8}),
    BatchStarted(calls=(BatchCall("c1", "echo", {"text": "a", "n": [1, 2]}),), batch_id="b", turn=1, fingerprint="f"),
    CallDecided(call_id="c1", tool="echo", verdict=AdmissionVerdict.ASK, arguments={"text": "a"}, signature="s",
                verdict_path=("registry:ok", "policy:ask"), reason="why", proposed_by="agent", client_key="k"),
    ApprovalRequested(approval_id="a1", call_id="c1", tool="credit", arguments={"amount": 5}, digest="d",
                      created_at=1.0, expires_at=2.0, mutates=True, idempotency_key="ik", client_key="ck",
                      image_digest="sha256:x", policy_version="p", verdict_path=("x",), proposed_by="agent",
                      kind=ApprovalKind.RECONCILE, reason="interrupted"),
    ApprovalDecided(approval_id="a1", approved=True, by="boss", reason="ok", remember=True),
    ApprovalExpired(approval_id="a1"),
    ApprovalUsed(approval_id="a1"),
    ApprovalWithdrawn(approval_id="a1", by="agent", reason="changed my mind"),
    GrantAdded(signature="s", tool="credit", arguments={"amount": 5}, by="boss", approval_id="a1"),
    DispatchStarted(call_id="c1", tool="credit", mutates=True, idempotency_key="ik", arguments={"amount": 5},
                    signature="s", client_key="ck", verdict_path=("admitted",), approval_id="a1"),
    AttemptFinished(call_id="c1", attempt=2, failure_class="transient", outcome="exited", message="boom",
                    retry_after_s=0.5, duration_ms=12.0, setup_ms=3.0, image_id="sha256:i", runtime="runc"),
    EgressDecided(call_id="c1", attempt=1, decisions=({"host": "example.org", "allowed": False},)),
    CallCompleted(call_id="c1", tool="credit", ok=True, mutates=True, idempotency_key="ik", content={"done": 1},
                  guard=ResultGuard("redact", ("aws_access_key",), "redacted"), error=None, error_class=None,
                  attempts=2, cost=0.25, executed=True),
    CallObserved(call_id="c1", tool="credit", status=ObservationStatus.EXECUTED, executed=True, content=[1, "x"],
                 verdict_path=("admitted", "result:ok"), approval_id="a1", attempts=2),
    RunFinished(outcome=RunOutcome.CANCELLED, reason="stop"),
    WorkspaceCreated(volume="rf-ws-1", bytes=1024, inodes=8),
    WorkspaceRemoved(volume="rf-ws-1", reason="completed"),
    CallOutput(call_id="c1", attempt=1, stream="stderr", seq=3, text="line\n", bytes=5, redacted=True),
    FilesUploaded(dest="src", files=(FileEntry("src/a.py", 1, "cd" * 32),), by="agent", incomplete="stopped"),
    FilesDownloaded(files=(FileEntry("src/a.py", 1, "cd" * 32),), artifacts=True, by="agent"),
    ArtifactCollected(call_id="c1", files=(ArtifactFile("out.txt", 3, "ab" * 32, 2),), missing=("gone.txt",)),
]


def test_every_event_type_has_a_class_and_a_sample():
    assert sorted(p.TYPE for p in SAMPLES) == sorted(EventType)


@pytest.mark.parametrize("payload", SAMPLES, ids=lambda p: type(p).__name__)
def test_every_event_class_survives_the_stores_json(payload: EventPayload):
    stored = json.loads(canonical_json(event_data(payload)))  # what the store keeps, read back
    assert parse_event(payload.TYPE.value, stored) == payload
    # With its optional fields at their defaults too.
    required = {f.name: getattr(payload, f.name) for f in dataclasses.fields(payload)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    bare = type(payload)(**required)
    assert parse_event(bare.TYPE.value, json.loads(canonical_json(event_data(bare)))) == bare


def test_fields_an_older_log_lacks_take_the_meaning_it_had():
    completed = parse_event("call_completed", {"call_id": "c", "tool": "t", "ok": False})
    assert isinstance(completed, CallCompleted) and completed.executed is True
    requested = parse_event("approval_requested", {"approval_id": "a", "call_id": "c", "tool": "t", "arguments": {},
                                                   "digest": "d", "created_at": 1, "expires_at": 2})
    assert isinstance(requested, ApprovalRequested) and requested.approval_kind is ApprovalKind.CALL
    uploaded = parse_event("files_uploaded", {"dest": "d", "files": [], "by": "me"})
    assert isinstance(uploaded, FilesUploaded) and uploaded.incomplete is None
    # ...and the writers that did not know a field do not write it.
    assert "incomplete" not in event_data(uploaded)
    assert {"kind", "reason"}.isdisjoint(event_data(dataclasses.replace(requested, kind=None)))


@pytest.mark.parametrize(("type_", "data"), [
    ("no_such_event", {}),
    ("run_started", ["not", "an", "object"]),
    ("run_started", {"tenant": "t"}),  # no created_at
    ("batch_started", {"calls": [{"tool": "echo"}]}),  # a call without its id
    ("call_decided", {"call_id": "c", "tool": "t", "verdict": "maybe"}),
    ("observation", {"call_id": "c", "tool": "t", "status": "fine", "executed": True}),
    ("run_finished", {"outcome": "done"}),
    ("workspace_created", {"volume": "v", "bytes": 1.5, "inodes": 1}),
    ("call_output", {"call_id": "c", "attempt": 1, "stream": "stdin", "seq": 1, "text": "", "bytes": 0,
                     "redacted": False}),
    ("artifact_collected", {"call_id": "c", "files": [{"path": "x"}], "missing": []}),
])
def test_what_the_fold_cannot_take_is_refused_before_it_is_written(type_, data):
    with pytest.raises(ValueError):
        check_event(type_, data)
