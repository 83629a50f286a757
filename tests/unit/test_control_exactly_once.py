"""Effects happen once, whoever asks twice: tenants sharing a run id, a client resending a batch,
a crash between admission and dispatch, and an actor approving what it proposed. Each test
counts at the witness of what reached the sandbox (the emulator's log / the backend's starts).
"""

from __future__ import annotations

import threading

import pytest
from control_support import ADMIN, AGENT, APPROVER, Harness, content_result, error_result, outcome_result

from ringfence.errors import InvalidArgument, PermissionDenied
from ringfence.model import ObservationStatus as S
from ringfence.model import Principal, ProposedCall, Role
from ringfence_server.sandbox.result import Outcome

GLOBEX = Principal("globex", Role.AGENT, "globex-agent")


def test_two_tenants_with_the_same_run_id_get_different_idempotency_keys(tmp_path):
    """A receiver deduplicating by key must not drop one tenant's effect as the other's repeat."""
    h = Harness(tmp_path, limits={"max_concurrent_batches": 4})
    h.orch.start_run(AGENT, "acme's job", "nightly")
    h.orch.start_run(GLOBEX, "globex's job", "nightly")
    note = {"name": "report", "text": "same words"}
    [a] = h.orch.submit_batch(AGENT, "nightly", [ProposedCall("w", "write_note", note)])
    [b] = h.orch.submit_batch(GLOBEX, "nightly", [ProposedCall("w", "write_note", note)])
    assert a.status is b.status is S.EXECUTED
    keys = [c.idempotency_key for c in h.emulator.log]
    assert len(keys) == 2 and keys[0] != keys[1] and all(keys)


