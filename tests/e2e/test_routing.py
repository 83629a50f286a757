"""Supervisor routing end to end: the real gRPC server, the real Orchestrator, real containers.

A ticket is routed by a sandboxed router tool (which must see only the symptom) to a sandboxed
specialist tool (which must receive exactly {incident, service}). The witness that a call did or
did not reach a container is the backend itself: every request it was handed, with the exact
bytes given to the container on stdin. Each decision is read back both from the RPC's answer and
from the `routing` records of the store; the tools' calls from the run's own event log.
"""

from __future__ import annotations

import re
import threading
import time
import tomllib
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest
from recording_backend import RecordingBackend

from ringfence import Client
from ringfence.errors import AlreadyExists, InvalidArgument, ResourceExhausted
from ringfence.model import RunOutcome
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.config import DEFAULT_CONFIG_PATH, load_config
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.store import SqliteEventStore
from ringfence_server.sandbox import labels as L

pytestmark = pytest.mark.docker

TENANT, TOKEN = "demo", "demo-agent-token"


def policy_rules() -> list[dict[str, Any]]:
    """The embedded rules (arrays replace on merge, so all of them), plus allow rules for the
    two test tools that are not allowed by default."""
    with DEFAULT_CONFIG_PATH.open("rb") as f:
        rules = tomllib.load(f)["policy"]["rules"]
    return [*rules, {"tool": "crash", "verdict": "allow"}, {"tool": "stall", "verdict": "allow"}]


@dataclass
class Stack:
    server: BackgroundServer
    recording: RecordingBackend
    store: SqliteEventStore
    agent: Client
    clients: list[Client] = field(default_factory=list)

    def client(self) -> Client:
        c = Client(self.server.address, TOKEN, timeout=60)
        self.clients.append(c)
        return c

    def records(self, ticket_id: str):
        return self.store.read_records(TENANT, "routing", ticket_id)

    def unexpected_errors(self) -> int:
        api = self.server.server
        assert api is not None, "the server is not running"
        return api.edge.unexpected_errors

    def events(self, run_id: str) -> list:
        return list(self.agent.watch_run(run_id, 0, timeout=30))


def close_all(clients: list[Client]) -> None:
    for c in clients:
        c.close()


@pytest.fixture
def make_stack(tmp_path, backend):
    """make_stack(routing_override) -> a server of its own on that `[routing]` table."""
    with ExitStack() as cleanup:
        made: list[Stack] = []

        def make(routing: dict[str, Any] | None = None) -> Stack:
            state = tmp_path / f"state{len(made)}"
            config = load_config(overrides={
                "state_dir": str(state), "pool": {"size": 0},
                "routing": routing or {}, "policy": {"rules": policy_rules()}})
            recording = RecordingBackend(backend)
            store = SqliteEventStore(config.db_path)
            cleanup.callback(store.close)
            orch = Orchestrator.from_config(config, recording, store)
            cleanup.callback(orch.close)
            server = cleanup.enter_context(BackgroundServer(orch, config))
            agent = Client(server.address, TOKEN, timeout=60)
            cleanup.callback(agent.close)
            stack = Stack(server, recording, store, agent)
            cleanup.callback(close_all, stack.clients)
            made.append(stack)
            return stack

        yield make
        # No request of any test fell through to the server's catch-all (INTERNAL).
        for stack in made:
            assert stack.unexpected_errors() == 0


def completed(events, call: str) -> dict[str, Any]:
    """The call_completed event's data of `call` (what the tool returned, from inside its sandbox)."""
    (done,) = [e.data for e in events if e.type == "call_completed" and e.data["call_id"] == call]
    return done


def decided_arguments(events, call: str) -> dict[str, Any]:
    (decided,) = [e.data for e in events if e.type == "call_decided" and e.data["call_id"] == call]
    return dict(decided["arguments"])


def field_names(e: InvalidArgument) -> set[str]:
    return {v.field for v in e.violations}


# ---------------------------------------------------------------------------------------- 1


