"""The agent loop (ringfence.agent) through the real server on a real loopback port: the
real Orchestrator and SQLite log behind BackgroundServer, a FakeBackend speaking the runner
protocol, and a ScriptedModel in place of a language model.

Every terminal outcome is reached and asserted with its turn count and token accounting: the
loop's own (completed, budget_exhausted by turns and by cost, loop_detected) and the server's
(guardrail_stop, loop_detected and budget_exhausted by its own limits, deadline_exceeded,
cancelled, error, uncertain).
"""

from __future__ import annotations

from itertools import pairwise

import pytest
from api_support import TOKENS, RealCore, fake_backend, make_config, runner_result
from control_support import FakeClock

from ringfence import Approver, Client, RetryPolicy, Unavailable
from ringfence.agent import (
    AgentLoop,
    AgentResult,
    ModelTurn,
    ScriptedModel,
    TokenUsage,
    ToolCall,
    batch_id_for,
    estimate_tokens,
)
from ringfence.model import ObservationStatus, Role, RunOutcome, RunStatus
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.store import SqliteEventStore
from ringfence_server.sandbox.fake import FakeBackend

AGENT = TOKENS[("acme", Role.AGENT)]
APPROVER = TOKENS[("acme", Role.APPROVER)]
FAST = RetryPolicy(attempts=4, initial_backoff_s=0.0, max_backoff_s=0.0, jitter_s=0.0)
PRIVATE_KEY = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq3\n-----END RSA PRIVATE KEY-----"


def say(text: str, call_id: str = "call_0") -> ModelTurn:
    return ModelTurn.calls(ToolCall("echo", {"text": text}, call_id))


def distinct_echoes(n: int = 20) -> list:
    """A model that never stops and never repeats itself: echo "step <turn>" each turn."""
    return [lambda ctx: say(f"step {ctx.turn}")] * n


class Stack:
    """Orchestrator + server (+ clients) over one SQLite file in tmp_path."""

    def __init__(self, tmp_path, limits=None, backend=None, clock=None) -> None:
        self.config = make_config(tmp_path / "state", limits)
        self.backend = backend or fake_backend()
        self.clock = clock
        self.core: RealCore | None = None
        self.start()

    def start(self) -> None:
        if self.clock is None:
            self.core = RealCore(self.config, self.backend)
            self.store, self.orchestrator = self.core.store, self.core.orchestrator
        else:  # the run deadline needs a clock the test can move
            self.core = None
            self.store = SqliteEventStore(self.config.db_path, clock=self.clock)
            self.orchestrator = Orchestrator.from_config(self.config, self.backend, self.store, clock=self.clock)
        self.server = BackgroundServer(self.orchestrator, self.config).start()
        self.agent = Client(self.server.address, AGENT, retry=FAST)
        self.approver = Client(self.server.address, APPROVER, retry=FAST)

    def stop(self) -> None:
        self.agent.close()
        self.approver.close()
        self.server.stop()
        self.orchestrator.close()
        self.store.close()

    def restart(self) -> None:
        self.stop()
        self.start()

    def loop(self, model, *, max_turns: int = 10, max_cost: float = 1e9, cost_per_input_token: float = 1e-6,
             cost_per_output_token: float = 4e-6, goal: str = "say hello, then stop", **kwargs) -> AgentLoop:
        return AgentLoop(self.agent, model, max_turns=max_turns, max_cost=max_cost,
                         cost_per_input_token=cost_per_input_token, cost_per_output_token=cost_per_output_token,
                         goal=goal, **kwargs)

    def batch_ids(self, run_id: str) -> list[str]:
        return [e.data["batch_id"] for e in self.store.read(run_id) if e.type == "batch_started"]


@pytest.fixture
def stack(tmp_path, request):
    s = Stack(tmp_path, getattr(request, "param", None))
    yield s
    s.stop()


