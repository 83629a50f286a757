"""Escape and ceiling cases 54-61: MCP servers in session sandboxes (docs/escape-battery.md).

A session sandbox lives for a run and runs a third party's server: every case the battery
proves for a call's container must hold for it, and a few are its own (it outlives a call, so
it must not outlive its run; it serves one run, so no other run may see it). Each case runs the
rogue server (tests/mcp_servers: a stdlib MCP server that attempts the attack when asked) in a
session sandbox through the same DockerBackend the control plane uses, and each is paired with
its red check: the same attack with exactly that protection removed, which must succeed.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest
from mcp_sandbox_support import MCP_TEST_IMAGES, content, rogue_request, session_containers
from weaken import WeakenedBackend

from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.egress.grant import EgressGrant
from ringfence_server.sandbox.profile import WorkspaceMount
from ringfence_server.sandbox.reaper import reap
from ringfence_server.sandbox.result import Outcome
from ringfence_server.sandbox.workspace import WorkspaceSpec

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def backend(docker_client, mcp_images, testbed):
    b = DockerBackend(docker_client, lock=mcp_images, egress_proxy=testbed.proxy())
    yield b
    b.close()


@pytest.fixture
def run_id(request):
    """A run of its own for one test; every backend it used ends it afterwards."""
    rid = f"mcp-esc-{uuid.uuid4().hex[:10]}"
    used: list[DockerBackend] = []
    request.node.mcp_backends = used
    yield rid
    for b in used:
        b.end_run(rid)


@pytest.fixture
def weakened(docker_client, mcp_images, request):
    """weakened(change) -> a backend whose container settings pass through `change`; closed
    (its sessions removed) after the test."""
    made: list[DockerBackend] = []

    def make(change):
        b = WeakenedBackend(docker_client, mcp_images, change)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


def call(backend, run_id, tool, arguments=None, **kw):
    return backend.run(rogue_request(run_id, tool, arguments, **kw))


# -- 54: the root filesystem -----------------------------------------------------------

def test_case_54_the_server_cannot_write_the_root_filesystem(backend, run_id):
    got = content(call(backend, run_id, "write_root"))
    assert got == {"/var/tmp/evil": "OSError", "/opt/ringfence/evil": "OSError", "/etc/evil": "OSError",
                   "/evil": "OSError", "/tmp/fine": "written"}
    backend.end_run(run_id)


def test_case_54_red_without_read_only(weakened, run_id):
    """With read_only=False the server (uid 10001) writes into the image's world-writable /var/tmp."""
    b = weakened(lambda s: {**s, "read_only": False})
    assert content(call(b, run_id, "write_root"))["/var/tmp/evil"] == "written"


# -- 55: memory ------------------------------------------------------------------------

def test_case_55_the_server_cannot_exceed_its_memory(backend, run_id, docker_client):
    result = call(backend, run_id, "alloc", {"mib": 400})
    assert result.outcome is Outcome.OOM, result.message
    assert session_containers(docker_client, run_id) == []  # the dead session is removed


def test_case_55_red_without_the_memory_limit(weakened, run_id):
    b = weakened(lambda s: {**s, "mem_limit": None, "memswap_limit": None})
    assert content(call(b, run_id, "alloc", {"mib": 400})) == {"mib": 400}


# -- 56: pids --------------------------------------------------------------------------

def test_case_56_the_server_cannot_exceed_its_pids(backend, run_id):
    started = content(call(backend, run_id, "spawn", {"n": 100}))["started"]
    assert started < 32  # the declaration's pids = 32, the server's own threads included


def test_case_56_red_without_the_pids_limit(weakened, run_id):
    b = weakened(lambda s: {**s, "pids_limit": -1})
    assert content(call(b, run_id, "spawn", {"n": 100}))["started"] == 100


# -- 57: the network -------------------------------------------------------------------

def _net_request(run_id, url, allow):
    request = rogue_request(run_id, "http_get", {"url": url}, server="rogue_net")
    return dataclasses.replace(request, profile=dataclasses.replace(request.profile, egress=EgressGrant(allow=allow)))


def test_case_57_the_server_reaches_its_allowlist_and_nothing_else(backend, run_id, testbed):
    allowed, denied = testbed.decoys["allowed"], testbed.decoys["denied"]
    allowed_before, denied_before = len(allowed.connections()), len(denied.connections())
    ok = content(backend.run(_net_request(run_id, "http://allowed.test/", ("allowed.test",))))
    assert ok["status"] == 200
    refused = content(backend.run(_net_request(run_id, "http://denied.test/", ("allowed.test",))))
    assert refused["status"] is None  # the proxy refused it
    connect = rogue_request(run_id, "connect", {"host": denied.ip, "port": 80}, server="rogue_net")
    raw = content(backend.run(dataclasses.replace(_net_request(run_id, "", ("allowed.test",)), mcp=connect.mcp)))
    assert raw["connected"] is False  # no network but the proxy's socket
    assert len(denied.connections()) == denied_before  # counted at the decoy: nothing arrived
    assert len(allowed.connections()) == allowed_before + 1
    backend.end_run(run_id)


