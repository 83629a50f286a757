"""Contextual policy: predicates, most-restrictive-wins, default deny, autonomy, grants, version."""

from __future__ import annotations

import pytest

from ringfence_server.control.config import GrantConfig, PolicyConfig, RuleConfig
from ringfence_server.control.policy import PolicyEngine, Verdict, rule_matches
from ringfence_server.control.registry import ToolManifest

CREDIT = ToolManifest("credit", "c", {"type": "object"}, mutates=True, reversible=False)
ECHO = ToolManifest("echo", "e", {"type": "object"}, mutates=False, reversible=True)
NOTE = ToolManifest("write_note", "w", {"type": "object"}, mutates=True, reversible=True)


@pytest.mark.parametrize("pred,value,expected", [
    ({"lte": 100}, 100, True), ({"lte": 100}, 100.5, False), ({"lt": 100}, 100, False),
    ({"gt": 100}, 101, True), ({"gte": 100}, 99, False), ({"lte": 100}, "50", False),
    ({"lte": 100}, True, False), ({"eq": 1}, True, False), ({"eq": "a"}, "a", True),
    ({"ne": "a"}, "b", True), ({"in": ["a", "b"]}, "b", True), ({"not_in": ["a"]}, "a", False),
    ({"matches": "acme-[0-9]+"}, "acme-9", True), ({"matches": "acme-[0-9]+"}, "acme-9x", False),
    ({"prefix": "/input/"}, "/input/a", True), ({"gte": 0, "lte": 10}, 11, False),
])
def test_predicates(pred, value, expected):
    assert rule_matches(RuleConfig("credit", "allow", {"amount": pred}), "credit", {"amount": value}) is expected


def test_a_missing_argument_satisfies_only_negative_predicates():
    assert not rule_matches(RuleConfig("t", "allow", {"a": {"lte": 5}}), "t", {})
    assert rule_matches(RuleConfig("t", "allow", {"a": {"ne": 5}}), "t", {})


def test_the_demo_credit_rules():
    engine = PolicyEngine(PolicyConfig("autonomous", (
        RuleConfig("credit", "ask", {"amount": {"lte": 100}}), RuleConfig("credit", "deny", {"amount": {"gt": 100}}))))
    assert engine.decide(CREDIT, {"account": "acme-9", "amount": 50}).verdict is Verdict.ASK
    assert engine.decide(CREDIT, {"account": "acme-9", "amount": 500}).verdict is Verdict.DENY


def test_most_restrictive_matching_rule_wins():
    engine = PolicyEngine(PolicyConfig("autonomous", (RuleConfig("*", "allow"), RuleConfig("echo", "ask"))))
    d = engine.decide(ECHO, {})
    assert d.verdict is Verdict.ASK and d.path == ("rule[0]:allow", "rule[1]:ask")


def test_default_deny():
    assert PolicyEngine(PolicyConfig("autonomous", ())).decide(ECHO, {}).verdict is Verdict.DENY


@pytest.mark.parametrize("autonomy,tool,expected", [
    ("supervised", ECHO, Verdict.ASK), ("standard", ECHO, Verdict.ALLOW), ("autonomous", ECHO, Verdict.ALLOW),
    ("supervised", NOTE, Verdict.ASK), ("standard", NOTE, Verdict.ASK), ("autonomous", NOTE, Verdict.ALLOW),
    ("supervised", CREDIT, Verdict.ASK), ("standard", CREDIT, Verdict.ASK), ("autonomous", CREDIT, Verdict.ASK),
])
def test_autonomy_and_risk_only_tighten(autonomy, tool, expected):
    engine = PolicyEngine(PolicyConfig(autonomy, (RuleConfig("*", "allow"),)))
    assert engine.decide(tool, {}).verdict is expected


def test_config_grants_are_exact():
    engine = PolicyEngine(PolicyConfig("autonomous", (), (GrantConfig("echo", {"text": "hi"}),)))
    assert engine.decide(ECHO, {"text": "hi"}).verdict is Verdict.ALLOW
    assert engine.decide(ECHO, {"text": "hi!"}).verdict is Verdict.DENY


def test_the_version_changes_with_the_policy():
    a = PolicyEngine(PolicyConfig("standard", (RuleConfig("echo", "allow"),)))
    b = PolicyEngine(PolicyConfig("standard", (RuleConfig("echo", "ask"),)))
    c = PolicyEngine(PolicyConfig("autonomous", (RuleConfig("echo", "allow"),)))
    assert len({a.version, b.version, c.version}) == 3
    assert a.version == PolicyEngine(PolicyConfig("standard", (RuleConfig("echo", "allow"),))).version