def assert_honest_accounting(result: AgentResult, model: ScriptedModel, loop: AgentLoop) -> None:
    """Input tokens are the estimate of the whole context of each turn (no usage reported by
    these scripts); the context, and so the input, grows every turn; the cost adds up."""
    assert len(result.input_tokens) == len(result.output_tokens) == result.turns == len(model.contexts)
    assert list(result.input_tokens) == [estimate_tokens(c.render()) for c in model.contexts]
    assert all(a < b for a, b in pairwise(result.input_tokens)), result.input_tokens
    assert [c.turn for c in model.contexts] == list(range(1, result.turns + 1))
    expected = sum(i * loop.cost_per_input_token + o * loop.cost_per_output_token
                   for i, o in zip(result.input_tokens, result.output_tokens, strict=True))
    assert result.total_cost == pytest.approx(expected)


# --- the loop's own outcomes ------------------------------------------------------------------


def test_completed_the_observations_feed_the_next_turn(stack):
    def second(ctx):
        # What turn 1's tool returned is in turn 2's context, under the model's own call id.
        assert ctx.results() == [{"id": "call_0", "name": "echo", "status": "executed", "executed": True,
                                  "content": {"text": "hello"}, "error": None, "error_class": None,
                                  "trust": "data"}]
        return say("hello again")  # the same call id again: the loop keeps wire ids unique

    model = ScriptedModel([say("hello"), second, ModelTurn.answer("I said hello twice.")])
    loop = stack.loop(model, run_id="hello-1")
    result = loop.run()
    assert (result.outcome, result.ended_by, result.turns) == (RunOutcome.COMPLETED, "agent", 3)
    assert result.final_answer == "I said hello twice."
    assert [o.content for o in result.trajectory] == [{"text": "hello"}, {"text": "hello again"}]
    assert [o.call_id for o in result.trajectory] == ["t1.call_0", "t2.call_0"]
    assert result.run.status is RunStatus.FINISHED and result.run.outcome is RunOutcome.COMPLETED
    assert_honest_accounting(result, model, loop)
    # Output tokens of a turn without reported usage: the estimate of what the model said.
    assert result.output_tokens[2] == estimate_tokens("I said hello twice.")
    # One batch per turn, its id derived from the run id and the turn.
    assert stack.batch_ids("hello-1") == [batch_id_for("hello-1", 1), batch_id_for("hello-1", 2)]
    assert batch_id_for("hello-1", 2) == "hello-1.t2"
    assert stack.backend.starts == 2


def test_a_turns_calls_go_as_one_batch(stack):
    model = ScriptedModel([
        ModelTurn.calls(ToolCall("echo", {"text": "a"}, "x"), ToolCall("echo", {"text": "b"}, "y")),
        ModelTurn.answer("done"),
    ])
    result = stack.loop(model, run_id="two-calls").run()
    assert result.outcome is RunOutcome.COMPLETED
    assert len(stack.batch_ids("two-calls")) == 1
    assert [o.call_id for o in result.trajectory] == ["t1.x", "t1.y"]
    assert [r["id"] for r in model.contexts[1].results()] == ["x", "y"]


def test_on_turn_sees_each_settled_turn_once(stack):
    seen = []
    model = ScriptedModel([say("one"), say("two"), ModelTurn.answer("done")])
    result = stack.loop(model, run_id="progress-1", on_turn=seen.append).run()
    assert result.outcome is RunOutcome.COMPLETED
    # One record per turn that sent calls (the final answer sends none), with its observations.
    assert [(r.turn, [c.name for c in r.calls], [o.status.value for o in r.observations]) for r in seen] == [
        (1, ["echo"], ["executed"]), (2, ["echo"], ["executed"])]
    assert [o.content for r in seen for o in r.observations] == [{"text": "one"}, {"text": "two"}]


