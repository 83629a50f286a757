"""Every named run outcome (and an approval surviving a restart), forced by a scripted client
through the real gRPC server on a real port: the real Orchestrator and SQLite log, a
FakeBackend that speaks the runner protocol and a fake clock, so no container and no wall
time. The client must see the outcome in GetRun and as the last event of WatchRun."""

from __future__ import annotations

import pytest
from api_support import TOKENS, tenants_table
from control_support import FakeClock, ToolEmulator

from ringfence import Client
from ringfence.errors import FailedPrecondition
from ringfence.model import ObservationStatus, Role, RunOutcome
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.config import load_config
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.registry import Registry
from ringfence_server.control.store.sqlite import SqliteEventStore
from ringfence_server.control.tools import BUILTIN_DIR
from ringfence_server.sandbox.fake import FakeBackend

AGENT = TOKENS[("acme", Role.AGENT)]
APPROVER = TOKENS[("acme", Role.APPROVER)]
PRIVATE_KEY = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq3\n-----END RSA PRIVATE KEY-----"


class Stack:
    """Orchestrator + server over one SQLite file; `restart()` is a crash and a new process."""

    def __init__(self, tmp_path, limits=None) -> None:
        self.clock = FakeClock()
        self.emulator = ToolEmulator()
        self.backend = FakeBackend(self.emulator)
        self.config = load_config(overrides={
            "state_dir": str(tmp_path), "tenants": tenants_table(), "limits": limits or {},
            "policy": {"autonomy": "autonomous"},
        })
        self.start()

    def start(self) -> None:
        self.store = SqliteEventStore(self.config.db_path, clock=self.clock)
        self.orchestrator = Orchestrator.from_config(
            self.config, self.backend, self.store, clock=self.clock, sleep=self.clock.sleep,
            image_digest=lambda name: "sha256:" + "ab" * 32, registry=Registry.from_dir(BUILTIN_DIR))
        self.server = BackgroundServer(self.orchestrator, self.config).start()

    def stop(self) -> None:
        self.server.stop()
        self.orchestrator.close()
        self.store.close()

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self, token: str = AGENT) -> Client:
        return Client(self.server.address, token)


@pytest.fixture
def stack(tmp_path, request):
    s = Stack(tmp_path, getattr(request, "param", None))
    yield s
    s.stop()


def echo(call_id: str, text: str = "hi") -> dict:
    return {"call_id": call_id, "tool": "echo", "arguments": {"text": text}}


def outcome_seen(client: Client, run_id: str) -> RunOutcome:
    view = client.get_run(run_id)
    assert view.outcome is not None, f"{run_id} has not finished"
    events = list(client.watch_run(run_id, 0))
    assert events[-1].type == "run_finished"
    assert events[-1].data["outcome"] == view.outcome.value
    return view.outcome


def test_completed(stack):
    with stack.client() as c:
        run = c.start_run("finish cleanly").run_id
        [obs] = c.submit_batch(run, [echo("a")])
        assert obs.status is ObservationStatus.EXECUTED
        c.finish_run(run)
        assert outcome_seen(c, run) is RunOutcome.COMPLETED


def test_loop_detected(stack):
    with stack.client() as c:
        run = c.start_run("repeat itself").run_id
        c.submit_batch(run, [echo("a", "same")])
        c.submit_batch(run, [echo("b", "same")])
        [third] = c.submit_batch(run, [echo("c", "same")])
        assert third.status is ObservationStatus.HALTED
        assert outcome_seen(c, run) is RunOutcome.LOOP_DETECTED
    assert stack.backend.starts == 2


def test_guardrail_stop(stack):
    with stack.client() as c:
        run = c.start_run("leak a key").run_id
        [obs] = c.submit_batch(run, [echo("a", PRIVATE_KEY)])
        assert obs.status is ObservationStatus.HALTED
        assert outcome_seen(c, run) is RunOutcome.GUARDRAIL_STOP
    assert stack.backend.starts == 0


