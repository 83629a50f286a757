"""The agent loop, client side: the model proposes, the control plane disposes.

    start_run (idempotent on run_id), list_tools once
    each turn:
      boundary: turn ceiling, then cost ceiling      -> budget_exhausted (run cancelled)
      context -> model.next_turn(context)             input tokens = estimate of the WHOLE context
      final answer                                    -> finish_run: completed (or the server's
                                                         word, e.g. uncertain)
      loop detector on the proposal                   -> loop_detected (run cancelled; the
                                                         repeated call is never sent)
      the turn's calls as ONE batch                   batch id = run id + turn: a retry is safe
      ASK verdicts: wait for their decisions          (watch_run, up to approval_timeout_s)
      get_run: the run ended on the server            -> the server's outcome
      observations into the context for the next turn

Outcomes and who decides them (AgentResult.ended_by):
  agent:  completed, budget_exhausted (turns or cost), loop_detected
  server: guardrail_stop, loop_detected / budget_exhausted (its own ceilings and detector),
          deadline_exceeded, cancelled, error, uncertain
A terminal outcome is returned, never raised. What is raised: errors that are not an end of
the run (a wrong token, a malformed call: InvalidArgument, a server fault: Internal, the
model's own exceptions).

Loop detection beats the turn ceiling: the detector judges a turn's proposal before the next
boundary's ceilings, so a turn that is both the last one allowed and the Nth repeat ends
loop_detected, not budget_exhausted.

Token accounting (the estimator is ringfence.turns.estimate_tokens, ceil(bytes/4)):
  input tokens of turn k  = max(the model's reported input tokens, estimate(context_k.render()))
  output tokens of turn k = the model's reported output tokens, else estimate(turn.render())
  cost = input * cost_per_input_token + output * cost_per_output_token, summed over turns
The context holds every earlier call and result, so tool output counts toward the NEXT
turn's input and input tokens grow turn by turn. A reported count is believed only upwards:
a double that reports nothing cannot make a run look cheaper than its context. Ceilings are
checked at turn boundaries, so the last turn may overshoot max_cost by at most its own cost.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from ringfence._wire import is_wire_id
from ringfence.context import ContextAssembler, MemoryRecall, Summarizer
from ringfence.errors import ControlError, FailedPrecondition
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
from ringfence.turns import (
    AgentContext,
    ModelClient,
    ModelTurn,
    ScriptedModel,
    ScriptExhausted,
    TokenUsage,
    ToolCall,
    TurnRecord,
    estimate_tokens,
)

__all__ = [
    "AgentContext",
    "AgentLoop",
    "AgentResult",
    "ModelClient",
    "ModelTurn",
    "ScriptExhausted",
    "ScriptedModel",
    "TokenUsage",
    "ToolCall",
    "TurnRecord",
    "batch_id_for",
    "estimate_tokens",
]

log = logging.getLogger("ringfence.agent")

AGENT, SERVER = "agent", "server"


@dataclass(frozen=True)
class AgentResult:
    """How a run of the loop ended, and what it cost."""

    outcome: RunOutcome
    """The terminal outcome: the loop's own (see ended_by) or the server's."""
    reason: str
    """Why, in words (the ceiling, the repeated call, the server's halt reason)."""
    ended_by: str
    """"agent" when the loop decided the outcome, "server" when the run ended on the server."""
    run_id: str
    turns: int
    """Model turns taken (calls of next_turn)."""
    input_tokens: tuple[int, ...]
    """Input tokens of each turn, in order (see the module's accounting rule)."""
    output_tokens: tuple[int, ...]
    """Output tokens of each turn, in order."""
    total_cost: float
    """Sum over turns of input * cost_per_input_token + output * cost_per_output_token."""
    trajectory: tuple[Observation, ...]
    """Every observation the loop received, in order, as the model was shown them (after any
    approval was decided)."""
    final_answer: str | None = None
    """The model's answer, when it gave one."""
    run: RunView | None = None
    """The server's last view of the run. After an agent-decided stop it says `cancelled`:
    the loop cancels the run (no RPC records a client's reason), and `outcome` says why."""
    context_tokens: tuple[int, ...] = ()
    """The estimated size of each turn's context as sent (after any compaction)."""
    compactions: int = 0
    """How many times older turns were folded into the summary (ringfence.context)."""


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


class AgentLoop:
    """`AgentLoop(client, model, max_turns=10, max_cost=1.0, ...).run() -> AgentResult`."""

    def __init__(
        self,
        client: _Client,
        model: ModelClient,
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
        (ringfence.context)."""
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        if max_cost < 0 or cost_per_input_token < 0 or cost_per_output_token < 0:
            raise ValueError("costs cannot be negative")
        if loop_threshold < 2:
            raise ValueError("loop_threshold must be at least 2")
        self.client = client
        self.model = model
        self.max_turns = max_turns
        self.max_cost = max_cost
        self.cost_per_input_token = cost_per_input_token
        self.cost_per_output_token = cost_per_output_token
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

    def run(self) -> AgentResult:
        return _Run(self).run()


class _Run:
    """The state of one run of the loop."""

    def __init__(self, loop: AgentLoop) -> None:
        self.loop = loop
        self.client = loop.client
        self.run_id = ""
        self.turns = 0
        self.server_turns = 0  # the server's turn count when the loop began (a resumed run)
        self.input_tokens: list[int] = []
        self.output_tokens: list[int] = []
        self.cost = 0.0
        self.history: list[TurnRecord] = []
        self.trajectory: list[Observation] = []
        self.proposals: Counter[tuple[str, str]] = Counter()
        self.next_seq = 1
        self.view: RunView | None = None
        self.context_tokens: list[int] = []
        self.assembler = ContextAssembler(loop.context_budget_tokens, summarizer=loop.summarizer,
                                          memory=loop.memory, keep_recent=loop.keep_recent_turns)

    def run(self) -> AgentResult:
        loop = self.loop
        self.view = self.client.start_run(loop.goal, loop.run_id)
        self.run_id = self.view.run_id
        if self.view.status is RunStatus.FINISHED:
            return self.server_ended(self.view, ())
        # A resumed run continues the server's turn numbering, so batch ids never repeat.
        self.server_turns = self.view.turns
        tools = tuple(self.client.list_tools(loop.tools_query))
        while True:
            # -- the boundary before a turn: ceilings -----------------------------------------
            if self.turns >= loop.max_turns:
                return self.agent_ended(RunOutcome.BUDGET_EXHAUSTED, f"turn ceiling reached ({loop.max_turns} turns)")
            if self.cost >= loop.max_cost:
                return self.agent_ended(RunOutcome.BUDGET_EXHAUSTED,
                                        f"cost ceiling reached ({self.cost:g} >= {loop.max_cost:g})")
            # -- the turn ----------------------------------------------------------------------
            context = self.assembler.assemble(loop.goal, self.run_id, self.turns + 1, tools, self.history)
            estimated = estimate_tokens(context.render())
            self.context_tokens.append(estimated)
            turn = loop.model.next_turn(context)
            self.turns += 1
            self.account(turn, estimated)
            if turn.final_answer is not None:
                return self.finish(turn.final_answer)
            repeated = self.repeated(turn.tool_calls)
            if repeated is not None:
                return self.agent_ended(RunOutcome.LOOP_DETECTED, repeated)
            observations, view = self.submit(turn.tool_calls)
            record = TurnRecord(self.turns, turn.tool_calls, tuple(observations))
            self.history.append(record)
            if loop.on_turn is not None:
                loop.on_turn(record)
            self.trajectory.extend(observations)
            self.view = view
            if view.status is RunStatus.FINISHED:
                return self.server_ended(view, observations)

    # -- accounting ---------------------------------------------------------------------------

    def account(self, turn: ModelTurn, estimated_input: int) -> None:
        reported = turn.usage
        input_tokens = max(estimated_input, reported.input_tokens if reported else 0)
        output_tokens = reported.output_tokens if reported else estimate_tokens(turn.render())
        self.input_tokens.append(input_tokens)
        self.output_tokens.append(output_tokens)
        self.cost += input_tokens * self.loop.cost_per_input_token + output_tokens * self.loop.cost_per_output_token

    def repeated(self, calls: Sequence[ToolCall]) -> str | None:
        """The loop detector: counts every proposal; the first call that reaches the threshold."""
        self.proposals.update(c.signature() for c in calls)
        for call in calls:
            n = self.proposals[call.signature()]
            if n >= self.loop.loop_threshold:
                return f"{call.name} {call.signature()[1]} proposed {n} times"
        return None

    # -- the batch ----------------------------------------------------------------------------

    def submit(self, calls: Sequence[ToolCall]) -> tuple[list[Observation], RunView]:
        server_turn = self.server_turns + self.turns
        wire = [ProposedCall(wire_call_id(server_turn, i, c.call_id), c.name, dict(c.arguments))
                for i, c in enumerate(calls)]
        try:
            observations = self.client.submit_batch(self.run_id, wire, batch_id_for(self.run_id, server_turn))
        except FailedPrecondition:
            # The run ended on the server before this batch (cancelled by someone, say).
            view = self.client.get_run(self.run_id)
            if view.status is not RunStatus.FINISHED:
                raise
            return [], view
        pending = {o.call_id for o in observations if o.status is ObservationStatus.PENDING_APPROVAL}
        if pending:
            self.await_decisions(pending)
        view = self.client.get_run(self.run_id)
        if pending:
            decided = {o.call_id: o for o in view.trajectory}
            observations = [decided.get(o.call_id, o) for o in observations]
        return list(observations), view

    def await_decisions(self, call_ids: set[str]) -> None:
        """Follow the run's log until each call's observation is no longer pending (approved
        and run, declined, expired), the run ends, or approval_timeout_s passes."""
        waiting = set(call_ids)
        stream = self.client.watch_run(self.run_id, self.next_seq, timeout=self.loop.approval_timeout_s)
        try:
            for event in stream:
                self.next_seq = event.seq + 1
                data = event.data
                if (event.type == "observation" and data.get("call_id") in waiting
                        and data.get("status") != ObservationStatus.PENDING_APPROVAL.value):
                    waiting.discard(data["call_id"])
                if event.type == "run_finished" or not waiting:
                    return
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
            log.info("run %s: %d call(s) still wait for approval", self.run_id, len(waiting))
        finally:
            stream.cancel()

    # -- endings ------------------------------------------------------------------------------

    def result(self, outcome: RunOutcome, reason: str, ended_by: str, final_answer: str | None = None) -> AgentResult:
        return AgentResult(
            outcome=outcome, reason=reason, ended_by=ended_by, run_id=self.run_id, turns=self.turns,
            input_tokens=tuple(self.input_tokens), output_tokens=tuple(self.output_tokens), total_cost=self.cost,
            trajectory=tuple(self.trajectory), final_answer=final_answer, run=self.view,
            context_tokens=tuple(self.context_tokens), compactions=self.assembler.compactions)

    def finish(self, answer: str) -> AgentResult:
        self.view = view = self.client.finish_run(self.run_id)
        outcome = view.outcome or RunOutcome.COMPLETED
        if outcome is RunOutcome.COMPLETED:
            return self.result(outcome, "the model gave its final answer", AGENT, answer)
        # The server's word wins: a call whose effect nobody could confirm makes it uncertain,
        # and a run already ended (cancelled, past its deadline) stays what it was.
        return self.result(outcome, f"the server ended the run: {outcome.value}", SERVER, answer)

    def agent_ended(self, outcome: RunOutcome, reason: str) -> AgentResult:
        try:
            self.view = self.client.cancel_run(self.run_id)
        except ControlError as e:
            # The outcome stands either way; the run is left for its own deadline.
            log.warning("run %s ended (%s) but could not be cancelled: %s", self.run_id, outcome.value, e)
        view = self.view
        if view is not None and view.status is RunStatus.FINISHED and view.outcome not in (None, RunOutcome.CANCELLED):
            return self.server_ended(view, ())  # the server had ended it first
        return self.result(outcome, reason, AGENT)

    def server_ended(self, view: RunView, last: Sequence[Observation]) -> AgentResult:
        self.view = view
        outcome = view.outcome or RunOutcome.ERROR
        halted = [o.error for o in last if o.status is ObservationStatus.HALTED and o.error]
        reason = halted[0] if halted else f"the run ended on the server: {outcome.value}"
        return self.result(outcome, reason, SERVER)
