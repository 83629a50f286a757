"""Runs: every terminal outcome forced, tenant isolation, plans, watchers, replay equality
(spans: test_tracing_spans.py)."""

from __future__ import annotations

import threading

import pytest
from control_support import (
    AGENT,
    APPROVER,
    STRANGER,
    Harness,
    error_result,
    outcome_result,
    replay_equals_live_at_every_prefix,
)

from ringfence.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from ringfence.model import ObservationStatus as S
from ringfence.model import PlanStep, ProposedCall, RunOutcome, RunStatus
from ringfence_server.sandbox.result import Outcome

# -- one test per outcome ------------------------------------------------------------------


def test_completed(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    h.submit(run, ("echo", {"text": "x"}))
    view = h.orch.finish_run(AGENT, run)
    assert view.status is RunStatus.FINISHED and view.outcome is RunOutcome.COMPLETED
    with pytest.raises(FailedPrecondition):
        h.submit(run, ("echo", {"text": "y"}))
    assert h.backend.starts == 1


def test_loop_detected_on_the_third_identical_call(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    h.submit(run, ("echo", {"text": "again"}))
    h.submit(run, ("echo", {"text": "again"}))
    obs = h.submit(run, ("echo", {"text": "other"}), ("echo", {"text": "again"}))
    assert [o.status for o in obs] == [S.HALTED, S.HALTED]
    assert h.orch.get_run(AGENT, run).outcome is RunOutcome.LOOP_DETECTED
    assert h.backend.starts == 2  # the third batch ran nothing


def test_loop_detected_within_one_batch(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    obs = h.submit(run, *[("echo", {"text": "same"})] * 3)
    assert [o.status for o in obs] == [S.HALTED] * 3
    assert h.orch.get_run(AGENT, run).outcome is RunOutcome.LOOP_DETECTED
    assert h.backend.starts == 0


def test_guardrail_stop(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    h.submit(run, ("echo", {"text": "-----BEGIN EC PRIVATE KEY-----"}))
    assert h.orch.get_run(AGENT, run).outcome is RunOutcome.GUARDRAIL_STOP
    assert h.backend.starts == 0


def test_budget_exhausted_by_turns(tmp_path):
    h = Harness(tmp_path, limits={"max_turns": 2})
    run = h.run()
    h.submit(run, ("echo", {"text": "1"}))
    h.submit(run, ("echo", {"text": "2"}))
    [obs] = h.submit(run, ("echo", {"text": "3"}))
    assert obs.status is S.HALTED
    assert h.orch.get_run(AGENT, run).outcome is RunOutcome.BUDGET_EXHAUSTED
    assert h.backend.starts == 2


def test_budget_exhausted_by_cost(tmp_path):
    h = Harness(tmp_path, limits={"max_cost": 0.03})  # echo costs 0.01 per attempt
    h.emulator.overrides["echo"] = lambda call: error_result("transient")
    run = h.run()
    h.submit(run, ("echo", {"text": "1"}))  # 4 attempts: 0.04
    h.submit(run, ("echo", {"text": "2"}))
    view = h.orch.get_run(AGENT, run)
    assert view.outcome is RunOutcome.BUDGET_EXHAUSTED and view.usage.cost == pytest.approx(0.04)
    assert h.backend.starts == 4


def test_deadline_exceeded(tmp_path):
    h = Harness(tmp_path, limits={"run_deadline_s": 60.0})
    run = h.run()
    h.submit(run, ("echo", {"text": "1"}))
    h.clock.advance(60)
    [obs] = h.submit(run, ("echo", {"text": "2"}))
    assert obs.status is S.HALTED
    assert h.orch.get_run(AGENT, run).outcome is RunOutcome.DEADLINE_EXCEEDED
    assert h.backend.starts == 1


def test_cancelled(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    assert h.orch.cancel_run(APPROVER, run).outcome is RunOutcome.CANCELLED
    with pytest.raises(FailedPrecondition):
        h.submit(run, ("echo", {"text": "1"}))


def test_error(tmp_path):
    h = Harness(tmp_path)
    h.emulator.overrides["echo"] = lambda call: 1 / 0
    run = h.run()
    h.submit(run, ("echo", {"text": "1"}))
    assert h.orch.get_run(AGENT, run).outcome is RunOutcome.ERROR


def test_an_interrupted_mutation_without_a_lookup_becomes_a_reconciliation_task(tmp_path):
    """Never re-run blindly; the run is not thrown away: a person says whether it happened."""
    h = Harness(tmp_path)
    run = h.run()
    # The process died after dispatching a write and before recording its completion.
    h.store.append(run, "batch_started", {"batch_id": "b", "turn": 1, "calls": [
        {"call_id": "w", "tool": "write_note", "arguments": {"name": "a", "text": "b"}}]})
    h.store.append(run, "dispatch_started", {"call_id": "w", "tool": "write_note", "mutates": True,
                                             "idempotency_key": "k", "arguments": {"name": "a", "text": "b"}})
    h.restart()
    view = h.orch.get_run(AGENT, run)
    assert view.outcome is None
    [obs] = view.trajectory
    assert obs.status is S.PENDING_APPROVAL and obs.error_class == "reconciliation_needed" and obs.executed
    [task] = h.orch.list_approvals(APPROVER, run)
    assert task.kind.value == "reconcile" and task.call_id == "w"
    assert h.backend.starts == 0
    # "It happened" (decline: do not run it again): recorded uncertain, and the run says so.
    h.orch.decide_approval(APPROVER, task.approval_id, False, "the note is there")
    [obs] = h.orch.get_run(AGENT, run).trajectory
    assert obs.status is S.EXECUTED and obs.error_class == "uncertain" and "the note is there" in obs.error
    assert h.orch.finish_run(AGENT, run).outcome is RunOutcome.UNCERTAIN
    assert h.backend.starts == 0


def test_a_reconciliation_task_approved_runs_the_call_once(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    h.store.append(run, "batch_started", {"batch_id": "b", "turn": 1, "calls": [
        {"call_id": "w", "tool": "write_note", "arguments": {"name": "a", "text": "b"}}]})
    h.store.append(run, "dispatch_started", {"call_id": "w", "tool": "write_note", "mutates": True,
                                             "idempotency_key": "k", "arguments": {"name": "a", "text": "b"}})
    h.restart()
    [task] = h.orch.list_approvals(APPROVER, run)
    h.orch.decide_approval(APPROVER, task.approval_id, True, "checked: not there")
    [obs] = h.orch.get_run(AGENT, run).trajectory
    assert obs.status is S.EXECUTED and obs.error_class is None
    assert h.emulator.tools() == ["write_note"]


def test_an_interrupted_read_does_not_make_the_run_uncertain(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    h.store.append(run, "batch_started", {"batch_id": "b", "turn": 1, "calls": [
        {"call_id": "r", "tool": "echo", "arguments": {}}]})
    h.store.append(run, "dispatch_started", {"call_id": "r", "tool": "echo", "mutates": False, "idempotency_key": None})
    h.restart()
    view = h.orch.get_run(AGENT, run)
    assert view.outcome is None and view.trajectory[0].error_class == "interrupted"


def test_a_completion_without_observation_is_observed_on_restart(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    h.store.append(run, "batch_started", {"batch_id": "b", "turn": 1, "calls": [
        {"call_id": "r", "tool": "echo", "arguments": {}}]})
    h.store.append(run, "dispatch_started", {"call_id": "r", "tool": "echo", "mutates": False, "idempotency_key": None})
    h.store.append(run, "call_completed", {"call_id": "r", "tool": "echo", "mutates": False, "idempotency_key": None,
                                           "ok": True, "content": {"v": "AKIAIOSFODNN7EXAMPLE"}, "error": None,
                                           "error_class": None, "attempts": 1, "cost": 0.01})
    h.restart()
    [obs] = h.orch.get_run(AGENT, run).trajectory
    assert obs.status is S.EXECUTED and obs.content == {"v": "[REDACTED:aws_access_key]"}
    assert h.backend.starts == 0


# -- tenants and roles ----------------------------------------------------------------------


def test_another_tenant_sees_nothing(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    for call in (lambda: h.orch.get_run(STRANGER, run),
                 lambda: h.orch.submit_batch(STRANGER, run, [ProposedCall("x", "echo", {})]),
                 lambda: h.orch.finish_run(STRANGER, run),
                 lambda: h.orch.cancel_run(STRANGER, run),
                 lambda: h.orch.list_approvals(STRANGER, run),
                 lambda: h.orch.watch_run(STRANGER, run, 0, threading.Event())):
        with pytest.raises(NotFound):
            call()
    assert h.orch.list_runs(STRANGER) == []
    assert [v.run_id for v in h.orch.list_runs(AGENT)] == [run]
    assert h.backend.starts == 0


def test_two_tenants_can_use_the_same_run_id_without_learning_of_each_other(tmp_path):
    h = Harness(tmp_path)
    mine = h.orch.start_run(AGENT, "mine", "shared-id")
    h.submit("shared-id", ("echo", {"text": "mine"}))
    theirs = h.orch.start_run(STRANGER, "theirs", "shared-id")  # no AlreadyExists: that would leak
    assert theirs.run_id == "shared-id" and theirs.goal == "theirs" and theirs.trajectory == ()
    h.orch.submit_batch(STRANGER, "shared-id", [ProposedCall("c1", "echo", {"text": "theirs"})])
    h.restart()
    for who, goal, text in [(AGENT, "mine", "mine"), (STRANGER, "theirs", "theirs")]:
        h.orch.finish_run(who, "shared-id")  # so that the watch below replays and ends
        view = h.orch.get_run(who, "shared-id")
        assert view.goal == goal and [o.content for o in view.trajectory] == [{"text": text}]
        events = list(h.orch.watch_run(who, "shared-id", 0, threading.Event()))
        assert {e.run_id for e in events} == {"shared-id"}
        assert events[0].data["tenant"] == who.tenant
    # Each tenant's call ran labelled with its tenant and its run id as the caller knows it, so
    # killing one tenant's run never touches the other's sandboxes.
    assert [r.run_id for r in h.backend.requests] == ["acme:shared-id", "globex:shared-id"]
    assert mine.run_id == "shared-id"


def test_start_run_is_idempotent_on_run_id(tmp_path):
    h = Harness(tmp_path)
    a = h.orch.start_run(AGENT, "goal", "my-run")
    b = h.orch.start_run(AGENT, "goal", "my-run")
    assert a == b and h.event_types("my-run") == ["run_started"]
    with pytest.raises(InvalidArgument):
        h.orch.start_run(AGENT, "goal", "bad/id")


def test_approvers_cannot_submit(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    with pytest.raises(PermissionDenied):
        h.orch.submit_batch(APPROVER, run, [ProposedCall("x", "echo", {})])


def test_per_tenant_concurrency_is_bounded(tmp_path):
    from ringfence.errors import ResourceExhausted

    h = Harness(tmp_path, limits={"max_concurrent_batches": 1})
    inside, release = threading.Event(), threading.Event()

    def slow(call):
        inside.set()
        release.wait(10)
        return "done"

    h.emulator.overrides["echo"] = slow
    r1, r2 = h.run(), h.run()
    t = threading.Thread(target=h.submit, args=(r1, ("echo", {"text": "1"})))
    t.start()
    try:
        assert inside.wait(10)
        with pytest.raises(ResourceExhausted):
            h.submit(r2, ("echo", {"text": "2"}))
    finally:
        release.set()
        t.join()
    assert h.backend.starts == 1


# -- plans and watchers ---------------------------------------------------------------------


def test_validate_plan_lists_every_violation(tmp_path):
    h = Harness(tmp_path)
    steps = [PlanStep("a", "echo", {"text": 1}), PlanStep("a", "nope", {}),
             PlanStep("c", "credit", {"account": "x", "amount": 0})]
    with pytest.raises(InvalidArgument) as e:
        h.orch.validate_plan(AGENT, steps, 2)
    fields = sorted(v.field for v in e.value.violations)
    assert fields == ["steps", "steps[0].arguments.text", "steps[1].key", "steps[1].tool",
                      "steps[2].arguments.account", "steps[2].arguments.amount"]
    with pytest.raises(InvalidArgument) as e:
        h.orch.validate_plan(AGENT, [PlanStep("a", "echo", {})], 1000)
    assert [v.field for v in e.value.violations] == ["max_steps"]
    h.orch.validate_plan(AGENT, [PlanStep("a", "echo", {})], None)


def test_execute_plan_validates_first_then_streams_events(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    with pytest.raises(InvalidArgument):
        h.orch.execute_plan(AGENT, run, [PlanStep("a", "echo", {}), PlanStep("b", "nope", {})], None)
    assert h.event_types(run) == ["run_started"]
    events = list(h.orch.execute_plan(AGENT, run, [PlanStep("a", "echo", {"text": "1"}),
                                                   PlanStep("b", "write_note", {"name": "n", "text": "t"})], None))
    assert [e.seq for e in events] == list(range(2, len(h.events(run)) + 1))
    observed = [e.data["call_id"] for e in events if e.type == "observation"]
    assert sorted(observed) == ["a", "b"]
    assert h.backend.starts == 2


def test_watch_run_replays_then_follows_until_finished(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    h.submit(run, ("echo", {"text": "1"}))
    stop = threading.Event()
    seen = []
    started = threading.Event()

    def watch():
        for event in h.orch.watch_run(AGENT, run, 0, stop):
            seen.append(event)
            started.set()

    t = threading.Thread(target=watch)
    t.start()
    assert started.wait(10)
    h.submit(run, ("echo", {"text": "2"}))
    h.orch.finish_run(AGENT, run)
    t.join(10)
    stop.set()
    assert not t.is_alive()
    assert [e.seq for e in seen] == [e.seq for e in h.events(run)]
    assert seen[-1].type == "run_finished"


def test_watch_approvals_yields_pending_then_new(tmp_path):
    h = Harness(tmp_path, rules=[{"tool": "credit", "verdict": "ask"}])
    run = h.run()
    [first] = h.submit(run, ("credit", {"account": "acme-1", "amount": 1}))
    stop = threading.Event()
    it = h.orch.watch_approvals(APPROVER, stop)
    assert next(it).approval_id == first.approval_id
    [second] = h.submit(run, ("credit", {"account": "acme-1", "amount": 2}))
    assert next(it).approval_id == second.approval_id
    stop.set()
    with pytest.raises(PermissionDenied):
        h.orch.watch_approvals(AGENT, stop)


# -- replay equality ------------------------------------------------------------------------


def test_live_state_equals_the_fold_of_every_prefix(tmp_path):
    replay_equals_live_at_every_prefix(tmp_path)


def test_watching_a_finished_run_past_its_end_returns(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    h.orch.finish_run(AGENT, run)
    assert list(h.orch.watch_run(AGENT, run, 2**64 - 1, threading.Event())) == []
    assert [e.type for e in h.orch.watch_run(AGENT, run, 2, threading.Event())] == ["run_finished"]


def test_readers_do_not_wait_for_a_running_batch(tmp_path):
    h = Harness(tmp_path, limits={"max_parallel_reads": 2})
    inside, release = threading.Event(), threading.Event()

    def slow(call):
        inside.set()
        release.wait(10)
        return "done"

    h.emulator.overrides["echo"] = slow
    run = h.run()
    t = threading.Thread(target=h.submit, args=(run, ("echo", {"text": "1"}), ("echo", {"text": "2"})))
    t.start()
    try:
        assert inside.wait(10)
        # Answered while the batch still holds the run (a blocked reader would hang here).
        assert h.orch.get_run(AGENT, run).trajectory == ()
        assert h.orch.list_approvals(AGENT, run) == []
        assert len(h.orch.list_runs(AGENT)) == 1
    finally:
        release.set()
        t.join()
    assert len(h.orch.get_run(AGENT, run).trajectory) == 2


def test_cancel_kills_what_runs_and_stops_the_batch_before_its_writes(tmp_path):
    """Cancel does not wait for the batch: it kills the run's sandboxes at once (here the fake
    backend's in-flight read ends as the real one would, `killed`), and nothing else of the
    batch is dispatched."""
    h = Harness(tmp_path)
    inside = threading.Event()

    def runs_until_killed(call):
        inside.set()
        for _ in range(1000):
            if h.backend.kills:
                return outcome_result(Outcome.KILLED)
            threading.Event().wait(0.01)
        return "never killed"

    h.emulator.overrides["echo"] = runs_until_killed
    run = h.run()
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("obs", h.submit(
        run, ("echo", {"text": "r"}), ("write_note", {"name": "w", "text": "x"}))))
    t.start()
    try:
        assert inside.wait(10)
        result["view"] = h.orch.cancel_run(AGENT, run)
    finally:
        t.join(10)
    assert h.backend.kills == [(f"acme:{run}", "cancelled by agent-1")]
    read, write = result["obs"]
    assert read.status is S.EXECUTED and read.executed and read.error_class == "killed"
    assert write.status is S.HALTED and write.error_class == "cancelled" and not write.executed
    assert h.emulator.tools() == ["echo"]
    assert result["view"].outcome is RunOutcome.CANCELLED
