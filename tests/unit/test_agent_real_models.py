"""The loop's rules for real models, for both drivers (AgentLoop on Client, AsyncAgentLoop on
AsyncClient), through the real server on a real loopback port: the real Orchestrator and SQLite
log behind BackgroundServer, a FakeBackend speaking the runner protocol, and a ScriptedModel (the
control) standing in for a provider adapter's turns.

What reached the server is counted AT the server (a counting wrapper around the Orchestrator,
and the FakeBackend's container starts), never inferred from what the loop says it did.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from api_support import TOKENS, RealCore, fake_backend, make_config, runner_result
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from ringfence import Approver, AsyncClient, Client, InvalidArgument, RetryPolicy
from ringfence._loop import NOT_RUN, REPAIR_HINT, refused_batch
from ringfence.agent import (
    AgentContext,
    AgentLoop,
    AgentResult,
    AsyncAgentLoop,
    ModelTurn,
    ScriptedModel,
    StopReason,
    TokenUsage,
    ToolCall,
    batch_id_for,
)
from ringfence.errors import FieldViolation
from ringfence.memory import MemoryKind, Provenance, SqliteMemoryStore
from ringfence.model import ObservationStatus, ProposedCall, Role, RunOutcome, RunStatus
from ringfence.models.errors import ModelRequestRefused, ModelUnavailable
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.sandbox.fake import FakeBackend

AGENT = TOKENS[("acme", Role.AGENT)]
APPROVER = TOKENS[("acme", Role.APPROVER)]
FAST = RetryPolicy(attempts=4, initial_backoff_s=0.0, max_backoff_s=0.0, jitter_s=0.0)
DRIVERS = ["sync", "async"]
COUNTED = ("start_run", "list_tools", "submit_batch", "get_run", "finish_run", "cancel_run", "watch_run")


def say(text: str, call_id: str = "call_0") -> ModelTurn:
    return ModelTurn.calls(ToolCall("echo", {"text": text}, call_id))


class Counting:
    """The Orchestrator, with a count of each RunService method the server's edge reached."""

    def __init__(self, orchestrator: Any) -> None:
        self._orchestrator = orchestrator
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._orchestrator, name)
        if name not in COUNTED:
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


class Stack:
    """Orchestrator (counted) + server + a sync agent client and an approver, over tmp_path."""

    def __init__(self, tmp_path, limits=None, backend=None) -> None:
        self.config = make_config(tmp_path / "state", limits)
        self.backend = backend or fake_backend()
        self.core = RealCore(self.config, self.backend)
        self.counting = Counting(self.core.orchestrator)
        self.server = BackgroundServer(self.counting, self.config).start()
        self.agent = Client(self.server.address, AGENT, retry=FAST)
        self.approver = Client(self.server.address, APPROVER, retry=FAST)

    def close(self) -> None:
        self.agent.close()
        self.approver.close()
        self.server.stop()
        self.core.close()

    @property
    def received(self) -> Counter[str]:
        return self.counting.calls

    def batches(self, run_id: str) -> list[dict]:
        return [dict(e.data) for e in self.core.store.read(run_id) if e.type == "batch_started"]

    def run(self, driver: str, model: Any, **kwargs: Any) -> AgentResult:
        """One run of the loop with `driver`: the same arguments for both."""
        options: dict[str, Any] = {"max_turns": 10, "max_cost": 1e9, "cost_per_input_token": 1e-6,
                                   "cost_per_output_token": 4e-6, "goal": "say hello, then stop"} | kwargs
        if driver == "sync":
            return AgentLoop(self.agent, model, **options).run()

        async def main() -> AgentResult:
            async with AsyncClient(self.server.address, AGENT, retry=FAST) as c:
                return await AsyncAgentLoop(c, model, **options).run()

        return asyncio.run(main())


@pytest.fixture
def stack(tmp_path, request):
    s = Stack(tmp_path, getattr(request, "param", None))
    yield s
    s.close()


# --- both drivers, the same run -------------------------------------------------------------------


