"""What a reviewer's console reads over the public API, through a real server on a loopback port
with the real Orchestrator and a real store (a SQLite file; the paging also on PostgreSQL):
runs a page at a time with filters, a run's log a page at a time, the server's check of a run's
audit chain (and a tampered row caught), an approval's proposer, asking rule and tool risk
(listed, watched, decided, and after a restart), one approval by its id in any state and of a
finished run (GetApproval, also after a restart), who the server takes a token to be (WhoAmI:
the name four eyes compares), a tool's risk for approvers only, and who may download what. Each
rule with its red direction: another tenant, the wrong role, bad input.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from api_support import TOKENS, fake_backend, make_config

from ringfence import Client
from ringfence.errors import InvalidArgument, NotFound, PermissionDenied, Unauthenticated
from ringfence.model import (
    Approval,
    ApprovalStatus,
    Identity,
    ObservationStatus,
    Role,
    RunOutcome,
    RunStatus,
    RunView,
)
from ringfence.v1 import approvals_pb2, identity_pb2, runs_pb2, tools_pb2
from ringfence_server.control.api.background import BackgroundServer

AGENT = TOKENS[("acme", Role.AGENT)]
APPROVER = TOKENS[("acme", Role.APPROVER)]
ADMIN = TOKENS[("acme", Role.ADMIN)]
OTHER = TOKENS[("globex", Role.AGENT)]
OTHER_APPROVER = TOKENS[("globex", Role.APPROVER)]
CREDIT = {"tool": "credit", "arguments": {"account": "acme-9", "amount": 50}}  # asks an approver


class Served:
    """A real server over the real Orchestrator on `store`, with a client per token."""

    def __init__(self, config, store, clock: Callable[[], float] = time.time) -> None:
        from ringfence_server.control.orchestration import Orchestrator

        self.config = config
        self.store = store
        self.orchestrator = Orchestrator.from_config(config, fake_backend(), store, clock)
        self.server = BackgroundServer(self.orchestrator, config)
        self.server.__enter__()
        self.clients: dict[str, Client] = {}

    def client(self, token: str) -> Client:
        if token not in self.clients:
            self.clients[token] = Client(self.server.address, token)
        return self.clients[token]

    def close(self) -> None:
        for c in self.clients.values():
            c.close()
        self.server.__exit__(None, None, None)
        self.orchestrator.close()
        self.store.close()


@contextlib.contextmanager
def served(config, store, clock: Callable[[], float] = time.time) -> Iterator[Served]:
    s = Served(config, store, clock)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def config(tmp_path):
    return make_config(tmp_path / "state")


@pytest.fixture
def sqlite_served(config) -> Iterator[Served]:
    from ringfence_server.control.store import SqliteEventStore

    with served(config, SqliteEventStore(config.db_path)) as s:
        yield s


@pytest.fixture(params=["sqlite", "postgres"])
def any_served(request, config) -> Iterator[Served]:
    from ringfence_server.control.store import open_store

    where = str(config.db_path) if request.param == "sqlite" else request.getfixturevalue("pg_url")
    with served(config, open_store(where)) as s:
        yield s


def violated(error: pytest.ExceptionInfo[InvalidArgument]) -> set[str]:
    return {v.field for v in error.value.violations}


def walk(client: Client, size: int, **filters) -> list[list[str]]:
    """Every page of list_runs_page, as run ids; asserts that only the last has no token."""
    pages, token = [], ""
    while True:
        page = client.list_runs_page(page_size=size, page_token=token, **filters)
        pages.append([r.run_id for r in page.runs])
        if not page.next_page_token:
            return pages
        assert len(page.runs) == size
        token = page.next_page_token


# --- ListRuns --------------------------------------------------------------------------------


def _seven_runs(agent: Client) -> dict[str, str]:
    """r0..r6 in this order; their status or outcome by name."""
    fate = {"r0": "completed", "r1": "running", "r2": "waiting", "r3": "cancelled", "r4": "completed",
            "r5": "running", "r6": "waiting"}
    for name, what in fate.items():
        agent.start_run(f"goal of {name}", name)
        if what == "completed":
            agent.finish_run(name)
        elif what == "cancelled":
            agent.cancel_run(name)
        elif what == "waiting":
            [asked] = agent.submit_batch(name, [dict(CREDIT, call_id="c1")])
            assert asked.status is ObservationStatus.PENDING_APPROVAL
    return fate


def test_runs_come_a_page_at_a_time_newest_first_with_filters(any_served):
    agent, other = any_served.client(AGENT), any_served.client(OTHER)
    other.start_run("globex's own", "g0")
    fate = _seven_runs(agent)
    other.start_run("globex's later", "g1")
    newest_first = ["r6", "r5", "r4", "r3", "r2", "r1", "r0"]

    pages = walk(agent, 3)
    assert pages == [newest_first[0:3], newest_first[3:6], newest_first[6:]]
    flat = [r for p in pages for r in p]
    assert len(flat) == len(set(flat))  # no run on two pages, none missed
    assert walk(agent, 7) == [newest_first]  # a full last page: its token is empty, no empty page after
    assert walk(agent, 0) == [newest_first]  # 0: the default size (50)

    def named(status: str) -> list[str]:
        return [n for n in newest_first if fate[n] == status]

    assert walk(agent, 1, status=RunStatus.RUNNING) == [[n] for n in named("running")]
    assert walk(agent, 1, status=RunStatus.WAITING_APPROVAL) == [[n] for n in named("waiting")]
    assert walk(agent, 2, status=RunStatus.FINISHED) == [["r4", "r3"], ["r0"]]
    assert walk(agent, 5, outcome=RunOutcome.COMPLETED) == [["r4", "r0"]]
    assert walk(agent, 5, status="finished", outcome="cancelled") == [["r3"]]
    assert walk(agent, 5, status=RunStatus.RUNNING, outcome=RunOutcome.COMPLETED) == [[]]
    page = agent.list_runs_page(status=RunStatus.WAITING_APPROVAL)
    assert all(isinstance(r, RunView) and r.status is RunStatus.WAITING_APPROVAL for r in page.runs)
    assert all(len(r.pending_approvals) == 1 for r in page.runs)

    # list_runs follows the pages; the filters work there too.
    assert [r.run_id for r in agent.list_runs()] == newest_first
    assert [r.run_id for r in agent.list_runs(status=RunStatus.FINISHED)] == ["r4", "r3", "r0"]
    # Tenant-scoped: globex sees only its own, and an approver of acme sees acme's.
    assert walk(other, 1) == [["g1"], ["g0"]]
    assert walk(any_served.client(APPROVER), 10) == [newest_first]
    assert walk(any_served.client(OTHER_APPROVER), 10) == [["g1", "g0"]]


def test_a_run_started_between_pages_never_shifts_them(sqlite_served):
    agent = sqlite_served.client(AGENT)
    for i in range(4):
        agent.start_run("g", f"r{i}")
    first = agent.list_runs_page(page_size=2)
    agent.start_run("g", "late")
    second = agent.list_runs_page(page_size=2, page_token=first.next_page_token)
    assert [r.run_id for r in first.runs] == ["r3", "r2"]
    assert [r.run_id for r in second.runs] == ["r1", "r0"] and second.next_page_token == ""
    assert agent.list_runs_page(page_size=1).runs[0].run_id == "late"


def test_list_runs_refuses_bad_pages_naming_the_field(sqlite_served):
    agent, other = sqlite_served.client(AGENT), sqlite_served.client(OTHER)
    for i in range(3):
        agent.start_run("g", f"r{i}")
        other.start_run("g", f"g{i}")
    token = agent.list_runs_page(page_size=1).next_page_token
    running = agent.list_runs_page(page_size=1, status=RunStatus.RUNNING).next_page_token
    assert token and running
    assert agent.list_runs_page(page_size=500).next_page_token == ""  # the maximum is served
    cases = [
        (lambda: agent.list_runs_page(page_size=501), "page_size"),
        (lambda: agent.list_runs_page(page_token="not-a-token!"), "page_token"),
        (lambda: agent.list_runs_page(page_token="eyJ2IjoxfQ"), "page_token"),  # {"v":1}: no cursor
        (lambda: agent.list_runs_page(page_token="x" * 600), "page_token"),
        # A token of other filters, or of another tenant, continues nothing.
        (lambda: agent.list_runs_page(page_token=token, status=RunStatus.RUNNING), "page_token"),
        (lambda: agent.list_runs_page(page_token=running), "page_token"),
        (lambda: other.list_runs_page(page_token=token), "page_token"),
    ]
    for attempt, field in cases:
        with pytest.raises(InvalidArgument) as e:
            attempt()
        assert violated(e) == {field}
    # Values outside the enums, sent raw, are refused naming the field (never INTERNAL).
    for request, field in ((runs_pb2.ListRunsRequest(status=99), "status"),
                           (runs_pb2.ListRunsRequest(outcome=42), "outcome"),
                           (runs_pb2.ListRunsRequest(outcome=9), "outcome")):  # MODEL_TRUNCATED: never stored
        with pytest.raises(InvalidArgument) as e:
            agent._send(_raw("ListRuns", request), None)
        assert violated(e) == {field}


def _raw(method: str, request):
    from ringfence import _wire as W

    return W.Unary(W.RUNS, method, request, lambda r: r)


# --- ListEvents and VerifyRun ---------------------------------------------------------------------


def test_a_runs_log_comes_a_page_at_a_time(sqlite_served):
    agent, approver = sqlite_served.client(AGENT), sqlite_served.client(APPROVER)
    agent.start_run("log me", "r1")
    agent.submit_batch("r1", [{"call_id": "e1", "tool": "echo", "arguments": {"text": "hi"}},
                              dict(CREDIT, call_id="c1")])
    whole = [(e.seq, e.type, dict(e.data)) for e in agent.list_events("r1", page_size=1000).events]
    assert [s for s, _, _ in whole] == list(range(1, len(whole) + 1)) and len(whole) > 4
    assert agent.list_events("r1", page_size=1000).next_seq == 0

    read, seq = [], 0
    while True:
        page = approver.list_events("r1", from_seq=seq, page_size=2)  # an approver reads the log too
        assert len(page.events) <= 2
        read += [(e.seq, e.type, dict(e.data)) for e in page.events]
        if page.next_seq == 0:
            break
        assert page.next_seq == page.events[-1].seq + 1
        seq = page.next_seq
    assert read == whole
    # The same events WatchRun replays; a page from the end is empty.
    with agent.watch_run("r1") as stream:
        replayed = []
        for e in stream:
            replayed.append((e.seq, e.type, dict(e.data)))
            if len(replayed) == len(whole):
                break
    assert replayed == whole
    assert agent.list_events("r1", from_seq=len(whole) + 1).events == ()
    assert agent.list_events("r1", from_seq=3, page_size=1).events[0].seq == 3
    # A live run's log grows: asking from the last seen seq + 1 finds the new events.
    agent.finish_run("r1")
    later = agent.list_events("r1", from_seq=len(whole) + 1)
    assert later.events[-1].type == "run_finished" and later.next_seq == 0


def test_list_events_and_verify_run_refuse_bad_input_naming_the_field(sqlite_served):
    agent = sqlite_served.client(AGENT)
    agent.start_run("g", "r1")
    for attempt, fields in (
        (lambda: agent.list_events("r1", page_size=1001), {"page_size"}),
        (lambda: agent.list_events("", page_size=0), {"run_id"}),
        (lambda: agent.list_events("bad id!", page_size=5000), {"run_id", "page_size"}),
        (lambda: agent.list_events("r1", from_seq=2**63), {"from_seq"}),
        (lambda: agent.verify_run(""), {"run_id"}),
        (lambda: agent.verify_run("../etc"), {"run_id"}),
    ):
        with pytest.raises(InvalidArgument) as e:
            attempt()
        assert violated(e) == fields
    assert len(agent.list_events("r1", page_size=1000).events) >= 1  # the maximum is served


def test_another_tenant_cannot_read_a_runs_log_or_its_audit(sqlite_served):
    agent, other = sqlite_served.client(AGENT), sqlite_served.client(OTHER)
    agent.start_run("acme's secret", "r1")
    other_approver = sqlite_served.client(OTHER_APPROVER)
    for client in (other, other_approver):
        for read in (client.list_events, client.verify_run):
            with pytest.raises(NotFound):
                read("r1")
        assert "r1" not in [r.run_id for r in client.list_runs_page().runs]
    # The same id in globex is globex's own run, with a log of its own.
    other.start_run("globex's goal", "r1")
    assert other.list_events("r1").events[0].data["goal"] == "globex's goal"
    assert agent.list_events("r1").events[0].data["goal"] == "acme's secret"


def test_verify_run_checks_the_stored_chain_and_catches_a_tampered_row(sqlite_served):
    agent, approver, admin = (sqlite_served.client(t) for t in (AGENT, APPROVER, ADMIN))
    for run_id in ("kept", "edited", "moved"):
        agent.start_run(f"goal of {run_id}", run_id)
        agent.submit_batch(run_id, [{"call_id": "e1", "tool": "echo", "arguments": {"text": run_id}}])
        agent.finish_run(run_id)
    for client in (agent, approver, admin):
        report = client.verify_run("edited")
        assert report.ok and report.first_bad_seq == 0 and report.problem == ""
    events = sqlite_served.store.read("edited")
    assert report.events == len(events) and report.head_hash == events[-1].hash

    # An operator (or an intruder) edits the stored rows by hand, past the append-only trigger.
    db = sqlite3.connect(sqlite_served.config.db_path, isolation_level=None)
    try:
        db.execute("DROP TRIGGER events_append_only_u")
        db.execute("UPDATE events SET data = replace(data, 'goal of edited', 'goal of nobody') "
                   "WHERE run_id = 'edited' AND seq = 1")
        db.execute("UPDATE events SET at = at + 1 WHERE run_id = 'moved' AND seq = 3")
    finally:
        db.close()
    edited = agent.verify_run("edited")
    assert (edited.ok, edited.first_bad_seq) == (False, 1) and "edited" in edited.problem
    moved = approver.verify_run("moved")
    assert (moved.ok, moved.first_bad_seq, moved.events) == (False, 3, 3)
    assert agent.verify_run("kept").ok  # the other runs' chains are untouched


# --- approvals: proposer, asking rule, tool risk ---------------------------------------------------


def test_an_approval_says_who_proposed_it_which_rule_asked_and_the_tools_risk(config):
    from ringfence_server.control.store import SqliteEventStore

    with served(config, SqliteEventStore(config.db_path)) as s:
        agent, approver = s.client(AGENT), s.client(APPROVER)
        credit = s.orchestrator.registry.get("credit")
        agent.start_run("pay", "r1")
        stream = approver.watch_approvals()
        watched, got = [], threading.Event()

        def read():
            for a in stream:
                watched.append(a)
                got.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            second = {"call_id": "c2", "tool": "credit", "arguments": {"account": "acme-9", "amount": 60}}
            [first, _] = agent.submit_batch("r1", [dict(CREDIT, call_id="c1"), second])
            assert got.wait(30)
        finally:
            stream.cancel()
            reader.join(10)
        listed = {a.call_id: a for a in approver.list_approvals("r1")}
        for approval, observation in ((listed["c1"], first), (watched[0], first)):
            assert approval.proposer == "acme-agent"
            assert approval.policy_rule in observation.verdict_path
            assert approval.policy_rule.startswith("policy:") and approval.policy_rule.endswith("ask")
            risk = approval.tool_risk
            assert risk is not None and risk.mutates is credit.mutates is True
            assert (risk.irreversible, risk.cost, risk.timeout_s, risk.memory_bytes, risk.pids, risk.image) == (
                credit.irreversible, credit.cost, credit.limits.timeout_s, credit.limits.memory_bytes,
                credit.limits.pids, credit.image)
            assert risk.image_digest and risk.egress_hosts == credit.egress_hosts
        decided = approver.decide_approval(listed["c1"].approval_id, True, "fine", digest=listed["c1"].digest)
        assert decided.status in (ApprovalStatus.APPROVED, ApprovalStatus.USED)  # used at once: it ran
        assert (decided.proposer, decided.policy_rule, decided.tool_risk) == (
            listed["c1"].proposer, listed["c1"].policy_rule, listed["c1"].tool_risk)
        # An agent's view of the run shows who asked and why, never the tool's risk.
        [pending] = agent.get_run("r1").pending_approvals
        assert pending.call_id == "c2" and pending.proposer == "acme-agent" and pending.tool_risk is None
        before = {a.call_id: (a.status, a.proposer, a.policy_rule, a.tool_risk) for a in approver.list_approvals("r1")}

    # After a restart the log replays to the same approvals, decided and pending.
    with served(config, SqliteEventStore(config.db_path)) as s:
        after = {a.call_id: (a.status, a.proposer, a.policy_rule, a.tool_risk)
                 for a in s.client(APPROVER).list_approvals("r1")}
        assert after == before and after["c1"][0] is ApprovalStatus.USED and after["c2"][0] is ApprovalStatus.PENDING


def test_an_old_log_without_the_proposer_reads_as_unknown():
    from ringfence.model import Event
    from ringfence_server.control.state import fold

    requested = {"approval_id": "ap-1", "call_id": "c1", "tool": "credit", "arguments": {}, "digest": "d",
                 "created_at": 1.0, "expires_at": 2.0}  # as a log written before proposer and path
    state = fold([Event("r1", 1, "run_started", {"tenant": "acme", "goal": "g", "created_at": 1.0}, 4, 1.0),
                  Event("r1", 2, "approval_requested", requested, 4, 1.0)])
    approval = state.approvals["ap-1"]
    assert (approval.proposer, approval.policy_rule, approval.tool_risk) == ("", "", None)


# --- GetApproval: one approval by its id, whatever its state -------------------------------------


def _essence(a: Approval) -> tuple:
    return (a.approval_id, a.tenant, a.run_id, a.call_id, a.tool, dict(a.arguments), a.digest, a.status,
            a.created_at, a.expires_at, a.decided_by, a.reason, a.kind, a.proposer, a.policy_rule, a.tool_risk)


def test_get_approval_reads_one_approval_pending_decided_and_of_a_finished_run_also_after_a_restart(config):
    from ringfence_server.control.store import SqliteEventStore

    with served(config, SqliteEventStore(config.db_path)) as s:
        agent, approver, admin = s.client(AGENT), s.client(APPROVER), s.client(ADMIN)
        credit = s.orchestrator.registry.get("credit")
        agent.start_run("pay twice", "r1")
        second = {"call_id": "c2", "tool": "credit", "arguments": {"account": "acme-9", "amount": 60}}
        [first, other] = agent.submit_batch("r1", [dict(CREDIT, call_id="c1"), second])
        listed = {a.call_id: a for a in approver.list_approvals("r1")}

        # Pending: exactly what ListApprovals says of it, tool risk included.
        got = approver.get_approval(first.approval_id)
        assert _essence(got) == _essence(listed["c1"])
        assert (got.approval_id, got.run_id, got.call_id, got.status, got.proposer) == (
            first.approval_id, "r1", "c1", ApprovalStatus.PENDING, "acme-agent")
        assert dict(got.arguments) == CREDIT["arguments"] and got.policy_rule in first.verdict_path
        assert got.tool_risk is not None and got.tool_risk.mutates is credit.mutates is True
        assert got.tool_risk.image_digest and got.tool_risk.egress_hosts == credit.egress_hosts
        assert _essence(admin.get_approval(first.approval_id)) == _essence(got)  # an admin reads it too

        # Decided: the decision and who made it.
        approver.decide_approval(first.approval_id, True, "fine", digest=got.digest)
        decided = approver.get_approval(first.approval_id)
        assert decided.status is ApprovalStatus.USED and decided.decided_by == "acme-approver"
        assert decided.reason == "fine" and decided.digest == got.digest and decided.tool_risk == got.tool_risk

        # The run finishes: its pending approval is declined by the system, and is gone from
        # ListApprovals (unfinished runs only) but not from GetApproval.
        agent.finish_run("r1")
        assert other.approval_id not in [a.approval_id for a in approver.list_approvals()]
        closed = approver.get_approval(other.approval_id)
        assert (closed.status, closed.decided_by, closed.run_id, closed.call_id) == (
            ApprovalStatus.DECLINED, "system", "r1", "c2")
        assert closed.tool_risk == got.tool_risk
        before = {i: _essence(approver.get_approval(i)) for i in (first.approval_id, other.approval_id)}

    # A restart: this process never saw them; the store's key of each finds its (finished) run.
    with served(config, SqliteEventStore(config.db_path)) as s:
        approver = s.client(APPROVER)
        assert {i: _essence(approver.get_approval(i)) for i in before} == before
        with pytest.raises(NotFound):
            s.client(OTHER_APPROVER).get_approval(first.approval_id)


def test_get_approval_shows_an_approval_whose_time_is_up_as_expired(config):
    from ringfence_server.control.store import SqliteEventStore

    now = [1_000_000.0]
    with served(config, SqliteEventStore(config.db_path), clock=lambda: now[0]) as s:
        agent, approver = s.client(AGENT), s.client(APPROVER)
        agent.start_run("pay later", "r1")
        [asked] = agent.submit_batch("r1", [dict(CREDIT, call_id="c1")])
        assert approver.get_approval(asked.approval_id).status is ApprovalStatus.PENDING
        now[0] += config.limits.approval_ttl_s + 1
        expired = approver.get_approval(asked.approval_id)
        assert expired.status is ApprovalStatus.EXPIRED and expired.tool_risk is not None
        [obs] = agent.get_run("r1").trajectory
        assert obs.status is ObservationStatus.DECLINED and obs.error_class == "approval_expired"


def test_get_approval_is_the_tenants_approvers_and_refuses_bad_ids_naming_the_field(sqlite_served):
    agent, approver = sqlite_served.client(AGENT), sqlite_served.client(APPROVER)
    agent.start_run("pay", "r1")
    [asked] = agent.submit_batch("r1", [dict(CREDIT, call_id="c1")])
    approval_id = asked.approval_id or ""
    assert approver.get_approval(approval_id).approval_id == approval_id

    # Another tenant's approval is NOT_FOUND, worded exactly as an id nobody has.
    with pytest.raises(NotFound) as theirs:
        sqlite_served.client(OTHER_APPROVER).get_approval(approval_id)
    unknown_id = "ap-" + "0" * len(approval_id[3:])
    with pytest.raises(NotFound) as unknown:
        sqlite_served.client(OTHER_APPROVER).get_approval(unknown_id)
    assert str(theirs.value).replace(approval_id, "ID") == str(unknown.value).replace(unknown_id, "ID")
    with pytest.raises(NotFound):
        approver.get_approval(unknown_id)

    # Agents never read approvals (theirs come with their run, without the tool's risk).
    for token in (AGENT, OTHER):
        with pytest.raises(PermissionDenied, match="GetApproval"):
            sqlite_served.client(token).get_approval(approval_id)

    # A malformed id is refused at the edge, naming the field.
    for bad in ("", "bad id!", "../etc", "x" * 101, "-leading-dash"):
        with pytest.raises(InvalidArgument) as e:
            approver.get_approval(bad)
        assert violated(e) == {"approval_id"}, bad
    raw = approver.stubs.approvals.GetApproval(approvals_pb2.GetApprovalRequest(approval_id=approval_id),
                                               metadata=approver.metadata(), timeout=10)
    assert raw.approval_id == approval_id and raw.HasField("tool_risk")


# --- WhoAmI: the caller as the server sees it -----------------------------------------------------


def test_whoami_answers_every_role_its_tenant_principal_and_role(sqlite_served):
    for (tenant, role), token in TOKENS.items():
        assert sqlite_served.client(token).whoami() == Identity(tenant, f"{tenant}-{role.value}", role)
    agent = sqlite_served.client(AGENT)
    raw = agent.stubs.identity.WhoAmI(identity_pb2.WhoAmIRequest(), metadata=agent.metadata(), timeout=10)
    assert (raw.tenant, raw.principal, raw.role) == ("acme", "acme-agent", "agent")
    for token in ("no-such-token", None):
        with Client(sqlite_served.server.address, token) as stranger, pytest.raises(Unauthenticated):
            stranger.whoami()


def test_whoami_names_the_proposer_four_eyes_compares(sqlite_served):
    """The principal WhoAmI answers is the proposer an approval names: whoever it names is refused
    the decision, and anyone else of the tenant's approvers is not."""
    agent, approver, admin = (sqlite_served.client(t) for t in (AGENT, APPROVER, ADMIN))
    agent.start_run("pay", "r1")
    admin.start_run("the admin's own", "r2")
    [by_agent] = agent.submit_batch("r1", [dict(CREDIT, call_id="c1")])
    [by_admin] = admin.submit_batch("r2", [dict(CREDIT, call_id="c1")])
    mine = admin.get_approval(by_admin.approval_id or "")
    me = admin.whoami()
    assert me.principal == mine.proposer == "acme-admin" and me.proposed(mine)
    with pytest.raises(PermissionDenied, match="acme-admin proposed this call"):
        admin.decide_approval(mine.approval_id, True, digest=mine.digest)
    assert agent.whoami().principal == approver.get_approval(by_agent.approval_id or "").proposer
    assert not approver.whoami().proposed(mine)
    assert approver.decide_approval(mine.approval_id, True, digest=mine.digest).decided_by == (
        approver.whoami().principal)