def test_budget_exhausted_by_the_turn_ceiling(stack):
    model = ScriptedModel(distinct_echoes())
    loop = stack.loop(model, max_turns=2)
    result = loop.run()
    assert (result.outcome, result.ended_by, result.turns) == (RunOutcome.BUDGET_EXHAUSTED, "agent", 2)
    assert "turn ceiling" in result.reason
    assert len(result.trajectory) == 2 and stack.backend.starts == 2
    # The loop stops the run on the server (no RPC records a client's reason: it is cancelled).
    assert result.run.status is RunStatus.FINISHED and result.run.outcome is RunOutcome.CANCELLED
    assert_honest_accounting(result, model, loop)


def test_budget_exhausted_by_the_cost_ceiling(stack):
    # Output tokens cost 1 each, input nothing; each turn reports 10 output tokens: after turn 3
    # the run has spent 30 >= 25, checked at the boundary before turn 4.
    model = ScriptedModel([lambda ctx: ModelTurn.calls(ToolCall("echo", {"text": f"n{ctx.turn}"}),
                                                       usage=TokenUsage(input_tokens=1, output_tokens=10))] * 10)
    loop = stack.loop(model, max_cost=25.0, cost_per_input_token=0.0, cost_per_output_token=1.0)
    result = loop.run()
    assert (result.outcome, result.ended_by, result.turns) == (RunOutcome.BUDGET_EXHAUSTED, "agent", 3)
    assert "cost ceiling" in result.reason and result.total_cost == 30.0
    assert result.output_tokens == (10, 10, 10)
    # The model reported 1 input token per turn; the loop counts its whole context instead.
    assert_honest_accounting(result, model, loop)


def test_reported_usage_is_believed_only_upwards(stack):
    model = ScriptedModel([
        ModelTurn.calls(ToolCall("echo", {"text": "a"}), usage=TokenUsage(input_tokens=0, output_tokens=3)),
        ModelTurn.answer("done", usage=TokenUsage(input_tokens=50_000, output_tokens=7)),
    ])
    result = stack.loop(model).run()
    assert result.input_tokens == (estimate_tokens(model.contexts[0].render()), 50_000)
    assert result.output_tokens == (3, 7)


def test_loop_detected_by_the_loop_before_the_repeat_is_sent(stack):
    # The same call three times (keys in another order is still the same call).
    model = ScriptedModel([
        ModelTurn.calls(ToolCall("echo", {"text": "again", "n": 1}, "a")),
        ModelTurn.calls(ToolCall("echo", {"n": 1, "text": "again"}, "b")),
        ModelTurn.calls(ToolCall("echo", {"text": "again", "n": 1}, "c")),
    ])
    loop = stack.loop(model)
    result = loop.run()
    assert (result.outcome, result.ended_by, result.turns) == (RunOutcome.LOOP_DETECTED, "agent", 3)
    assert "proposed 3 times" in result.reason
    assert stack.backend.starts == 2  # the third was never sent
    assert result.run.outcome is RunOutcome.CANCELLED
    assert_honest_accounting(result, model, loop)


@pytest.mark.parametrize("max_turns, outcome", [(3, RunOutcome.LOOP_DETECTED), (2, RunOutcome.BUDGET_EXHAUSTED)])
def test_loop_detection_beats_the_turn_ceiling(stack, max_turns, outcome):
    """With max_turns=3 the third turn is both the last allowed and the third repeat: loop
    detection wins. With max_turns=2 the ceiling comes first, before any third repeat."""
    model = ScriptedModel([say("same")] * 5)
    result = stack.loop(model, max_turns=max_turns).run()
    assert (result.outcome, result.turns) == (outcome, max_turns)


# --- outcomes decided by the server -------------------------------------------------------------


def test_guardrail_stop(stack):
    model = ScriptedModel([say("fine"), say(PRIVATE_KEY), ModelTurn.answer("never reached")])
    loop = stack.loop(model)
    result = loop.run()
    assert (result.outcome, result.ended_by, result.turns) == (RunOutcome.GUARDRAIL_STOP, "server", 2)
    assert result.trajectory[-1].status is ObservationStatus.HALTED and result.final_answer is None
    assert stack.backend.starts == 1
    assert_honest_accounting(result, model, loop)


