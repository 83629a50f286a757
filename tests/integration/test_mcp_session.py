"""MCP session sandboxes on the real engine, below the control plane: the DockerBackend runs
tools/calls of the rogue server (tests/mcp_servers: a stdlib MCP server that misbehaves on
demand) in a container per (run, server), and each way a call can end is classified as the
module docstring of ringfence_server.sandbox.mcp_session says.

What is asserted is meaning: the outcome and message of each ending, that a failure leaves the
next call a fresh session (the server's in-memory mark is gone, and the backend counts one
more start), that a run's session is its own (another run's mark is not seen), and that the
containers the engine has for a run are gone when the run ends.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from mcp_sandbox_support import content, rogue_request, session_containers

from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.mcp_session import IDEMPOTENCY_META
from ringfence_server.sandbox.result import Outcome, ToolErrorClass

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def backend(docker_client, mcp_images):
    b = DockerBackend(docker_client, lock=mcp_images)
    yield b
    b.close()


_runs = iter(range(10_000))


@pytest.fixture
def run_id(backend):
    """A run of its own for one test; its sessions are ended afterwards, whatever happened."""
    rid = f"mcp-it-{next(_runs)}-{time.time_ns() % 10**9}"
    yield rid
    backend.end_run(rid)


def test_a_call_answers_and_the_session_keeps_its_state_between_calls(backend, docker_client, run_id):
    started = backend.mcp_sessions.started
    assert content(backend.run(rogue_request(run_id, "mark", {"text": "one"}))) == {"before": None}
    assert content(backend.run(rogue_request(run_id, "mark", {"text": "two"}))) == {"before": "one"}
    assert backend.mcp_sessions.started == started + 1
    [container] = session_containers(docker_client, run_id)
    assert container.labels["ringfence.mcp-server"] == "rogue"
    assert container.labels["ringfence.purpose"] == "mcp-session"


def without_trace(meta: dict) -> dict:
    """`_meta` as the server got it, less the W3C trace context the MCP SDK's client adds
    whenever a tracer provider is installed (the spans fixture of other tests installs one)."""
    return {k: v for k, v in meta.items() if k not in ("traceparent", "tracestate")}


def test_the_idempotency_key_reaches_the_server_in_meta(backend, run_id):
    got = content(backend.run(rogue_request(run_id, "echo", {"text": "hi"}, key="key-123")))
    assert got["text"] == "hi" and without_trace(got["meta"]) == {IDEMPOTENCY_META: "key-123"}
    assert without_trace(content(backend.run(rogue_request(run_id, "echo", {"text": "hi"})))["meta"]) == {}


@pytest.mark.parametrize("tool, arguments, profile, outcome, message", [
    ("garbage", {}, {}, Outcome.TOOL_ERROR, "the MCP server sent a malformed message"),
    ("huge", {"bytes": 200_000}, {}, Outcome.OUTPUT_LIMIT, "over the 65536-byte cap (stdout_limit)"),
    ("hang", {}, {"timeout_s": 2.0}, Outcome.TIMEOUT, "wall time of 2.0s reached"),
    ("die", {}, {}, Outcome.UNCERTAIN, "the MCP server's session ended during the call"),
    ("alloc", {"mib": 400}, {}, Outcome.OOM, "memory limit of 134217728 bytes reached"),
])
def test_each_failure_is_classified_and_the_next_call_gets_a_fresh_session(
        backend, run_id, tool, arguments, profile, outcome, message):
    backend.run(rogue_request(run_id, "mark", {"text": "before the failure", **{}}, **profile))
    started = backend.mcp_sessions.started
    result = backend.run(rogue_request(run_id, tool, arguments, **profile))
    assert result.outcome is outcome, result.message
    assert message in result.message
    if outcome is Outcome.TOOL_ERROR:
        assert result.error_class is ToolErrorClass.FATAL  # a broken server is not retried
    # The failed session is gone: the next call starts another, which never saw the mark.
    assert content(backend.run(rogue_request(run_id, "mark", {"text": "after"}, **profile))) == {"before": None}
    assert backend.mcp_sessions.started == started + 1


def test_a_result_within_the_cap_is_whole_and_one_over_it_fails(backend, run_id):
    assert len(content(backend.run(rogue_request(run_id, "huge", {"bytes": 60_000})))["text"]) == 60_000
    assert backend.run(rogue_request(run_id, "huge", {"bytes": 70_000})).outcome is Outcome.OUTPUT_LIMIT


def test_a_garbled_answer_to_a_mutation_is_uncertain_not_fatal(backend, run_id):
    result = backend.run(rogue_request(run_id, "garbage", mutates=True))
    assert result.outcome is Outcome.UNCERTAIN
    assert "whether the mutation took effect is unknown" in result.message


def test_the_server_refusing_a_call_is_the_tools_error(backend, run_id):
    result = backend.run(rogue_request(run_id, "no_such_tool"))
    assert result.outcome is Outcome.TOOL_ERROR and result.error_class is ToolErrorClass.FATAL
    assert "answered error -32602" in result.message
    assert content(backend.run(rogue_request(run_id, "mark", {"text": "x"}))) == {"before": None}


def test_each_run_has_its_own_session_and_ending_a_run_removes_only_its_own(backend, docker_client):
    a, b = f"mcp-it-a-{time.time_ns()}", f"mcp-it-b-{time.time_ns()}"
    try:
        backend.run(rogue_request(a, "mark", {"text": "a's secret"}))
        assert content(backend.run(rogue_request(b, "mark", {"text": "b"}))) == {"before": None}
        assert content(backend.run(rogue_request(a, "mark", {"text": "again"}))) == {"before": "a's secret"}
        [ca], [cb] = session_containers(docker_client, a), session_containers(docker_client, b)
        assert ca.id != cb.id
        assert backend.end_run(a) == 1
        assert session_containers(docker_client, a) == []
        assert [c.id for c in session_containers(docker_client, b)] == [cb.id]
    finally:
        backend.end_run(a)
        backend.end_run(b)
    assert session_containers(docker_client, b) == []


def test_a_session_that_starts_after_its_run_ended_is_not_kept(backend, docker_client, run_id):
    backend.end_run(run_id)
    result = backend.run(rogue_request(run_id, "mark", {"text": "late"}))
    assert result.outcome is Outcome.START_FAILED and "the run ended" in result.message
    assert session_containers(docker_client, run_id) == []


def test_kill_run_mid_call_ends_the_call_killed(backend, run_id):
    results = []
    call = threading.Thread(target=lambda: results.append(
        backend.run(rogue_request(run_id, "sleep", {"seconds": 20}, timeout_s=30.0))))
    backend.run(rogue_request(run_id, "mark", {"text": "up"}, timeout_s=30.0))  # the session is up
    call.start()
    time.sleep(0.5)
    assert backend.kill_run(run_id, "cancelled by the test") >= 1
    call.join(30)
    [result] = results
    assert result.outcome is Outcome.KILLED
    assert "cancelled by the test" in result.message


def test_an_outside_kill_mid_call_is_uncertain_and_the_next_call_starts_afresh(backend, docker_client, run_id):
    backend.run(rogue_request(run_id, "mark", {"text": "up"}, timeout_s=30.0))
    [container] = session_containers(docker_client, run_id, stopped=False)
    results = []
    call = threading.Thread(target=lambda: results.append(
        backend.run(rogue_request(run_id, "sleep", {"seconds": 20}, timeout_s=30.0))))
    call.start()
    time.sleep(0.5)
    container.kill()  # not ours: the engine's kill from outside (an operator, another instance)
    call.join(30)
    [result] = results
    assert result.outcome is Outcome.UNCERTAIN, result.message
    assert content(backend.run(rogue_request(run_id, "mark", {"text": "x"}, timeout_s=30.0))) == {"before": None}


def test_parallel_calls_of_one_run_share_one_session(backend, run_id):
    started = backend.mcp_sessions.started
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        backend.run(rogue_request(run_id, "sleep", {"seconds": 1})))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r.outcome for r in results] == [Outcome.OK] * 4
    assert backend.mcp_sessions.started == started + 1


def test_an_idle_session_is_closed_by_the_sweep(backend, docker_client, run_id):
    backend.run(rogue_request(run_id, "mark", {"text": "x"}))
    assert len(session_containers(docker_client, run_id)) == 1
    assert backend.mcp_sessions.sweep(now=time.monotonic() + 10_000) >= 1
    assert session_containers(docker_client, run_id) == []


def test_a_call_that_finds_its_session_ended_was_never_sent(backend, run_id):
    """A session killed between a call's look-up and its send (another call's timeout): the call
    is start_failed (nothing reached a server, so it is retried), never an error of the run."""
    backend.run(rogue_request(run_id, "mark", {"text": "x"}))
    [session] = backend.mcp_sessions.of_run(run_id)
    session.kill("another call's wall time")
    result = session.call(rogue_request(run_id, "mark", {"text": "y"}))
    assert result.outcome is Outcome.START_FAILED and "before the call was sent" in result.message


def test_a_tenant_past_its_session_cap_is_refused_and_others_are_not(docker_client, mcp_images):
    """Sessions live for their runs: past max_per_owner live sessions of one tenant, a call that
    would start another is start_failed, saying so; another tenant's is not; and a run's end
    frees its slot. Red check: with the cap at 3, the third run's session starts."""
    from ringfence_server.sandbox.mcp_session import McpSettings

    for cap in (2, 3):
        backend = DockerBackend(docker_client, lock=mcp_images, mcp=McpSettings(max_per_owner=cap))
        runs = [f"cap-{cap}-{i}-{time.time_ns()}" for i in range(3)]
        try:
            def call(run_id: str, owner: str, backend=backend):
                request = rogue_request(run_id, "mark", {"text": "x"})
                assert request.mcp is not None
                return backend.run(dataclasses.replace(request, mcp=dataclasses.replace(request.mcp, owner=owner)))

            assert call(runs[0], "acme").ok and call(runs[1], "acme").ok
            third = call(runs[2], "acme")
            if cap == 2:
                assert third.outcome is Outcome.START_FAILED
                assert "its cap (mcp.max_sessions_per_tenant 2)" in third.message
                assert session_containers(docker_client, runs[2]) == []
                assert call(f"other-{time.time_ns()}", "globex").ok  # another tenant's own budget
                backend.end_run(runs[0])
                assert call(runs[2], "acme").ok  # a run's end frees its slot
            else:
                assert third.ok
        finally:
            backend.close()