def test_a_valid_ticket_is_routed_to_its_specialist_and_recorded(make_stack):
    s = make_stack()
    d = s.agent.route_ticket("T1", "INC-1", "checkout", "checkout is slow")

    assert (d.status, d.route, d.evidence) == ("review", "latency", "fixture:L1"), d
    assert (d.taxonomy_version, d.router_version, d.specialist_version) == ("1", "1", "1")
    assert re.fullmatch(r"[0-9a-f]{64}", d.scope_digest)
    assert d.version == 1 and not d.replayed and d.correlation_id and d.run_id
    # Exactly two containers: the router, then the specialist.
    assert s.recording.calls() == ["router", "specialist"]

    # One record, `routing_decided`, saying what the answer said.
    (record,) = s.records("T1")
    assert record.body["event"] == "routing_decided"
    assert record.body["status"] == "review" and record.body["evidence"] == "fixture:L1"
    assert record.body["correlation_id"] == d.correlation_id and record.body["run_id"] == d.run_id
    assert [h.evidence for h in s.agent.get_routing("T1")] == ["fixture:L1"]

    # The run holds both calls, each answered by its tool inside its container.
    events = s.events(d.run_id)
    assert completed(events, "router")["content"] == "latency"
    assert completed(events, "specialist")["content"] == "fixture:L1"
    assert s.agent.get_run(d.run_id).outcome is RunOutcome.COMPLETED
    assert s.unexpected_errors() == 0


# ---------------------------------------------------------------------------------------- 2


def test_a_symptom_the_router_cannot_place_is_escalated_without_a_specialist(make_stack):
    s = make_stack()
    d = s.agent.route_ticket("T2", "INC-2", "checkout", "the logo looks purple")

    assert d.status == "escalate" and d.route == "" and d.evidence == "", d
    assert "unclassified" in d.reason
    assert completed(s.events(d.run_id), "router")["content"] == "unclassified"
    assert s.recording.calls() == ["router"]  # no specialist container
    assert [r.body["status"] for r in s.records("T2")] == ["escalate"]


# ---------------------------------------------------------------------------------------- 3


def test_a_service_the_tenant_may_not_route_is_denied_before_any_router(make_stack):
    s = make_stack()
    d = s.agent.route_ticket("T3", "INC-3", "billing", "billing is slow")

    assert d.status == "denied" and d.route == "" and d.run_id == "", d
    assert "billing" in d.reason and d.router_version == ""
    assert s.recording.calls() == []  # the router never ran: zero containers
    assert [r.body["status"] for r in s.records("T3")] == ["denied"]


def test_an_invalid_ticket_is_refused_naming_the_field_and_runs_nothing(make_stack):
    s = make_stack()
    with pytest.raises(InvalidArgument) as empty_incident:
        s.agent.route_ticket("T3b", "   ", "checkout", "checkout is slow")
    assert field_names(empty_incident.value) == {"ticket.incident"}
    with pytest.raises(InvalidArgument) as empty_id:
        s.agent.route_ticket("", "INC-3", "checkout", "checkout is slow")
    assert field_names(empty_id.value) == {"ticket.id"}

    assert s.recording.calls() == []
    assert s.records("T3b") == [] and s.agent.get_routing("T3b") == []
    assert s.unexpected_errors() == 0


# ---------------------------------------------------------------------------------------- 4


def test_a_route_without_a_specialist_is_unavailable(make_stack):
    s = make_stack()
    d = s.agent.route_ticket("T4", "INC-4", "checkout", "disk full")

    assert d.status == "unavailable" and d.route == "capacity" and d.evidence == "", d
    assert d.specialist_version == ""
    assert s.recording.calls() == ["router"]


# ---------------------------------------------------------------------------------------- 5, 6


def test_a_specialist_answer_that_is_not_evidence_is_invalid_result(make_stack):
    s = make_stack({"specialists": {"latency": {"tool": "echo"}}})
    d = s.agent.route_ticket("T5", "INC-5", "checkout", "checkout is slow")

    assert d.status == "invalid_result" and d.route == "latency" and d.evidence == "", d
    assert "not a fixture: evidence locator" in d.reason
    assert s.recording.calls() == ["router", "specialist"]


