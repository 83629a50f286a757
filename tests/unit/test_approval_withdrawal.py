"""Withdrawing a pending approval (issue 26, point 5) and the honest tool hints of ListTools
(point 2), through a real gRPC server on a real port over the real Orchestrator, its SQLite
store and an in-memory sandbox (FakeBackend: `starts` counts what reached a sandbox).

A withdrawn call never runs: its observation is declined on "approval:withdrawn", the log says
`approval_withdrawn` and the backend never saw it. Only the call's proposer, or an admin, may
withdraw it; the log folds to the same run.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from api_support import TOKENS, RealCore, fake_backend, make_config, tenants_table
from control_support import ADMIN, AGENT, Harness, error_result

from ringfence import AsyncClient, Client
from ringfence.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from ringfence.model import ApprovalStatus, Observation, ObservationStatus, Role, RunStatus
from ringfence.v1 import tools_pb2, types_pb2
from ringfence.wire import convert
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.config import token_digest
from ringfence_server.control.state import fold

AGENT_TOKEN = TOKENS[("acme", Role.AGENT)]
APPROVER_TOKEN = TOKENS[("acme", Role.APPROVER)]
ADMIN_TOKEN = TOKENS[("acme", Role.ADMIN)]
GLOBEX_TOKEN = TOKENS[("globex", Role.AGENT)]
SECOND_AGENT_TOKEN = "acme-second-agent-token"  # another agent of the same tenant

# write_note mutates but is reversible, so only this rule makes it wait for a person.
RULES = [{"tool": "write_note", "verdict": "ask"}, {"tool": "echo", "verdict": "allow"}]
NOTE = {"call_id": "note", "tool": "write_note", "arguments": {"name": "plan", "text": "ship it"}}


@pytest.fixture
def core(tmp_path):
    tenants = tenants_table()
    tenants["acme"]["tokens"].append({"sha256": token_digest(SECOND_AGENT_TOKEN), "role": "agent",
                                      "subject": "acme-agent-2"})
    config = make_config(tmp_path / "state", tenants=tenants, policy={"rules": RULES})
    with RealCore(config, fake_backend()) as c:
        yield c


@pytest.fixture
def server(core):
    with BackgroundServer(core.orchestrator, core.config) as s:
        yield s


@pytest.fixture
def clients(server):
    """Connect a client by token, each closed when the test ends."""
    opened: list[Client] = []

    def connect(token: str) -> Client:
        client = Client(server.address, token)
        opened.append(client)
        return client

    yield connect
    for client in opened:
        client.close()


def ask(agent: Client, run_id: str) -> str:
    """Start `run_id`, propose the note (asked by policy); its approval id."""
    agent.start_run("withdrawal", run_id)
    [pending] = agent.submit_batch(run_id, [NOTE])
    assert pending.status is ObservationStatus.PENDING_APPROVAL and pending.approval_id
    return pending.approval_id


# --- withdrawal ------------------------------------------------------------------------------


def test_the_proposer_withdraws_and_the_call_never_runs(core, clients):
    agent, approver = clients(AGENT_TOKEN), clients(APPROVER_TOKEN)
    approval_id = ask(agent, "w1")

    obs = agent.withdraw_approval("w1", approval_id, "changed my mind")

    assert (obs.call_id, obs.status, obs.executed, obs.error, obs.error_class, obs.approval_id) == (
        "note", ObservationStatus.DECLINED, False, "withdrawn by acme-agent: changed my mind", "approval_withdrawn",
        approval_id)
    assert obs.verdict_path == ("registry:ok", "validation:ok", "guardrail:pass", "resource:ok", "policy:rule[0]:ask",
                                "approval:requested", "approval:withdrawn")
    run = agent.get_run("w1")
    assert run.status is RunStatus.RUNNING and run.pending_approvals == () and run.trajectory == (obs,)
    [approval] = approver.list_approvals("w1")
    assert (approval.status, approval.decided_by, approval.reason) == (
        ApprovalStatus.WITHDRAWN, "acme-agent", "changed my mind")
    # Nobody can approve it afterwards: it is not waiting for anyone.
    with pytest.raises(FailedPrecondition, match=f"approval {approval_id} is withdrawn: nothing to decide"):
        approver.decide_approval(approval_id, True, "too late")
    with pytest.raises(FailedPrecondition, match="is withdrawn: nothing to withdraw"):
        agent.withdraw_approval("w1", approval_id)
    assert core.backend.starts == 0  # the sandbox never saw the call

    agent.finish_run("w1")
    events = list(agent.watch_run("w1"))
    assert [e.type for e in events] == ["run_started", "batch_started", "call_decided", "approval_requested",
                                        "observation", "approval_withdrawn", "observation", "run_finished"]
    assert events[5].data == {"approval_id": approval_id, "by": "acme-agent", "reason": "changed my mind"}
    assert (events[6].data["status"], events[6].data["error_class"]) == ("declined", "approval_withdrawn")
    # Replay: the log folds to the run the server holds, and a restarted server says the same.
    stored = core.store.read("w1")
    live = core.orchestrator.runs.get("acme", "w1")
    assert fold(stored).snapshot() == live.snapshot()
    with RealCore(core.config, fake_backend()) as again:
        assert again.orchestrator.runs.get("acme", "w1").view() == fold(stored).view() == live.view()


def test_the_withdrawal_reads_as_such_in_the_cli_the_log_lines_and_the_trace(core, clients):
    from ringfence.cli.render import event_detail
    from ringfence_server.control.eventlog import EventLogger
    from ringfence_server.control.tracing.from_events import trace_from_events

    agent = clients(AGENT_TOKEN)
    approval_id = ask(agent, "w9")
    agent.withdraw_approval("w9", approval_id, "changed my mind")
    agent.finish_run("w9")
    [withdrawn] = [e for e in core.store.read("w9") if e.type == "approval_withdrawn"]

    assert event_detail(withdrawn) == f"{approval_id} withdrawn by acme-agent: changed my mind"
    line = EventLogger().line(core.orchestrator.runs.get("acme", "w9"), withdrawn)
    assert {k: line[k] for k in ("event", "call_id", "approval_id", "by", "reason")} == {
        "event": "approval_withdrawn", "call_id": "note", "approval_id": approval_id, "by": "acme-agent",
        "reason": "changed my mind"}

    def nodes(node):
        yield node
        for child in node.children:
            yield from nodes(child)

    [approval] = [n for n in nodes(trace_from_events(core.store.read("w9"))) if n.attributes.get("decision")]
    assert approval.labels[-1] == "withdrawn by acme-agent: changed my mind"
    assert approval.attributes["decision"] == "withdrawn" and approval.end == withdrawn.at


def test_without_a_reason_the_error_names_who_withdrew(core, clients):
    agent = clients(AGENT_TOKEN)
    approval_id = ask(agent, "w2")
    obs = agent.withdraw_approval("w2", approval_id)
    assert obs.error == "withdrawn by acme-agent" and core.backend.starts == 0


def test_another_agent_of_the_tenant_cannot_withdraw_and_an_admin_can(core, clients):
    agent, second, admin = clients(AGENT_TOKEN), clients(SECOND_AGENT_TOKEN), clients(ADMIN_TOKEN)
    approval_id = ask(agent, "w3")
    with pytest.raises(PermissionDenied, match="acme-agent-2 did not propose"):
        second.withdraw_approval("w3", approval_id, "not mine")
    # An approver decides; it never withdraws (the edge refuses its role).
    with pytest.raises(PermissionDenied):
        clients(APPROVER_TOKEN).withdraw_approval("w3", approval_id)
    assert agent.get_run("w3").pending_approvals[0].status is ApprovalStatus.PENDING  # untouched
    obs = admin.withdraw_approval("w3", approval_id, "stop")
    assert obs.error == "withdrawn by acme-admin: stop" and obs.status is ObservationStatus.DECLINED
    assert core.backend.starts == 0


def test_another_tenant_finds_nothing(core, clients):
    agent, globex = clients(AGENT_TOKEN), clients(GLOBEX_TOKEN)
    approval_id = ask(agent, "w4")
    with pytest.raises(NotFound):
        globex.withdraw_approval("w4", approval_id)  # acme's run: not globex's
    globex.start_run("globex's own", "w4")  # the same run id, globex's run
    with pytest.raises(NotFound):
        globex.withdraw_approval("w4", approval_id)  # acme's approval is not in it
    with pytest.raises(NotFound):
        agent.withdraw_approval("w4", "apr-no-such-approval")
    assert agent.get_run("w4").pending_approvals[0].status is ApprovalStatus.PENDING


def test_a_decided_approval_or_a_finished_run_has_nothing_to_withdraw(core, clients):
    agent, approver = clients(AGENT_TOKEN), clients(APPROVER_TOKEN)
    declined = ask(agent, "w5")
    approver.decide_approval(declined, False, "no")
    with pytest.raises(FailedPrecondition, match=f"approval {declined} is declined: nothing to withdraw"):
        agent.withdraw_approval("w5", declined)

    approved = ask(agent, "w6")
    approver.decide_approval(approved, True, "yes")  # dispatched at once: used
    with pytest.raises(FailedPrecondition, match=f"approval {approved} is used: nothing to withdraw"):
        agent.withdraw_approval("w6", approved)
    assert core.backend.starts == 1

    pending = ask(agent, "w7")
    agent.finish_run("w7")
    with pytest.raises(FailedPrecondition, match="run w7 is finished"):
        agent.withdraw_approval("w7", pending)
    assert core.backend.starts == 1


def test_empty_ids_are_invalid_arguments_naming_the_field(clients):
    agent = clients(AGENT_TOKEN)
    with pytest.raises(InvalidArgument) as both:
        agent.withdraw_approval("", "")
    assert [v.field for v in both.value.violations] == ["run_id", "approval_id"]
    with pytest.raises(InvalidArgument) as one:
        agent.withdraw_approval("w8", "")
    assert [v.field for v in one.value.violations] == ["approval_id"]


def test_a_reconciliation_task_is_the_approvers(tmp_path):
    """A call interrupted mid-effect may have run: only a person may say; its proposer cannot
    make it go away by withdrawing."""
    h = Harness(tmp_path, limits={"max_attempts": 1})
    h.emulator.overrides["credit_lookup"] = lambda call: error_result("fatal", "ledger unreachable")
    run = h.run()
    h.store.append(run, "batch_started", {"batch_id": "b", "turn": 1, "calls": [
        {"call_id": "pay", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}}]})
    h.store.append(run, "dispatch_started", {"call_id": "pay", "tool": "credit", "mutates": True,
                                             "idempotency_key": "key-1",
                                             "arguments": {"account": "acme-9", "amount": 50}})
    h.restart()
    [obs] = h.orch.get_run(AGENT, run).trajectory
    assert obs.error_class == "reconciliation_needed"
    for who in (AGENT, ADMIN):
        with pytest.raises(FailedPrecondition, match="is a reconciliation task"):
            h.orch.withdraw_approval(who, run, obs.approval_id, "")
    assert h.orch.get_run(AGENT, run).pending_approvals[0].status is ApprovalStatus.PENDING


# --- ListTools' hints ------------------------------------------------------------------------


def test_list_tools_hints_follow_the_manifests(clients):
    agent = clients(AGENT_TOKEN)
    # credit: mutates, irreversible; write_note: mutates, reversible; echo: reads only.
    expected = {"credit": (False, True), "write_note": (False, False), "echo": (True, False)}
    tools = {t.name: t for t in agent.list_tools()}
    assert {n: (tools[n].read_only_hint, tools[n].destructive_hint) for n in expected} == expected
    # On the wire both hints are always sent (an absent one would mean an older server).
    raw = agent.stubs.tools.ListTools(tools_pb2.ListToolsRequest(), metadata=agent.metadata(), timeout=10)
    for tool in raw.tools:
        assert tool.HasField("read_only_hint") and tool.HasField("destructive_hint"), tool.name
    assert {t.name: (t.read_only_hint, t.destructive_hint) for t in raw.tools if t.name in expected} == expected


def test_a_tool_from_a_server_without_hints_is_read_cautiously():
    view = convert.tool_from_proto(types_pb2.Tool(name="t", description="d", arguments_schema_json="{}"))
    assert (view.read_only_hint, view.destructive_hint) == (False, True)
    back = convert.tool_from_proto(convert.tool_to_proto(view))
    assert back == view


# --- the people's CLI ------------------------------------------------------------------------


def test_the_cli_withdraws_with_the_proposers_token(core, server, clients):
    agent = clients(AGENT_TOKEN)
    approval_id = ask(agent, "w9")
    # Loopback only: no configured server, token or proxy of the environment is used.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGFENCE_") and "proxy" not in k.lower()}
    done = subprocess.run(
        [sys.executable, "-m", "ringfence.cli", "approvals", "withdraw", "w9", approval_id, "--reason", "no need"],
        env={**env, "RINGFENCE_SERVER": server.address, "RINGFENCE_TOKEN": AGENT_TOKEN},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"withdrew {approval_id}: write_note (run w9, call note) is now declined - "
                                   "withdrawn by acme-agent: no need")
    assert agent.get_run("w9").trajectory[0].error_class == "approval_withdrawn" and core.backend.starts == 0


def test_the_async_client_withdraws_too(core, server, clients):
    approval_id = ask(clients(AGENT_TOKEN), "w10")

    async def withdraw() -> Observation:
        async with AsyncClient(server.address, AGENT_TOKEN) as c:
            return await c.withdraw_approval("w10", approval_id, "async")

    obs = asyncio.run(withdraw())
    assert (obs.status, obs.error, obs.error_class) == (
        ObservationStatus.DECLINED, "withdrawn by acme-agent: async", "approval_withdrawn")
    assert core.backend.starts == 0
