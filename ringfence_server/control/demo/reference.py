"""`ringfence demo`: the reference incident-response agent, seven turns through the real server.

The agent is scripted (ScriptedModel: the same turns every time, so the ending is checkable),
everything else is real: the gRPC control plane on a loopback port, the agent and the approver
as two clients with their own tokens, a fresh hardened container per executed call, the egress
proxy, and two internal services in containers of pinned images (runbooks, ledger).

    turn 1  read_file /input/incident.md  +  fetch_url the runbook      one batch, run in parallel
    turn 2  read_file /etc/passwd                                       denied by path policy
    turn 3  issue_credit acme-9 $500                                    asked; the approver declines
    turn 4  issue_credit acme-9 $50                                     asked; approved and remembered
    turn 5  issue_credit acme-9 $50 again (the model forgot)            no ask; deduplicated, not run
    turn 6  write_file /output/incident-summary.md                      executed
    turn 7  the final answer                                            completed

Denied, declined and deduplicated calls come back to the model as observations, not errors.
The last four lines are read from the result and from the ledger itself (what was applied),
never from a tool's reply.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ringfence import ApprovalDecision, Approver, Client
from ringfence.agent import AgentContext, AgentLoop, AgentResult, ModelClient, ModelTurn, ScriptedModel, ToolCall
from ringfence.model import Approval, ApprovalStatus, Observation, ObservationStatus
from ringfence.turns import TurnRecord
from ringfence_server.control.demo.console_mode import HUMAN_WAIT_S, PersonApproves, person_approves

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

# The embedded config's public dev tokens (ringfence_server/control/default_config.toml).
AGENT_TOKEN, APPROVER_TOKEN = "demo-agent-token", "demo-approver-token"
GOAL = ("INC-4471: customer acme-9 was charged twice. Read the incident and the runbook, make the "
        "customer whole, and write a summary.")
APPROVER_LIMIT = 100.0
"""The demo approver approves credits up to this amount (and remembers them for the run)."""
RUNBOOK_URL = "http://runbooks.internal.corp/runbooks/payment-failed"
REFUND = {"account": "acme-9", "amount": 50, "reason": "INC-4471: refund of the double charge"}
SUMMARY_PATH = "/output/incident-summary.md"
CONTEXT_BUDGET = 2_800
"""The agent's context budget in tokens (ringfence.context): past it, older turns are folded.
Sized for the built-in catalogue (every tool's schema is in each turn's context: 1927 tokens at
turn 1, 2693 at turn 6, 2921 at turn 7 uncompacted), so that one compaction comes before turn 7;
a bigger catalogue moves it earlier (tests/e2e/test_demo.py says so)."""


def _summary(context: AgentContext) -> ModelTurn:
    """Turn 6: a summary written from what the earlier turns observed (not from the script)."""
    lines = [f"# {GOAL.split(':', 1)[0]} summary", ""]
    for result in context.results():
        lines.append(f"- {result['name']} ({result['id']}): {result['status']}")
    lines += ["", "acme-9 was credited $50 once, for the double charge."]
    return ModelTurn.calls(ToolCall("write_file", {"path": SUMMARY_PATH, "content": "\n".join(lines) + "\n"},
                                    "summary"))


def reference_model() -> ScriptedModel:
    return ScriptedModel([
        ModelTurn.calls(ToolCall("read_file", {"path": "/input/incident.md"}, "incident"),
                        ToolCall("fetch_url", {"url": RUNBOOK_URL}, "runbook")),
        ModelTurn.calls(ToolCall("read_file", {"path": "/etc/passwd"}, "users")),
        ModelTurn.calls(ToolCall("issue_credit", {"account": "acme-9", "amount": 500,
                                                  "reason": "INC-4471: goodwill for the trouble"}, "goodwill")),
        ModelTurn.calls(ToolCall("issue_credit", REFUND, "refund")),
        ModelTurn.calls(ToolCall("issue_credit", REFUND, "refund-again")),
        _summary,
        ModelTurn.answer("acme-9 has its $50 back (once); the summary is in /output/incident-summary.md."),
    ])


class Narrated:
    """A ModelClient that says what the model proposes each turn, before the batch is sent
    (the scripted model here; a real one in `ringfence demo --model local`, local_agent.py)."""

    def __init__(self, model: ModelClient, out: TextIO) -> None:
        self.model = model
        self.out = out

    def next_turn(self, context: AgentContext) -> ModelTurn:
        turn = self.model.next_turn(context)
        print(f"turn {context.turn}", file=self.out)
        if turn.final_answer is not None:
            print(f"   final answer: {turn.final_answer}", file=self.out)
        for call in turn.tool_calls:
            print(f"   proposes {call.name} {json.dumps(dict(call.arguments), sort_keys=True)[:100]}", file=self.out)
        self.out.flush()
        return turn


class DemoApprover:
    """The approver's callable: credits up to APPROVER_LIMIT are approved and remembered."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.asked: list[tuple[Approval, ApprovalDecision]] = []
        self._lock = threading.Lock()

    def __call__(self, approval: Approval) -> ApprovalDecision:
        amount = float(approval.arguments.get("amount", 0))
        arguments = json.dumps(dict(approval.arguments), sort_keys=True)
        if amount <= APPROVER_LIMIT:
            decision = ApprovalDecision(True, f"within my ${APPROVER_LIMIT:g} limit", remember=True)
            said = "approve, and remember for this run"
        else:
            decision = ApprovalDecision(False, f"over my ${APPROVER_LIMIT:g} limit")
            said = "decline"
        with self._lock:
            self.asked.append((approval, decision))
        print(f"   approver asked: {approval.tool} {arguments}\n"
              f"                   digest {approval.digest[:23]}…  -> {said}", file=self.out, flush=True)
        return decision

    def amounts(self) -> list[float]:
        return [float(a.arguments["amount"]) for a, _ in self.asked]


