"""The tool registry: manifests, the caller's view, narrowing, clear errors for bad manifests."""

from __future__ import annotations

import json

import pytest

from ringfence.errors import ConfigError
from ringfence_server.control.registry import NARROW_ABOVE, Reconcile, Registry, ToolManifest, parse_manifest
from ringfence_server.control.tools import load_builtin

RISK_WORDS = ("mutates", "reversible", "irreversible", "paths", "egress", "cost", "limits")


def test_the_builtin_tools():
    r = load_builtin()
    assert r.names == ("assess_evidence", "check_evidence", "crash", "credit", "credit_lookup", "echo", "fail",
                       "fetch_url", "issue_credit", "latency_specialist", "read_file", "route_symptom",
                       "run_tests", "sleep", "stall", "workspace_read", "workspace_write", "write_file",
                       "write_note")
    credit = r.get("credit")
    assert credit.mutates and credit.irreversible
    # credit reaches the ledger (through the egress proxy, when policy grants it) and says how
    # its effects are looked up by key: a read-only tool that takes the key as an argument.
    assert credit.egress_hosts == ("ledger.ringfence.internal",)
    assert credit.reconcile == Reconcile("credit_lookup", "idempotency_key")
    lookup = r.get("credit_lookup")
    assert not lookup.mutates and lookup.egress_hosts == credit.egress_hosts and lookup.reconcile is None
    assert r.get("write_note").mutates and r.get("write_note").reversible
    assert not r.get("echo").mutates
    assert r.get("read_file").paths == {"path": ("/input",)}
    # The demo tools (tests/unit/test_demo_tools.py has their admission and code).
    issue = r.get("issue_credit")
    assert issue.mutates and issue.irreversible and issue.reconcile == credit.reconcile
    assert issue.egress_hosts == credit.egress_hosts
    fetch = r.get("fetch_url")
    assert not fetch.mutates and fetch.egress_hosts == ("runbooks.internal.corp",) and fetch.url_arguments == ("url",)
    assert r.get("write_file").paths == {"path": ("/output",)} and not r.get("write_file").egress_hosts


def test_views_carry_the_schema_and_no_risk_metadata():
    for view in load_builtin().list():
        text = json.dumps(view.schema)
        assert view.schema["type"] == "object"
        assert not any(f'"{w}"' in text for w in RISK_WORDS), view.name
        # The only other fields are the two derived hints (the orchestrator's list_tools sets
        # them from the manifest: test_approval_withdrawal.py) and `risk`, which the registry's
        # view never fills: only the orchestrator does, for approvers and admins
        # (test_api_reviewer_reads.py).
        assert set(vars(view)) == {"name", "description", "schema", "read_only_hint", "destructive_hint", "risk"}
        assert view.risk is None


def _tool(name, description="a tool"):
    return ToolManifest(name, description, {"type": "object"}, mutates=False, reversible=True)


def test_small_registries_are_listed_whole_even_with_a_query():
    r = Registry([_tool(f"t{i}") for i in range(NARROW_ABOVE)])
    assert len(r.list("zzz")) == NARROW_ABOVE


def test_large_registries_are_narrowed_by_the_query():
    tools = [_tool(f"tool_{i}", "does nothing in particular") for i in range(20)]
    tools += [_tool("send_invoice", "email an invoice to a customer"),
              _tool("refund", "refund a customer invoice")]
    r = Registry(tools)
    assert [v.name for v in r.list("invoice")] == ["refund", "send_invoice"]
    assert next(v.name for v in r.list("send invoice")) == "send_invoice"
    assert len(r.list("particular")) == NARROW_ABOVE
    assert len(r.list("")) == 22


BASE = {"name": "t", "description": "d", "schema": {"type": "object"}, "mutates": False, "reversible": True}


@pytest.mark.parametrize("change,key", [
    ({"mutates": None}, "mutates"),
    ({"reversible": "yes"}, "reversible"),
    ({"name": "Bad-Name"}, "name"),
    ({"schema": {"type": "array"}}, "schema"),
    ({"schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}, "schema"),
    ({"paths": {"p": ["relative"]}}, "paths.p"),
    ({"paths": {"p": ["/"]}}, "paths.p"),
    ({"limits": {"memory_bytes": 1}}, "limits.memory_bytes"),
    ({"limits": {"wishes": 3}}, "limits.wishes"),
    ({"egress_hosts": ["Not a host"]}, "egress_hosts"),
    ({"runtime": "gvisor", "egress_hosts": ["api.example.com"]}, "runtime"),
    ({"surprise": 1}, "surprise"),
    ({"mutates": True, "reconcile": "lookup"}, "reconcile"),
    ({"mutates": True, "reconcile": {"tool": "lookup", "how": "x"}}, "reconcile.how"),
    ({"mutates": True, "reconcile": {"tool": "Look Up"}}, "reconcile.tool"),
    ({"mutates": True, "reconcile": {"tool": "t"}}, "reconcile.tool"),
    ({"mutates": True, "reconcile": {"tool": "lookup", "key_argument": ""}}, "reconcile.key_argument"),
    ({"reconcile": {"tool": "lookup"}}, "reconcile"),  # a read-only tool has no effects to look up
])
def test_bad_manifests_name_the_key(change, key):
    doc = {**BASE, **change}
    doc = {k: v for k, v in doc.items() if v is not None}
    with pytest.raises(ConfigError) as e:
        parse_manifest(doc, "t.json")
    assert e.value.key == f"t.json:{key}"


def test_manifest_file_name_must_match(tmp_path):
    (tmp_path / "other.json").write_text(json.dumps(BASE))
    with pytest.raises(ConfigError, match="differs from the file name"):
        Registry.from_dir(tmp_path)


def test_toml_manifests_load(tmp_path):
    (tmp_path / "t.toml").write_text('name = "t"\ndescription = "d"\nmutates = false\nreversible = true\n'
                                     '[schema]\ntype = "object"\n')
    assert Registry.from_dir(tmp_path).names == ("t",)


LOOKUP = {"name": "lookup", "description": "d", "mutates": False, "reversible": True,
          "schema": {"type": "object", "properties": {"idempotency_key": {"type": "string"}},
                     "required": ["idempotency_key"]}}
PAY = {**BASE, "name": "pay", "mutates": True, "reversible": False, "reconcile": {"tool": "lookup"}}


def test_reconcile_names_a_registered_read_only_lookup_taking_the_key():
    r = Registry([parse_manifest(PAY), parse_manifest(LOOKUP)])
    assert r.get("pay").reconcile == Reconcile("lookup", "idempotency_key")


@pytest.mark.parametrize("lookup, why", [
    (None, "not a registered tool"),
    ({**LOOKUP, "mutates": True}, "a look-up must be read-only"),
    ({**LOOKUP, "schema": {"type": "object", "properties": {"idempotency_key": {"type": "string"}}}},
     "as a required argument"),
    ({**LOOKUP, "schema": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}},
     "as a required argument"),
])
def test_a_reconcile_the_registry_cannot_honour_is_refused(lookup, why):
    manifests = [parse_manifest(PAY)] + ([parse_manifest(lookup)] if lookup else [])
    with pytest.raises(ConfigError, match=why) as e:
        Registry(manifests)
    assert e.value.key == "tools.pay.reconcile"


def test_reconcile_with_another_key_argument():
    lookup = {**LOOKUP, "schema": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}
    pay = {**PAY, "reconcile": {"tool": "lookup", "key_argument": "key"}}
    assert Registry([parse_manifest(pay), parse_manifest(lookup)]).get("pay").reconcile.key_argument == "key"