def test_the_idempotency_key_survives_a_restart(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    h.submit(run, ("write_note", {"name": "n", "text": "t"}))
    h.restart()
    [again] = h.submit(run, ("write_note", {"name": "n", "text": "t"}))
    assert again.status is S.DEDUPLICATED and h.backend.starts == 1


def test_the_proposer_cannot_decide_its_own_approval(tmp_path):
    """An admin holds the agent and approver roles: it may propose, or approve, never both."""
    h = Harness(tmp_path)
    run = h.orch.start_run(ADMIN, "four eyes").run_id
    [pending] = h.orch.submit_batch(ADMIN, run, [ProposedCall("pay", "credit", {"account": "acme-9", "amount": 50})])
    assert pending.status is S.PENDING_APPROVAL
    with pytest.raises(PermissionDenied, match="proposed this call"):
        h.orch.decide_approval(ADMIN, pending.approval_id, True, "my own")
    assert h.backend.starts == 0
    h.orch.decide_approval(APPROVER, pending.approval_id, True, "someone else")
    assert h.orch.get_run(ADMIN, run).trajectory[0].status is S.EXECUTED and h.backend.starts == 1


def test_a_resent_batch_returns_the_recorded_observations(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    calls = [ProposedCall("r", "echo", {"text": "hi"}), ProposedCall("w", "write_note", {"name": "n", "text": "t"})]
    first = h.orch.submit_batch(AGENT, run, calls, batch_id="turn-1")
    again = h.orch.submit_batch(AGENT, run, calls, batch_id="turn-1")
    assert again == first and h.backend.starts == 2
    assert [e.type for e in h.events(run)].count("batch_started") == 1


def test_a_different_batch_under_a_used_id_is_refused(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    h.orch.submit_batch(AGENT, run, [ProposedCall("r", "echo", {"text": "hi"})], batch_id="turn-1")
    with pytest.raises(InvalidArgument) as info:
        h.orch.submit_batch(AGENT, run, [ProposedCall("r2", "echo", {"text": "other"})], batch_id="turn-1")
    assert [v.field for v in info.value.violations] == ["batch_id"]
    assert h.backend.starts == 1


class Crash(BaseException):
    """Stands for the process dying: nothing after it runs (a BaseException, like SystemExit)."""


def test_calls_admitted_before_a_crash_run_once_after_the_restart(tmp_path):
    """Killed between admitting a batch and dispatching it: the restarted server runs each
    admitted call once (they provably never reached a container), reads and writes alike."""
    h = Harness(tmp_path)
    run = h.run()
    decided = []

    def die_after_the_last_verdict(state, event):
        if event.type == "call_decided":
            decided.append(event.data["call_id"])
            if len(decided) == 2:
                raise Crash()

    h.orch.on_event = die_after_the_last_verdict
    with pytest.raises(Crash):
        h.submit(run, ProposedCall("r", "echo", {"text": "hi"}),
                 ProposedCall("w", "write_note", {"name": "n", "text": "t"}))
    assert h.backend.starts == 0
    h.restart()
    view = h.orch.get_run(AGENT, run)
    by_id = {o.call_id: o for o in view.trajectory}
    assert by_id["r"].status is S.EXECUTED and by_id["w"].status is S.EXECUTED
    assert by_id["w"].verdict_path[-2:] == ("recovery:resumed", "result:ok")
    assert sorted(h.emulator.tools()) == ["echo", "write_note"]
    h.restart()  # a second restart finds nothing left to do
    assert sorted(h.emulator.tools()) == ["echo", "write_note"]


def test_a_finished_run_leaves_memory_and_is_served_from_the_store(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    h.submit(run, ("echo", {"text": "hi"}))
    h.orch.finish_run(AGENT, run)
    assert h.orch.runs.live() == []
    assert h.orch.get_run(AGENT, run).trajectory[0].content == {"text": "hi"}
    assert [v.run_id for v in h.orch.list_runs(AGENT)] == [run]
    h.restart()
    assert h.orch.runs.live() == []  # start-up does not fold finished runs
    assert h.orch.get_run(AGENT, run).outcome.value == "completed"


def test_an_engine_failure_after_start_runs_a_mutation_once_and_says_uncertain(tmp_path):
    """`uncertain` is never retried for a mutating tool (a second run could be a second effect)."""
    h = Harness(tmp_path)
    h.emulator.overrides["write_note"] = lambda call: outcome_result(Outcome.UNCERTAIN)
    run = h.run()
    [obs] = h.submit(run, ("write_note", {"name": "n", "text": "t"}))
    assert h.emulator.tools() == ["write_note"]
    assert obs.status is S.EXECUTED and obs.executed and obs.error_class == "uncertain"


def test_an_engine_failure_after_start_of_a_read_is_retried(tmp_path):
    h = Harness(tmp_path)
    answers = iter([outcome_result(Outcome.UNCERTAIN), content_result({"text": "hi"})])
    h.emulator.overrides["echo"] = lambda call: next(answers)
    run = h.run()
    [obs] = h.submit(run, ("echo", {"text": "hi"}))
    assert h.emulator.tools() == ["echo", "echo"]
    assert obs.status is S.EXECUTED and obs.content == {"text": "hi"} and obs.attempts == 2


def test_the_run_deadline_kills_what_runs_mid_batch(tmp_path):
    """The deadline is not only checked between batches: a watchdog kills the run's sandboxes
    when it passes, and the run ends deadline_exceeded with the call `killed`."""
    h = Harness(tmp_path, limits={"run_deadline_s": 0.2})

    def runs_until_killed(call):
        for _ in range(1000):
            if h.backend.kills:
                return outcome_result(Outcome.KILLED)
            threading.Event().wait(0.01)
        return "never killed"

    h.emulator.overrides["echo"] = runs_until_killed
    run = h.run()
    [obs] = h.submit(run, ("echo", {"text": "slow"}))
    assert h.backend.kills == [(f"acme:{run}", "the run deadline passed")]
    assert obs.executed and obs.error_class == "killed"
    view = h.orch.get_run(AGENT, run)
    assert view.outcome.value == "deadline_exceeded"


def _credit_note(key, text="t", call_id="w"):
    return ProposedCall(call_id, "write_note", {"name": "n", "text": text}, idempotency_key=key)


def test_a_client_key_deduplicates_across_the_tenants_runs(tmp_path):
    """"The same credit in a later run of the same job" must not run again."""
    h = Harness(tmp_path)
    first_run, later_run = h.run(), h.run()
    [first] = h.orch.submit_batch(AGENT, first_run, [_credit_note("invoice-7")])
    [again] = h.orch.submit_batch(AGENT, later_run, [_credit_note("invoice-7")])
    assert first.status is S.EXECUTED and again.status is S.DEDUPLICATED
    assert again.content == first.content
    assert h.emulator.tools() == ["write_note"]
    # The key the tool saw is the tenant-scoped one, not the client's raw key.
    assert h.emulator.log[0].idempotency_key != "invoice-7"


def test_a_client_key_with_other_arguments_is_refused_never_run(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    h.orch.submit_batch(AGENT, run, [_credit_note("invoice-7", "50")])
    [refused] = h.orch.submit_batch(AGENT, h.run(), [_credit_note("invoice-7", "500")])
    assert refused.status is S.DENIED and not refused.executed
    assert refused.error_class == "idempotency_key_reused" and "other arguments" in refused.error
    assert h.emulator.tools() == ["write_note"]


def test_client_keys_are_scoped_to_the_tenant(tmp_path):
    h = Harness(tmp_path)
    h.orch.start_run(AGENT, "a", "ra")
    h.orch.start_run(GLOBEX, "g", "rg")
    [a] = h.orch.submit_batch(AGENT, "ra", [_credit_note("shared-key")])
    [g] = h.orch.submit_batch(GLOBEX, "rg", [_credit_note("shared-key")])
    assert a.status is g.status is S.EXECUTED
    keys = [c.idempotency_key for c in h.emulator.log]
    assert len(set(keys)) == 2


def test_a_client_key_whose_call_failed_is_not_run_again(tmp_path):
    h = Harness(tmp_path, limits={"max_attempts": 1})
    h.emulator.overrides["write_note"] = lambda call: outcome_result(Outcome.UNCERTAIN)
    h.orch.submit_batch(AGENT, h.run(), [_credit_note("k")])
    [again] = h.orch.submit_batch(AGENT, h.run(), [_credit_note("k")])
    assert again.status is S.DENIED and again.error_class == "idempotency_key_in_doubt"
    assert h.emulator.tools() == ["write_note"]


@pytest.mark.parametrize("ending", ["declined", "withdrawn", "expired"])
def test_a_crash_after_an_approval_ends_a_call_still_gives_it_its_observation_and_never_runs_it(tmp_path, ending):
    """Killed between the approval's event (decided no, withdrawn, expired) and the call's
    observation: the restarted server writes the observation the call would have had, and the
    call never reaches the sandbox."""
    h = Harness(tmp_path)
    run = h.run()
    [pending] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    event_type = {"declined": "approval_decided", "withdrawn": "approval_withdrawn", "expired": "approval_expired"}

    def die_after_the_approvals_event(state, event):
        if event.type == event_type[ending]:
            raise Crash()

    h.orch.on_event = die_after_the_approvals_event
    with pytest.raises(Crash):
        if ending == "declined":
            h.orch.decide_approval(APPROVER, pending.approval_id, False, "not today")
        elif ending == "withdrawn":
            h.orch.withdraw_approval(AGENT, run, pending.approval_id, "changed my mind")
        else:
            h.clock.advance(10 ** 6)
            h.orch.list_approvals(APPROVER, run)
    h.restart()
    [observation] = h.orch.get_run(AGENT, run).trajectory
    expected = {"declined": (f"declined by {APPROVER.subject}: not today", None),
                "withdrawn": (f"withdrawn by {AGENT.subject}: changed my mind", "approval_withdrawn"),
                "expired": ("approval expired", "approval_expired")}[ending]
    assert (observation.call_id, observation.status, observation.executed) == (pending.call_id, S.DECLINED, False)
    assert (observation.error, observation.error_class) == expected
    assert observation.verdict_path[-1] == f"approval:{ending}"
    assert h.backend.starts == 0 and h.emulator.tools() == []
    events = [e.type for e in h.store.read(run)]
    assert events[-2:] == [event_type[ending], "observation"]
    h.restart()  # a second restart finds nothing left to do
    assert [e.type for e in h.store.read(run)] == events


def test_an_approval_is_found_through_the_store_after_a_restart(tmp_path):
    h = Harness(tmp_path)
    run = h.run()
    [pending] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    h.restart()
    approval = h.orch.decide_approval(APPROVER, pending.approval_id, True, "ok")
    assert approval.status.value == "used" and h.backend.starts == 1


def _crashed_mid_credit(h, run):
    """The log a server leaves when it dies after dispatching a credit, before its completion."""
    h.store.append(run, "batch_started", {"batch_id": "b", "turn": 1, "calls": [
        {"call_id": "pay", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}}]})
    h.store.append(run, "dispatch_started", {"call_id": "pay", "tool": "credit", "mutates": True,
                                             "idempotency_key": "key-1",
                                             "arguments": {"account": "acme-9", "amount": 50}})


def test_reconciliation_finds_the_effect_and_records_it_without_running_again(tmp_path):
    h = Harness(tmp_path)
    record = {"account": "acme-9", "amount": 50, "idempotency_key": "key-1"}
    h.emulator.overrides["credit_lookup"] = lambda call: {"found": True, "record": record}
    run = h.run()
    _crashed_mid_credit(h, run)
    h.restart()
    [obs] = h.orch.get_run(AGENT, run).trajectory
    assert obs.status is S.EXECUTED and obs.content == {"reconciled": True, "found": True, "record": record}
    assert "recovery:reconciled:found" in obs.verdict_path
    assert h.emulator.tools() == ["credit_lookup"]  # asked the receiver; never credited again
    assert h.emulator.log[0].arguments == {"idempotency_key": "key-1"}


def test_reconciliation_that_finds_nothing_runs_the_call_once_with_the_same_key(tmp_path):
    h = Harness(tmp_path)
    h.emulator.overrides["credit_lookup"] = lambda call: {"found": False}
    run = h.run()
    _crashed_mid_credit(h, run)
    h.restart()
    [obs] = h.orch.get_run(AGENT, run).trajectory
    assert obs.status is S.EXECUTED and "recovery:reconciled:absent" in obs.verdict_path
    assert h.emulator.tools() == ["credit_lookup", "credit"]
    assert h.emulator.log[1].idempotency_key == "key-1"
    h.restart()
    assert h.emulator.tools() == ["credit_lookup", "credit"]  # and never again


def test_reconciliation_whose_lookup_fails_asks_a_person(tmp_path):
    h = Harness(tmp_path, limits={"max_attempts": 1})
    h.emulator.overrides["credit_lookup"] = lambda call: error_result("fatal", "ledger unreachable")
    run = h.run()
    _crashed_mid_credit(h, run)
    h.restart()
    [obs] = h.orch.get_run(AGENT, run).trajectory
    assert obs.status is S.PENDING_APPROVAL and obs.error_class == "reconciliation_needed"
    assert "ledger unreachable" in obs.error
    assert h.emulator.tools() == ["credit_lookup"]


def test_a_run_whose_writer_died_is_adopted_when_its_lease_expires(tmp_path):
    """Another instance (another owner) admitted a call and died holding the run's lease: this
    instance leaves the run alone while the lease lives, and recovers it after."""
    h = Harness(tmp_path)
    run = h.run()
    lease = h.store.acquire_lease(run, "elsewhere:1:dead", 3600)
    h.store.append(run, "batch_started", {"batch_id": "b", "turn": 1, "calls": [
        {"call_id": "r", "tool": "echo", "arguments": {"text": "hi"}}]}, lease=lease)
    h.store.append(run, "call_decided", {"call_id": "r", "tool": "echo", "arguments": {"text": "hi"},
                                         "verdict": "allow", "verdict_path": ["admitted"]}, lease=lease)
    assert h.orch.adopt_orphans() == 0 and h.backend.starts == 0  # its writer may still be alive
    h.store.release_lease(lease)  # what expiry does
    assert h.orch.adopt_orphans() == 1
    [obs] = h.orch.get_run(AGENT, run).trajectory
    assert obs.status is S.EXECUTED and h.emulator.tools() == ["echo"]