def test_the_async_client_gets_an_approval_and_asks_who_it_is(sqlite_served):
    import asyncio

    from ringfence import AsyncClient

    agent = sqlite_served.client(AGENT)
    agent.start_run("pay", "r1")
    [asked] = agent.submit_batch("r1", [dict(CREDIT, call_id="c1")])

    async def read():
        async with AsyncClient(sqlite_served.server.address, APPROVER) as c:
            return await c.whoami(), await c.get_approval(asked.approval_id or "")

    me, got = asyncio.run(read())
    assert me == Identity("acme", "acme-approver", Role.APPROVER)
    assert _essence(got) == _essence(sqlite_served.client(APPROVER).get_approval(asked.approval_id or ""))


# --- ListTools: risk for approvers only ----------------------------------------------------------


def test_a_tools_risk_goes_to_approvers_and_admins_never_to_agents(sqlite_served):
    registry = sqlite_served.orchestrator.registry
    agent = sqlite_served.client(AGENT)
    raw = agent.stubs.tools.ListTools(tools_pb2.ListToolsRequest(), metadata=agent.metadata(), timeout=10)
    assert raw.tools and not any(t.HasField("risk") for t in raw.tools)
    wire = raw.SerializeToString()
    assert all(t.risk is None for t in agent.list_tools())
    assert all(t.risk is None for t in sqlite_served.client(OTHER).list_tools())
    for token in (APPROVER, ADMIN, OTHER_APPROVER):
        tools = {t.name: t for t in sqlite_served.client(token).list_tools()}
        for name, tool in tools.items():
            m = registry.get(name)
            assert tool.risk is not None, name
            assert (tool.risk.mutates, tool.risk.irreversible, tool.risk.cost, tool.risk.egress_hosts,
                    tool.risk.timeout_s, tool.risk.memory_bytes, tool.risk.cpus, tool.risk.pids,
                    tool.risk.stdout_limit, tool.risk.stderr_limit, tool.risk.runtime, tool.risk.image,
                    tool.risk.workspace, dict(tool.risk.paths)) == (
                m.mutates, m.irreversible, m.cost, m.egress_hosts, m.limits.timeout_s, m.limits.memory_bytes,
                m.limits.cpus, m.limits.pids, m.limits.stdout_limit, m.limits.stderr_limit, m.runtime, m.image,
                m.workspace or "", dict(m.paths)), name
            assert tool.risk.image_digest, name
            assert tool.risk.image_digest.encode() not in wire, name  # nothing of it reached the agent


