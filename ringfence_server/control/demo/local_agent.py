"""`ringfence demo --model local` (`make demo-local`): the reference demo's incident-response agent
(reference.py: its stack, tools, policy and approver) driven by a real language model on this
machine instead of the ScriptedModel: Gemma 3 270M behind llama-cpp-python's OpenAI-compatible
server (local_model.py), through OpenAIChatModel, the SDK and the real control plane.

Steered, not scripted. Left to choose (tool_choice "auto"), the 270M model answers at once with
an empty message and calls nothing (measured on every goal tried). So the first turns name the
tool it must call (tool_choice = that tool): turn 1 read_file, turn 2 fetch_url, turn 3
issue_credit, turn 4 write_file; from turn 5 it chooses. What it calls each tool WITH (a path,
a URL, an account, an amount) is the model's own, and that is what the control plane judges: a
path outside /input is denied, a credit is asked of the approver (who approves up to $100), an
argument outside the tool's schema is denied, arguments that are not JSON are shown back to the
model as `invalid` without reaching the server.

Not byte-exact: it is a real model. What the demo checks (exit 1 otherwise) is the contract: the
run ends with a named outcome, not an `error` of the model's server (the local server must answer
every turn); every call the model proposed has exactly one observation, and the server's log
holds every one of them but the loop's own `invalid` ones; the approver decided every ask; no
container is left.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from ringfence import Approver, Client
from ringfence.agent import AgentContext, AgentLoop, AgentResult, ModelClient, ModelTurn, TurnRecord
from ringfence.model import Event, ObservationStatus, RunOutcome
from ringfence_server.control.demo.local_model import (
    INSTALL_HINT,
    MODEL_SHA256,
    LocalModelMissing,
    LocalModelServer,
)
from ringfence_server.control.demo.reference import (
    AGENT_TOKEN,
    APPROVER_LIMIT,
    APPROVER_TOKEN,
    GOAL,
    RUNBOOK_URL,
    SUMMARY_PATH,
    DemoApprover,
    Narrated,
    _left_behind,
    _show_turn,
    summary_lines,
)

__all__ = ["LOCAL_GOAL", "STEERING", "Steered", "contract_problems", "local_models", "run"]

STEERING = ("read_file", "fetch_url", "issue_credit", "write_file")
"""The tool the model must call on turns 1, 2, 3, 4 (tool_choice); then "auto"."""
TOOLS_QUERY = " ".join(STEERING)
"""ListTools narrowed to the four tools the agent needs (a 270M model reads every schema each turn)."""
LOCAL_GOAL = (f"{GOAL} The incident is in /input/incident.md, the runbook at {RUNBOOK_URL}; "
              f"credits go through issue_credit (account acme-9); write the summary to {SUMMARY_PATH}.")
"""The reference goal, with where things are: what an operator would tell a real agent."""
MAX_TURNS = 6
MAX_OUTPUT_TOKENS = 256
LOCAL_REQUEST_TIMEOUT_S = 300.0
"""One request's deadline. A late turn (2,300 tokens in, 256 out) takes 20-40 s on two quiet
cores, and past 60 s (ModelRetry's default) when the machine is busy. The default then does harm:
llama-cpp-python's server answers one request at a time and finishes one whose client gave up,
so each retry queues behind the abandoned generation and times out too (4 attempts: the demo
ended after ~320 s, its model never answering). A local server is slow, not lost: wait for it."""


def local_models(server: LocalModelServer, steering: Sequence[str] = STEERING,
                 max_output_tokens: int = MAX_OUTPUT_TOKENS) -> Steered:
    """One OpenAIChatModel per tool_choice, on the local server (no key), temperature 0."""
    try:
        from ringfence.models import ModelRetry
        from ringfence.models.openai import OpenAIChatModel
    except ImportError as e:
        raise LocalModelMissing(f"the local model needs the `openai` package ({e}): {INSTALL_HINT}") from None

    def model(choice: str) -> ModelClient:
        # tool_results="user": llama-cpp-python's function-calling template drops `tool` messages.
        return OpenAIChatModel(server.model, base_url=server.base_url, api_key_env=None, tool_choice=choice,
                               temperature=0.0, max_output_tokens=max_output_tokens, tool_results="user",
                               retry=ModelRetry(request_timeout_s=LOCAL_REQUEST_TIMEOUT_S))

    return Steered([model(tool) for tool in steering], model("auto"))


class Steered:
    """A ModelClient that asks `first[k]` on turn k+1, and `then` after them."""

    def __init__(self, first: Sequence[ModelClient], then: ModelClient) -> None:
        self.first = list(first)
        self.then = then

    def next_turn(self, context: AgentContext) -> ModelTurn:
        index = context.turn - 1
        model = self.first[index] if 0 <= index < len(self.first) else self.then
        return model.next_turn(context)


class _Told(Narrated):
    """Narrated, saying also what a real model's turn carries that a script's never does."""

    def next_turn(self, context: AgentContext) -> ModelTurn:
        started = time.monotonic()
        turn = super().next_turn(context)
        took = time.monotonic() - started
        for call in turn.tool_calls:
            if call.invalid_arguments is not None:
                print(f"   (its arguments for {call.name}: {call.invalid_arguments[:120]})", file=self.out)
        if turn.truncated:
            print(f"   its response was cut by the length limit (finish reason {turn.finish_reason!r})", file=self.out)
        usage = turn.usage
        said = (f"{usage.input_tokens} in, {usage.output_tokens} out" if usage is not None else "no usage reported")
        print(f"   model: finish reason {turn.finish_reason or '-'}, {said}, {took:.1f} s", file=self.out, flush=True)
        return turn


def contract_problems(result: AgentResult, records: Sequence[TurnRecord], events: Sequence[Event]) -> list[str]:
    """What breaks the contract of a run (module docstring), in words; [] when it holds."""
    problems: list[str] = []
    for record in records:
        if len(record.observations) != len(record.calls) and record is not records[-1]:
            problems.append(f"turn {record.turn}: {len(record.calls)} call(s), "
                            f"{len(record.observations)} observation(s)")
    seen = [o for r in records for o in r.observations]
    if list(result.trajectory) != seen:
        problems.append("the trajectory is not the turns' observations")
    logged = {e.data.get("call_id") for e in events if e.type == "observation"}
    named = {e.data.get("call_id") for e in events}
    invalid = {o.call_id for o in seen if o.status is ObservationStatus.INVALID}
    admitted = {o.call_id for o in seen} - invalid
    if admitted != logged:
        problems.append(f"the server's log has observations for {sorted(map(str, logged))}, "
                        f"the run for {sorted(admitted)}")
    if invalid & named:
        problems.append(f"the loop's own invalid observations reached the server: {sorted(invalid & named)}")
    if not events or events[-1].type != "run_finished":
        problems.append("the run's log does not end with run_finished")
    return problems


def _events(client: Client, run_id: str) -> list[Event]:
    out: list[Event] = []
    for event in client.watch_run(run_id, 0, timeout=30):
        out.append(event)
        if event.type == "run_finished":
            break
    return out


def run(workdir: Path | None = None, out: TextIO = sys.stdout) -> int:
    from ringfence_server.control.demo.stack import DemoStack

    # With a workdir the model server's log stays beside the run's state, for a look afterwards.
    log_path = None
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        log_path = Path(workdir) / "local-model.log"
    server = LocalModelServer(log_path=log_path)
    with server, tempfile.TemporaryDirectory(prefix="ringfence-demo-") as tmp:
        model = local_models(server)
        where = Path(workdir) if workdir is not None else Path(tmp)
        with DemoStack(where) as stack:
            config, ledger = stack.config, stack.ledger
            assert config is not None and ledger is not None, "the stack is started"
            print("ringfence demo --model local: the incident-response agent, driven by a real language model\n",
                  file=out)
            print(f"model           {server.model} (Gemma 3 270M, Q4_K_M, sha256 {MODEL_SHA256[:16]}…, checked) "
                  f"on {server.base_url}, llama-cpp-python", file=out)
            print(f"steering        tool_choice {', '.join(STEERING)} on turns 1-{len(STEERING)}, then auto; "
                  "the arguments are the model's own", file=out)
            print(f"control plane   {stack.address} (event log {config.db_path})", file=out)
            print(f"approver        a second client with the approver token; approves credits up to "
                  f"${APPROVER_LIMIT:g}\n", file=out, flush=True)
            approve = DemoApprover(out)
            records: list[TurnRecord] = []

            def on_turn(record: TurnRecord) -> None:
                records.append(record)
                _show_turn(record, out)

            with Client(stack.address, AGENT_TOKEN) as agent, Client(stack.address, APPROVER_TOKEN) as approver_client:
                with Approver(approver_client, approve) as helper:
                    loop = AgentLoop(agent, _Told(model, out), goal=LOCAL_GOAL, max_turns=MAX_TURNS, max_cost=1.0,
                                     cost_per_input_token=3e-6, cost_per_output_token=1.5e-5,
                                     approval_timeout_s=120, on_turn=on_turn, tools_query=TOOLS_QUERY)
                    result = loop.run()
                events = _events(agent, result.run_id)
            credits = ledger.all_credits()
            asked = sum(1 for e in events if e.type == "approval_requested")
            decided = sum(1 for e in events if e.type == "approval_decided")
            print(f"\nrun             {result.run_id}", file=out)
            if workdir is not None:
                print(f"                its log: ringfence runs show {result.run_id} --state-dir {where / 'state'}",
                      file=out)
            print(f"ended by        {result.ended_by}: {result.reason}", file=out)
            print(f"finish reasons  {', '.join(r or '-' for r in result.finish_reasons)}", file=out)
            print(f"input tokens    {' → '.join(str(n) for n in result.input_tokens)}", file=out)
            print(f"events          {len(events)} in the run's log ({asked} approval_requested, "
                  f"{decided} approval_decided)", file=out)
            print(f"approvals       asked {len(approve.asked)}: "
                  + (", ".join(f"${float(a.arguments.get('amount', 0)):g} {'approved' if d.approve else 'declined'}"
                               for a, d in approve.asked) or "none")
                  + f" ({len(helper.decided)} decided, {len(helper.errors)} approver error(s))", file=out)
            ours = stack.container_names()
        left = _left_behind(result.run_id, ours)
        print(f"containers left {len(left)}\n", file=out)
    problems = contract_problems(result, records, events)
    if result.outcome is RunOutcome.ERROR and result.ended_by == "model":
        problems.append(f"the local model's server gave no turn: {result.reason}")
    if asked != decided or len(approve.asked) != asked:
        problems.append(f"{asked} ask(s) in the log, {decided} decided, {len(approve.asked)} seen by the approver")
    if left:
        problems.append(f"containers left behind: {left}")
    for line in summary_lines(result, credits):
        print(line, file=out)
    out.flush()
    for p in problems:
        print(f"UNEXPECTED: {p}", file=sys.stderr)
    return 1 if problems else 0


def describe(turn: ModelTurn) -> str:
    """One line for a turn, as the tests print what the model did."""
    if turn.truncated:
        return f"cut by the length limit ({turn.finish_reason})"
    if turn.final_answer is not None:
        return f"answer {turn.final_answer[:80]!r} ({turn.finish_reason})"
    calls = "; ".join(f"{c.name} {json.dumps(dict(c.arguments), sort_keys=True)[:100]}"
                      + (f" INVALID {c.invalid_arguments[:80]}" if c.invalid_arguments else "")
                      for c in turn.tool_calls)
    return f"{calls} ({turn.finish_reason})"
