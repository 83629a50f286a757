"""Approval (step 6): bound to the exact call, expiring, used once, durable across restarts."""

from __future__ import annotations

import pytest
from control_support import AGENT, APPROVER, STRANGER_APPROVER, Harness

from ringfence.errors import FailedPrecondition, NotFound, PermissionDenied
from ringfence.model import ApprovalStatus as A
from ringfence.model import ObservationStatus as S
from ringfence.model import RunStatus
from ringfence_server.control.approvals import approval_digest

RULES = [{"tool": "credit", "verdict": "ask", "when": {"amount": {"lte": 1000}}},
         {"tool": "echo", "verdict": "allow"}]


def test_the_digest_binds_every_part():
    base = dict(tenant="acme", run_id="r1", tool="credit", arguments={"account": "acme-9", "amount": 50},
                image_digest="sha256:aa", policy_version="p1")
    d = approval_digest(**base)
    for key, other in [("tenant", "globex"), ("run_id", "r2"), ("tool", "debit"),
                       ("arguments", {"account": "acme-9", "amount": 500}), ("image_digest", "sha256:bb"),
                       ("policy_version", "p2")]:
        assert approval_digest(**{**base, key: other}) != d, key
    # The canonical form: key order and 50.0 vs 50 are the same call.
    assert approval_digest(**{**base, "arguments": {"amount": 50.0, "account": "acme-9"}}) == d


def test_an_approval_for_50_never_authorizes_500(tmp_path):
    h = Harness(tmp_path, rules=RULES)
    run = h.run()
    small, big = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}),
                          ("credit", {"account": "acme-9", "amount": 500}))
    assert small.status is big.status is S.PENDING_APPROVAL
    approvals = {a.approval_id: a for a in h.orch.list_approvals(APPROVER, run)}
    assert approvals[small.approval_id].digest != approvals[big.approval_id].digest
    h.orch.decide_approval(APPROVER, small.approval_id, True, "fine")
    assert [(c.tool, c.arguments) for c in h.emulator.log] == [("credit", {"account": "acme-9", "amount": 50})]
    view = h.orch.get_run(AGENT, run)
    by_id = {o.call_id: o for o in view.trajectory}
    assert by_id[small.call_id].status is S.EXECUTED
    assert by_id[small.call_id].content["credited"] == 50
    assert by_id[big.call_id].status is S.PENDING_APPROVAL  # still waiting for its own decision
    assert view.status is RunStatus.WAITING_APPROVAL


def test_a_changed_image_or_policy_voids_the_approval(tmp_path):
    h = Harness(tmp_path, rules=RULES)
    run = h.run()
    [obs] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    h.image_digest = "sha256:" + "cd" * 32  # the tool image was rebuilt after the approver looked
    h.restart()
    # Approving what no longer matches is refused, like every decision that cannot apply.
    with pytest.raises(FailedPrecondition, match="no longer matches"):
        h.orch.decide_approval(APPROVER, obs.approval_id, True, "ok")
    assert h.backend.starts == 0
    h.orch.decide_approval(APPROVER, obs.approval_id, False, "then no")
    [final] = h.orch.get_run(AGENT, run).trajectory
    assert final.status is S.DECLINED and not final.executed


def test_declined_is_an_observation_and_never_dispatched(tmp_path):
    h = Harness(tmp_path, rules=RULES)
    run = h.run()
    [obs] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    approval = h.orch.decide_approval(APPROVER, obs.approval_id, False, "not today")
    assert approval.status is A.DECLINED and approval.decided_by == "boss" and approval.reason == "not today"
    [final] = h.orch.get_run(AGENT, run).trajectory
    assert final.status is S.DECLINED and not final.executed and "not today" in final.error
    assert h.backend.starts == 0


def test_an_expired_approval_declines_the_call(tmp_path):
    h = Harness(tmp_path, rules=RULES, limits={"approval_ttl_s": 60.0})
    run = h.run()
    [obs] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    h.clock.advance(61)
    with pytest.raises(FailedPrecondition, match="expired"):
        h.orch.decide_approval(APPROVER, obs.approval_id, True, "too late")
    assert h.orch.list_approvals(APPROVER, run)[0].status is A.EXPIRED
    [final] = h.orch.get_run(AGENT, run).trajectory
    assert final.status is S.DECLINED and final.error_class == "approval_expired"
    assert h.backend.starts == 0
    assert "approval_expired" in h.event_types(run)


def test_an_approval_is_used_once(tmp_path):
    h = Harness(tmp_path, rules=RULES)
    run = h.run()
    [obs] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    assert h.orch.decide_approval(APPROVER, obs.approval_id, True, "").status is A.USED
    with pytest.raises(FailedPrecondition):
        h.orch.decide_approval(APPROVER, obs.approval_id, True, "again")
    assert h.backend.starts == 1


