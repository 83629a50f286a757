"""Declared MCP servers, without an engine: the declaration's rules (risk metadata from the
operator only, exposure, the pinned listing), the policy's SERVER.* patterns, and how the control
plane hands a call of a server's tool to the sandbox (a FakeBackend records the request) and
ends the run's sessions with the run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from control_support import AGENT

from ringfence.errors import ConfigError
from ringfence.model import ObservationStatus as S
from ringfence_server.control.config import PolicyConfig, RuleConfig, Verdict, load_config, tool_matches
from ringfence_server.control.idempotency import client_idempotency_key
from ringfence_server.control.mcp_servers.declaration import load_server, server_folders
from ringfence_server.control.mcp_servers.pinning import drift
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.policy import PolicyEngine
from ringfence_server.control.store.sqlite import SqliteEventStore
from ringfence_server.control.toolpkg.packages import registry_from_config
from ringfence_server.sandbox.fake import FakeBackend, FakeWorkspaces, ok_result

SERVERS = Path(__file__).resolve().parents[1] / "mcp_servers" / "servers"


@pytest.fixture
def rogue(tmp_path) -> Path:
    """A copy of the rogue server's declaration, to change."""
    folder = tmp_path / "rogue"
    shutil.copytree(SERVERS / "rogue", folder)
    return folder


def edit(folder: Path, old: str, new: str) -> None:
    path = folder / "server.toml"
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_the_exposed_tools_are_registered_as_server_dot_tool_with_the_operators_risk(rogue):
    decl = load_server(rogue)
    by_name = {m.name: m for m in decl.manifests}
    assert "rogue.hidden" not in by_name and "rogue.count" not in by_name  # kept out / never judged
    lying = by_name["rogue.delete_everything"]
    assert lying.mutates and lying.irreversible and lying.cost == 1.0
    assert lying.mcp is not None and (lying.mcp.server, lying.mcp.tool) == ("rogue", "delete_everything")
    assert lying.mcp.command == ("python3", "-I", "-S", "-B", "/opt/ringfence/rogue_mcp.py")
    assert lying.schema == decl.listed["delete_everything"]["inputSchema"]
    assert by_name["rogue.echo"].limits.timeout_s == 8.0 and by_name["rogue.echo"].image == "mcp-rogue"


def test_the_servers_annotations_never_change_a_verdict(rogue):
    """The server says delete_everything is read-only and not destructive; the operator's
    declaration says it mutates irreversibly: policy asks even where a rule allows. Red check:
    judged as the server describes it, the same rule lets it run."""
    policy = PolicyEngine(PolicyConfig(autonomy="autonomous", rules=(RuleConfig("rogue.*", Verdict.ALLOW),)))
    [lying] = [m for m in load_server(rogue).manifests if m.name == "rogue.delete_everything"]
    assert policy.decide(lying, {"confirm": True}).verdict is Verdict.ASK
    edit(rogue, "[tools.delete_everything]\nmutates = true\nreversible = false",
         "[tools.delete_everything]\nmutates = false\nreversible = true")
    [believed] = [m for m in load_server(rogue).manifests if m.name == "rogue.delete_everything"]
    assert policy.decide(believed, {"confirm": True}).verdict is Verdict.ALLOW


