"""MCP servers in session sandboxes, through the whole control plane: the real gRPC server, the
real Orchestrator with the rogue server declared (tests/mcp_servers/servers: `rogue`, `rogue_ws`
with the run's workspace, `rogue_net` with one host on its allowlist), the real DockerBackend,
the real egress proxy and its decoys on the test's own networks.

What is asserted is meaning: the tools a client is listed (SERVER.TOOL, the pinned schemas, the
operator's hints, never the server's), the exact events of a call in the run's log, what reached
the server (the rogue server's own record of the calls it was sent, read with `whoami`), the
session a run has (one, its own, gone when the run ends), and how a call is classified when its
session dies under it.
"""

from __future__ import annotations

import threading
import time

import pytest
from mcp_sandbox_support import MCP_TEST_IMAGES, SERVERS, served_mcp_servers, session_containers

from ringfence import Client
from ringfence.model import ApprovalStatus, ObservationStatus
from ringfence_server.control.mcp_servers.declaration import read_listing
from ringfence_server.sandbox.mcp_session import IDEMPOTENCY_META

pytestmark = pytest.mark.docker

AGENT, APPROVER = "mcp-servers-agent", "mcp-servers-approver"


@pytest.fixture(scope="module")
def stack(docker_client, mcp_images, testbed, tmp_path_factory):
    # `autonomous`: a reversible mutation that a rule allows runs (rogue_ws.count); an irreversible
    # one is still asked (rogue.delete_everything), under every autonomy.
    policy = {"autonomy": "autonomous",
              "rules": [{"tool": f"{name}.*", "verdict": "allow"} for name in ("rogue", "rogue_ws", "rogue_net")],
              "egress": {"rogue_net.*": ["allowed.test"]}}
    with served_mcp_servers(docker_client, mcp_images, testbed, tmp_path_factory.mktemp("mcp-servers") / "state",
                            images=MCP_TEST_IMAGES, servers=SERVERS, policy=policy, agent=AGENT,
                            approver=APPROVER) as (server, backend):
        yield server, backend, testbed


def received(agent: Client, run_id: str) -> list[str]:
    """The tools/calls the run's rogue session was sent so far (its own record), whoami excluded."""
    [obs] = agent.submit_batch(run_id, [{"call_id": f"who-{time.monotonic_ns()}", "tool": "rogue.whoami"}])
    assert obs.status is ObservationStatus.EXECUTED and obs.content is not None, obs
    return [name for name in obs.content["received"] if name != "whoami"]


def call_events(agent: Client, run_id: str, call_id: str) -> list[str]:
    return [e.type for e in agent.watch_run(run_id, timeout=30) if e.data.get("call_id") == call_id]


def test_list_tools_gives_server_dot_tool_with_the_pinned_schemas_and_the_operators_hints(stack):
    server, _backend, _tb = stack
    pinned = read_listing(SERVERS / "rogue")
    with Client(server.address, AGENT) as agent:
        tools = {t.name: t for t in agent.list_tools()}
    assert {"rogue.echo", "rogue.delete_everything", "rogue_ws.count", "rogue_net.http_get"} <= set(tools)
    # Listed by the server, judged by the operator as not exposed: unknown to every client.
    assert "rogue.hidden" not in tools and "rogue_net.echo" not in tools
    assert dict(tools["rogue.echo"].schema) == pinned["echo"]["inputSchema"]
    assert tools["rogue.echo"].read_only_hint is True
    # The server annotates it readOnlyHint and not destructive; the operator's declaration wins.
    lying = tools["rogue.delete_everything"]
    assert lying.read_only_hint is False and lying.destructive_hint is True
    assert lying.description == "Totally safe."


def test_a_call_runs_in_the_runs_session_with_the_events_of_any_call(stack):
    server, _backend, _tb = stack
    with Client(server.address, AGENT) as agent:
        run = agent.start_run("call an MCP server")
        [obs] = agent.submit_batch(run.run_id, [{"call_id": "e1", "tool": "rogue.echo", "arguments": {"text": "hi"}}])
        assert obs.status is ObservationStatus.EXECUTED and obs.executed
        assert obs.content is not None and obs.content["text"] == "hi"
        # A read carries no idempotency key (the trace context the MCP SDK adds aside).
        assert {k for k in obs.content["meta"] if k not in ("traceparent", "tracestate")} == set()
        assert obs.verdict_path == ("registry:ok", "validation:ok", "guardrail:pass", "resource:ok",
                                    "policy:rule[0]:allow", "admitted", "result:ok")
        agent.finish_run(run.run_id)
        assert call_events(agent, run.run_id, "e1") == [
            "call_decided", "dispatch_started", "attempt", "call_completed", "observation"]


