"""Supervisor routing: the config table and the control flow on the FakeBackend (the real
containers are in tests/e2e/test_routing.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from control_support import AGENT, Harness, error_result

from ringfence.errors import AlreadyExists, ConfigError, InvalidArgument
from ringfence.routing import Ticket
from ringfence_server.control.config import load_config
from ringfence_server.control.routing.config import RouterConfig, RoutingConfig, SpecialistConfig, parse_routing
from ringfence_server.control.routing.service import TicketRouter

RULES = [{"tool": t, "verdict": "allow"} for t in ("route_symptom", "latency_specialist", "echo", "crash")]
R = {"taxonomy": ["latency"], "router": {"tool": "route_symptom"}}
TICKET = Ticket("T1", "INC-1", "checkout", "checkout is slow")


LATENCY = SpecialistConfig("latency_specialist", "5")


def config(specialist: SpecialistConfig = LATENCY) -> RoutingConfig:
    return RoutingConfig(("latency", "errors", "capacity"), "7", RouterConfig("route_symptom", "3"),
                         {"latency": specialist}, {"acme": ("checkout",)})


@pytest.fixture
def h(tmp_path):
    h = Harness(tmp_path, rules=RULES)
    h.emulator.overrides["route_symptom"] = lambda call: "latency" if "slow" in call.arguments["symptom"] else "nope"
    h.emulator.overrides["latency_specialist"] = lambda call: "fixture:L1"
    yield h
    h.orch.close()


def router(h, specialist: SpecialistConfig = LATENCY) -> TicketRouter:
    return TicketRouter(h.orch, h.store, config(specialist))


def test_the_embedded_routing_table():
    r = load_config().routing
    assert r.taxonomy == ("latency", "errors", "capacity") and r.router == RouterConfig("route_symptom", "1")
    assert r.specialists["latency"] == SpecialistConfig("latency_specialist", "1", 4, 10.0, 4096)
    assert r.services["demo"] == ("checkout", "payments", "search")


@pytest.mark.parametrize("raw, key", [
    ({"taxonomy": ["latency"], "colour": 1}, "routing.colour"),
    ({"taxonomy": ["latency", "latency"]}, "routing.taxonomy"),
    ({"taxonomy": ["latency"]}, "routing.router.tool"),
    ({**R, "specialists": {"errors": {"tool": "x"}}}, "routing.specialists.errors"),
    ({**R, "specialists": {"latency": {"tool": "Bad Name"}}}, "routing.specialists.latency.tool"),
    ({**R, "specialists": {"latency": {"tool": "x", "max_concurrent": 0}}},
     "routing.specialists.latency.max_concurrent"),
    ({**R, "specialists": {"latency": {"tool": "x", "deadline_s": 0}}},
     "routing.specialists.latency.deadline_s"),
    ({"taxonomy": ["latency"], "router": {"tool": "r", "version": "no spaces"}}, "routing.router.version"),
    ({**R, "services": {"acme": "checkout"}}, "routing.services.acme"),
])
def test_a_bad_routing_table_names_its_key(raw, key):
    with pytest.raises(ConfigError) as e:
        parse_routing(raw)
    assert e.value.violations[0].field == key


def test_review_and_the_exact_inputs_of_router_and_specialist(h):
    d = router(h).route(AGENT, TICKET)
    assert (d.status, d.route, d.evidence, d.version, d.taxonomy_version, d.router_version,
            d.specialist_version, d.replayed) == ("review", "latency", "fixture:L1", 1, "7", "3", "5", False)
    assert [(c.tool, c.arguments) for c in h.emulator.log] == [
        ("route_symptom", {"symptom": "checkout is slow"}),
        ("latency_specialist", {"incident": "INC-1", "service": "checkout"})]
    [record] = h.store.read_records("acme", "routing", "T1")
    assert record.body["event"] == "routing_decided" and record.body["correlation_id"] == d.correlation_id


@pytest.mark.parametrize("router_answer, status", [
    ("nope", "escalate"), (42, "escalate"), (["latency"], "escalate"), ("capacity", "unavailable")])
def test_what_the_router_answers_decides(h, router_answer, status):
    h.emulator.overrides["route_symptom"] = lambda call: router_answer
    d = router(h).route(AGENT, TICKET)
    assert d.status == status
    assert [c.tool for c in h.emulator.log] == ["route_symptom"]  # no specialist ran


def test_a_failing_router_is_route_error(h):
    h.emulator.overrides["route_symptom"] = lambda call: error_result("fatal", "boom")
    assert router(h).route(AGENT, TICKET).status == "route_error"


@pytest.mark.parametrize("answer, status", [
    (error_result("fatal", "boom"), "worker_error"), ({"evidence": "fixture:L1"}, "invalid_result"),
    ("see the logs", "invalid_result"), ("fixture:", "invalid_result"), ("fixture:L9", "review")])
def test_what_the_specialist_answers_decides(h, answer, status):
    h.emulator.overrides["latency_specialist"] = lambda call: answer
    assert router(h).route(AGENT, TICKET).status == status


def test_a_denied_service_runs_nothing_and_is_recorded(h):
    d = router(h).route(AGENT, Ticket("T2", "INC-2", "billing", "slow"))
    assert (d.status, d.run_id, d.router_version) == ("denied", "", "")
    assert h.backend.requests == []


def test_a_bad_ticket_is_refused_before_anything(h):
    with pytest.raises(InvalidArgument) as e:
        router(h).route(AGENT, Ticket("", "  ", "", "slow"))
    assert [v.field for v in e.value.violations] == ["ticket.id", "ticket.incident", "ticket.service"]
    assert h.backend.requests == []


def test_a_retry_keeps_its_decision_and_reclassify_makes_a_new_version(h):
    r = router(h)
    first = r.route(AGENT, TICKET, "corr-1")
    h.emulator.overrides["latency_specialist"] = lambda call: "fixture:L2"
    again = r.route(AGENT, TICKET)
    assert again.replayed and (again.version, again.evidence, again.correlation_id) == (1, "fixture:L1", "corr-1")
    assert len(h.emulator.log) == 2
    new = r.route(AGENT, TICKET, reclassify=True)
    assert (new.version, new.evidence, new.correlation_id, new.replayed) == (2, "fixture:L2", "corr-1", False)
    assert [x.body["event"] for x in h.store.read_records("acme", "routing", "T1")] == \
        ["routing_decided", "routing_reclassified"]
    assert [d.version for d in r.history(AGENT, "T1")] == [1, 2] and first.version == 1
    with pytest.raises(AlreadyExists):
        r.route(AGENT, Ticket("T1", "INC-1", "checkout", "something else"))
    with pytest.raises(AlreadyExists):
        r.route(AGENT, TICKET, "corr-other")


def test_an_envelope_over_the_payload_cap_is_refused(h):
    with pytest.raises(InvalidArgument) as e:
        router(h, replace(LATENCY, max_payload_bytes=64)).route(AGENT, Ticket("T3", "x" * 100, "checkout", "slow"))
    assert [v.field for v in e.value.violations] == ["ticket.incident"]
    assert [c.tool for c in h.emulator.log] == ["route_symptom"]  # the specialist never ran
    assert h.store.read_records("acme", "routing", "T3") == []
