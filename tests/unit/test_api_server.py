"""The API over the real Orchestrator, SQLite store and a FakeBackend, through a real server.

What a client sees: the tool schema as it arrives, tenant isolation (with its red check),
plan validation before any effect, a batch end to end with an approver on a second channel,
and the run's log replayed and followed.
"""

from __future__ import annotations

import json
import shutil
import threading

import grpc
import pytest
from api_support import TOKENS, RealCore, fake_backend, make_config

from ringfence import Client
from ringfence.errors import FailedPrecondition, InvalidArgument, NotFound
from ringfence.model import ApprovalStatus, ObservationStatus, Role, RunOutcome, RunStatus
from ringfence.v1 import tools_pb2
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.orchestration.runs import RunRepository
from ringfence_server.control.tools import BUILTIN_DIR

AGENT = TOKENS[("acme", Role.AGENT)]
APPROVER = TOKENS[("acme", Role.APPROVER)]
OTHER = TOKENS[("globex", Role.AGENT)]
OTHER_APPROVER = TOKENS[("globex", Role.APPROVER)]
RISK_KEYS = {"mutates", "reversible", "cost", "paths", "egress_hosts", "url_arguments", "limits", "runtime", "image"}

TRANSFER = {
    "name": "transfer",
    "description": "Move money between two accounts of the same customer.",
    "schema": {
        "type": "object",
        "properties": {
            "from_account": {"type": "string", "description": "Account to debit."},
            "to_account": {"type": "string", "description": "Account to credit."},
            "amount": {"type": "number", "exclusiveMinimum": 0, "description": "Amount in euros; cents allowed."},
            "currency": {"enum": ["EUR", "USD"], "description": "ISO 4217 code."},
            "memo_lines": {"type": "integer", "minimum": 0, "maximum": 3},
        },
        "required": ["from_account", "to_account", "amount"],
        "additionalProperties": False,
    },
    "mutates": True,
    "reversible": False,
    "cost": 0.5,
    "paths": {},
    "limits": {"timeout_s": 5},
}