def _detail(o: Observation) -> str:
    if o.error:
        return o.error
    if o.tool == "fetch_url" and isinstance(o.content, dict):
        return f"HTTP {o.content.get('status')} {o.content.get('content_type')}, {len(o.content.get('body', ''))} bytes"
    if o.tool == "read_file" and isinstance(o.content, dict):
        return f"{len(str(o.content.get('content', '')))} characters"
    if o.content is not None:
        return json.dumps(o.content, sort_keys=True)[:80]
    return ""


def _show_turn(record: TurnRecord, out: TextIO) -> None:
    for o in record.observations:
        print(f"   -> {o.tool:<13} {o.status.value:<13} executed={o.executed!s:<5} "
              f"path={' > '.join(o.verdict_path)}", file=out)
        detail = _detail(o)
        if detail:
            print(f"      {'':<13} {detail[:110]}", file=out)
    out.flush()


def _count_events(client: Client, run_id: str) -> tuple[int, dict[str, int]]:
    total, by_type = 0, dict[str, int]()
    for event in client.watch_run(run_id, 0, timeout=30):
        total += 1
        by_type[event.type] = by_type.get(event.type, 0) + 1
        if event.type == "run_finished":
            break
    return total, by_type


def summary_lines(result: AgentResult, credits: list[dict[str, Any]]) -> list[str]:
    """The four closing lines: the outcome, the turns, the executed calls, the ledger's credits."""
    executed = [o.tool for o in result.trajectory if o.executed and o.status is ObservationStatus.EXECUTED]
    applied = [f"{c['account']}:{float(c['amount'])}" for c in credits]
    return [
        f"{'outcome':<12}{result.outcome.value}",
        f"{'turns':<12}{result.turns}",
        f"{'trajectory':<12}{' → '.join(executed)}",
        f"{'credits':<12}{applied}",
    ]


def _install_span_memory() -> InMemorySpanExporter:
    """Keep this process's spans in memory (the server runs in it), for the trace tree."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@contextlib.contextmanager
def _approver(client: Client, approve: DemoApprover, address: str, console: str | None,
              out: TextIO) -> Iterator[Approver | PersonApproves]:
    """The scripted approver, or (with `console`) a person in the reviewer's console."""
    if console is None:
        with Approver(client, approve) as helper:
            yield helper
        return
    with person_approves(address, console, APPROVER_TOKEN, out) as person:
        yield person


def _asked(approvals: list[Approval]) -> str:
    """The console mode's approvals line: what the person decided, from the run's own record."""
    said = {ApprovalStatus.APPROVED: "approved", ApprovalStatus.USED: "approved",
            ApprovalStatus.DECLINED: "declined"}
    return ", ".join(f"${float(a.arguments.get('amount', 0)):g} {said.get(a.status, a.status.value)}"
                     for a in approvals)