def comparable(result: AgentResult) -> tuple:
    return (result.outcome, result.ended_by, result.reason, result.turns, result.final_answer, result.input_tokens,
            result.output_tokens, result.total_cost, result.context_tokens,
            [(o.call_id, o.status, o.executed, o.content, o.error) for o in result.trajectory])


@pytest.mark.parametrize("script", ["completed", "loop_detected", "guardrail_stop", "turn_ceiling", "approval",
                                    "memory_and_compaction"])
def test_both_drivers_give_the_same_result(tmp_path, script) -> None:
    """The same script through AgentLoop and AsyncAgentLoop, each against its own fresh server:
    the same outcome, reason, turns, tokens, cost and observations (one core, two drivers)."""
    long = lambda ctx: say(f"step {ctx.turn} " + "x" * 1500)  # noqa: E731 - a one-line helper reads better as a lambda here
    scripts: dict[str, Callable[[], list[Any]]] = {
        "completed": lambda: [say("hello"), say("again"), ModelTurn.answer("said it twice")],
        "memory_and_compaction": lambda: [long] * 5 + [ModelTurn.answer("done")],
        "loop_detected": lambda: [say("same")] * 4,
        "guardrail_stop": lambda: [say("fine"), say("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq3\n"
                                                     "-----END RSA PRIVATE KEY-----"), ModelTurn.answer("no")],
        "turn_ceiling": lambda: [lambda ctx: say(f"step {ctx.turn}")] * 5,
        "approval": lambda: [ModelTurn.calls(ToolCall("credit", {"account": "acme-9", "amount": 5}, "pay")),
                             ModelTurn.answer("paid")],
    }
    results, contexts = [], []
    for driver in DRIVERS:
        s = Stack(tmp_path / driver)
        memory = SqliteMemoryStore(tmp_path / f"{driver}-memory.sqlite3")
        try:
            memory.remember("acme", MemoryKind.SEMANTIC, "say hello politely", Provenance("earlier", None, False))
            options: dict[str, Any] = {"max_turns": 3}
            if script == "memory_and_compaction":
                options = {"max_turns": 8, "memory": memory.for_tenant("acme"), "context_budget_tokens": 1500}
            model = ScriptedModel(scripts[script]())
            with Approver(s.approver, lambda a: (True, "fine by the helper")):
                results.append(s.run(driver, model, run_id=f"same-{script}", **options))
            contexts.append([c.render() for c in model.contexts])
        finally:
            memory.close()
            s.close()
    sync, in_async = results
    assert comparable(sync) == comparable(in_async)
    assert contexts[0] == contexts[1]
    expected = {"completed": RunOutcome.COMPLETED, "loop_detected": RunOutcome.LOOP_DETECTED,
                "guardrail_stop": RunOutcome.GUARDRAIL_STOP, "turn_ceiling": RunOutcome.BUDGET_EXHAUSTED,
                "approval": RunOutcome.COMPLETED, "memory_and_compaction": RunOutcome.COMPLETED}[script]
    assert sync.outcome is expected
    if script == "approval":
        assert sync.trajectory[0].status is ObservationStatus.EXECUTED
    if script == "memory_and_compaction":
        assert sync.compactions == in_async.compactions >= 1
        assert "say hello politely" in contexts[1][-1]


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_undecided_ask_is_shown_to_the_model_as_pending(stack, driver):
    pay = ToolCall("credit", {"account": "acme-9", "amount": 5}, "pay")
    model = ScriptedModel([ModelTurn.calls(pay), ModelTurn.answer("waiting on a human")])
    result = stack.run(driver, model, approval_timeout_s=0.5)
    assert model.contexts[1].results()[0]["status"] == "pending_approval"
    assert result.outcome is RunOutcome.COMPLETED and stack.received["watch_run"] == 1
    assert result.run.trajectory[0].status is ObservationStatus.DECLINED  # finishing declined what still waited