@pytest.fixture
def tools_dir(tmp_path):
    d = tmp_path / "tools"
    shutil.copytree(BUILTIN_DIR, d, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    (d / "transfer.json").write_text(json.dumps(TRANSFER))
    return d


@pytest.fixture
def config(tmp_path, tools_dir):
    return make_config(tmp_path / "state", tools_dir=str(tools_dir))


@pytest.fixture
def core(config):
    with RealCore(config, fake_backend()) as c:
        yield c


@pytest.fixture
def server(core):
    with BackgroundServer(core.orchestrator, core.config) as s:
        yield s


@pytest.fixture
def agent(server):
    with Client(server.address, AGENT) as c:
        yield c


@pytest.fixture
def approver(server):
    with Client(server.address, APPROVER) as c:
        yield c


@pytest.fixture
def other(server):
    with Client(server.address, OTHER) as c:
        yield c


def keys_anywhere(value) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys_anywhere(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys_anywhere(v)}
    return set()


# --- ListTools ---------------------------------------------------------------------------------


def test_list_tools_schema_as_the_client_receives_it(agent, server):
    raw = agent.stubs.tools.ListTools(tools_pb2.ListToolsRequest(), metadata=agent.metadata(), timeout=10)
    wire = raw.SerializeToString()
    tools = {t.name: t for t in raw.tools}
    assert set(tools) >= {"echo", "credit", "read_file", "write_note", "transfer", "fail", "sleep"}
    transfer = tools["transfer"]
    assert transfer.description == TRANSFER["description"]
    schema = json.loads(transfer.arguments_schema_json)
    props = schema["properties"]
    assert schema["type"] == "object"
    assert props["amount"]["type"] == "number"  # a float parameter is a JSON Schema number
    assert props["amount"]["exclusiveMinimum"] == 0
    assert props["memo_lines"] == {"type": "integer", "minimum": 0, "maximum": 3}
    assert isinstance(props["memo_lines"]["maximum"], int)  # integers stay integers on the wire
    assert props["currency"]["enum"] == ["EUR", "USD"]
    assert props["from_account"]["description"] == "Account to debit."
    assert schema["required"] == ["from_account", "to_account", "amount"]
    assert schema["additionalProperties"] is False
    credit = json.loads(tools["credit"].arguments_schema_json)
    assert credit["properties"]["amount"]["type"] == "number"
    assert credit["required"] == ["account", "amount"]
    assert json.loads(tools["fail"].arguments_schema_json)["properties"]["class"]["enum"][0] == "invalid"
    # Risk metadata is nowhere in what the client got: not in a schema, not in the message.
    for tool in raw.tools:
        assert not keys_anywhere(json.loads(tool.arguments_schema_json)) & RISK_KEYS, tool.name
    for word in (b"mutates", b"reversible", b"irreversible", b"egress"):
        assert word not in wire
    # And the typed client gives the same schema.
    assert {t.name: t.schema for t in agent.list_tools()}["transfer"] == schema


def test_list_tools_narrows_by_query_past_twelve_tools(tmp_path, tools_dir):
    for i in range(8):
        doc = dict(TRANSFER, name=f"ledger_{i}", description=f"Ledger report number {i}.")
        (tools_dir / f"ledger_{i}.json").write_text(json.dumps(doc))
    config = make_config(tmp_path / "state", tools_dir=str(tools_dir))
    with RealCore(config, fake_backend()) as core, BackgroundServer(core.orchestrator, config) as s, \
            Client(s.address, AGENT) as c:
        everything = c.list_tools()
        assert len(everything) == len(list(tools_dir.glob("*.json"))) > 12
        narrowed = [t.name for t in c.list_tools("credit an account")]
        assert narrowed and "credit" in narrowed and len(narrowed) < len(everything)
        assert not any(n.startswith("ledger_") for n in narrowed)


# --- tenants -------------------------------------------------------------------------------


def test_a_tenant_cannot_see_or_touch_another_tenants_run(agent, approver, other, server):
    run = agent.start_run("acme's secret goal", "acme-run-1")
    agent.submit_batch(run.run_id,
                       [{"call_id": "c1", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}}])
    approval = approver.list_approvals(run.run_id)[0]
    with pytest.raises(NotFound) as missing:
        other.get_run("no-such-run")
    with pytest.raises(NotFound) as foreign:
        other.get_run(run.run_id)
    # Same answer as for a run that does not exist: the id does not leak.
    assert str(foreign.value).replace(run.run_id, "X") == str(missing.value).replace("no-such-run", "X")
    for attempt in (
        lambda: other.submit_batch(run.run_id, [{"call_id": "x", "tool": "echo", "arguments": {}}]),
        lambda: other.finish_run(run.run_id),
        lambda: other.cancel_run(run.run_id),
        lambda: list(other.watch_run(run.run_id)),
        lambda: list(other.execute_plan(run.run_id, [{"key": "s1", "tool": "echo", "arguments": {}}])),
    ):
        with pytest.raises(NotFound):
            attempt()
    assert run.run_id not in [r.run_id for r in other.list_runs()]
    with Client(server.address, OTHER_APPROVER) as globex_approver:
        with pytest.raises(NotFound):
            globex_approver.list_approvals(run.run_id)
        assert globex_approver.list_approvals() == []
        with pytest.raises(NotFound):
            globex_approver.decide_approval(approval.approval_id, True, "not mine")
    # Run ids are per tenant: the same id names globex's own, separate run (and starting it
    # tells globex nothing about acme's).
    theirs = other.start_run("globex's goal", run.run_id)
    assert (theirs.tenant, theirs.goal, theirs.trajectory) == ("globex", "globex's goal", ())
    after = agent.get_run(run.run_id)
    assert after.status is RunStatus.WAITING_APPROVAL and after.goal == "acme's secret goal"
    assert after.pending_approvals[0].status is ApprovalStatus.PENDING


def test_red_check_without_the_tenant_check_the_run_leaks(agent, other, monkeypatch):
    """The test above fails when the core's tenant check is removed: here it is removed, and
    another tenant's client reads the run."""

    def get_without_tenant_check(self, tenant, run_id):
        state = next((s for s in self.live() if s.run_id == run_id), None)
        if state is None:
            raise NotFound(f"run {run_id!r} not found")
        return state

    monkeypatch.setattr(RunRepository, "get", get_without_tenant_check)
    run = agent.start_run("acme's secret goal", "acme-run-2")
    leaked = other.get_run(run.run_id)
    assert leaked.goal == "acme's secret goal" and leaked.tenant == "acme"