def test_case_57_red_with_the_host_granted(backend, run_id, testbed):
    denied = testbed.decoys["denied"]
    before = len(denied.connections())
    got = content(backend.run(_net_request(run_id, "http://denied.test/", ("allowed.test", "denied.test"))))
    assert got["status"] == 200 and len(denied.connections()) == before + 1
    backend.end_run(run_id)


def test_case_57_red_on_a_network(weakened, run_id, testbed):
    """Attached to the decoys' network instead of none, the server connects to the decoy directly."""
    b = weakened(lambda s: {**s, "network_mode": testbed.networks["outside"].name})
    got = content(call(b, run_id, "connect", {"host": testbed.decoys["denied"].ip, "port": 80}))
    assert got == {"connected": True}


# -- 58: another run -------------------------------------------------------------------

def test_case_58_a_run_sees_neither_another_runs_session_nor_its_workspace(backend, make_workspace):
    a, b = f"mcp-esc-a-{uuid.uuid4().hex[:8]}", f"mcp-esc-b-{uuid.uuid4().hex[:8]}"
    _key_a, vol_a = make_workspace(WorkspaceSpec(bytes=1 << 20, inodes=64))
    _key_b, vol_b = make_workspace(WorkspaceSpec(bytes=1 << 20, inodes=64))
    try:
        def ws(run_id, tool, volume, arguments=None):
            request = rogue_request(run_id, tool, arguments, server="rogue_ws")
            return backend.run(dataclasses.replace(request, profile=dataclasses.replace(
                request.profile, workspace=WorkspaceMount(volume))))

        assert content(ws(a, "count", vol_a)) == {"count": 1}
        content(ws(a, "mark", vol_a, {"text": "A's secret"}))
        seen = content(ws(b, "whoami", vol_b))
        assert seen["listing"]["/workspace"] == []  # A's count is not in B's workspace
        assert content(ws(b, "mark", vol_b, {"text": "B"})) == {"before": None}  # nor A's session state
        # B's session sees its own processes only: its init and the server.
        assert len(seen["pids"]) <= 3, seen["pids"]
    finally:
        backend.end_run(a)
        backend.end_run(b)


def test_case_58_red_with_the_other_runs_workspace_mounted(backend, make_workspace):
    a, b = f"mcp-esc-a-{uuid.uuid4().hex[:8]}", f"mcp-esc-b-{uuid.uuid4().hex[:8]}"
    _key_a, vol_a = make_workspace(WorkspaceSpec(bytes=1 << 20, inodes=64))
    try:
        for run_id, tool in ((a, "count"), (b, "whoami")):
            request = rogue_request(run_id, tool, server="rogue_ws")
            result = backend.run(dataclasses.replace(request, profile=dataclasses.replace(
                request.profile, workspace=WorkspaceMount(vol_a))))
        assert content(result)["listing"]["/workspace"] == ["count"]
    finally:
        backend.end_run(a)
        backend.end_run(b)


def test_case_58_red_in_the_hosts_pid_namespace(weakened, run_id):
    b = weakened(lambda s: {**s, "pid_mode": "host"})
    assert len(content(call(b, run_id, "whoami"))["pids"]) > 3


# -- 59: the run's end, and the control plane's death ---------------------------------

def test_case_59_the_session_does_not_outlive_its_run(backend, run_id, docker_client):
    call(backend, run_id, "mark", {"text": "x"})
    assert len(session_containers(docker_client, run_id, stopped=False)) == 1
    assert backend.end_run(run_id) == 1
    assert session_containers(docker_client, run_id) == []


_OWNER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from mcp_sandbox_support import rogue_request
    from ringfence_server.sandbox.docker_backend import DockerBackend
    from ringfence_server.sandbox.pinned_images import lock_for
    backend = DockerBackend(lock=lock_for(sys.argv[2]))
    result = backend.run(rogue_request(sys.argv[3], "mark", {"text": "x"}))
    print(result.outcome.value, flush=True)
    time.sleep(600)
""")


def _orphaned_session(docker_client, run_id: str) -> None:
    """A control plane (a process of its own) starts a session for `run_id` and dies by SIGKILL."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, tests, str(MCP_TEST_IMAGES), run_id],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "ok"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
    assert len(session_containers(docker_client, run_id, stopped=False)) == 1


def test_case_59_the_session_of_a_dead_control_plane_is_reaped(docker_client, run_id):
    """Red check built in: after the owner's SIGKILL and before the reaper, the session is still
    running (_orphaned_session asserts it): nothing else would ever remove it."""
    _orphaned_session(docker_client, run_id)
    reaped = reap(docker_client)
    assert session_containers(docker_client, run_id) == []
    assert any("owner process" in r.reason for r in reaped), reaped


# -- 60: wall time ---------------------------------------------------------------------

def test_case_60_a_server_that_hangs_is_killed_at_the_wall_time(backend, run_id, docker_client):
    result = call(backend, run_id, "hang", timeout_s=2.0)
    assert result.outcome is Outcome.TIMEOUT
    assert session_containers(docker_client, run_id) == []  # killed and removed, not left running