# --- a response cut by the length limit ------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_truncated_turn_ends_the_run_model_truncated_never_completed(stack, driver):
    # Turn 2 is what an adapter returns for a response cut mid tool call; had the loop taken it
    # for "no calls", turn 3's answer would complete the run.
    model = ScriptedModel([say("one"),
                           ModelTurn.cut("length", usage=TokenUsage(input_tokens=900, output_tokens=256)),
                           ModelTurn.answer("done")])
    result = stack.run(driver, model, run_id="cut-1")
    assert (result.outcome, result.ended_by, result.turns) == (RunOutcome.MODEL_TRUNCATED, "model", 2)
    assert "finish_reason 'length'" in result.reason and "turn 2" in result.reason
    assert result.final_answer is None
    # At the server: one batch (turn 1's), no finish, the run cancelled.
    assert (stack.received["submit_batch"], stack.received["finish_run"], stack.received["cancel_run"]) == (1, 0, 1)
    assert len(stack.batches("cut-1")) == 1 and stack.backend.starts == 1
    assert result.run.status is RunStatus.FINISHED and result.run.outcome is RunOutcome.CANCELLED
    # The cut turn is paid for and described.
    assert result.output_tokens[1] == 256 and result.input_tokens[1] >= 900
    assert result.finish_reasons == ("", "length")
    assert result.stop_reasons == (None, StopReason.LENGTH)


# --- arguments that are not JSON ---------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_call_with_malformed_arguments_is_never_sent_and_the_model_can_repair_it(stack, driver):
    broken = ToolCall.malformed("echo", '{"text": "unterminated', "Unterminated string starting at: line 1", "bad")

    def repair(ctx: AgentContext) -> ModelTurn:
        bad, good = ctx.results()
        assert (bad["id"], bad["status"], bad["executed"], bad["error_class"]) == (
            "bad", "invalid", False, "invalid_arguments")
        assert "not a JSON object" in bad["error"] and REPAIR_HINT in bad["error"]
        assert "unterminated" in bad["error"]  # the model is shown what it wrote
        assert (good["id"], good["status"], good["content"]) == ("good", "executed", {"text": "fine"})
        return ModelTurn.calls(ToolCall("echo", {"text": "repaired"}, "bad"))

    model = ScriptedModel([ModelTurn.calls(broken, ToolCall("echo", {"text": "fine"}, "good")), repair,
                           ModelTurn.answer("done")])
    result = stack.run(driver, model, run_id="malformed-1")
    assert result.outcome is RunOutcome.COMPLETED
    assert [(o.call_id, o.status) for o in result.trajectory] == [
        ("t1.bad", ObservationStatus.INVALID), ("t1.good", ObservationStatus.EXECUTED),
        ("t2.bad", ObservationStatus.EXECUTED)]
    # At the server: the first batch held the good call only; the broken one never arrived.
    assert stack.received["submit_batch"] == 2 and stack.backend.starts == 2
    assert [[c["call_id"] for c in b["calls"]] for b in stack.batches("malformed-1")] == [["t1.good"], ["t2.bad"]]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_turn_of_only_malformed_calls_sends_no_batch(stack, driver):
    broken = ToolCall.malformed("echo", "text=hello", "Expecting value: line 1 column 1", "c")
    model = ScriptedModel([ModelTurn.calls(broken), say("hello"), ModelTurn.answer("done")])
    result = stack.run(driver, model, run_id="malformed-2")
    assert result.outcome is RunOutcome.COMPLETED
    assert model.contexts[1].results()[0]["status"] == "invalid"
    assert stack.received["submit_batch"] == 1  # turn 2's only
    # The next turn's batch id and call ids follow the loop's turn number: nothing repeats.
    assert [b["batch_id"] for b in stack.batches("malformed-2")] == [batch_id_for("malformed-2", 2)]