def test_loop_detected_by_the_server(stack):
    # The loop's own detector is set higher: the server's (HALT on the third) ends the run.
    model = ScriptedModel([say("same")] * 5)
    loop = stack.loop(model, loop_threshold=10)
    result = loop.run()
    assert (result.outcome, result.ended_by, result.turns) == (RunOutcome.LOOP_DETECTED, "server", 3)
    assert result.trajectory[-1].status is ObservationStatus.HALTED
    assert stack.backend.starts == 2
    assert_honest_accounting(result, model, loop)


@pytest.mark.parametrize("stack", [{"max_turns": 2}], indirect=True)
def test_budget_exhausted_by_the_servers_ceiling(stack):
    model = ScriptedModel(distinct_echoes())
    loop = stack.loop(model, max_turns=10)
    result = loop.run()
    assert (result.outcome, result.ended_by, result.turns) == (RunOutcome.BUDGET_EXHAUSTED, "server", 3)
    assert "turn ceiling" in result.reason and stack.backend.starts == 2
    assert_honest_accounting(result, model, loop)


def test_deadline_exceeded(tmp_path):
    clock = FakeClock()
    stack = Stack(tmp_path, {"run_deadline_s": 60.0}, clock=clock)
    try:
        def late(ctx):
            clock.advance(61)  # the model took longer than the run may last
            return say("too late")

        model = ScriptedModel([say("in time"), late, ModelTurn.answer("never reached")])
        loop = stack.loop(model)
        result = loop.run()
        assert (result.outcome, result.ended_by, result.turns) == (RunOutcome.DEADLINE_EXCEEDED, "server", 2)
        assert stack.backend.starts == 1
        assert_honest_accounting(result, model, loop)
    finally:
        stack.stop()


def test_cancelled(stack):
    def after_a_cancel(ctx):
        stack.approver.cancel_run(ctx.run_id)  # a person pulls the kill switch between turns
        return say("still going")

    model = ScriptedModel([say("one"), after_a_cancel, ModelTurn.answer("never reached")])
    loop = stack.loop(model)
    result = loop.run()
    assert (result.outcome, result.ended_by, result.turns) == (RunOutcome.CANCELLED, "server", 2)
    assert len(result.trajectory) == 1 and stack.backend.starts == 1
    assert_honest_accounting(result, model, loop)


def test_error(tmp_path):
    def handler(request):
        if b"explode" in request.stdin:
            raise ZeroDivisionError("the dispatch path itself blows up")
        return runner_result(request)

    stack = Stack(tmp_path, backend=FakeBackend(handler))
    try:
        model = ScriptedModel([say("fine"), say("explode"), ModelTurn.answer("never reached")])
        loop = stack.loop(model)
        result = loop.run()
        assert (result.outcome, result.ended_by, result.turns) == (RunOutcome.ERROR, "server", 2)
        assert_honest_accounting(result, model, loop)
    finally:
        stack.stop()


def test_uncertain(stack):
    run_id = stack.agent.start_run("crash mid-write", "crashed-1").run_id
    # The process died after dispatching a write and before recording its completion.
    stack.store.append(run_id, "batch_started", {"batch_id": "b", "turn": 1, "calls": [
        {"call_id": "w", "tool": "write_note", "arguments": {"name": "a", "text": "b"}}]})
    stack.store.append(run_id, "dispatch_started", {"call_id": "w", "tool": "write_note", "mutates": True,
                                                    "idempotency_key": "k"})
    stack.restart()
    model = ScriptedModel([ModelTurn.answer("all done, I think")])
    result = stack.loop(model, run_id=run_id, goal="crash mid-write").run()
    # The model says it is done; the server knows a write may or may not have happened.
    assert (result.outcome, result.ended_by, result.turns) == (RunOutcome.UNCERTAIN, "server", 1)
    assert result.final_answer == "all done, I think"
    assert stack.backend.starts == 0


# --- approvals, retries -----------------------------------------------------------------------