# --- DownloadFiles: approvers get artifacts only ---------------------------------------------------


def _collect_artifact(s: Served, run_id: str, path: str, data: bytes) -> None:
    """Record an artifact exactly as the collector does after a tool's call (files.FileDesk):
    its bytes as a record, then `artifact_collected` (a real collection needs a container)."""
    import base64
    import hashlib

    from ringfence_server.control.events import ArtifactCollected, ArtifactFile
    from ringfence_server.control.files import ARTIFACT_KIND

    repo = s.orchestrator.runs
    state = repo.get("acme", run_id)
    digest = hashlib.sha256(data).hexdigest()
    record = s.store.append_record("acme", ARTIFACT_KIND, f"{state.key}:{path}",
                                   {"path": path, "size": len(data), "sha256": digest, "call_id": "c1",
                                    "data_b64": base64.b64encode(data).decode("ascii")}, written_by="call:c1")
    with repo.writing(state):
        repo.append(state, ArtifactCollected(call_id="c1", files=(
            ArtifactFile(path=path, size=len(data), sha256=digest, revision=record.revision),), missing=()))


def test_an_approver_may_download_a_runs_artifacts_never_its_workspace(sqlite_served):
    agent, approver = sqlite_served.client(AGENT), sqlite_served.client(APPROVER)
    agent.start_run("g", "r1")
    _collect_artifact(sqlite_served, "r1", "reports/summary.txt", b"what the run produced\n")
    got = approver.download_files("r1", artifacts=True)
    assert dict(got) == {"reports/summary.txt": b"what the run produced\n"}
    downloaded = [e for e in agent.list_events("r1").events if e.type == "files_downloaded"]
    assert [(e.data["by"], e.data["artifacts"]) for e in downloaded] == [("acme-approver", True)]
    with pytest.raises(PermissionDenied, match="artifacts"):
        approver.download_files("r1")
    with pytest.raises(PermissionDenied, match="artifacts"):
        approver.download_files("r1", ["notes/a.txt"])
    with pytest.raises(NotFound):
        sqlite_served.client(OTHER_APPROVER).download_files("r1", artifacts=True)
    with pytest.raises(NotFound):
        sqlite_served.client(OTHER).download_files("r1", artifacts=True)
    assert dict(agent.download_files("r1", artifacts=True)) == dict(got)
    with pytest.raises(PermissionDenied):  # uploads stay the run's actors' own
        approver.upload_files("r1", {"a.txt": b"x"})


