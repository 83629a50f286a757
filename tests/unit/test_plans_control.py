"""Plan, execute, verify: control flow on the FakeBackend (the real containers are in
tests/e2e/test_plans_verify.py). The emulated evidence tools answer as the image's do."""

from __future__ import annotations

import pytest
from control_support import ADMIN, AGENT, Harness

from ringfence.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied
from ringfence.model import Principal, Role
from ringfence.plans import Claim, Step
from ringfence_server.control.plans.service import PlanVerification

VERIFIER = Principal("acme", Role.VERIFIER, "vera")
RULES = [{"tool": "assess_evidence", "verdict": "allow"}, {"tool": "check_evidence", "verdict": "allow"}]


def assess(call):  # as images/tool/.../assess_evidence.py
    record = call.arguments["record"]
    return {"ref": call.arguments["ref"], "claim": "degraded" if record and record["value"] == "high" else "unknown",
            "revision": record["revision"] if record else 0}


def check(call):  # as images/tool/.../check_evidence.py
    record = call.arguments["record"]
    ok = call.arguments["claim"] == "degraded" and bool(record) and record["value"] == "high"
    return {"ref": call.arguments["ref"], "supported": ok, "value": record and record["value"],
            "revision": record["revision"] if record else 0}


@pytest.fixture
def h(tmp_path):
    h = Harness(tmp_path, rules=RULES)
    h.emulator.overrides.update(assess_evidence=assess, check_evidence=check)
    yield h
    h.orch.close()


def test_every_violation_of_a_plan_is_reported_at_once():
    steps = [Step("", "checkout/p99"), Step("a", ""), Step("a", "x y"), Step("b", "ok/ref")]
    with pytest.raises(InvalidArgument) as e:
        PlanVerification.validate(3, steps, "bad id!")
    assert [(v.field, v.description) for v in e.value.violations] == [
        ("plan_id", "must be 1-80 characters of [A-Za-z0-9_.:-]"),
        ("steps", "4 steps is more than max_steps (3)"),
        ("steps[0].key", "is required"),
        ("steps[1].evidence_ref", "is required"),
        ("steps[2].key", "'a' is also the key of steps[1]"),
        ("steps[2].evidence_ref", "must be 1-200 characters of [A-Za-z0-9_.:/-]"),
    ]


@pytest.mark.parametrize("max_steps", [0, 11, True, 2.0, None])
def test_max_steps_is_an_integer_from_1_to_10(max_steps):
    with pytest.raises(InvalidArgument) as e:
        PlanVerification.validate(max_steps, [Step("a", "r")])
    assert [v.field for v in e.value.violations] == ["max_steps"]


def test_an_empty_plan_and_the_largest_plan():
    with pytest.raises(InvalidArgument) as e:
        PlanVerification.validate(1, [])
    assert [(v.field, v.description) for v in e.value.violations] == [("steps", "must not be empty")]
    PlanVerification.validate(10, [Step(f"k{i}", f"r/{i}") for i in range(10)])  # no error


def test_an_invalid_plan_reads_nothing_and_runs_nothing(h):
    plans = h.orch.plans
    with pytest.raises(InvalidArgument):
        plans.run_plan(AGENT, "p1", 1, [Step("a", "r"), Step("b", "r")])
    assert h.backend.requests == [] and h.store.read_records("acme", "plan", "p1") == []
    with pytest.raises(NotFound):
        plans.get_plan(AGENT, "p1")


def test_a_supported_claim_end_to_end(h):
    plans = h.orch.plans
    plans.evidence.put(AGENT, "executor", "checkout/p99", "high")
    plans.evidence.put(VERIFIER, "verifier", "checkout/p99", "high")
    report = plans.run_plan(AGENT, "p1", 1, [Step("p99", "checkout/p99")])
    assert report.claims == (Claim("p99", "checkout/p99", "degraded", 1, report.claims[0].retrieved_at, "step-1"),)
    verdict = plans.verify(VERIFIER, "p1", report.claims)
    assert (verdict.verified, verdict.assessment, verdict.remediation, dict(verdict.verifier_revisions)) == \
        (True, 1, "none", {"p99": 1})
    assert [c.tool for c in h.emulator.log] == ["assess_evidence", "check_evidence"]
    # The plan's record: accepted, retrieved (pinned revisions), reported.
    stages = h.store.read_records("acme", "plan", "p1")
    assert [r.body["stage"] for r in stages] == ["accepted", "retrieved", "reported"]
    assert stages[1].body["evidence"][0]["revision"] == 1


