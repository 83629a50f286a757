"""Plan, execute, verify through the real gRPC server, the real Orchestrator and real containers.

The executor (an agent token) runs an evidence plan: each step's record in the executor's
evidence store is read and handed to the sandboxed `assess_evidence` tool. The verifier (a
verifier token) checks the report against its OWN store through the sandboxed `check_evidence`
tool. The witness that a container did or did not run is the backend itself (every request it
was handed, with the tool named in the request's body); the witness of what was decided is the
store's append-only records and the runs' event logs, read back through the API.

One server serves the whole module; every test uses plan ids and evidence refs of its own.
"""

from __future__ import annotations

import grpc
import pytest
from recording_backend import RecordingBackend

from ringfence import Client
from ringfence.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied
from ringfence.model import ObservationStatus
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.config import load_config
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.store import SqliteEventStore

pytestmark = pytest.mark.docker

TENANT = "demo"
AGENT, VERIFIER = "demo-agent-token", "demo-verifier-token"
TIMEOUT = 180.0


class Stack:
    def __init__(self, server, recording, store) -> None:
        self.server = server
        self.recording = recording
        self.store = store
        self.agent = Client(server.address, AGENT, timeout=TIMEOUT)
        self.verifier = Client(server.address, VERIFIER, timeout=TIMEOUT)

    @property
    def unexpected_errors(self) -> int:
        return self.server.server.edge.unexpected_errors

    def records(self, kind: str, key: str):
        return self.store.read_records(TENANT, kind, key)

    def events(self, run_id: str):
        with self.agent.watch_run(run_id, timeout=60) as stream:
            return list(stream)

    def close(self) -> None:
        self.agent.close()
        self.verifier.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, backend):
    tmp = tmp_path_factory.mktemp("plans")
    config = load_config(overrides={"state_dir": str(tmp / "state"), "pool": {"size": 0}})
    recording = RecordingBackend(backend)
    store = SqliteEventStore(config.db_path)
    orchestrator = Orchestrator.from_config(config, recording, store)
    s = None
    try:
        with BackgroundServer(orchestrator, config) as server:
            s = Stack(server, recording, store)
            yield s
    finally:
        if s is not None:
            s.close()
        orchestrator.close()
        store.close()


def code_of(e: BaseException):
    """The gRPC status code the SDK exception was translated from."""
    cause = e.__cause__
    assert isinstance(cause, grpc.RpcError), f"{e!r} did not come from a gRPC status"
    return cause.code()


def tools_of(events, type_: str) -> list[str]:
    return [e.data["tool"] for e in events if e.type == type_]


# ---------------------------------------------------------------------------------------------