def test_arguments_are_checked_against_the_pinned_schema_before_the_server_sees_them(stack):
    server, _backend, _tb = stack
    with Client(server.address, AGENT) as agent:
        run = agent.start_run("bad arguments")
        [obs] = agent.submit_batch(run.run_id, [{"call_id": "bad", "tool": "rogue.echo", "arguments": {"text": 5}}])
        assert obs.status is ObservationStatus.DENIED and not obs.executed
        assert any(step.startswith("validation:") and step != "validation:ok" for step in obs.verdict_path)
        assert "echo" not in received(agent, run.run_id)
        agent.finish_run(run.run_id)


def test_a_tool_the_operator_did_not_expose_cannot_be_called(stack):
    server, _backend, _tb = stack
    with Client(server.address, AGENT) as agent:
        run = agent.start_run("call the hidden tool")
        [obs] = agent.submit_batch(run.run_id, [{"call_id": "h", "tool": "rogue.hidden"}])
        assert obs.status is ObservationStatus.UNKNOWN_TOOL and not obs.executed
        assert obs.verdict_path == ("registry:unknown",)
        assert received(agent, run.run_id) == []  # the server was never sent it
        agent.finish_run(run.run_id)


def test_red_check_the_server_runs_the_hidden_tool_when_asked_directly(stack):
    """The registry is what keeps `hidden` out: sent to the session without it, the server runs it."""
    from mcp_sandbox_support import content, rogue_request

    _server, backend, _tb = stack
    run_id = f"red-hidden-{time.time_ns()}"
    try:
        assert content(backend.run(rogue_request(run_id, "hidden"))) == {"hidden": True}
    finally:
        backend.end_run(run_id)


def test_a_server_that_says_read_only_is_still_asked_and_gets_the_key_once_approved(stack):
    server, _backend, _tb = stack
    with Client(server.address, AGENT) as agent, Client(server.address, APPROVER) as approver:
        run = agent.start_run("the lying tool")
        [obs] = agent.submit_batch(run.run_id, [{"call_id": "d", "tool": "rogue.delete_everything",
                                                 "arguments": {"confirm": True}}])
        assert obs.status is ObservationStatus.PENDING_APPROVAL and not obs.executed
        assert received(agent, run.run_id) == []  # asked, so not sent
        [approval] = [a for a in approver.list_approvals(run.run_id) if a.status is ApprovalStatus.PENDING]
        approver.decide_approval(approval.approval_id, True, "checked", digest=approval.digest)
        done = {o.call_id: o for o in agent.get_run(run.run_id).trajectory}["d"]
        assert done.status is ObservationStatus.EXECUTED and done.executed
        key = done.content["meta"][IDEMPOTENCY_META]
        assert key and done.content["deleted"] is True
        assert received(agent, run.run_id) == ["delete_everything"]
        agent.finish_run(run.run_id)


def test_the_session_is_the_runs_alone_and_ends_with_it(stack, docker_client):
    server, _backend, _tb = stack
    with Client(server.address, AGENT) as agent:
        a = agent.start_run("run A")
        b = agent.start_run("run B")
        agent.submit_batch(a.run_id, [{"call_id": "m1", "tool": "rogue.mark", "arguments": {"text": "A's"}}])
        [seen_b] = agent.submit_batch(b.run_id, [{"call_id": "m2", "tool": "rogue.mark", "arguments": {"text": "B"}}])
        assert seen_b.content == {"before": None}
        [seen_a] = agent.submit_batch(a.run_id, [{"call_id": "m3", "tool": "rogue.mark", "arguments": {"text": "A2"}}])
        assert seen_a.content == {"before": "A's"}
        [in_a] = session_containers(docker_client, f"acme:{a.run_id}")
        [in_b] = session_containers(docker_client, f"acme:{b.run_id}")
        assert in_a.id != in_b.id  # one session per run, never shared
        agent.finish_run(a.run_id)
        assert session_containers(docker_client, f"acme:{a.run_id}") == []  # gone with its run
        assert [c.id for c in session_containers(docker_client, f"acme:{b.run_id}")] == [in_b.id]
        agent.finish_run(b.run_id)
        assert session_containers(docker_client, f"acme:{b.run_id}") == []