def test_a_specialist_that_raises_is_worker_error(make_stack):
    s = make_stack({"specialists": {"latency": {"tool": "crash"}}})
    d = s.agent.route_ticket("T6", "INC-6", "checkout", "checkout is slow")

    assert d.status == "worker_error" and d.route == "latency" and d.evidence == "", d
    assert "specialist failed" in d.reason
    done = completed(s.events(d.run_id), "specialist")
    assert done["ok"] is False and "always raises" in done["error"]
    assert s.recording.calls()[0] == "router" and set(s.recording.calls()[1:]) == {"specialist"}


# ---------------------------------------------------------------------------------------- 7, 8


def test_the_specialist_receives_exactly_incident_and_service(make_stack):
    s = make_stack({"specialists": {"latency": {"tool": "echo"}}})
    incident, service, symptom = "INC-7 card declines at checkout", "checkout", "checkout is slow since 09:00"
    d = s.agent.route_ticket("T7", incident, service, symptom)
    assert d.status == "invalid_result", d

    expected = {"incident": incident, "service": service}
    # What crossed into the specialist's container (its stdin) ...
    assert s.recording.sent("specialist") == [expected]
    # ... and what the echo tool, running inside it, saw and returned.
    events = s.events(d.run_id)
    echoed = completed(events, "specialist")["content"]
    assert set(echoed) == {"incident", "service"}, echoed
    assert echoed == expected
    assert decided_arguments(events, "specialist") == expected
    # The router got the symptom and nothing else.
    assert s.recording.sent("router") == [{"symptom": symptom}]
    assert decided_arguments(events, "router") == {"symptom": symptom}


def test_the_router_receives_only_the_symptom_and_a_non_string_route_escalates(make_stack):
    s = make_stack({"router": {"tool": "echo"}})
    d = s.agent.route_ticket("T8", "INC-8 secret incident text", "checkout", "checkout is slow")

    # The router echoed its input: a dict, which is not a route.
    assert d.status == "escalate" and d.route == "", d
    assert "dict" in d.reason
    echoed = completed(s.events(d.run_id), "router")["content"]
    assert echoed == {"symptom": "checkout is slow"}
    assert s.recording.sent("router") == [{"symptom": "checkout is slow"}]
    assert s.recording.calls() == ["router"]


# ---------------------------------------------------------------------------------------- 9


def test_a_router_that_raises_is_route_error(make_stack):
    s = make_stack({"router": {"tool": "crash"}})
    d = s.agent.route_ticket("T9", "INC-9", "checkout", "checkout is slow")

    assert d.status == "route_error" and d.route == "", d
    assert "router failed" in d.reason
    assert "specialist" not in s.recording.calls() and "router" in s.recording.calls()


# ---------------------------------------------------------------------------------------- 10


def test_a_specialist_past_its_deadline_is_killed_and_worker_error(make_stack, docker_client):
    s = make_stack({"specialists": {"latency": {"tool": "stall", "deadline_s": 1.5}}})
    d = s.agent.route_ticket("T10", "INC-10", "checkout", "checkout is slow")

    assert d.status == "worker_error" and d.route == "latency", d
    assert "deadline" in d.reason and "1.5" in d.reason
    # Stopped by the deadline (killed), not by the tool's own 60 s wall time (which is `timeout`).
    attempts = [e.data for e in s.events(d.run_id) if e.type == "attempt" and e.data["call_id"] == "specialist"]
    assert [a["outcome"] for a in attempts] == ["killed"], attempts
    # The deadline is the run's kill switch: the run ended cancelled, the call killed.
    events = s.events(d.run_id)
    (finished,) = [e.data for e in events if e.type == "run_finished"]
    assert s.agent.get_run(d.run_id).outcome is RunOutcome.CANCELLED, finished
    assert completed(events, "specialist")["ok"] is False
    # No container of this run is left running.
    (sandbox_run,) = {r.run_id for r in s.recording.requests}
    running = docker_client.containers.list(
        filters={"label": [f"{L.PRODUCT_LABEL}={L.PRODUCT}", f"{L.RUN_LABEL}={sandbox_run}"]})
    assert running == []
    assert [r.body["status"] for r in s.records("T10")] == ["worker_error"]