@pytest.mark.parametrize("old, new, key, why", [
    ("[tools.echo]\nmutates = false\nreversible = true\ncost = 0.0", "[tools.echo]\nmutates = false\nreversible = true",
     "tools.echo.cost", "risk metadata is never defaulted"),
    ("[tools.echo]\nmutates = false\n", "[tools.echo]\n", "tools.echo:mutates", "is required"),
    ("[tools.echo]\n", "[tools.echo]\nsafe = true\n", "tools.echo.safe", "unknown key"),
    ("[tools.echo]\n", "[tools.nope]\nmutates = false\nreversible = true\ncost = 0\n\n[tools.echo]\n",
     "tools.nope", "the server does not list 'nope'"),
    ('name = "rogue"', 'name = "other"', "name", "a server's folder is named after it"),
    ('workspace = ""', 'workspace = "all"', "workspace", '"", "read" or "write"'),
    ("timeout_s = 8", "timeout_s = 3000", "limits.timeout_s", "over the server's cap"),
    ('egress_hosts = []', 'egress_hosts = ["10.0.0.1"]', "egress_hosts", ""),
    ('command = [', 'commands = [', "commands", "unknown key"),
])
def test_a_bad_declaration_is_refused_naming_the_file_and_key(rogue, old, new, key, why):
    edit(rogue, old, new)
    with pytest.raises(ConfigError) as e:
        load_server(rogue)
    assert key in e.value.key and str(rogue) in e.value.key
    assert why in e.value.message


def test_a_declaration_without_its_pinned_tools_says_how_to_pin_them(rogue):
    (rogue / "tools.json").unlink()
    with pytest.raises(ConfigError, match="ringfence mcp-servers pin"):
        load_server(rogue)


def test_a_registered_name_must_fit_the_wire(rogue):
    listing = json.loads((rogue / "tools.json").read_text())
    listing["tools"].append({"name": "t" * 60, "inputSchema": {"type": "object"}})
    (rogue / "tools.json").write_text(json.dumps(listing))
    edit(rogue, "[tools.echo]\n", f"[tools.{'t' * 60}]\nmutates = false\nreversible = true\ncost = 0\n\n[tools.echo]\n")
    with pytest.raises(ConfigError, match="must fit 64 characters"):
        load_server(rogue)


def test_drift_names_each_difference():
    pinned = {"a": {"inputSchema": {"type": "object"}, "description": "A"},
              "b": {"inputSchema": {"type": "object"}, "description": "B"}}
    live = [{"name": "a", "inputSchema": {"type": "object", "properties": {"x": {}}}, "description": "A"},
            {"name": "c", "inputSchema": {"type": "object"}}]
    assert drift(pinned, live) == ["b: the server no longer lists it",
                                   "c: new, not pinned (pin again to see it; it stays unexposed until judged)",
                                   "a: its inputSchema changed"]
    assert drift(pinned, [{"name": k, **v} for k, v in pinned.items()]) == []


def test_rule_patterns_name_one_tool_every_tool_or_a_servers_tools():
    assert tool_matches("*", "rogue.echo") and tool_matches("rogue.*", "rogue.echo")
    assert tool_matches("rogue.*", "rogue.a.b")  # an MCP tool's own name may hold dots
    assert not tool_matches("rogue.*", "rogue_ws.echo") and not tool_matches("rogue.*", "rogue")
    assert tool_matches("echo", "echo") and not tool_matches("echo", "rogue.echo")


def test_policy_egress_grants_per_server():
    policy = PolicyConfig(egress={"rogue_net.*": ("allowed.test",), "*": ("any.test",)})
    assert policy.egress_for("rogue_net.http_get") == ("allowed.test", "any.test")
    assert policy.egress_for("rogue.http_get") == ("any.test",)


def test_server_folders_finds_one_or_a_folder_of_them():
    assert [p.name for p in server_folders(SERVERS)] == ["rogue", "rogue_net", "rogue_ws"]
    assert server_folders(SERVERS / "rogue") == [SERVERS / "rogue"]


def _orchestrator(tmp_path, backend, autonomy="autonomous"):
    config = load_config(overrides={
        "state_dir": str(tmp_path), "mcp": {"servers": [str(SERVERS)]},
        "policy": {"autonomy": autonomy, "rules": [{"tool": "rogue.*", "verdict": "allow"},
                                                   {"tool": "rogue_ws.*", "verdict": "allow"}]}})
    store = SqliteEventStore(tmp_path / "events.sqlite3")
    orch = Orchestrator.from_config(config, backend, store, registry=registry_from_config(config),
                                    workspaces=FakeWorkspaces())
    return orch, store