def run(workdir: Path | None = None, out: TextIO = sys.stdout, console: str | None = None) -> int:
    """The demo; with `console` (HOST:PORT) a person approves in the reviewer's console served there."""
    from ringfence_server.control.demo.skills_scene import run_skill_scene
    from ringfence_server.control.demo.stack import DemoStack
    from ringfence_server.control.demo.tracetree import render, run_spans

    spans = _install_span_memory()
    with tempfile.TemporaryDirectory(prefix="ringfence-demo-") as tmp:
        where = Path(workdir) if workdir is not None else Path(tmp)
        with DemoStack(where) as stack:
            config, ledger = stack.config, stack.ledger
            assert config is not None and ledger is not None, "the stack is started"
            print("ringfence reference demo: an incident-response agent, seven turns, real containers\n", file=out)
            print(f"control plane   {stack.address} (event log {config.db_path})", file=out)
            print(f"services        runbooks.internal.corp, ledger.ringfence.internal on {ledger.network}, "
                  "reached only through the egress proxy", file=out)
            if console is None:
                print(f"approver        a second client with the approver token; approves credits up to "
                      f"${APPROVER_LIMIT:g}\n", file=out, flush=True)
            else:
                print("approver        you, in the reviewer's console", file=out, flush=True)
            approve = DemoApprover(out)
            with Client(stack.address, AGENT_TOKEN) as agent, Client(stack.address, APPROVER_TOKEN) as approver_client:
                with _approver(approver_client, approve, stack.address, console, out) as helper:
                    loop = AgentLoop(agent, Narrated(reference_model(), out), goal=GOAL, max_turns=10, max_cost=1.0,
                                     cost_per_input_token=3e-6, cost_per_output_token=1.5e-5,
                                     approval_timeout_s=120 if console is None else HUMAN_WAIT_S,
                                     on_turn=lambda r: _show_turn(r, out), context_budget_tokens=CONTEXT_BUDGET)
                    result = loop.run()
                print(file=out)
                decided = approver_client.list_approvals(result.run_id) if console is not None else []
                events, by_type = _count_events(agent, result.run_id)
                # A skill the agent proposes is not reusable until a reviewer's fixtures pass it
                # in fresh sandboxes (ringfence.skills).
                skill_ok = run_skill_scene(agent, where / "skills.sqlite3", lambda line: print(line, file=out))
                print(file=out)
            credits = ledger.all_credits()
            ledger_stats = ledger.stats()
            print("trace (this process's spans of the run; ∥ = tools that ran at the same time)", file=out)
            for line in render(run_spans(spans.get_finished_spans(), result.run_id)):
                print(f"   {line}", file=out)
            print(f"\nrun             {result.run_id}", file=out)
            if workdir is not None:
                print(f"                its log: ringfence runs show {result.run_id} --state-dir {where / 'state'}",
                      file=out)
            tokens = " → ".join(str(n) for n in result.context_tokens)
            print(f"context tokens  {tokens}  (each turn's context holds every earlier result, until compacted)",
                  file=out)
            print(f"compactions     {result.compactions} (budget {CONTEXT_BUDGET} tokens; older turns folded into a "
                  "summary, the goal kept byte for byte)", file=out)
            print(f"cost            ${result.total_cost:.4f} at $3/M input, $15/M output tokens", file=out)
            print(f"events          {events} in the run's log ({by_type.get('approval_requested', 0)} "
                  f"approval_requested, {by_type.get('grant_added', 0)} grant_added)", file=out)
            if console is None:
                asked = ", ".join(f"${float(a.arguments['amount']):g} {'approved' if d.approve else 'declined'}"
                                  for a, d in approve.asked)
                print(f"approvals       asked {len(approve.asked)}: {asked}; the repeat of $50 was not asked "
                      f"({len(helper.decided)} decided, {len(helper.errors)} approver error(s))", file=out)
            else:
                print(f"approvals       asked {len(decided)}: {_asked(decided)} (decided in the console)", file=out)
            print(f"ledger          {ledger_stats['credits']} credit(s) applied, {ledger_stats['replays']} replay(s), "
                  f"{ledger_stats['network']['requests']} request(s) over the network", file=out)
            ours = stack.container_names()
        # The stack is gone: nothing of this demo may be left, neither a call's sandbox nor a service.
        left = _left_behind(result.run_id, ours)
        print(f"containers left {len(left)}\n", file=out)
    for line in summary_lines(result, credits):
        print(line, file=out)
    out.flush()
    # A person's decisions are theirs: the scripted approver's expectations hold only without one.
    expected = _as_expected(result, credits, approve) if console is None else True
    return 0 if expected and skill_ok and not left else 1


def _left_behind(run_id: str, names: set[str]) -> list[str]:
    import contextlib

    import docker

    from ringfence_server.sandbox import labels as L
    from ringfence_server.sandbox import listing

    with contextlib.closing(docker.from_env(timeout=60)) as client:
        found = listing.containers(client, {"label": f"{L.PRODUCT_LABEL}={L.PRODUCT}"})
        # An unnamed container (none should be) is reported by its id.
        return [c.name or c.short_id for c in found if c.labels.get(L.RUN_LABEL) == run_id or c.name in names]


def _as_expected(result: AgentResult, credits: list[dict[str, Any]], approve: DemoApprover) -> bool:
    """The demo's own check, so `make demo` fails loudly when the platform misbehaves."""
    problems = []
    if result.outcome.value != "completed" or result.turns != 7:
        problems.append(f"the run ended {result.outcome.value} after {result.turns} turns: {result.reason}")
    if [(c["account"], float(c["amount"])) for c in credits] != [("acme-9", 50.0)]:
        problems.append(f"the ledger holds {credits}")
    if approve.amounts() != [500.0, 50.0]:
        problems.append(f"the approver was asked for {approve.amounts()}")
    for p in problems:
        print(f"UNEXPECTED: {p}", file=sys.stderr)
    return not problems