def test_supported_result_is_verified_with_one_container_per_step(stack):
    plan = "t1-supported"
    steps = [("p99", "t1/checkout/p99-latency"), ("errors", "t1/checkout/error-rate")]
    for _, ref in steps:
        assert stack.agent.put_evidence("executor", ref, "high").revision == 1
        assert stack.verifier.put_evidence("verifier", ref, "high").revision == 1

    report = stack.agent.run_evidence_plan(steps, max_steps=2, plan_id=plan)

    assert report.plan_id == plan and report.run_id == f"{plan}.exec"
    assert [(c.key, c.evidence_ref, c.claim, c.revision) for c in report.claims] == [
        ("p99", "t1/checkout/p99-latency", "degraded", 1),
        ("errors", "t1/checkout/error-rate", "degraded", 1),
    ]
    assert [c.call_id for c in report.claims] == ["step-1", "step-2"]
    assert all(c.retrieved_at > 0 for c in report.claims)

    # The executor's run: one assess_evidence call per step, each executed, then finished.
    events = stack.events(report.run_id)
    assert tools_of(events, "dispatch_started") == ["assess_evidence", "assess_evidence"]
    completed = [e.data for e in events if e.type == "call_completed"]
    # The steps are reads: they run in parallel and complete in either order.
    assert sorted((d["call_id"], d["tool"], d["ok"]) for d in completed) == [
        ("step-1", "assess_evidence", True), ("step-2", "assess_evidence", True)]
    assert {d["content"]["claim"] for d in completed} == {"degraded"}
    assert events[-1].type == "run_finished"
    observed = {o.call_id: o for o in stack.agent.get_run(report.run_id).trajectory}
    assert {k: o.status for k, o in observed.items()} == {
        "step-1": ObservationStatus.EXECUTED, "step-2": ObservationStatus.EXECUTED}
    # Exactly one container per step, each running assess_evidence.
    assert sorted(stack.recording.of_run(f"{TENANT}:{report.run_id}")) == [
        ("step-1.a1", "assess_evidence"), ("step-2.a1", "assess_evidence")]

    # The plan's stages as records: accepted, retrieved, reported.
    assert [r.body["stage"] for r in stack.records("plan", plan)] == ["accepted", "retrieved", "reported"]

    verdict = stack.verifier.verify_report(plan, report.claims)
    assert verdict.verified is True, verdict
    assert verdict.assessment == 1 and verdict.plan_id == plan
    assert verdict.remediation == "none"
    assert verdict.mismatches == ()
    assert verdict.verifier_revisions == {"p99": 1, "errors": 1}
    assert "supported" in verdict.reason
    assert verdict.run_id.startswith(f"{plan}.verify-")
    assert sorted(stack.recording.of_run(f"{TENANT}:{verdict.run_id}")) == [
        ("check-1.a1", "check_evidence"), ("check-2.a1", "check_evidence")]

    view = stack.agent.get_plan(plan)
    assert [(s.key, s.evidence_ref) for s in view.steps] == steps and view.max_steps == 2
    assert view.report == report
    assert [v.assessment for v in view.verdicts] == [1] and view.verdicts[0].verified is True
    assert stack.unexpected_errors == 0


@pytest.mark.parametrize(
    "case, steps, max_steps, fields",
    [
        ("empty", [], 3, ["steps"]),
        ("over-max", [("a", "t2/a"), ("b", "t2/b"), ("c", "t2/c")], 2, ["steps"]),
        ("max-11", [("a", "t2/a")], 11, ["max_steps"]),
        ("dup-key", [("a", "t2/a"), ("a", "t2/b")], 2, ["steps[1].key"]),
        ("malformed", [("", "t2/ok"), ("k2", ""), ("k3", "t2/bad ref!")], 3,
         ["steps[0].key", "steps[1].evidence_ref", "steps[2].evidence_ref"]),
        ("everything-at-once", [("", ""), ("", "t2/x")], 0,
         ["max_steps", "steps[0].key", "steps[0].evidence_ref", "steps[1].key"]),
    ],
)
def test_invalid_plans_are_refused_whole_before_anything_runs(stack, case, steps, max_steps, fields):
    plan = f"t2-{case}"
    before = stack.recording.count()
    runs_before = {r.run_id for r in stack.agent.list_runs()}
    with pytest.raises(InvalidArgument) as caught:
        stack.agent.run_evidence_plan(steps, max_steps=max_steps, plan_id=plan)
    assert code_of(caught.value) == grpc.StatusCode.INVALID_ARGUMENT
    # Every violation in one answer, each on the field it is about.
    assert sorted(v.field for v in caught.value.violations) == sorted(fields), caught.value.violations
    if case == "dup-key":
        assert "steps[0]" in caught.value.violations[0].description
    if case in ("over-max", "max-11"):
        assert any(("2" if case == "over-max" else "11") in v.description for v in caught.value.violations)

    # Nothing ran, nothing was read, nothing was recorded.
    assert stack.recording.count() == before
    assert stack.records("plan", plan) == []
    assert {r.run_id for r in stack.agent.list_runs()} == runs_before
    with pytest.raises(NotFound):
        stack.agent.get_plan(plan)
    with pytest.raises(NotFound):
        stack.agent.get_run(f"{plan}.exec")
    assert stack.unexpected_errors == 0


