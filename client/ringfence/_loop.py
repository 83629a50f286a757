"""The agent loop's one core, without I/O: every rule of the loop, written once.

`LoopCore(settings, span).steps()` is a generator. It yields what it needs done as small frozen
values (StartRun, ListTools, Assemble, NextTurn, SubmitBatch, GetRun, AwaitDecisions, FinishRun,
CancelRun) and is sent each one's result, or thrown the exception it raised, by a driver:
AgentLoop performs them with Client and a ModelClient, AsyncAgentLoop with AsyncClient and a
model of either kind (ringfence.agent). Ceilings, accounting, the loop detector, invalid calls,
refused batches and every ending live here; a driver only does what it is asked and says what
happened, so the two loops cannot drift apart. The rules themselves are documented in
ringfence.agent's module docstring (the loop's reference).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from opentelemetry import trace

from ringfence._version import __version__
from ringfence._wire import is_wire_id
from ringfence.context import ContextAssembler, MemoryRecall, Summarizer
from ringfence.errors import ControlError, FailedPrecondition, FieldViolation, InvalidArgument
from ringfence.model import (
    Event,
    Observation,
    ObservationStatus,
    ProposedCall,
    RunOutcome,
    RunStatus,
    RunView,
    ToolView,
)
from ringfence.models.errors import ModelError
from ringfence.turns import AgentContext, ModelTurn, StopReason, ToolCall, TurnRecord, estimate_tokens

log = logging.getLogger("ringfence.agent")

AGENT, SERVER, MODEL = "agent", "server", "model"

REPAIR_HINT = "send the call again with a JSON object as arguments"
NOT_RUN = "not run: the batch is admitted whole or not at all, and another call of it was invalid"


# -- what a run of the loop returns ------------------------------------------------------------


@dataclass(frozen=True)
class AgentResult:
    """How a run of the loop ended, and what it cost."""

    outcome: RunOutcome
    """The terminal outcome: the loop's own (see ended_by) or the server's."""
    reason: str
    """Why, in words (the ceiling, the repeated call, the server's halt reason, the provider's
    error, the finish reason of a cut response)."""
    ended_by: str
    """"agent" when the loop decided the outcome (a ceiling, its deadline, the loop detector, the
    model's final answer); "model" when the model gave no usable turn (its provider failed: a
    ModelError; or its response was cut by the length limit: model_truncated); "server" when the
    run ended on the server."""
    run_id: str
    turns: int
    """Model turns taken (calls of next_turn that returned a turn)."""
    input_tokens: tuple[int, ...]
    """Input tokens of each turn, in order, cached ones included (see the accounting rule)."""
    output_tokens: tuple[int, ...]
    """Output tokens of each turn, in order."""
    total_cost: float
    """Sum over turns of (input - cached) * cost_per_input_token + cached *
    cost_per_cached_input_token + output * cost_per_output_token."""
    trajectory: tuple[Observation, ...]
    """Every observation the loop received or made, in order, as the model was shown them
    (after any approval was decided); the loop's own are `invalid` (never sent, never ran)."""
    final_answer: str | None = None
    """The model's answer, when it gave one."""
    run: RunView | None = None
    """The server's last view of the run. After a stop decided by the loop or the model it says
    `cancelled`: the loop cancels the run (no RPC records a client's reason), and `outcome` says
    why."""
    context_tokens: tuple[int, ...] = ()
    """The estimated size of each turn's context as sent (after any compaction)."""
    compactions: int = 0
    """How many times older turns were folded into the summary (ringfence.context)."""
    cached_input_tokens: tuple[int, ...] = ()
    """Of each turn's input tokens, those the provider read from its prompt cache (0 when it
    did not say)."""
    finish_reasons: tuple[str, ...] = ()
    """Each turn's finish reason as the provider sent it ("" when the model did not say)."""
    stop_reasons: tuple[StopReason | None, ...] = ()
    """Each turn's normalised stop reason (None when the model did not say)."""


# -- what the core asks a driver to do -----------------------------------------------------------


@dataclass(frozen=True)
class StartRun:
    """-> RunView (Client.start_run)."""

    goal: str
    run_id: str | None


@dataclass(frozen=True)
class ListTools:
    """-> list[ToolView] (Client.list_tools)."""

    query: str


@dataclass(frozen=True)
class Assemble:
    """-> AgentContext: the loop's own work that may block (the memory's recall, a summarizer
    that is itself a model); a driver runs it where blocking harms nothing."""

    work: Callable[[], AgentContext]