# --- plans -----------------------------------------------------------------------------------


def test_an_eleven_step_plan_is_refused_before_any_container_starts(agent, core):
    run = agent.start_run("too long a plan")
    steps = [{"key": f"s{i}", "tool": "echo", "arguments": {"text": str(i)}} for i in range(11)]
    with pytest.raises(InvalidArgument) as e:
        list(agent.execute_plan(run.run_id, steps))
    assert [(v.field, v.description) for v in e.value.violations] == [("steps", "11 steps is over max_steps 10")]
    assert core.backend.starts == 0
    assert agent.get_run(run.run_id).trajectory == ()
    assert [ev.type for ev in core.store.read(run.run_id)] == ["run_started"]


def test_a_plan_with_several_bad_steps_reports_every_violation_at_once(agent, core):
    run = agent.start_run("a bad plan")
    steps = [
        {"key": "s1", "tool": "echo", "arguments": {"text": "fine"}},
        {"key": "s1", "tool": "echo", "arguments": {"text": "same key"}},
        {"key": "s3", "tool": "launch_missiles", "arguments": {}},
        {"key": "s4", "tool": "credit", "arguments": {"account": "acme-9", "amount": -5}},
        {"key": "s5", "tool": "credit", "arguments": {"account": "acme-9"}},
    ]
    with pytest.raises(InvalidArgument) as e:
        list(agent.execute_plan(run.run_id, steps))
    fields = [v.field for v in e.value.violations]
    assert "steps[1].key" in fields
    assert "steps[2].tool" in fields
    assert any(f.startswith("steps[3].arguments") for f in fields)
    assert any(f.startswith("steps[4].arguments") for f in fields)
    assert not any(f.startswith("steps[0]") for f in fields)
    assert core.backend.starts == 0


def test_edge_and_core_plan_violations_come_back_together(agent, core):
    from ringfence.v1 import runs_pb2, types_pb2

    run = agent.start_run("malformed and meaningless")
    request = runs_pb2.ExecutePlanRequest(
        run_id=run.run_id,
        max_steps=1000,
        steps=[
            types_pb2.PlanStep(key="a", tool="echo", arguments_json='{"text": "x", "text": "y"}'),
            types_pb2.PlanStep(key="b", tool="nope", arguments_json="{}"),
            types_pb2.PlanStep(key="", tool="echo", arguments_json="{}"),
        ],
    )
    with pytest.raises(grpc.RpcError) as e:
        list(agent.stubs.runs.ExecutePlan(request, metadata=agent.metadata(), timeout=10))
    from ringfence.wire.status import from_rpc_error

    error = from_rpc_error(e.value)
    assert isinstance(error, InvalidArgument)
    fields = sorted(v.field for v in error.violations)
    assert fields == ["max_steps", "steps[0].arguments_json", "steps[1].tool", "steps[2].key"]
    assert core.backend.starts == 0


def test_a_valid_plan_runs_and_streams_its_events(agent, core):
    run = agent.start_run("a good plan")
    steps = [{"key": f"s{i}", "tool": "echo", "arguments": {"text": f"step {i}"}} for i in range(3)]
    events = list(agent.execute_plan(run.run_id, steps))
    types = [e.type for e in events]
    assert types[0] == "batch_started"
    assert types.count("call_decided") == 3 and types.count("call_completed") == 3
    assert types.count("observation") == 3
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert core.backend.starts == 3
    view = agent.get_run(run.run_id)
    assert [o.content for o in view.trajectory] == [{"text": f"step {i}"} for i in range(3)]


# --- batches, approvals, the log ---------------------------------------------------------------