def test_missing_record_is_unknown_never_normal_and_fails_verification(stack):
    plan = "t3-missing"
    ref = "t3/no-such-record"
    stack.verifier.put_evidence("verifier", ref, "high")  # the verifier's side alone cannot rescue it

    report = stack.agent.run_evidence_plan([("latency", ref)], max_steps=1, plan_id=plan)
    [claim] = report.claims
    assert claim.claim == "unknown" and claim.claim != "normal"
    assert (claim.key, claim.evidence_ref, claim.revision) == ("latency", ref, 0)
    # The sandboxed tool was still what turned "no record" into a claim.
    assert stack.recording.of_run(f"{TENANT}:{report.run_id}") == [("step-1.a1", "assess_evidence")]
    [completed] = [e.data for e in stack.events(report.run_id) if e.type == "call_completed"]
    assert completed["content"] == {"ref": ref, "claim": "unknown", "revision": 0}

    verdict = stack.verifier.verify_report(plan, report.claims)
    assert verdict.verified is False and verdict.remediation == "none"
    [mismatch] = verdict.mismatches
    assert mismatch.key == "latency" and mismatch.claim == "unknown"
    assert "'degraded'" in mismatch.reason, mismatch.reason
    assert mismatch.executor_revision == 0
    assert "1 of 1" in verdict.reason
    assert stack.unexpected_errors == 0


def test_conflicting_evidence_names_both_revisions_and_both_retrievals(stack):
    plan = "t4-conflict"
    ref = "t4/db/replication-lag"
    stack.agent.put_evidence("executor", ref, "low")
    assert stack.agent.put_evidence("executor", ref, "high").revision == 2
    assert stack.verifier.put_evidence("verifier", ref, "normal").revision == 1

    report = stack.agent.run_evidence_plan([("lag", ref)], max_steps=1, plan_id=plan)
    [claim] = report.claims
    assert (claim.claim, claim.revision) == ("degraded", 2)

    verdict = stack.verifier.verify_report(plan, report.claims)
    assert verdict.verified is False and verdict.remediation == "none"
    [m] = verdict.mismatches
    assert (m.key, m.evidence_ref, m.claim) == ("lag", ref, "degraded")
    assert m.verifier_value == "normal"
    assert m.verifier_revision == 1
    assert m.executor_revision == 2
    assert m.executor_retrieved_at > 0 and m.verifier_retrieved_at > 0
    assert m.executor_retrieved_at == pytest.approx(claim.retrieved_at, abs=1e-3)
    assert m.verifier_retrieved_at >= m.executor_retrieved_at
    assert "'normal'" in m.reason and "revision 1" in m.reason
    assert verdict.verifier_revisions == {"lag": 1}
    # The verdict as persisted says the same.
    [stored] = stack.records("verdict", plan)
    assert stored.body["verified"] is False
    assert stored.body["mismatches"][0]["verifier_value"] == "normal"
    assert stack.unexpected_errors == 0


def test_empty_report_is_rejected_as_an_assessment_and_runs_nothing(stack):
    plan = "t5-empty-report"
    ref = "t5/queue/depth"
    stack.agent.put_evidence("executor", ref, "high")
    stack.verifier.put_evidence("verifier", ref, "high")
    stack.agent.run_evidence_plan([("depth", ref)], max_steps=1, plan_id=plan)
    runs_before = {r.run_id for r in stack.agent.list_runs()}
    before = stack.recording.count()

    verdict = stack.verifier.verify_report(plan, [])

    assert verdict.verified is False
    assert "empty" in verdict.reason
    assert verdict.assessment == 1 and verdict.remediation == "none"
    assert verdict.mismatches == () and verdict.verifier_revisions == {} and verdict.run_id == ""
    assert stack.recording.count() == before  # no container ran for it
    assert {r.run_id for r in stack.agent.list_runs()} == runs_before  # nor was a run started
    [stored] = stack.records("verdict", plan)
    assert stored.revision == 1 and stored.body["verified"] is False
    assert [v.verified for v in stack.agent.get_plan(plan).verdicts] == [False]
    assert stack.unexpected_errors == 0