def test_a_resumed_plan_uses_the_evidence_it_pinned_and_runs_each_step_once(h):
    plans = h.orch.plans
    plans.evidence.put(AGENT, "executor", "checkout/p99", "high")
    report = plans.run_plan(AGENT, "p1", 1, [Step("p99", "checkout/p99")])
    # A resend (a client retry after a lost answer) is the same report; nothing runs again.
    assert plans.run_plan(AGENT, "p1", 1, [Step("p99", "checkout/p99")]) == report
    assert len(h.emulator.log) == 1
    with pytest.raises(AlreadyExists):
        plans.run_plan(AGENT, "p1", 1, [Step("p99", "search/p99")])


def test_a_crash_after_retrieval_resumes_with_the_pinned_revision(h):
    plans = h.orch.plans
    plans.evidence.put(AGENT, "executor", "checkout/p99", "high")
    steps = [Step("p99", "checkout/p99")]
    # As if the server died after stage 2: the plan accepted and its evidence pinned at revision 1.
    h.store.append_record("acme", "plan", "p1", {"stage": "accepted", "max_steps": 1, "run_id": "p1.exec",
                                                 "steps": [{"key": "p99", "evidence_ref": "checkout/p99"}]}, "a", 0)
    h.store.append_record("acme", "plan", "p1", {"stage": "retrieved", "evidence": [
        {"evidence_ref": "checkout/p99", "revision": 1, "retrieved_at": 5.0}]}, "a", 1)
    plans.evidence.put(AGENT, "executor", "checkout/p99", "normal")  # revision 2, after the retrieval
    report = plans.run_plan(AGENT, "p1", 1, steps)
    assert (report.claims[0].claim, report.claims[0].revision, report.claims[0].retrieved_at) == ("degraded", 1, 5.0)
    assert h.emulator.log[0].arguments["record"] == {"value": "high", "revision": 1}


def test_the_stores_are_guarded_by_role(h):
    ev = h.orch.plans.evidence
    with pytest.raises(PermissionDenied):
        ev.put(AGENT, "verifier", "r", "high")
    with pytest.raises(PermissionDenied):
        ev.history(AGENT, "verifier", "r")
    with pytest.raises(PermissionDenied):
        ev.put(VERIFIER, "executor", "r", "high")
    with pytest.raises(InvalidArgument):
        ev.put(AGENT, "elsewhere", "r", "high")
    ev.put(ADMIN, "verifier", "r", "high")  # an admin may write both
    assert [r.written_by for r in ev.history(VERIFIER, "verifier", "r")] == ["root-ish"]
    with pytest.raises(PermissionDenied):
        h.orch.plans.verify(AGENT, "p1", [])
    with pytest.raises(PermissionDenied):
        h.orch.plans.run_plan(VERIFIER, "p1", 1, [Step("a", "r")])


def test_an_empty_report_fails_without_running_anything(h):
    plans = h.orch.plans
    plans.run_plan(AGENT, "p1", 1, [Step("p99", "checkout/p99")])
    before = len(h.backend.requests)
    verdict = plans.verify(VERIFIER, "p1", [])
    assert (verdict.verified, verdict.reason) == (False, "the report is empty: there is nothing to verify")
    assert len(h.backend.requests) == before


def test_a_claim_that_differs_from_the_executors_report_is_a_mismatch(h):
    plans = h.orch.plans
    plans.evidence.put(AGENT, "executor", "checkout/p99", "normal")
    plans.evidence.put(VERIFIER, "verifier", "checkout/p99", "high")
    report = plans.run_plan(AGENT, "p1", 1, [Step("p99", "checkout/p99")])
    assert report.claims[0].claim == "unknown"  # never an invented normal
    forged = Claim("p99", "checkout/p99", "degraded")
    verdict = plans.verify(VERIFIER, "p1", [forged])
    assert not verdict.verified
    assert [m.reason for m in verdict.mismatches] == ["the claim differs from the executor's report"]