def test_the_loop_detector_tells_a_broken_call_from_a_valid_one(stack):
    """A malformed call's arguments read as {}: it is not "the same call" as echo {}, and the
    same broken text repeated is a loop like any other."""
    broken = ToolCall.malformed("echo", "{{", "Expecting property name", "c")
    model = ScriptedModel([ModelTurn.calls(ToolCall("echo", {}, "a")), ModelTurn.calls(broken),
                           ModelTurn.calls(ToolCall("echo", {}, "b")), ModelTurn.calls(broken),
                           ModelTurn.calls(broken)])
    result = stack.run("sync", model)
    assert (result.outcome, result.ended_by, result.turns) == (RunOutcome.LOOP_DETECTED, "agent", 5)
    assert "invalid: " in result.reason and stack.received["submit_batch"] == 2


# --- a batch the server refuses whole ------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_refused_batch_becomes_one_invalid_observation_per_call(stack, driver) -> None:
    # A tool name no server takes (a model's hallucination) and arguments nested deeper than the
    # edge accepts: the edge refuses the batch whole, naming calls[0].tool and calls[2].arguments_json.
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(40):
        node["x"] = {}
        node = node["x"]
    turn1 = ModelTurn.calls(ToolCall("echo\nrm -rf /", {"text": "a"}, "weird"), ToolCall("echo", {"text": "b"}, "ok"),
                            ToolCall("echo", deep, "deep"))

    def repair(ctx: AgentContext) -> ModelTurn:
        weird, ok, deep_ = ctx.results()
        assert all(r["status"] == "invalid" and r["executed"] is False for r in (weird, ok, deep_))
        assert weird["error"].startswith("refused by the server: tool: must be a printable tool name")
        assert weird["error_class"] == "invalid_call"
        assert deep_["error"].startswith("refused by the server: arguments_json:")
        assert (ok["error"], ok["error_class"]) == (NOT_RUN, "batch_refused")
        return ModelTurn.calls(ToolCall("echo", {"text": "b"}, "ok"))

    model = ScriptedModel([turn1, repair, ModelTurn.answer("done")])
    result = stack.run(driver, model, run_id="refused-1")
    assert result.outcome is RunOutcome.COMPLETED
    assert [o.status for o in result.trajectory] == [ObservationStatus.INVALID] * 3 + [ObservationStatus.EXECUTED]
    assert [o.call_id for o in result.trajectory[:3]] == ["t1.weird", "t1.ok", "t1.deep"]
    # Nothing of the refused batch reached the core, let alone a container.
    assert stack.received["submit_batch"] == 1 and stack.backend.starts == 1
    assert [b["batch_id"] for b in stack.batches("refused-1")] == [batch_id_for("refused-1", 2)]


@pytest.mark.parametrize("stack", [{"max_batch_calls": 2}], indirect=True)
def test_a_violation_that_names_no_call_goes_on_every_call(stack):
    model = ScriptedModel([ModelTurn.calls(*(ToolCall("echo", {"text": str(i)}, f"c{i}") for i in range(3))),
                           ModelTurn.answer("too many")])
    result = stack.run("sync", model)
    assert result.outcome is RunOutcome.COMPLETED
    assert [o.status for o in result.trajectory] == [ObservationStatus.INVALID] * 3
    assert all("refused by the server: calls: 3 calls is over the limit of 2" in o.error for o in result.trajectory)
    assert stack.received["submit_batch"] == 0


def test_only_violations_about_the_calls_are_the_models_to_repair():
    calls = [ProposedCall("t1.a", "echo", {}), ProposedCall("t1.b", "echo", {})]
    # A bad batch id is the harness's fault: not an observation, the error stands.
    assert refused_batch(InvalidArgument("bad", [FieldViolation("batch_id", "reused")]), calls) is None
    assert refused_batch(InvalidArgument("bad", []), calls) is None
    # An index past the batch cannot be mapped: it goes on every call, like a bare "calls".
    both = refused_batch(InvalidArgument("bad", [FieldViolation("calls[7].tool", "odd")]), calls)
    assert both is not None and all(o.error == "refused by the server: calls[7].tool: odd" for o in both)
    one = refused_batch(InvalidArgument("bad", [FieldViolation("calls[1].call_id", "used"),
                                                FieldViolation("calls[1].tool", "bad name")]), calls)
    assert one is not None and one[0].error == NOT_RUN
    assert one[1].error == "refused by the server: call_id: used; refused by the server: tool: bad name"