def test_a_workspace_server_writes_its_runs_workspace_and_no_other(stack):
    server, _backend, _tb = stack
    with Client(server.address, AGENT) as agent:
        a = agent.start_run("run A", workspace=True)
        b = agent.start_run("run B", workspace=True)
        [counted] = agent.submit_batch(a.run_id, [{"call_id": "c", "tool": "rogue_ws.count"}])
        assert counted.status is ObservationStatus.EXECUTED and counted.content == {"count": 1}
        assert agent.download_files(a.run_id, ["count"])["count"] == b"1"
        [who_b] = agent.submit_batch(b.run_id, [{"call_id": "w", "tool": "rogue_ws.whoami"}])
        assert who_b.content["listing"]["/workspace"] == []
        for r in (a, b):
            agent.finish_run(r.run_id)


def test_a_session_killed_mid_call_read_retried_afresh_mutation_uncertain(stack, docker_client):
    server, _backend, _tb = stack

    def kill_session_soon(run_id: str) -> threading.Thread:
        """In a second: the run's session container killed from outside (a crash, an operator)."""
        def kill() -> None:
            time.sleep(1.0)
            for c in session_containers(docker_client, f"acme:{run_id}", stopped=False):
                c.kill()

        t = threading.Thread(target=kill)
        t.start()
        return t

    with Client(server.address, AGENT) as agent:
        run = agent.start_run("a mutation killed mid-call", workspace=True)
        agent.submit_batch(run.run_id, [{"call_id": "up", "tool": "rogue_ws.mark", "arguments": {"text": "x"}}])
        killer = kill_session_soon(run.run_id)
        [count] = agent.submit_batch(run.run_id, [{"call_id": "n", "tool": "rogue_ws.count",
                                                    "arguments": {"seconds": 4}}])
        killer.join()
        assert count.status is ObservationStatus.EXECUTED and count.error_class == "uncertain", count
        assert count.attempts == 1  # a mutation is never tried again on its own
        # The next call gets a fresh session: the mark is gone.
        [mark] = agent.submit_batch(run.run_id, [{"call_id": "m", "tool": "rogue_ws.mark", "arguments": {"text": "y"}}])
        assert mark.content == {"before": None}
        agent.finish_run(run.run_id)

        run = agent.start_run("a read killed mid-call")
        agent.submit_batch(run.run_id, [{"call_id": "up", "tool": "rogue.mark", "arguments": {"text": "x"}}])
        killer = kill_session_soon(run.run_id)
        [slept] = agent.submit_batch(run.run_id, [{"call_id": "s", "tool": "rogue.sleep",
                                                    "arguments": {"seconds": 3}}])
        killer.join()
        assert slept.status is ObservationStatus.EXECUTED and slept.error_class is None, slept
        assert slept.attempts == 2  # transient: tried again, on a fresh session
        agent.finish_run(run.run_id)


def test_a_hanging_server_is_killed_at_the_wall_time(stack, docker_client):
    server, _backend, _tb = stack
    with Client(server.address, AGENT) as agent:
        run = agent.start_run("hang")
        [obs] = agent.submit_batch(run.run_id, [{"call_id": "h", "tool": "rogue.hang"}])
        assert obs.error_class == "timeout", obs
        assert "wall time of 8.0s reached" in (obs.error or "")
        [mark] = agent.submit_batch(run.run_id, [{"call_id": "m", "tool": "rogue.mark", "arguments": {"text": "y"}}])
        assert mark.content == {"before": None}
        agent.finish_run(run.run_id)


def test_the_proxys_decisions_are_the_calls_events(stack):
    """A session's egress is attributed to the call it happened in, as a call container's is."""
    server, _backend, _testbed = stack
    with Client(server.address, AGENT) as agent:
        run = agent.start_run("egress events")
        calls = [{"call_id": "in", "tool": "rogue_net.http_get", "arguments": {"url": "http://allowed.test/"}},
                 {"call_id": "out", "tool": "rogue_net.http_get", "arguments": {"url": "http://denied.test/"}}]
        allowed, denied = (agent.submit_batch(run.run_id, [c])[0] for c in calls)
        assert allowed.content["status"] == 200 and denied.content["status"] is None
        agent.finish_run(run.run_id)
        egress = {e.data["call_id"]: e.data["decisions"] for e in agent.watch_run(run.run_id, timeout=30)
                  if e.type == "egress"}
    assert [(d["host"], d["decision"]) for d in egress["in"]] == [("allowed.test", "allowed")], egress
    assert [(d["host"], d["decision"]) for d in egress["out"]] == [("denied.test", "denied")], egress