def test_only_approvers_of_the_tenant_decide(tmp_path):
    h = Harness(tmp_path, rules=RULES)
    run = h.run()
    [obs] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    with pytest.raises(PermissionDenied):
        h.orch.decide_approval(AGENT, obs.approval_id, True, "self-approval")
    with pytest.raises(NotFound):
        h.orch.decide_approval(STRANGER_APPROVER, obs.approval_id, True, "other tenant")
    assert h.orch.list_approvals(STRANGER_APPROVER) == []
    assert h.backend.starts == 0


def test_a_pending_approval_survives_a_restart_and_resumes_the_same_call(tmp_path):
    h = Harness(tmp_path, rules=RULES)
    run = h.run()
    [obs] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    h.restart()
    [pending] = h.orch.list_approvals(APPROVER)
    assert pending.approval_id == obs.approval_id and pending.status is A.PENDING
    assert h.orch.get_run(AGENT, run).status is RunStatus.WAITING_APPROVAL
    h.orch.decide_approval(APPROVER, obs.approval_id, True, "after restart")
    [call] = h.emulator.log
    assert (call.call_id, call.tool, call.arguments) == (obs.call_id, "credit", {"account": "acme-9", "amount": 50})
    assert call.idempotency_key is not None
    [final] = h.orch.get_run(AGENT, run).trajectory
    assert final.status is S.EXECUTED and final.approval_id == obs.approval_id


def test_an_approved_call_not_yet_dispatched_is_resumed_on_startup(tmp_path):
    h = Harness(tmp_path, rules=RULES)
    run = h.run()
    [obs] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    # The process died right after recording the decision, before dispatching.
    h.store.append(run, "approval_decided", {"approval_id": obs.approval_id, "approved": True, "by": "boss",
                                             "reason": "ok"})
    assert h.backend.starts == 0
    h.restart()
    assert [c.call_id for c in h.emulator.log] == [obs.call_id]
    [final] = h.orch.get_run(AGENT, run).trajectory
    assert final.status is S.EXECUTED
    h.restart()  # and a second restart does not run it again
    assert h.backend.starts == 1


def test_finishing_a_run_declines_its_pending_approvals(tmp_path):
    h = Harness(tmp_path, rules=RULES)
    run = h.run()
    [obs] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    h.orch.finish_run(AGENT, run)
    [final] = h.orch.get_run(AGENT, run).trajectory
    assert final.status is S.DECLINED
    with pytest.raises(FailedPrecondition):
        h.orch.decide_approval(APPROVER, obs.approval_id, True, "late")
    assert h.backend.starts == 0


def test_approve_and_remember_grants_the_exact_call_for_the_run(tmp_path):
    """The same $50 again is not asked again (and is deduplicated: one execution); $60 is asked."""
    h = Harness(tmp_path, rules=RULES)
    run = h.run()
    [first] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    h.orch.decide_approval(APPROVER, first.approval_id, True, "regular customer", remember=True)
    [again] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    assert again.status is S.DEDUPLICATED and again.approval_id is None
    assert "policy:grant:session" in again.verdict_path
    [other] = h.submit(run, ("credit", {"account": "acme-9", "amount": 60}))
    assert other.status is S.PENDING_APPROVAL
    assert len(h.orch.list_approvals(APPROVER, run)) == 2  # asked for 50 once, and for 60
    assert h.emulator.tools() == ["credit"]
    # In another run the grant does not hold.
    other_run = h.run()
    [fresh] = h.submit(other_run, ("credit", {"account": "acme-9", "amount": 50}))
    assert fresh.status is S.PENDING_APPROVAL


def test_a_decision_for_a_digest_the_approver_did_not_see_is_refused(tmp_path):
    h = Harness(tmp_path, rules=RULES)
    run = h.run()
    [obs] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    [approval] = h.orch.list_approvals(APPROVER, run)
    with pytest.raises(FailedPrecondition, match="another call than the one you saw"):
        h.orch.decide_approval(APPROVER, obs.approval_id, True, "ok", digest="0" * 64)
    assert h.backend.starts == 0
    decided = h.orch.decide_approval(APPROVER, obs.approval_id, True, "ok", digest=approval.digest)
    assert decided.status is A.USED and h.backend.starts == 1


def test_deciding_twice_is_refused_not_answered_ok(tmp_path):
    h = Harness(tmp_path, rules=RULES)
    run = h.run()
    [obs] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    h.orch.decide_approval(APPROVER, obs.approval_id, True, "ok")
    with pytest.raises(FailedPrecondition, match="nothing to decide"):
        h.orch.decide_approval(APPROVER, obs.approval_id, False, "changed my mind")
