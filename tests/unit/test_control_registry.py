"""The tool registry: manifests, the caller's view, narrowing, clear errors for bad manifests."""

from __future__ import annotations

import json

import pytest

from control.errors import ConfigError
from control.registry import NARROW_ABOVE, Registry, ToolManifest, parse_manifest
from control.tools import load_builtin

RISK_WORDS = ("mutates", "reversible", "irreversible", "paths", "egress", "cost", "limits")


def test_the_builtin_tools():
    r = load_builtin()
    assert r.names == ("credit", "echo", "fail", "read_file", "sleep", "write_note")
    credit = r.get("credit")
    assert credit.mutates and credit.irreversible
    assert r.get("write_note").mutates and r.get("write_note").reversible
    assert not r.get("echo").mutates
    assert r.get("read_file").paths == {"path": ("/input",)}


def test_views_carry_the_schema_and_no_risk_metadata():
    for view in load_builtin().list():
        text = json.dumps(view.schema)
        assert view.schema["type"] == "object"
        assert not any(f'"{w}"' in text for w in RISK_WORDS), view.name
        assert set(vars(view)) == {"name", "description", "schema"}


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
    assert [v.name for v in r.list("send invoice")][0] == "send_invoice"
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