@dataclass(frozen=True)
class NextTurn:
    """-> ModelTurn (the model's next_turn); a ModelError is thrown back in."""

    context: AgentContext


@dataclass(frozen=True)
class SubmitBatch:
    """-> list[Observation] (Client.submit_batch)."""

    run_id: str
    calls: tuple[ProposedCall, ...]
    batch_id: str


@dataclass(frozen=True)
class GetRun:
    """-> RunView (Client.get_run)."""

    run_id: str


@dataclass(frozen=True)
class AwaitDecisions:
    """-> int, the next sequence number to read: follow the run's log from `from_seq` with a
    DecisionWait until it says stop or `timeout` passes (a stream deadline is not an error)."""

    run_id: str
    from_seq: int
    call_ids: frozenset[str]
    timeout: float


@dataclass(frozen=True)
class FinishRun:
    """-> RunView (Client.finish_run)."""

    run_id: str


@dataclass(frozen=True)
class CancelRun:
    """-> RunView (Client.cancel_run)."""

    run_id: str


Request = StartRun | ListTools | Assemble | NextTurn | SubmitBatch | GetRun | AwaitDecisions | FinishRun | CancelRun


class DecisionWait:
    """The rule for following a run's log while some of a turn's calls wait for a person: stop
    when each one's observation is no longer pending (approved and run, declined, expired) or
    the run ends. Drivers feed it the events they read."""

    def __init__(self, call_ids: frozenset[str], from_seq: int) -> None:
        self.waiting = set(call_ids)
        self.next_seq = from_seq

    def see(self, event: Event) -> bool:
        """Take one event; True when following the log can stop."""
        self.next_seq = event.seq + 1
        data = event.data
        if (event.type == "observation" and data.get("call_id") in self.waiting
                and data.get("status") != ObservationStatus.PENDING_APPROVAL.value):
            self.waiting.discard(data["call_id"])
        return event.type == "run_finished" or not self.waiting


# -- ids -------------------------------------------------------------------------------------------


def _digest(text: str, n: int) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def batch_id_for(run_id: str, turn: int) -> str:
    """The batch id of a run's turn: the same on every resend, so the server answers a resend
    with the recorded observations; distinct per turn. A run id too long to extend is hashed."""
    candidate = f"{run_id}.t{turn}"
    return candidate if is_wire_id(candidate) else f"b-{_digest(run_id, 32)}.t{turn}"


def wire_call_id(turn: int, index: int, model_call_id: str) -> str:
    """Call ids must be unique in the run, and models reuse theirs across turns ("call_0"):
    the turn number makes them unique; an id the wire would refuse is replaced by a digest."""
    candidate = f"t{turn}.{model_call_id or index}"
    return candidate if is_wire_id(candidate) else f"t{turn}.{index}-{_digest(model_call_id, 16)}"


def wire_call_ids(turn: int, calls: Sequence[ToolCall]) -> list[str]:
    """Each call's wire id; a model that gives two calls of one turn the same id (or an id equal
    to another call's index) still gets distinct ones, since the server refuses a duplicate."""
    ids: list[str] = []
    for i, call in enumerate(calls):
        wire = wire_call_id(turn, i, call.call_id)
        if wire in ids:
            wire = f"t{turn}.{i}-{_digest(f'{i}:{call.call_id}', 16)}"
        ids.append(wire)
    return ids


_WIRE_TURN = re.compile(r"t(\d+)\.")
_CALL_FIELD = re.compile(r"calls(?:\[(\d+)\])?(?:[.\[]|$)")


def turns_recorded(view: RunView) -> int:
    """The highest turn number a resumed run has used on the server: its batch count, or the
    turn number in a recorded call id when higher (a turn whose calls were all invalid, or whose
    batch was refused, sent no batch, so the two counts can differ; batch and call ids of the
    next turns must still never repeat)."""
    recorded = [int(m.group(1)) for o in view.trajectory if (m := _WIRE_TURN.match(o.call_id))]
    return max([view.turns, *recorded])


def _invalid(call_id: str, tool: str, error: str, error_class: str) -> Observation:
    return Observation(call_id, tool, ObservationStatus.INVALID, False, error=error, error_class=error_class)