# --- the async client: the same methods ------------------------------------------------------------


def test_the_async_client_reads_pages_logs_and_audits_too(sqlite_served):
    import asyncio

    from ringfence import AsyncClient

    agent = sqlite_served.client(AGENT)
    for i in range(3):
        agent.start_run("g", f"r{i}")
    agent.finish_run("r1")

    async def read():
        async with AsyncClient(sqlite_served.server.address, APPROVER) as c:
            first = await c.list_runs_page(page_size=2)
            rest = await c.list_runs_page(page_size=2, page_token=first.next_page_token)
            finished = await c.list_runs(status=RunStatus.FINISHED)
            every = await c.list_runs()
            log = await c.list_events("r1", from_seq=1, page_size=1)
            report = await c.verify_run("r1")
            return first, rest, finished, every, log, report

    first, rest, finished, every, log, report = asyncio.run(read())
    assert [r.run_id for r in first.runs] == ["r2", "r1"] and first.next_page_token
    assert [r.run_id for r in rest.runs] == ["r0"] and rest.next_page_token == ""
    assert [r.run_id for r in finished] == ["r1"] and [r.run_id for r in every] == ["r2", "r1", "r0"]
    assert [e.seq for e in log.events] == [1] and log.next_seq == 2  # r1 holds two events: started, finished
    assert report.ok and report.head_hash == sqlite_served.store.read("r1")[-1].hash