@pytest.mark.parametrize("approve", [True, False])
def test_an_ask_is_decided_by_the_approver_helper_before_the_next_turn(stack, approve):
    pay = ToolCall("credit", {"account": "acme-9", "amount": 50}, "pay")
    model = ScriptedModel([ModelTurn.calls(pay), ModelTurn.answer("paid" if approve else "not paid")])
    with Approver(stack.approver, lambda a: (approve, "checked by the helper")) as helper:
        result = stack.loop(model).run()
    assert result.outcome is RunOutcome.COMPLETED and len(helper.decided) == 1
    [obs] = result.trajectory
    [seen] = model.contexts[1].results()
    if approve:
        assert obs.status is ObservationStatus.EXECUTED and obs.content["arguments"]["amount"] == 50
        assert seen["status"] == "executed"
        assert stack.backend.starts == 1
    else:
        assert obs.status is ObservationStatus.DECLINED and "checked by the helper" in obs.error
        assert seen["status"] == "declined" and "checked by the helper" in seen["error"]
        assert stack.backend.starts == 0


def test_an_undecided_ask_is_shown_to_the_model_as_pending(stack):
    pay = ToolCall("credit", {"account": "acme-9", "amount": 5}, "pay")
    model = ScriptedModel([ModelTurn.calls(pay), ModelTurn.answer("waiting on a human")])
    result = stack.loop(model, approval_timeout_s=0.5).run()
    assert model.contexts[1].results()[0]["status"] == "pending_approval"
    assert result.outcome is RunOutcome.COMPLETED
    # Finishing the run declined what still waited.
    assert result.run.trajectory[0].status is ObservationStatus.DECLINED


def test_a_lost_batch_response_is_retried_with_the_turns_batch_id(tmp_path):
    class LoseFirstResponse:
        def __init__(self, orchestrator):
            self._orchestrator = orchestrator
            self.sent = []

        def __getattr__(self, name):
            return getattr(self._orchestrator, name)

        def submit_batch(self, p, run_id, calls, batch_id=None):
            self.sent.append(batch_id)
            observations = self._orchestrator.submit_batch(p, run_id, calls, batch_id)
            if len(self.sent) == 1:
                raise Unavailable("connection lost after the batch ran (simulated)")
            return observations

    config = make_config(tmp_path / "state")
    with RealCore(config, fake_backend()) as core:
        flaky = LoseFirstResponse(core.orchestrator)
        with BackgroundServer(flaky, config) as s, Client(s.address, AGENT, retry=FAST) as c:
            model = ScriptedModel([say("once"), ModelTurn.answer("done")])
            loop = AgentLoop(c, model, max_turns=5, max_cost=1.0, cost_per_input_token=0.0,
                             cost_per_output_token=0.0, goal="retry safely", run_id="retry-1")
            result = loop.run()
    assert result.outcome is RunOutcome.COMPLETED
    assert flaky.sent == ["retry-1.t1", "retry-1.t1"]
    assert len(core.backend.requests) == 1
    assert result.trajectory[0].status is ObservationStatus.EXECUTED


def test_model_turns_validate_themselves():
    with pytest.raises(ValueError):
        ModelTurn()  # neither calls nor an answer
    with pytest.raises(ValueError):
        ModelTurn(tool_calls=(ToolCall("echo"),), final_answer="both")
    with pytest.raises(ValueError):
        TokenUsage(input_tokens=-1)
    assert estimate_tokens("") == 0 and estimate_tokens("abcd") == 1 and estimate_tokens("abcde") == 2
    assert estimate_tokens("é" * 2) == 1  # bytes, not characters
    assert batch_id_for("r" * 100, 7).endswith(".t7") and len(batch_id_for("r" * 100, 7)) <= 100


def test_a_script_that_runs_out_says_so(stack):
    from ringfence.agent import ScriptExhausted

    with pytest.raises(ScriptExhausted):
        stack.loop(ScriptedModel([say("one")])).run()