@pytest.mark.parametrize("stack", [{"max_turns": 1}], indirect=True)
def test_budget_exhausted(stack):
    with stack.client() as c:
        run = c.start_run("too many turns").run_id
        c.submit_batch(run, [echo("a")])
        [late] = c.submit_batch(run, [echo("b", "other")])
        assert late.status is ObservationStatus.HALTED
        assert outcome_seen(c, run) is RunOutcome.BUDGET_EXHAUSTED
    assert stack.backend.starts == 1


@pytest.mark.parametrize("stack", [{"run_deadline_s": 60.0}], indirect=True)
def test_deadline_exceeded(stack):
    with stack.client() as c:
        run = c.start_run("too slow").run_id
        c.submit_batch(run, [echo("a")])
        stack.clock.advance(61)
        [late] = c.submit_batch(run, [echo("b", "other")])
        assert late.status is ObservationStatus.HALTED
        assert outcome_seen(c, run) is RunOutcome.DEADLINE_EXCEEDED


def test_cancelled(stack):
    with stack.client() as c, stack.client(APPROVER) as approver:
        run = c.start_run("stop me").run_id
        approver.cancel_run(run)
        with pytest.raises(FailedPrecondition):
            c.submit_batch(run, [echo("a")])
        assert outcome_seen(c, run) is RunOutcome.CANCELLED
    assert stack.backend.starts == 0


def test_error(stack):
    stack.emulator.overrides["echo"] = lambda call: 1 / 0  # the dispatch path itself blows up
    with stack.client() as c:
        run = c.start_run("break").run_id
        c.submit_batch(run, [echo("a")])
        assert outcome_seen(c, run) is RunOutcome.ERROR


def test_uncertain_after_a_crash_between_effect_and_record(stack):
    with stack.client() as c:
        run = c.start_run("crash mid-write").run_id
    # The process died after dispatching a write and before recording its completion.
    stack.store.append(run, "batch_started", {"batch_id": "b", "turn": 1, "calls": [
        {"call_id": "w", "tool": "write_note", "arguments": {"name": "a", "text": "b"}}]})
    stack.store.append(run, "dispatch_started", {"call_id": "w", "tool": "write_note", "mutates": True,
                                                 "idempotency_key": "k"})
    stack.restart()
    with stack.client() as c:
        # No look-up declared: a reconciliation task; left as it is, the run ends uncertain.
        [obs] = c.get_run(run).trajectory
        assert obs.error_class == "reconciliation_needed"
        c.finish_run(run)
        assert outcome_seen(c, run) is RunOutcome.UNCERTAIN
        [obs] = c.get_run(run).trajectory
        assert obs.error_class == "uncertain"
    assert stack.backend.starts == 0  # never re-run: the effect may already have happened


def test_an_approval_given_after_a_restart_resumes_the_same_call(stack):
    """The ASK is durable: the server dies while the call waits, a new process on the same log
    gets the approver's decision, and exactly that call (same id, same arguments) runs once."""
    pay = {"call_id": "pay", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}}
    with stack.client() as c:
        run = c.start_run("credit acme-9").run_id
        [obs] = c.submit_batch(run, [pay])
        assert obs.status is ObservationStatus.PENDING_APPROVAL
    stack.restart()
    with stack.client(APPROVER) as approver, stack.client() as c:
        [pending] = approver.list_approvals(run)
        assert (pending.call_id, dict(pending.arguments)) == ("pay", {"account": "acme-9", "amount": 50})
        approver.decide_approval(pending.approval_id, True, "ok")
        [done] = c.get_run(run).trajectory
        assert done.call_id == "pay" and done.status is ObservationStatus.EXECUTED
        assert done.content["credited"] == 50
    assert [call.arguments for call in stack.emulator.log] == [{"account": "acme-9", "amount": 50}]