@pytest.mark.parametrize("driver", DRIVERS)
def test_two_calls_with_one_model_id_both_go(stack, driver):
    model = ScriptedModel([ModelTurn.calls(ToolCall("echo", {"text": "a"}, "call_0"),
                                           ToolCall("echo", {"text": "b"}, "call_0"), ToolCall("echo", {"text": "c"})),
                           ModelTurn.answer("done")])
    result = stack.run(driver, model)
    assert [o.status for o in result.trajectory] == [ObservationStatus.EXECUTED] * 3
    assert len({o.call_id for o in result.trajectory}) == 3 and stack.backend.starts == 3


def test_a_resumed_run_never_reuses_a_turn_number_a_batchless_turn_skipped(stack):
    broken = ToolCall.malformed("echo", "nope", "Expecting value", "c")
    first = ScriptedModel([ModelTurn.calls(broken), say("sent in turn 2")])  # then the script runs out
    from ringfence.agent import ScriptExhausted

    with pytest.raises(ScriptExhausted):
        stack.run("sync", first, run_id="resumed-1")
    # The run is still open on the server, with one batch (turn 2's). A new loop resumes it.
    second = ScriptedModel([say("sent in turn 3"), ModelTurn.answer("done")])
    result = stack.run("sync", second, run_id="resumed-1")
    assert result.outcome is RunOutcome.COMPLETED
    assert [b["batch_id"] for b in stack.batches("resumed-1")] == ["resumed-1.t2", "resumed-1.t3"]
    assert [o.call_id for o in result.run.trajectory] == ["t2.call_0", "t3.call_0"]


# --- the model's provider fails ---------------------------------------------------------------------