def test_a_batch_end_to_end_with_an_approver_on_a_second_channel(agent, approver, core):
    run = agent.start_run("pay acme-9 and say hello", "pay-1")
    observations = agent.submit_batch(
        run.run_id,
        [
            {"call_id": "hello", "tool": "echo", "arguments": {"text": "hello"}},
            {"call_id": "nope", "tool": "launch_missiles", "arguments": {}},
            {"call_id": "big", "tool": "credit", "arguments": {"account": "acme-9", "amount": 500}},
            {"call_id": "small", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}},
            {"call_id": "leak", "tool": "echo", "arguments": {"text": "key AKIAABCDEFGHIJKLMNOP"}},
            {"call_id": "bad", "tool": "credit", "arguments": {"account": "acme-9", "amount": "fifty"}},
        ],
    )
    by_id = {o.call_id: o for o in observations}
    assert [o.call_id for o in observations] == ["hello", "nope", "big", "small", "leak", "bad"]
    assert by_id["hello"].status is ObservationStatus.EXECUTED and by_id["hello"].content == {"text": "hello"}
    assert by_id["nope"].status is ObservationStatus.UNKNOWN_TOOL
    assert by_id["big"].status is ObservationStatus.DENIED
    assert by_id["small"].status is ObservationStatus.PENDING_APPROVAL and by_id["small"].approval_id
    assert by_id["leak"].status is ObservationStatus.BLOCKED
    assert by_id["bad"].status is ObservationStatus.DENIED
    assert [o.executed for o in observations] == [True, False, False, False, False, False]
    assert "registry:ok" in by_id["hello"].verdict_path
    assert core.backend.starts == 1  # only the admitted echo ran

    pending = approver.list_approvals(run.run_id)
    assert [(a.call_id, a.status) for a in pending] == [("small", ApprovalStatus.PENDING)]
    assert pending[0].arguments == {"account": "acme-9", "amount": 50}
    decided = approver.decide_approval(pending[0].approval_id, True, "known customer")
    assert decided.decided_by == "acme-approver"
    view = agent.get_run(run.run_id)
    small = {o.call_id: o for o in view.trajectory}["small"]
    assert small.status is ObservationStatus.EXECUTED and small.executed
    assert small.content["arguments"] == {"account": "acme-9", "amount": 50}
    assert core.backend.starts == 2
    with pytest.raises(FailedPrecondition):
        approver.decide_approval(pending[0].approval_id, True, "again")

    # A mutation repeated in a later turn is answered from the log, not run again.
    # (write_note mutates, so under the "standard" autonomy each proposal needs an approval.)
    note = {"tool": "write_note", "arguments": {"name": "a", "text": "x"}}
    observed = []
    for call_id in ("n1", "n2"):
        [asked] = agent.submit_batch(run.run_id, [dict(note, call_id=call_id)])
        assert asked.status is ObservationStatus.PENDING_APPROVAL
        approver.decide_approval(asked.approval_id, True, "fine")
        observed.append({o.call_id: o for o in agent.get_run(run.run_id).trajectory}[call_id])
    first, again = observed
    assert first.status is ObservationStatus.EXECUTED and first.executed
    assert again.status is ObservationStatus.DEDUPLICATED and again.executed is False
    assert again.content == first.content and "idempotency_key" in first.content
    assert core.backend.starts == 3

    finished = agent.finish_run(run.run_id)
    assert finished.status is RunStatus.FINISHED and finished.outcome is RunOutcome.COMPLETED
    with pytest.raises(FailedPrecondition):
        agent.submit_batch(run.run_id, [{"call_id": "late", "tool": "echo", "arguments": {}}])
    log = [e.type for e in agent.watch_run(run.run_id, 0)]
    assert log[0] == "run_started" and log[-1] == "run_finished"
    assert log.count("batch_started") == 3
    assert {"approval_requested", "approval_decided", "approval_used", "dispatch_started"} <= set(log)


def test_tool_errors_declines_halts_and_cancels_reach_the_client(agent, approver, core):
    run = agent.start_run("everything that can go wrong")
    [failed] = agent.submit_batch(run.run_id, [{"call_id": "f", "tool": "fail", "arguments": {"class": "invalid"}}])
    assert failed.status is ObservationStatus.EXECUTED and failed.executed
    assert failed.error and failed.error_class == "invalid" and failed.content is None

    [asked] = agent.submit_batch(run.run_id,
                                 [{"call_id": "c", "tool": "credit", "arguments": {"account": "acme-1", "amount": 9}}])
    approver.decide_approval(asked.approval_id, False, "not today")
    declined = {o.call_id: o for o in agent.get_run(run.run_id).trajectory}["c"]
    assert declined.status is ObservationStatus.DECLINED and not declined.executed
    assert "not today" in declined.error

    key = "-----BEGIN RSA PRIVATE KEY-----"
    halted = agent.submit_batch(
        run.run_id,
        [
            {"call_id": "k", "tool": "echo", "arguments": {"text": key}},
            {"call_id": "h", "tool": "echo", "arguments": {"text": "innocent"}},
        ],
    )
    assert [o.status for o in halted] == [ObservationStatus.HALTED, ObservationStatus.HALTED]
    view = agent.get_run(run.run_id)
    assert view.status is RunStatus.FINISHED and view.outcome is RunOutcome.GUARDRAIL_STOP
    starts = core.backend.starts

    other = agent.start_run("to be cancelled")
    [pending] = agent.submit_batch(
        other.run_id, [{"call_id": "p", "tool": "credit", "arguments": {"account": "acme-1", "amount": 1}}])
    cancelled = approver.cancel_run(other.run_id)  # an approver may stop a run
    assert cancelled.outcome is RunOutcome.CANCELLED
    assert {o.call_id: o.status for o in cancelled.trajectory}["p"] is ObservationStatus.DECLINED
    with pytest.raises(FailedPrecondition):
        approver.decide_approval(pending.approval_id, True, "too late")
    assert core.backend.starts == starts  # neither the halted nor the cancelled calls ran


