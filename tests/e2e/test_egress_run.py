"""Egress through the whole control plane: a run on the real gRPC server, the real Orchestrator,
the real DockerBackend and the real egress proxy (its test resolver maps the decoys' names; the
decoys sit on the test's own internal networks).

The `fetch` tool declares allowed.test and denied.test; policy grants only allowed.test. So the
call's allowlist is allowed.test alone: a fetch of denied.test is denied at admission (never
dispatched, the decoy never sees a connection), a fetch of allowed.test runs through the proxy
(the `fetch` tool, the image's own runner, behind the in-sandbox relay and the call's own
socket: the sandbox has no network), and the proxy's decision is an `egress` event of that
call in the run's log, attributed to that call's attempt.
"""

from __future__ import annotations

import pytest
from egress_support import EgressTestbed

from ringfence import Client
from ringfence.model import ObservationStatus
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.config import load_config, token_digest
from ringfence_server.control.orchestration import Orchestrator
from ringfence_server.control.registry import Registry, ToolManifest
from ringfence_server.control.store import SqliteEventStore
from ringfence_server.sandbox.docker_backend import DockerBackend

pytestmark = pytest.mark.docker

AGENT = "egress-agent-token"
FETCH = ToolManifest(
    "fetch", "GET one URL through the egress proxy.",
    {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"], "additionalProperties": False},
    mutates=False, reversible=True, egress_hosts=("allowed.test", "denied.test"), url_arguments=("url",),
)


@pytest.fixture
def stack(docker_client, pinned_images, tmp_path, request):
    granted = getattr(request, "param", ["allowed.test"])
    testbed = EgressTestbed(docker_client, pinned_images, str(tmp_path / "testbed"))
    store = orchestrator = None
    try:
        backend = DockerBackend(docker_client, lock=pinned_images, egress_proxy=testbed.proxy())
        config = load_config(overrides={
            "state_dir": str(tmp_path / "state"),
            "tenants": {"acme": {"tokens": [{"sha256": token_digest(AGENT), "role": "agent", "subject": "a"}]}},
            "policy": {"rules": [{"tool": "fetch", "verdict": "allow"}], "egress": {"fetch": granted}},
        })
        store = SqliteEventStore(config.db_path)
        orchestrator = Orchestrator.from_config(config, backend, store, registry=Registry([FETCH]))
        with BackgroundServer(orchestrator, config) as server:
            yield server, testbed
    finally:
        if orchestrator is not None:
            orchestrator.close()
        if store is not None:
            store.close()
        testbed.close()


def test_a_calls_allowlist_is_the_tools_hosts_and_the_policy_grant(stack):
    server, testbed = stack
    allowed_before = len(testbed.decoys["allowed"].connections())
    denied_before = len(testbed.decoys["denied"].connections())
    with Client(server.address, AGENT) as agent:
        run = agent.start_run("fetch two pages").run_id
        ok, refused = agent.submit_batch(run, [
            {"call_id": "ok", "tool": "fetch", "arguments": {"url": "http://allowed.test/"}},
            {"call_id": "no", "tool": "fetch", "arguments": {"url": "http://denied.test/"}},
        ])
        assert ok.status is ObservationStatus.EXECUTED, ok.error
        assert ok.content == {"status": 200, "body": "hello from allowed\n", "truncated": False}
        assert refused.status is ObservationStatus.DENIED and not refused.executed
        assert "resource:deny" in refused.verdict_path
        agent.finish_run(run)
        events = list(agent.watch_run(run, 0))
    # The denied call never reached a container, so never the proxy, so never the decoy.
    assert [e.data["call_id"] for e in events if e.type == "dispatch_started"] == ["ok"]
    assert len(testbed.decoys["denied"].connections()) == denied_before
    assert len(testbed.decoys["allowed"].connections()) == allowed_before + 1
    [egress] = [e for e in events if e.type == "egress"]
    assert egress.data["call_id"] == "ok"
    # The proxy attributed the request to the sandbox call of that attempt (its socket's).
    assert {d["call_id"] for d in egress.data["decisions"]} == {f"ok.a{egress.data['attempt']}"}
    decisions = [(d["host"], d["port"], d["decision"]) for d in egress.data["decisions"]]
    assert decisions == [("allowed.test", 80, "allowed")]


@pytest.mark.parametrize("stack", [["allowed.test", "denied.test"]], indirect=True)
def test_red_check_with_both_hosts_granted_the_second_fetch_reaches_its_decoy(stack):
    """The protection above is the policy grant: grant denied.test too and the same call is
    admitted, dispatched, let through by the proxy, and the decoy sees it."""
    server, testbed = stack
    denied_before = len(testbed.decoys["denied"].connections())
    with Client(server.address, AGENT) as agent:
        run = agent.start_run("fetch").run_id
        [obs] = agent.submit_batch(run, [{"call_id": "no", "tool": "fetch", "arguments": {"url": "http://denied.test/"}}])
    assert obs.status is ObservationStatus.EXECUTED and obs.content["status"] == 200
    assert len(testbed.decoys["denied"].connections()) == denied_before + 1