def refused_batch(error: InvalidArgument, calls: Sequence[ProposedCall]) -> list[Observation] | None:
    """The observations of a batch the server refused whole for its calls' sake: each call the
    violations name (`calls[i]...`) carries their descriptions, the others say why they did not
    run; a violation about the calls that names no index of the batch goes on every call. None
    when no violation is about the calls at all (a bad run or batch id is the harness's fault,
    not the model's: it stays an exception)."""
    per_call: list[list[str]] = [[] for _ in calls]
    about_calls = False
    for v in error.violations:
        m = _CALL_FIELD.match(v.field)
        if m is None:
            continue
        about_calls = True
        index = int(m.group(1)) if m.group(1) is not None else -1
        if 0 <= index < len(calls):
            per_call[index].append(_describe(v, f"calls[{index}]."))
        else:
            for found in per_call:
                found.append(_describe(v, ""))
    if not about_calls:
        return None
    return [_invalid(c.call_id, c.tool, "; ".join(found), "invalid_call") if found
            else _invalid(c.call_id, c.tool, NOT_RUN, "batch_refused")
            for c, found in zip(calls, per_call, strict=True)]


def _describe(v: FieldViolation, prefix: str) -> str:
    # The model knows its call's fields (tool, arguments), not the batch's index of it.
    field = v.field.removeprefix(prefix) if prefix else v.field
    return f"refused by the server: {field}: {v.description}"


# -- the settings both loops share ---------------------------------------------------------------

C = TypeVar("C")
M = TypeVar("M")