def test_stale_evidence_makes_a_new_assessment_and_leaves_the_old_one(stack):
    plan = "t6-stale"
    ref = "t6/cache/hit-ratio"
    stack.agent.put_evidence("executor", ref, "high")
    stack.verifier.put_evidence("verifier", ref, "high")
    report = stack.agent.run_evidence_plan([("cache", ref)], max_steps=1, plan_id=plan)

    first = stack.verifier.verify_report(plan, report.claims)
    assert (first.assessment, first.verified, dict(first.verifier_revisions)) == (1, True, {"cache": 1})
    first_record = stack.records("verdict", plan)[0]

    assert stack.verifier.put_evidence("verifier", ref, "normal").revision == 2
    second = stack.verifier.verify_report(plan, report.claims)
    assert (second.assessment, second.verified) == (2, False)
    assert second.verifier_revisions == {"cache": 2}
    [m] = second.mismatches
    assert (m.verifier_value, m.verifier_revision, m.executor_revision) == ("normal", 2, 1)
    assert second.run_id != first.run_id

    view = stack.agent.get_plan(plan)
    assert [v.assessment for v in view.verdicts] == [1, 2]
    old, new = view.verdicts
    assert old == first  # assessment 1 unchanged: verified, same revisions, same time, same run
    assert old.verified is True and old.verifier_revisions == {"cache": 1} and old.at == first.at
    assert new == second
    # In the store: assessment 1's record is byte-for-byte what it was.
    records = stack.records("verdict", plan)
    assert [r.revision for r in records] == [1, 2]
    assert records[0] == first_record
    assert stack.unexpected_errors == 0


def test_the_executor_cannot_write_or_read_the_verifiers_evidence(stack):
    ref = "t7/api/availability"
    stack.verifier.put_evidence("verifier", ref, "normal")
    history = stack.verifier.get_evidence("verifier", ref)
    stored = stack.records("evidence:verifier", ref)
    assert [(r.revision, r.value) for r in history] == [(1, "normal")]

    with pytest.raises(PermissionDenied) as caught:
        stack.agent.put_evidence("verifier", ref, "high")
    assert code_of(caught.value) == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(PermissionDenied) as caught:
        stack.agent.get_evidence("verifier", ref)
    assert code_of(caught.value) == grpc.StatusCode.PERMISSION_DENIED

    # The verifier's store is exactly as it was.
    assert stack.verifier.get_evidence("verifier", ref) == history
    assert stack.records("evidence:verifier", ref) == stored

    # Roles: an agent does not verify, a verifier does not execute.
    plan = "t7-roles"
    stack.agent.put_evidence("executor", ref, "high")
    report = stack.agent.run_evidence_plan([("avail", ref)], max_steps=1, plan_id=plan)
    before = stack.recording.count()
    with pytest.raises(PermissionDenied) as caught:
        stack.agent.verify_report(plan, report.claims)
    assert code_of(caught.value) == grpc.StatusCode.PERMISSION_DENIED
    assert stack.records("verdict", plan) == []
    with pytest.raises(PermissionDenied) as caught:
        stack.verifier.run_evidence_plan([("avail", ref)], max_steps=1, plan_id="t7-verifier-plan")
    assert code_of(caught.value) == grpc.StatusCode.PERMISSION_DENIED
    assert stack.records("plan", "t7-verifier-plan") == []
    assert stack.recording.count() == before
    assert stack.unexpected_errors == 0