def test_start_run_is_idempotent_on_the_clients_run_id(agent):
    first = agent.start_run("goal", "same-id")
    again = agent.start_run("goal", "same-id")
    assert first == again
    assert [r.run_id for r in agent.list_runs()].count("same-id") == 1
    with pytest.raises(InvalidArgument) as e:
        agent.start_run("goal", "not a valid id!")
    assert [v.field for v in e.value.violations] == ["run_id"]
    with pytest.raises(InvalidArgument):
        agent.start_run("   ")


def test_watch_run_replays_from_a_sequence_number_then_follows_live(agent, core):
    run = agent.start_run("watch me", "watched")
    agent.submit_batch(run.run_id, [{"call_id": "c1", "tool": "echo", "arguments": {"text": "1"}}])
    logged = core.store.read(run.run_id)
    assert len(logged) > 3
    received = []
    caught_up = threading.Event()

    def read():
        for event in agent.watch_run(run.run_id, 3):
            received.append(event)
            if event.seq == logged[-1].seq:
                caught_up.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert caught_up.wait(30), "the replay never reached the last logged event"
    agent.finish_run(run.run_id)  # a live event; the stream ends after run_finished
    reader.join(30)
    assert not reader.is_alive()
    assert [e.seq for e in received] == list(range(3, logged[-1].seq + 2))
    assert [e.type for e in received[: len(logged) - 2]] == [e.type for e in logged[2:]]
    assert received[-1].type == "run_finished"


def test_watch_approvals_streams_new_requests_to_an_approver(agent, approver):
    run = agent.start_run("needs approval")
    stream = approver.watch_approvals()
    received = []
    got_one = threading.Event()

    def read():
        for approval in stream:
            received.append(approval)
            got_one.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        agent.submit_batch(run.run_id,
                           [{"call_id": "c1", "tool": "credit", "arguments": {"account": "acme-1", "amount": 5}}])
        assert got_one.wait(30)
        assert received[0].run_id == run.run_id and received[0].tool == "credit"
        assert received[0].status is ApprovalStatus.PENDING
    finally:
        stream.cancel()
        reader.join(10)
    assert not reader.is_alive()


def test_approve_and_remember_and_the_digest_through_the_api(agent, approver, core):
    run = agent.start_run("remember me")
    pay = {"call_id": "pay", "tool": "credit", "arguments": {"account": "acme-9", "amount": 50}}
    [obs] = agent.submit_batch(run.run_id, [pay])
    [seen] = approver.list_approvals(run.run_id)
    with pytest.raises(FailedPrecondition):
        approver.decide_approval(obs.approval_id, True, "ok", digest="f" * 64)
    with pytest.raises(InvalidArgument) as e:
        approver.decide_approval(obs.approval_id, False, "no", remember=True)
    assert [v.field for v in e.value.violations] == ["remember"]
    decided = approver.decide_approval(obs.approval_id, True, "ok", remember=True, digest=seen.digest)
    assert decided.status is ApprovalStatus.USED
    [again] = agent.submit_batch(run.run_id, [{**pay, "call_id": "pay-again"}])
    assert again.status is ObservationStatus.DEDUPLICATED and again.approval_id is None
    with pytest.raises(FailedPrecondition):
        approver.decide_approval(obs.approval_id, True, "twice")
