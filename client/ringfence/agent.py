"""The agent loop, client side: the model proposes, the control plane disposes.

    start_run (idempotent on run_id), list_tools once
    each turn:
      boundary: turn ceiling, then cost ceiling      -> budget_exhausted (run cancelled)
                then the loop's deadline             -> deadline_exceeded (run cancelled)
      context -> model.next_turn(context)             input tokens = estimate of the WHOLE context;
                                                      context.deadline = the loop's deadline
      the model's provider failed (ModelError)        -> error, ended_by model (run cancelled)
      the response was cut by the length limit        -> model_truncated, ended_by model (run
                                                         cancelled; nothing of it is acted on)
      the deadline passed while the model answered    -> deadline_exceeded (nothing of it is sent)
      final answer                                    -> finish_run: completed (or the server's
                                                         word, e.g. uncertain)
      loop detector on the proposal                   -> loop_detected (run cancelled; the
                                                         repeated call is never sent)
      calls whose arguments are not a JSON object     never sent: an `invalid` observation each
      the turn's other calls as ONE batch             batch id = run id + turn: a retry is safe
      the server refuses the batch for its calls      an `invalid` observation per call, none ran
      ASK verdicts: wait for their decisions          (watch_run, up to approval_timeout_s, never
                                                      past the deadline)
      get_run: the run ended on the server            -> the server's outcome
      observations into the context for the next turn

Two drivers, one core: AgentLoop runs on Client, AsyncAgentLoop on AsyncClient (its model's
next_turn may be a coroutine function: AsyncModelClient; a plain ModelClient runs in a worker
thread). Both take the same arguments and return the same AgentResult: every rule above lives
once, in ringfence._loop, which does no I/O itself.

Outcomes and who decides them (AgentResult.ended_by):
  agent:  completed, budget_exhausted (turns or cost), deadline_exceeded (max_duration_s),
          loop_detected
  model:  model_truncated (the response was cut by the length limit: the reason names the
          provider's raw finish_reason), error (the provider gave no turn: a ModelError, the
          reason names the provider and its HTTP status, never a key)
  server: guardrail_stop, loop_detected / budget_exhausted (its own ceilings and detector),
          deadline_exceeded, cancelled, error, uncertain
A terminal outcome is returned, never raised; a run ended on this side (agent or model) is
cancelled on the server. What is raised: errors that are not an end of the run (a wrong token,
a harness bug such as a bad run id: InvalidArgument, a server fault: Internal, a model's
exceptions other than ModelError: bugs).

A model's bad calls are observations for it to repair, never exceptions:
  - a ToolCall with `invalid_arguments` (an adapter could not read its arguments as a JSON
    object) is never sent: the model is shown an `invalid` observation under that call's id
    (error_class invalid_arguments, the problem and "send the call again with a JSON object as
    arguments"); the turn's other calls go as one batch; when every call is invalid no batch is
    sent at all.
  - a batch the server refuses whole with InvalidArgument naming its calls (`calls[i].tool`,
    `calls[i].arguments_json`, ...: nothing of it ran) becomes one `invalid` observation per
    call: the calls named carry the violations (error_class invalid_call), the others "not
    run: the batch is admitted whole or not at all, and another call of it was invalid"
    (batch_refused); a violation about the calls that names no index goes on every call.
(Schema-invalid arguments are judged per call by the server's admission: a `denied`
observation with error_class invalid_arguments, the batch's other calls still admitted.)

Loop detection beats the turn ceiling: the detector judges a turn's proposal before the next
boundary's ceilings, so a turn that is both the last one allowed and the Nth repeat ends
loop_detected, not budget_exhausted. A call whose arguments were not JSON repeats only with the
same broken text.

The deadline (max_duration_s, from the start of run(), on time.monotonic()) is checked at each
boundary and again when the model's turn comes back: what a model answered after it is neither
sent nor completed. A ModelError raised once the deadline has passed (an adapter clamps its
request to AgentContext.deadline) ends the run deadline_exceeded (ended_by agent), not error.

Token accounting (the estimator is ringfence.turns.estimate_tokens, ceil(bytes/4)):
  input tokens of turn k  = max(the model's reported input tokens, estimate(context_k.render())),
                            cached ones included (TokenUsage: cached_input_tokens <= input_tokens)
  cached tokens of turn k = the model's reported cached_input_tokens, else 0
  output tokens of turn k = the model's reported output tokens, else estimate(turn.render())
  cost of turn k = (input - cached) * cost_per_input_token
                   + cached * cost_per_cached_input_token (None: cost_per_input_token)
                   + output * cost_per_output_token
  so a cached token is counted once, at its own rate; the cost is summed over turns (a turn
  cut by the length limit is paid for too).
The context holds every earlier call and result, so tool output counts toward the NEXT
turn's input and input tokens grow turn by turn. A reported count is believed only upwards:
a double that reports nothing cannot make a run look cheaper than its context. Ceilings are
checked at turn boundaries, so the last turn may overshoot max_cost by at most its own cost.

Tracing: the whole run is one span, `invoke_agent {name}` (kind INTERNAL; gen_ai.operation.name,
gen_ai.agent.name = `name`, ringfence.run_id once known, ringfence.outcome and ringfence.turns
at the end), current while the model is asked and while the SDK calls the server: a model
adapter's `chat` spans and the server's RPC spans are its children (the server's own run trace
is linked to its StartRun RPC span).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Protocol, cast

import grpc
from opentelemetry import trace

from ringfence._loop import (
    AgentResult,
    Assemble,
    AwaitDecisions,
    CancelRun,
    DecisionWait,
    FinishRun,
    GetRun,
    ListTools,
    LoopCore,
    LoopSettings,
    NextTurn,
    Request,
    StartRun,
    Stepper,
    SubmitBatch,
    batch_id_for,
)
from ringfence.model import Event, Observation, ProposedCall, RunView, ToolView
from ringfence.turns import (
    AgentContext,
    ModelClient,
    ModelTurn,
    ScriptedModel,
    ScriptExhausted,
    StopReason,
    TokenUsage,
    ToolCall,
    TurnRecord,
    estimate_tokens,
)

__all__ = [
    "AgentContext",
    "AgentLoop",
    "AgentResult",
    "AsyncAgentLoop",
    "AsyncModelClient",
    "ModelClient",
    "ModelTurn",
    "ScriptExhausted",
    "ScriptedModel",
    "StopReason",
    "TokenUsage",
    "ToolCall",
    "TurnRecord",
    "batch_id_for",
    "estimate_tokens",
]

log = logging.getLogger("ringfence.agent")


class AsyncModelClient(Protocol):
    """A language model behind AsyncAgentLoop whose next_turn is a coroutine."""

    async def next_turn(self, context: AgentContext) -> ModelTurn: ...


class _EventStream(Protocol):
    """A run's events as the client streams them (ringfence.Stream[Event])."""

    def __iter__(self) -> Iterator[Event]: ...
    def cancel(self) -> None: ...