def test_the_verifier_never_starts_a_remediation(stack):
    plan = "t8-no-remediation"
    steps = [("cpu", "t8/node/cpu"), ("mem", "t8/node/memory")]
    for _, ref in steps:
        stack.agent.put_evidence("executor", ref, "high")
    stack.verifier.put_evidence("verifier", "t8/node/cpu", "high")
    stack.verifier.put_evidence("verifier", "t8/node/memory", "normal")
    report = stack.agent.run_evidence_plan(steps, max_steps=2, plan_id=plan)
    runs_before = {r.run_id for r in stack.agent.list_runs()}
    before = stack.recording.count()

    verdict = stack.verifier.verify_report(plan, report.claims)

    assert verdict.remediation == "none"
    assert verdict.verified is False and [m.key for m in verdict.mismatches] == ["mem"]
    assert verdict.run_id.startswith(f"{plan}.verify-")
    # The only run it started is its own verification run...
    assert {r.run_id for r in stack.agent.list_runs()} - runs_before == {verdict.run_id}
    # ...whose log holds check_evidence calls and nothing else, all dispatched and completed.
    events = stack.events(verdict.run_id)
    batches = [e.data for e in events if e.type == "batch_started"]
    assert len(batches) == 1
    assert [c["tool"] for c in batches[0]["calls"]] == ["check_evidence", "check_evidence"]
    assert tools_of(events, "call_decided") == ["check_evidence", "check_evidence"]
    assert tools_of(events, "dispatch_started") == ["check_evidence", "check_evidence"]
    assert tools_of(events, "call_completed") == ["check_evidence", "check_evidence"]
    assert not [e for e in events if e.type.startswith("approval") or e.type == "grant_added"]
    assert events[-1].type == "run_finished"
    # Every container started during verification was a check_evidence of that run.
    assert [(r, t) for r, _, t in stack.recording.since(before)] == [
        (f"{TENANT}:{verdict.run_id}", "check_evidence")] * 2
    # The persisted verdict says the same.
    assert stack.records("verdict", plan)[-1].body["remediation"] == "none"
    assert stack.unexpected_errors == 0


def test_resending_a_plan_returns_the_same_report_and_runs_once(stack):
    plan = "t9-retry"
    ref = "t9/disk/iops"
    stack.agent.put_evidence("executor", ref, "high")

    first = stack.agent.run_evidence_plan([("iops", ref)], max_steps=1, plan_id=plan)
    # New evidence after the report does not change a resent plan's answer.
    assert stack.agent.put_evidence("executor", ref, "normal").revision == 2
    second = stack.agent.run_evidence_plan([("iops", ref)], max_steps=1, plan_id=plan)

    assert second == first
    assert [(c.claim, c.revision) for c in second.claims] == [("degraded", 1)]
    assert stack.recording.of_run(f"{TENANT}:{first.run_id}") == [("step-1.a1", "assess_evidence")]
    assert [r.body["stage"] for r in stack.records("plan", plan)] == ["accepted", "retrieved", "reported"]
    events = stack.events(first.run_id)
    assert tools_of(events, "dispatch_started") == ["assess_evidence"]

    # The same id with other steps is refused, and runs nothing.
    before = stack.recording.count()
    with pytest.raises(AlreadyExists):
        stack.agent.run_evidence_plan([("iops", "t9/disk/other")], max_steps=1, plan_id=plan)
    assert stack.recording.count() == before
    assert stack.unexpected_errors == 0


def test_a_report_edited_after_the_executor_is_not_verified(stack):
    plan = "t10-forged"
    ref = "t10/lb/5xx"
    stack.verifier.put_evidence("verifier", ref, "high")  # the verifier's store would support it
    report = stack.agent.run_evidence_plan([("5xx", ref)], max_steps=1, plan_id=plan)
    [claim] = report.claims
    assert claim.claim == "unknown"  # no executor record

    forged = [type(claim)(claim.key, claim.evidence_ref, "degraded", 1, claim.retrieved_at, claim.call_id),
              type(claim)("extra", ref, "degraded", 1, claim.retrieved_at, "step-9")]
    verdict = stack.verifier.verify_report(plan, forged)
    assert verdict.verified is False and verdict.remediation == "none"
    reasons = {m.key: m.reason for m in verdict.mismatches}
    assert set(reasons) == {"5xx", "extra"}
    assert "differs from the executor's report" in reasons["5xx"]
    assert "no claim with this key" in reasons["extra"]
    assert stack.unexpected_errors == 0