class LoopSettings(Generic[C, M]):
    """The knobs of AgentLoop and AsyncAgentLoop (the same for both; ringfence.agent)."""

    def __init__(
        self,
        client: C,
        model: M,
        *,
        max_turns: int,
        max_cost: float,
        cost_per_input_token: float,
        cost_per_output_token: float,
        goal: str,
        run_id: str | None = None,
        loop_threshold: int = 3,
        approval_timeout_s: float = 300.0,
        tools_query: str = "",
        on_turn: Callable[[TurnRecord], None] | None = None,
        context_budget_tokens: int | None = None,
        summarizer: Summarizer | None = None,
        memory: MemoryRecall | None = None,
        keep_recent_turns: int = 2,
        cost_per_cached_input_token: float | None = None,
        max_duration_s: float | None = None,
        name: str = "ringfence-agent",
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        """`loop_threshold`: the same call (name + canonical arguments) proposed this many
        times in the run ends it loop_detected before the repeat is sent. `approval_timeout_s`:
        how long a turn waits for its ASK calls to be decided; a call still waiting is shown to
        the model as pending_approval. `tools_query` narrows the catalogue (ListTools).
        `on_turn` is called with each turn's calls and observations once they are settled
        (progress for a person watching; an exception from it ends the loop).
        `context_budget_tokens`: past it, all but the last `keep_recent_turns` turns are folded
        into a summary by `summarizer` (default: heads and tails kept); the goal never is.
        `memory`: recalled for the goal each turn and shown as labelled data
        (ringfence.context). `cost_per_cached_input_token`: the price of an input token read
        from the provider's prompt cache (None: the same as cost_per_input_token).
        `max_duration_s`: the run's wall-clock ceiling from the start of run() (None: none);
        the model's requests are given it as AgentContext.deadline. `name`: the agent's name on
        its span (gen_ai.agent.name). `tracer_provider`: where the agent's span goes (None: the
        global one)."""
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        if max_cost < 0 or cost_per_input_token < 0 or cost_per_output_token < 0 or (
                cost_per_cached_input_token is not None and cost_per_cached_input_token < 0):
            raise ValueError("costs cannot be negative")
        if loop_threshold < 2:
            raise ValueError("loop_threshold must be at least 2")
        if max_duration_s is not None and not max_duration_s > 0:
            raise ValueError("max_duration_s must be positive (None: no deadline)")
        self.client = client
        self.model = model
        self.max_turns = max_turns
        self.max_cost = max_cost
        self.cost_per_input_token = cost_per_input_token
        self.cost_per_output_token = cost_per_output_token
        self.cost_per_cached_input_token = cost_per_cached_input_token
        self.goal = goal
        self.run_id = run_id
        self.loop_threshold = loop_threshold
        self.approval_timeout_s = approval_timeout_s
        self.tools_query = tools_query
        self.on_turn = on_turn
        self.context_budget_tokens = context_budget_tokens
        self.summarizer = summarizer
        self.memory = memory
        self.keep_recent_turns = keep_recent_turns
        self.max_duration_s = max_duration_s
        self.name = name
        self.tracer_provider = tracer_provider

    def open_span(self) -> trace.Span:
        """The agent's span (INTERNAL), a child of whatever span is current. The driver makes it
        current for the whole run, so the server's RPC spans and a model adapter's chat spans
        are its children. Named as the GenAI conventions name it, `invoke_agent {agent name}`
        (as an adapter's are `chat {model}`): that also keeps it apart from the server's run
        root, a bare `invoke_agent` with the same ringfence.run_id."""
        tracer = trace.get_tracer("ringfence.agent", __version__, tracer_provider=self.tracer_provider)
        return tracer.start_span(f"invoke_agent {self.name}", kind=trace.SpanKind.INTERNAL, attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": self.name})


# -- the core ----------------------------------------------------------------------------------

Steps = Generator[Request, Any, AgentResult]


class LoopCore:
    """The state of one run of the loop, and its steps."""

    def __init__(self, settings: LoopSettings[Any, Any], span: trace.Span) -> None:
        self.loop = settings
        self.span = span
        self.run_id = ""
        self.turns = 0
        self.server_turns = 0  # the turn numbers the server had used when the loop began (a resumed run)
        self.input_tokens: list[int] = []
        self.output_tokens: list[int] = []
        self.cached_input_tokens: list[int] = []
        self.finish_reasons: list[str] = []
        self.stop_reasons: list[StopReason | None] = []
        self.cost = 0.0
        self.history: list[TurnRecord] = []
        self.trajectory: list[Observation] = []
        self.proposals: Counter[tuple[str, str]] = Counter()
        self.next_seq = 1
        self.view: RunView | None = None
        self.context_tokens: list[int] = []
        self.deadline: float | None = None
        self.assembler = ContextAssembler(settings.context_budget_tokens, summarizer=settings.summarizer,
                                          memory=settings.memory, keep_recent=settings.keep_recent_turns)

    def steps(self) -> Steps:
        result = yield from self._run()
        self.span.set_attribute("ringfence.outcome", result.outcome.value)
        self.span.set_attribute("ringfence.turns", result.turns)
        if result.outcome is RunOutcome.ERROR:
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, result.reason[:200]))
        return result

    def _run(self) -> Steps:
        loop = self.loop
        if loop.max_duration_s is not None:
            self.deadline = time.monotonic() + loop.max_duration_s
        view: RunView = yield StartRun(loop.goal, loop.run_id)
        self.view = view
        self.run_id = view.run_id
        self.span.set_attribute("ringfence.run_id", self.run_id)
        if view.status is RunStatus.FINISHED:
            return self.server_ended(view, ())
        # A resumed run continues the server's turn numbering, so batch ids never repeat.
        self.server_turns = turns_recorded(view)
        tools: list[ToolView] = yield ListTools(loop.tools_query)
        catalogue = tuple(tools)
        while True:
            # -- the boundary before a turn: ceilings -----------------------------------------
            if self.turns >= loop.max_turns:
                return (yield from self.stop(RunOutcome.BUDGET_EXHAUSTED,
                                             f"turn ceiling reached ({loop.max_turns} turns)"))
            if self.cost >= loop.max_cost:
                return (yield from self.stop(RunOutcome.BUDGET_EXHAUSTED,
                                             f"cost ceiling reached ({self.cost:g} >= {loop.max_cost:g})"))
            if self.past_deadline():
                return (yield from self.stop(RunOutcome.DEADLINE_EXCEEDED, self.deadline_reason("before")))
            # -- the turn ----------------------------------------------------------------------
            number = self.turns + 1
            context: AgentContext = yield Assemble(functools.partial(
                self.assembler.assemble, loop.goal, self.run_id, number, catalogue, tuple(self.history)))
            context = dataclasses.replace(context, deadline=self.deadline)
            estimated = estimate_tokens(context.render())
            try:
                turn: ModelTurn = yield NextTurn(context)
            except ModelError as e:
                if self.past_deadline():
                    # The adapter's request was clamped to the run's deadline: the deadline ended it.
                    return (yield from self.stop(RunOutcome.DEADLINE_EXCEEDED,
                                                 f"{self.deadline_reason('during')}: {e}"))
                return (yield from self.stop(RunOutcome.ERROR, str(e), MODEL))
            self.turns += 1
            self.context_tokens.append(estimated)
            self.account(turn, estimated)
            if turn.truncated:
                return (yield from self.stop(RunOutcome.MODEL_TRUNCATED, (
                    f"the model's response in turn {self.turns} was cut by its length limit (finish_reason "
                    f"{turn.finish_reason!r}): nothing of it was acted on"), MODEL))
            if self.past_deadline():
                # Nothing the model proposed after the deadline is sent, nor its answer completed.
                return (yield from self.stop(RunOutcome.DEADLINE_EXCEEDED, self.deadline_reason("after"),
                                             final_answer=turn.final_answer))
            if turn.final_answer is not None:
                return (yield from self.finish(turn.final_answer))
            repeated = self.repeated(turn.tool_calls)
            if repeated is not None:
                return (yield from self.stop(RunOutcome.LOOP_DETECTED, repeated))
            observations, view = yield from self.submit(turn.tool_calls)
            record = TurnRecord(self.turns, turn.tool_calls, tuple(observations))
            self.history.append(record)
            if loop.on_turn is not None:
                loop.on_turn(record)
            self.trajectory.extend(observations)
            self.view = view
            if view.status is RunStatus.FINISHED:
                return self.server_ended(view, observations)

    # -- time -------------------------------------------------------------------------------------

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def deadline_reason(self, when: str) -> str:
        where = {"before": f"before turn {self.turns + 1}", "during": f"while the model took turn {self.turns + 1}",
                 "after": f"when the model answered turn {self.turns}"}[when]
        return f"the run's deadline (max_duration_s={self.loop.max_duration_s:g}) passed {where}"

    # -- accounting ---------------------------------------------------------------------------

    def account(self, turn: ModelTurn, estimated_input: int) -> None:
        loop = self.loop
        reported = turn.usage
        input_tokens = max(estimated_input, reported.input_tokens if reported else 0)
        # Cached tokens are part of input_tokens (TokenUsage's rule): each is priced once, at its rate.
        cached = reported.cached_input_tokens if reported else 0
        output_tokens = reported.output_tokens if reported else estimate_tokens(turn.render())
        cached_rate = (loop.cost_per_input_token if loop.cost_per_cached_input_token is None
                       else loop.cost_per_cached_input_token)
        self.input_tokens.append(input_tokens)
        self.cached_input_tokens.append(cached)
        self.output_tokens.append(output_tokens)
        self.finish_reasons.append(turn.finish_reason)
        self.stop_reasons.append(turn.stop_reason)
        self.cost += ((input_tokens - cached) * loop.cost_per_input_token + cached * cached_rate
                      + output_tokens * loop.cost_per_output_token)

    def repeated(self, calls: Sequence[ToolCall]) -> str | None:
        """The loop detector: counts every proposal; the first call that reaches the threshold.
        A call whose arguments were not JSON is the same call only with the same broken text."""
        signatures = [c.signature() if c.invalid_arguments is None else (c.name, "invalid: " + c.invalid_arguments)
                      for c in calls]
        self.proposals.update(signatures)
        for call, signature in zip(calls, signatures, strict=True):
            n = self.proposals[signature]
            if n >= self.loop.loop_threshold:
                return f"{call.name} {signature[1]} proposed {n} times"
        return None

    # -- the batch ----------------------------------------------------------------------------

    def submit(self, calls: Sequence[ToolCall]) -> Generator[Request, Any, tuple[list[Observation], RunView]]:
        """The turn's calls: those with arguments that are not JSON are answered here (`invalid`,
        never sent), the others go as one batch; the observations come back in the calls' order."""
        assert self.view is not None  # set by StartRun
        server_turn = self.server_turns + self.turns
        ids = wire_call_ids(server_turn, calls)
        answered: dict[int, Observation] = {
            i: _invalid(ids[i], c.name, f"{c.invalid_arguments}; {REPAIR_HINT}", "invalid_arguments")
            for i, c in enumerate(calls) if c.invalid_arguments is not None}
        sent = [i for i in range(len(calls)) if i not in answered]
        if not sent:
            return [answered[i] for i in range(len(calls))], self.view  # nothing to send: no batch at all
        wire = tuple(ProposedCall(ids[i], calls[i].name, dict(calls[i].arguments)) for i in sent)
        try:
            got: list[Observation] = yield SubmitBatch(self.run_id, wire, batch_id_for(self.run_id, server_turn))
        except FailedPrecondition:
            # The run ended on the server before this batch (cancelled by someone, say).
            view: RunView = yield GetRun(self.run_id)
            if view.status is not RunStatus.FINISHED:
                raise
            return [], view
        except InvalidArgument as e:
            # The server refused the batch whole for its calls (a tool name it cannot take,
            # arguments too deep or too large): nothing ran, and the model is shown why.
            refused = refused_batch(e, wire)
            if refused is None:
                raise
            answered.update(zip(sent, refused, strict=True))
            return [answered[i] for i in range(len(calls))], self.view
        observations = list(got)
        pending = {o.call_id for o in observations if o.status is ObservationStatus.PENDING_APPROVAL}
        if pending:
            yield from self.await_decisions(pending)
        view = yield GetRun(self.run_id)
        if pending:
            decided = {o.call_id: o for o in view.trajectory}
            observations = [decided.get(o.call_id, o) for o in observations]
        answered.update(zip(sent, observations, strict=False))
        return [answered[i] for i in range(len(calls)) if i in answered], view

    def await_decisions(self, call_ids: set[str]) -> Generator[Request, Any, None]:
        timeout = self.loop.approval_timeout_s
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
        if timeout <= 0:
            return  # the run's deadline has come: what still waits is shown as pending
        self.next_seq = yield AwaitDecisions(self.run_id, self.next_seq, frozenset(call_ids), timeout)

    # -- endings ------------------------------------------------------------------------------

    def result(self, outcome: RunOutcome, reason: str, ended_by: str, final_answer: str | None = None) -> AgentResult:
        return AgentResult(
            outcome=outcome, reason=reason, ended_by=ended_by, run_id=self.run_id, turns=self.turns,
            input_tokens=tuple(self.input_tokens), output_tokens=tuple(self.output_tokens), total_cost=self.cost,
            trajectory=tuple(self.trajectory), final_answer=final_answer, run=self.view,
            context_tokens=tuple(self.context_tokens), compactions=self.assembler.compactions,
            cached_input_tokens=tuple(self.cached_input_tokens), finish_reasons=tuple(self.finish_reasons),
            stop_reasons=tuple(self.stop_reasons))

    def finish(self, answer: str) -> Steps:
        self.view = view = yield FinishRun(self.run_id)
        outcome = view.outcome or RunOutcome.COMPLETED
        if outcome is RunOutcome.COMPLETED:
            return self.result(outcome, "the model gave its final answer", AGENT, answer)
        # The server's word wins: a call whose effect nobody could confirm makes it uncertain,
        # and a run already ended (cancelled, past its deadline) stays what it was.
        return self.result(outcome, f"the server ended the run: {outcome.value}", SERVER, answer)

    def stop(self, outcome: RunOutcome, reason: str, ended_by: str = AGENT,
             final_answer: str | None = None) -> Steps:
        """An ending decided on this side (by the loop, or for want of a usable model turn): the
        run is cancelled on the server."""
        try:
            self.view = yield CancelRun(self.run_id)
        except ControlError as e:
            # The outcome stands either way; the run is left for its own deadline.
            log.warning("run %s ended (%s) but could not be cancelled: %s", self.run_id, outcome.value, e)
        view = self.view
        if view is not None and view.status is RunStatus.FINISHED and view.outcome not in (None, RunOutcome.CANCELLED):
            return self.server_ended(view, ())  # the server had ended it first
        return self.result(outcome, reason, ended_by, final_answer)

    def server_ended(self, view: RunView, last: Sequence[Observation]) -> AgentResult:
        self.view = view
        outcome = view.outcome or RunOutcome.ERROR
        halted = [o.error for o in last if o.status is ObservationStatus.HALTED and o.error]
        reason = halted[0] if halted else f"the run ended on the server: {outcome.value}"
        return self.result(outcome, reason, SERVER)


class Stepper:
    """Runs a LoopCore's steps for a driver: `first()`, then `send(result)` or `throw(error)`
    for each request, until they return None; `result` is then the AgentResult."""

    def __init__(self, steps: Steps) -> None:
        self._steps = steps
        self.result: AgentResult | None = None

    def first(self) -> Request | None:
        return self._advance(lambda: next(self._steps))

    def send(self, value: object) -> Request | None:
        return self._advance(lambda: self._steps.send(value))

    def throw(self, error: Exception) -> Request | None:
        return self._advance(lambda: self._steps.throw(error))

    def _advance(self, step: Callable[[], Request]) -> Request | None:
        try:
            return step()
        except StopIteration as done:
            self.result = done.value
            return None