class FailingModel:
    """Turn 1: an echo; turn 2: the provider's failure."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.asked = 0

    def next_turn(self, context: AgentContext) -> ModelTurn:
        self.asked += 1
        if self.asked == 1:
            return say("one")
        raise self.error


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("error", [ModelUnavailable("openai", "rate limited; retries exhausted", status=429),
                                   ModelRequestRefused("anthropic", "invalid_request_error", status=400)])
def test_a_model_error_ends_the_run_error_by_the_model(stack, driver, error):
    result = stack.run(driver, FailingModel(error), run_id="model-error-1")
    assert (result.outcome, result.ended_by, result.turns) == (RunOutcome.ERROR, "model", 1)
    assert result.reason == str(error) and f"(HTTP {error.status})" in result.reason
    assert (stack.received["submit_batch"], stack.received["cancel_run"]) == (1, 1)
    assert result.run.outcome is RunOutcome.CANCELLED and len(result.input_tokens) == 1


@pytest.mark.parametrize("driver", DRIVERS)
def test_any_other_exception_from_the_model_propagates(stack, driver):
    with pytest.raises(ZeroDivisionError):
        stack.run(driver, FailingModel(ZeroDivisionError("a bug in the adapter")))


# --- cached input tokens ---------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_cached_token_is_counted_once_at_its_own_rate(stack, driver):
    # Reported counts above the context's estimate, so they are the ones believed.
    model = ScriptedModel([
        ModelTurn(tool_calls=(ToolCall("echo", {"text": "a"}),), stop_reason=StopReason.TOOL_CALLS,
                  finish_reason="tool_calls",
                  usage=TokenUsage(input_tokens=10_000, output_tokens=100, cached_input_tokens=8_000)),
        ModelTurn(final_answer="done", stop_reason=StopReason.END_TURN, finish_reason="stop",
                  usage=TokenUsage(input_tokens=12_000, output_tokens=50, cached_input_tokens=9_000)),
    ])
    result = stack.run(driver, model, cost_per_input_token=1e-6, cost_per_cached_input_token=1e-7,
                       cost_per_output_token=4e-6)
    assert result.outcome is RunOutcome.COMPLETED
    assert (result.input_tokens, result.cached_input_tokens, result.output_tokens) == (
        (10_000, 12_000), (8_000, 9_000), (100, 50))
    # By hand: (10000-8000)*1e-6 + 8000*1e-7 + 100*4e-6 = 0.0032; (12000-9000)*1e-6 + 9000*1e-7 + 50*4e-6 = 0.0041
    assert result.total_cost == pytest.approx(0.0073)
    assert result.finish_reasons == ("tool_calls", "stop")
    assert result.stop_reasons == (StopReason.TOOL_CALLS, StopReason.END_TURN)


def test_without_a_cached_rate_a_cached_token_costs_an_input_token(stack):
    model = ScriptedModel([
        ModelTurn.answer("done", usage=TokenUsage(input_tokens=10_000, output_tokens=100, cached_input_tokens=8_000))])
    result = stack.run("sync", model, cost_per_input_token=1e-6, cost_per_output_token=4e-6)
    assert result.total_cost == pytest.approx(10_000 * 1e-6 + 100 * 4e-6)


def test_the_loops_arguments_are_checked():
    with pytest.raises(ValueError, match="costs"):
        AgentLoop(None, None, max_turns=1, max_cost=1, cost_per_input_token=0, cost_per_output_token=0, goal="g",
                  cost_per_cached_input_token=-1)
    with pytest.raises(ValueError, match="max_duration_s"):
        AsyncAgentLoop(None, None, max_turns=1, max_cost=1, cost_per_input_token=0, cost_per_output_token=0, goal="g",
                       max_duration_s=0)


# --- the loop's deadline ----------------------------------------------------------------------------------


def wait_past(deadline: float | None) -> None:
    """Block until time.monotonic() has passed `deadline` (so the test asserts no duration)."""
    assert deadline is not None
    pause = threading.Event()
    while time.monotonic() <= deadline:
        pause.wait(0.02)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_turn_that_comes_back_after_the_deadline_is_not_acted_on(stack, driver):
    def slow(ctx: AgentContext) -> ModelTurn:
        wait_past(ctx.deadline)  # the model took longer than the run may last
        return say("too late")

    model = ScriptedModel([slow, ModelTurn.answer("never asked")])
    result = stack.run(driver, model, run_id="late-1", max_duration_s=1.0)
    assert (result.outcome, result.ended_by) == (RunOutcome.DEADLINE_EXCEEDED, "agent")
    assert "max_duration_s=1" in result.reason
    assert stack.received["submit_batch"] == 0 and stack.received["cancel_run"] == 1
    assert result.run.outcome is RunOutcome.CANCELLED


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_deadline_is_checked_at_the_turn_boundary(tmp_path, driver) -> None:
    seen: list[float | None] = []

    def slow_tool(request):
        wait_past(seen[0])  # the tool runs past the loop's deadline
        return runner_result(request)

    stack = Stack(tmp_path, backend=FakeBackend(slow_tool))
    try:
        def first(ctx: AgentContext) -> ModelTurn:
            seen.append(ctx.deadline)
            return say("slow")

        model = ScriptedModel([first, ModelTurn.answer("never asked")])
        result = stack.run(driver, model, max_duration_s=1.0)
        assert (result.outcome, result.ended_by, result.turns) == (RunOutcome.DEADLINE_EXCEEDED, "agent", 1)
        assert "before turn 2" in result.reason and len(model.contexts) == 1
        assert stack.received["submit_batch"] == 1 and stack.received["cancel_run"] == 1
    finally:
        stack.close()


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_model_error_past_the_deadline_is_the_deadline(stack, driver):
    class Clamped:
        def next_turn(self, context: AgentContext) -> ModelTurn:
            wait_past(context.deadline)  # an adapter whose request was clamped to the deadline
            raise ModelUnavailable("openai", "the request's deadline passed")

    result = stack.run(driver, Clamped(), max_duration_s=1.0)
    assert (result.outcome, result.ended_by) == (RunOutcome.DEADLINE_EXCEEDED, "agent")
    assert "the request's deadline passed" in result.reason


# --- the agent's span ------------------------------------------------------------------------------------

adapter_tracer = trace.get_tracer("test.adapter")


def chat(turn: ModelTurn):
    """A stand-in for an adapter's request: a `chat` span around the turn."""

    def next_turn(ctx: AgentContext) -> ModelTurn:
        with adapter_tracer.start_as_current_span("chat scripted", kind=SpanKind.CLIENT,
                                                  attributes={"gen_ai.operation.name": "chat"}):
            return turn

    return next_turn