class _Client(Protocol):
    """What the loop needs of ringfence.Client."""

    def start_run(self, goal: str, run_id: str | None = None) -> RunView: ...
    def get_run(self, run_id: str) -> RunView: ...
    def finish_run(self, run_id: str) -> RunView: ...
    def cancel_run(self, run_id: str) -> RunView: ...
    def list_tools(self, query: str = "") -> list[ToolView]: ...
    def submit_batch(self, run_id: str, calls: Sequence[ProposedCall],
                     batch_id: str | None = None) -> list[Observation]: ...
    def watch_run(self, run_id: str, from_seq: int = 0, *, timeout: float | None = None) -> _EventStream: ...


class _AsyncEventStream(Protocol):
    """A run's events as the async client streams them (ringfence.AsyncStream[Event])."""

    def __aiter__(self) -> AsyncIterator[Event]: ...
    def cancel(self) -> None: ...


class _AsyncClient(Protocol):
    """What the async loop needs of ringfence.AsyncClient."""

    async def start_run(self, goal: str, run_id: str | None = None) -> RunView: ...
    async def get_run(self, run_id: str) -> RunView: ...
    async def finish_run(self, run_id: str) -> RunView: ...
    async def cancel_run(self, run_id: str) -> RunView: ...
    async def list_tools(self, query: str = "") -> list[ToolView]: ...
    async def submit_batch(self, run_id: str, calls: Sequence[ProposedCall],
                           batch_id: str | None = None) -> list[Observation]: ...
    def watch_run(self, run_id: str, from_seq: int = 0, *, timeout: float | None = None) -> _AsyncEventStream: ...


def _stream_ended_by_its_deadline(e: grpc.RpcError, run_id: str, wait: DecisionWait) -> None:
    """A watch that reaches approval_timeout_s is the end of the wait, not an error."""
    if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
        raise e
    log.info("run %s: %d call(s) still wait for approval", run_id, len(wait.waiting))