# ---------------------------------------------------------------------------------------- 11


def test_past_a_specialists_concurrency_a_ticket_is_refused_and_not_recorded(make_stack):
    s = make_stack({"specialists": {"latency": {"tool": "stall", "max_concurrent": 1, "deadline_s": 4}}})
    first: dict[str, Any] = {}

    def route_first() -> None:
        try:
            first["decision"] = s.client().route_ticket("T11a", "INC-11a", "checkout", "checkout is slow")
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            first["error"] = e

    worker = threading.Thread(target=route_first)
    worker.start()
    # Wait until the first ticket's specialist is in its container (its slot is held).
    deadline = time.monotonic() + 30
    while "specialist" not in s.recording.calls():
        assert time.monotonic() < deadline and worker.is_alive(), first
        time.sleep(0.02)

    with pytest.raises(ResourceExhausted) as refused:
        s.agent.route_ticket("T11b", "INC-11b", "payments", "payments are slow")
    assert "max_concurrent" in str(refused.value)

    worker.join(60)
    assert not worker.is_alive() and "error" not in first, first
    assert first["decision"].status == "worker_error"
    # The refused ticket left nothing behind; its specialist never ran.
    assert s.agent.get_routing("T11b") == [] and s.records("T11b") == []
    assert s.recording.calls().count("specialist") == 1
    assert s.unexpected_errors() == 0


# ---------------------------------------------------------------------------------------- 12


def test_a_retry_keeps_the_decision_and_only_reclassify_makes_a_new_one(make_stack):
    s = make_stack()
    d1 = s.agent.route_ticket("T12", "INC-12", "payments", "payments latency", correlation_id="wf-12")
    assert (d1.status, d1.evidence, d1.version, d1.correlation_id) == ("review", "fixture:L2", 1, "wf-12")
    s.recording.reset()

    again = s.agent.route_ticket("T12", "INC-12", "payments", "payments latency")
    assert again.replayed and again.version == 1 and again.correlation_id == "wf-12"
    assert (again.status, again.evidence, again.run_id) == (d1.status, d1.evidence, d1.run_id)
    assert s.recording.calls() == []  # a replay runs nothing
    assert len(s.records("T12")) == 1

    d2 = s.agent.route_ticket("T12", "INC-12", "payments", "payments latency", reclassify=True)
    assert d2.version == 2 and not d2.replayed and d2.correlation_id == "wf-12"
    assert d2.run_id != d1.run_id and s.recording.calls() == ["router", "specialist"]
    assert [r.body["event"] for r in s.records("T12")] == ["routing_decided", "routing_reclassified"]
    assert {r.body["correlation_id"] for r in s.records("T12")} == {"wf-12"}
    assert [h.version for h in s.agent.get_routing("T12")] == [1, 2]

    s.recording.reset()
    with pytest.raises(AlreadyExists):
        s.agent.route_ticket("T12", "INC-12", "payments", "payments are down")
    with pytest.raises(AlreadyExists):
        s.agent.route_ticket("T12", "INC-12", "payments", "payments latency", correlation_id="wf-other")
    assert s.recording.calls() == [] and len(s.records("T12")) == 2
    assert s.unexpected_errors() == 0


# ---------------------------------------------------------------------------------------- 13


def test_an_envelope_over_the_specialists_payload_cap_is_refused(make_stack):
    s = make_stack({"specialists": {"latency": {"max_payload_bytes": 64}}})
    with pytest.raises(InvalidArgument) as refused:
        s.agent.route_ticket("T13", "INC-13 " + "x" * 200, "checkout", "checkout is slow")
    assert field_names(refused.value) == {"ticket.incident"}
    assert "max_payload_bytes" in str(refused.value)
    assert "specialist" not in s.recording.calls()
    assert s.agent.get_routing("T13") == []
    # A ticket that fits is routed by the same server.
    assert s.agent.route_ticket("T13s", "INC-13", "checkout", "checkout is slow").status == "review"
    assert s.unexpected_errors() == 0