class AsyncChatModel:
    """An AsyncModelClient: its next_turn is a coroutine that opens the chat span."""

    def __init__(self, turns: list[ModelTurn]) -> None:
        self.turns = turns
        self.contexts: list[AgentContext] = []

    async def next_turn(self, context: AgentContext) -> ModelTurn:
        self.contexts.append(context)
        with adapter_tracer.start_as_current_span("chat scripted", kind=SpanKind.CLIENT):
            await asyncio.sleep(0)  # a real await inside the span
            return self.turns[len(self.contexts) - 1]


def parent_id(span) -> int | None:
    return span.parent.span_id if span.parent is not None else None


@pytest.mark.parametrize("driver, model_kind", [("sync", "sync"), ("async", "sync"), ("async", "async")])
def test_the_agent_span_holds_the_models_chat_spans_and_the_servers_calls(spans, stack, driver, model_kind) -> None:
    turns = [say("hello"), ModelTurn.answer("done")]
    model: Any = ScriptedModel([chat(t) for t in turns]) if model_kind == "sync" else AsyncChatModel(turns)
    result = stack.run(driver, model, run_id=f"traced-{driver}-{model_kind}", name="incident-bot")
    assert result.outcome is RunOutcome.COMPLETED
    finished = spans.get_finished_spans()
    [agent] = [s for s in finished if s.attributes.get("gen_ai.agent.name")]
    assert agent.name == "invoke_agent incident-bot"
    assert agent.kind is SpanKind.INTERNAL and agent.parent is None
    assert dict(agent.attributes) == {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "incident-bot",
                                      "ringfence.run_id": result.run_id, "ringfence.outcome": "completed",
                                      "ringfence.turns": 2}
    here = agent.context
    # Every model request is a child of the agent's span.
    chats = [s for s in finished if s.name == "chat scripted"]
    assert len(chats) == 2
    assert all(parent_id(c) == here.span_id and c.context.trace_id == here.trace_id for c in chats)
    # Every RPC the server answered for the loop continues the agent's trace, under its span.
    rpcs = {s.name.rsplit("/", 1)[-1]: s for s in finished if s.name.startswith("ringfence.v1.")}
    assert {"StartRun", "ListTools", "SubmitBatch", "GetRun", "FinishRun"} <= set(rpcs)
    for name, rpc in rpcs.items():
        assert rpc.context.trace_id == here.trace_id and parent_id(rpc) == here.span_id, name
        assert rpc.parent.is_remote, name
    # The server's run is a trace of its own, linked to the StartRun RPC (a child of the agent's
    # span); its batch span (the tool's dispatch under it) is in that trace.
    [run_root] = [s for s in finished if s.name == "invoke_agent" and s.attributes.get("ringfence.tenant")
                  and s.attributes.get("ringfence.run_id") == result.run_id]
    assert [link.context.span_id for link in run_root.links] == [rpcs["StartRun"].context.span_id]
    batch = [s for s in finished if s.name == "batch" and s.context.trace_id == run_root.context.trace_id]
    assert len(batch) == 1 and parent_id(batch[0]) == run_root.context.span_id


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_agent_span_says_why_a_run_failed(spans, stack, driver):
    stack.run(driver, FailingModel(ModelUnavailable("openai", "overloaded", status=503)))
    [agent] = [s for s in spans.get_finished_spans() if s.attributes.get("gen_ai.agent.name") == "ringfence-agent"]
    assert agent.attributes["ringfence.outcome"] == "error"
    assert agent.status.status_code is trace.StatusCode.ERROR and "HTTP 503" in agent.status.description