class AgentLoop(LoopSettings[_Client, ModelClient]):
    """`AgentLoop(client, model, max_turns=10, max_cost=1.0, ...).run() -> AgentResult`, on
    ringfence.Client (the arguments: LoopSettings.__init__)."""

    def run(self) -> AgentResult:
        span = self.open_span()
        with trace.use_span(span, end_on_exit=True):
            steps = Stepper(LoopCore(self, span).steps())
            request = steps.first()
            while request is not None:
                try:
                    value = self._perform(request)
                except Exception as e:  # noqa: BLE001 - every failure goes back to the core, which decides
                    request = steps.throw(e)
                else:
                    request = steps.send(value)
        assert steps.result is not None
        return steps.result

    def _perform(self, request: Request) -> object:
        client = self.client
        match request:
            case StartRun(goal, run_id):
                return client.start_run(goal, run_id)
            case ListTools(query):
                return client.list_tools(query)
            case Assemble(work):
                return work()
            case NextTurn(context):
                return self.model.next_turn(context)
            case SubmitBatch(run_id, calls, batch_id):
                return client.submit_batch(run_id, calls, batch_id)
            case GetRun(run_id):
                return client.get_run(run_id)
            case AwaitDecisions(run_id, from_seq, call_ids, timeout):
                wait = DecisionWait(call_ids, from_seq)
                stream = client.watch_run(run_id, from_seq, timeout=timeout)
                try:
                    for event in stream:
                        if wait.see(event):
                            break
                except grpc.RpcError as e:
                    _stream_ended_by_its_deadline(e, run_id, wait)
                finally:
                    stream.cancel()
                return wait.next_seq
            case FinishRun(run_id):
                return client.finish_run(run_id)
            case CancelRun(run_id):
                return client.cancel_run(run_id)
        raise TypeError(f"the loop's core asked for something unknown: {request!r}")


class AsyncAgentLoop(LoopSettings[_AsyncClient, ModelClient | AsyncModelClient]):
    """`await AsyncAgentLoop(async_client, model, ...).run() -> AgentResult`: AgentLoop's
    semantics on ringfence.AsyncClient, on the caller's event loop. The model may be an
    AsyncModelClient (its next_turn is awaited) or a ModelClient (its next_turn runs in a worker
    thread, with the agent's span current there too). Context assembly (memory recall, a
    summarizer) runs in a worker thread as well, so nothing of the loop blocks the event loop."""

    async def run(self) -> AgentResult:
        span = self.open_span()
        with trace.use_span(span, end_on_exit=True):
            steps = Stepper(LoopCore(self, span).steps())
            request = steps.first()
            while request is not None:
                try:
                    value = await self._perform(request)
                except Exception as e:  # noqa: BLE001 - every failure goes back to the core, which decides
                    request = steps.throw(e)
                else:
                    request = steps.send(value)
        assert steps.result is not None
        return steps.result

    async def _next_turn(self, context: AgentContext) -> ModelTurn:
        next_turn = self.model.next_turn
        if inspect.iscoroutinefunction(next_turn):
            return cast(ModelTurn, await next_turn(context))
        # A synchronous model would block the event loop: it runs in a worker thread, which
        # asyncio.to_thread gives a copy of this context (the agent's span stays current).
        turn: Any = await asyncio.to_thread(next_turn, context)
        if inspect.isawaitable(turn):  # a next_turn that returns a coroutine without being one
            turn = await turn
        return cast(ModelTurn, turn)

    async def _perform(self, request: Request) -> object:
        client = self.client
        match request:
            case StartRun(goal, run_id):
                return await client.start_run(goal, run_id)
            case ListTools(query):
                return await client.list_tools(query)
            case Assemble(work):
                return await asyncio.to_thread(work)
            case NextTurn(context):
                return await self._next_turn(context)
            case SubmitBatch(run_id, calls, batch_id):
                return await client.submit_batch(run_id, calls, batch_id)
            case GetRun(run_id):
                return await client.get_run(run_id)
            case AwaitDecisions(run_id, from_seq, call_ids, timeout):
                wait = DecisionWait(call_ids, from_seq)
                stream = client.watch_run(run_id, from_seq, timeout=timeout)
                events = stream.__aiter__()
                try:
                    async for event in events:
                        if wait.see(event):
                            break
                except grpc.RpcError as e:
                    _stream_ended_by_its_deadline(e, run_id, wait)
                finally:
                    stream.cancel()
                    aclose = getattr(events, "aclose", None)
                    if aclose is not None:
                        await aclose()
                return wait.next_seq
            case FinishRun(run_id):
                return await client.finish_run(run_id)
            case CancelRun(run_id):
                return await client.cancel_run(run_id)
        raise TypeError(f"the loop's core asked for something unknown: {request!r}")