def test_a_call_goes_to_the_runs_session_with_its_command_arguments_and_key(tmp_path):
    backend = FakeBackend(lambda request: ok_result(b'{"ok": true, "content": {"text": "hi"}}\n'))
    orch, store = _orchestrator(tmp_path, backend)
    try:
        run = orch.start_run(AGENT, "mcp", workspace=None).run_id
        from ringfence.model import ProposedCall

        [read] = orch.submit_batch(AGENT, run, [ProposedCall("r", "rogue.echo", {"text": "hi"})])
        [write] = orch.submit_batch(AGENT, run, [ProposedCall("w", "rogue.delete_everything", {"confirm": True})])
        assert read.status is S.EXECUTED and read.content == {"text": "hi"}
        assert write.status is S.PENDING_APPROVAL  # irreversible: asked, never sent
        [request] = backend.requests
        assert request.mcp is not None and request.warm is False and request.stdin == b""
        assert (request.mcp.server, request.mcp.tool, dict(request.mcp.arguments)) == ("rogue", "echo", {"text": "hi"})
        assert request.mcp.mutates is False and request.mcp.idempotency_key is None
        assert request.mcp.owner == "acme"  # the tenant its session counts against
        assert request.argv == ("python3", "-I", "-S", "-B", "/opt/ringfence/rogue_mcp.py")
        assert request.run_id == f"acme:{run}" and request.profile.image == "mcp-rogue"
        assert request.profile.timeout_s == 8.0 and request.profile.stdout_limit == 65536
        orch.finish_run(AGENT, run)
        assert backend.ended_runs == [f"acme:{run}"]  # the run's sessions end with it
    finally:
        orch.close()
        store.close()


def test_a_mutation_carries_its_idempotency_key_to_the_session(tmp_path):
    backend = FakeBackend(lambda request: ok_result(b'{"ok": true, "content": {"count": 1}}\n'))
    orch, store = _orchestrator(tmp_path, backend)
    try:
        from ringfence.model import ProposedCall, WorkspaceRequest

        run = orch.start_run(AGENT, "mcp", workspace=WorkspaceRequest()).run_id
        [obs] = orch.submit_batch(AGENT, run, [ProposedCall("c", "rogue_ws.count", {}, idempotency_key="client-1")])
        assert obs.status is S.EXECUTED
        [request] = backend.requests
        assert request.mcp is not None and request.mcp.mutates is True
        # The key the server gets is the one a built-in tool's runner gets: derived from the
        # client's key, scoped to the tenant.
        assert request.mcp.idempotency_key == client_idempotency_key("acme", "client-1")
        assert request.profile.workspace is not None and not request.profile.workspace.read_only
    finally:
        orch.close()
        store.close()


def test_an_mcp_call_has_the_spans_of_any_call(tmp_path, spans):
    """The call's execute_tool span is under its batch's reads, names the registered tool and its image,
    and has its attempt under it: a session's call is traced as a container's is."""
    from ringfence.model import ProposedCall

    backend = FakeBackend(lambda request: ok_result(b'{"ok": true, "content": {"text": "hi"}}\n'))
    orch, store = _orchestrator(tmp_path, backend)
    try:
        run = orch.start_run(AGENT, "spans").run_id
        orch.submit_batch(AGENT, run, [ProposedCall("r", "rogue.echo", {"text": "hi"})])
        finished = spans.get_finished_spans()
        [tool] = [s for s in finished if s.name == "execute_tool" and s.attributes["ringfence.run_id"] == run]
        [parent] = [s for s in finished if s.context.span_id == tool.parent.span_id]
        # A read: under its batch's parallel group, itself under the batch.
        [batch] = [s for s in finished if s.context.span_id == parent.parent.span_id]
        assert (parent.name, batch.name) == ("parallel", "batch") and batch.context.trace_id == tool.context.trace_id
        assert tool.attributes["gen_ai.tool.name"] == "rogue.echo"
        assert tool.attributes["ringfence.outcome"] == "ok" and tool.attributes["ringfence.tool.mutates"] is False
        [attempt] = [s for s in finished if s.name == "attempt" and s.parent.span_id == tool.context.span_id]
        assert attempt.context.trace_id == tool.context.trace_id
    finally:
        orch.close()
        store.close()


def test_an_mcp_servers_result_passes_the_result_guardrail(tmp_path):
    """A secret in what the server answered is redacted before the observation (and the log)."""
    from ringfence.model import ProposedCall

    secret = "AKIAIOSFODNN7EXAMPLE"
    backend = FakeBackend(lambda request: ok_result(
        json.dumps({"ok": True, "content": {"text": f"key {secret}"}}).encode() + b"\n"))
    orch, store = _orchestrator(tmp_path, backend)
    try:
        run = orch.start_run(AGENT, "guard").run_id
        [obs] = orch.submit_batch(AGENT, run, [ProposedCall("r", "rogue.echo", {"text": "x"})])
        assert obs.status is S.EXECUTED and secret not in json.dumps(obs.content)
        events = store.read(run)
        [completed] = [e for e in events if e.type == "call_completed"]
        assert completed.data["guard"]["redacted"] == ["aws_access_key"]  # the guardrail saw it
        assert all(secret not in json.dumps(dict(e.data)) for e in events)
    finally:
        orch.close()
        store.close()


def test_judge_writes_the_table_in_place_of_pins_template_and_refuses_what_it_cannot_say(rogue):
    from ringfence_server.control.mcp_servers.judging import TEMPLATE_HEADER, Judgement, judge
    from ringfence_server.control.mcp_servers.pinning import judgement_template

    listing = json.loads((rogue / "tools.json").read_text())["tools"]
    template = judgement_template(rogue, listing)
    assert "# [tools.count]" in template and "# [tools.echo]" not in template  # echo is judged already
    path = rogue / "server.toml"
    path.write_text(path.read_text() + "\n" + TEMPLATE_HEADER + template)
    with pytest.raises(ConfigError, match="non-negative"):
        judge(rogue, "count", Judgement(mutates=True, reversible=False, cost=-1))
    judge(rogue, "count", Judgement(mutates=True, reversible=False, cost=2.0))
    text = path.read_text()
    assert "# [tools.count]" not in text and TEMPLATE_HEADER not in text and "\n\n\n" not in text
    [count] = [m for m in load_server(rogue).manifests if m.name == "rogue.count"]
    assert (count.mutates, count.reversible, count.cost) == (True, False, 2.0)
    with pytest.raises(ConfigError, match="is judged already"):
        judge(rogue, "count", Judgement(mutates=False, reversible=True))
    with pytest.raises(ConfigError, match="the server does not list it"):
        judge(rogue, "nope", Judgement(mutates=False, reversible=True))


@pytest.mark.parametrize("table, key", [
    ({"max_sessions_per_tenant": 0}, "mcp.max_sessions_per_tenant"),
    ({"max_sessions_per_tenant": 2000}, "mcp.max_sessions_per_tenant"),
    ({"idle_s": 0}, "mcp.idle_s"),
    ({"idle_s": "long"}, "mcp.idle_s"),
    ({"sessions": 3}, "mcp.sessions"),
])
def test_the_mcp_table_refuses_bad_bounds_naming_the_key(tmp_path, table, key):
    with pytest.raises(ConfigError) as e:
        load_config(overrides={"state_dir": str(tmp_path), "mcp": table})
    assert e.value.key == key


def test_the_mcp_tables_defaults_reach_the_backends_settings(tmp_path):
    from ringfence_server.control.api.serve import mcp_settings

    config = load_config(overrides={"state_dir": str(tmp_path), "mcp": {"max_sessions_per_tenant": 4}})
    settings = mcp_settings(config)
    assert (settings.max_per_owner, settings.idle_s) == (4, 600.0)
