"""The Docker backend against the real engine and the pinned tool image: the issue's acceptance
points, the settings the engine reports, image pinning, and cleanup."""

from __future__ import annotations

import json
import time

import pytest
import requests

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.errors import ImageError
from ringfence_server.sandbox.profile import MiB, SandboxProfile
from ringfence_server.sandbox.result import Outcome, ToolErrorClass

pytestmark = pytest.mark.docker


def run(backend, argv, *, stdin=b"", **limits):
    request = SandboxRequest(profile=SandboxProfile(**limits), argv=tuple(argv), stdin=stdin, run_id="itest")
    return backend.run(request), request


def containers_of(docker_client, request):
    return docker_client.containers.list(all=True, filters={"label": f"{L.CALL_LABEL}={request.call_id}"})


def test_id_is_the_sandbox_user(backend, runtime):
    result, _ = run(backend, ["id", "-u"], runtime=runtime)
    assert result.outcome is Outcome.OK
    assert result.stdout == b"10001\n"
    assert result.runtime == runtime
    assert result.image_id == backend._image_id("tool")


def test_applied_settings_read_back_from_the_engine(backend):
    result, _ = run(backend, ["true"], memory_bytes=64 * MiB, cpus=0.5, pids=64, tmpfs_bytes=8 * MiB)
    applied = result.applied
    assert applied["user"] == "10001:10001"
    assert applied["read_only"] is True
    assert applied["cap_drop"] == ["ALL"]
    assert not applied["cap_add"]
    assert applied["privileged"] is False
    assert "no-new-privileges:true" in applied["security_opt"]
    assert any(o.startswith("seccomp=ringfence-default (sha256:") for o in applied["security_opt"])
    assert applied["network_mode"] == "none"
    assert applied["ipc_mode"] == "private"
    assert applied["cgroupns"] == "private"
    assert applied["memory"] == applied["memory_swap"] == 64 * MiB
    assert applied["nano_cpus"] == 500_000_000
    assert applied["pids_limit"] == 64
    memory_fs = f"rw,noexec,nosuid,nodev,size={8 * MiB},nr_inodes=4096,mode=1777"
    assert applied["tmpfs"] == {"/tmp": memory_fs, "/dev/shm": memory_fs,
                                "/dev/mqueue": "ro,noexec,nosuid,nodev,size=4k,nr_inodes=1,mode=555"}
    assert "/proc/cmdline" in applied["masked_paths"] and "/proc/kcore" in applied["masked_paths"]
    assert applied["entrypoint"] == ["/usr/bin/tini", "-v", "--"]
    assert {u["name"]: u["hard"] for u in applied["ulimits"]} == {"nofile": 256, "fsize": 16 * MiB, "core": 0}
    assert applied["dns"] == ["127.0.0.1"]
    # Only our static /etc files (never Docker's copies under its data root), all read-only.
    assert sorted(m["target"] for m in applied["mounts"]) == ["/etc/hostname", "/etc/hosts", "/etc/resolv.conf"]
    assert all(m["read_only"] for m in applied["mounts"])


def test_stdin_reaches_the_command_and_stderr_is_separate(backend, runtime):
    result, _ = run(backend, ["sh", "-c", "cat; echo oops >&2; exit 4"], stdin=b"request body", runtime=runtime)
    assert result.outcome is Outcome.TOOL_ERROR and result.exit_code == 4
    assert result.error_class is ToolErrorClass.FATAL
    assert (result.stdout, result.stderr) == (b"request body", b"oops\n")


def test_output_flood_is_cut_at_the_cap(backend, runtime):
    result, _request = run(backend, ["sh", "-c", "yes"], stdout_limit=64 * 1024, runtime=runtime)
    assert result.outcome is Outcome.OUTPUT_LIMIT
    assert len(result.stdout) == 64 * 1024 and result.stdout_truncated
    assert set(result.stdout) == set(b"y\n")


def test_memory_bomb_is_oom(backend, runtime):
    result, _ = run(
        backend, ["python3", "-c", "x = bytearray(1 << 30); print(len(x))"], memory_bytes=64 * MiB, runtime=runtime
    )
    assert result.outcome is Outcome.OOM
    assert result.stdout == b""


def test_setsid_child_does_not_outlive_the_deadline(backend, docker_client, runtime):
    result, request = run(backend, ["sh", "-c", "setsid sleep 1000 & sleep 100"], timeout_s=2, runtime=runtime)
    assert result.outcome is Outcome.TIMEOUT
    assert containers_of(docker_client, request) == []


def test_fork_bomb_ends_classified_and_the_host_is_unaffected(backend, docker_client):
    result, request = run(backend, ["sh", "-c", "f() { f | f & }; f; sleep 3"], pids=32, timeout_s=2)
    assert result.outcome in (Outcome.TIMEOUT, Outcome.TOOL_ERROR, Outcome.OK)
    assert containers_of(docker_client, request) == []
    # The host can still start processes and containers.
    after, _ = run(backend, ["true"])
    assert after.outcome is Outcome.OK


def test_runner_mode_returns_the_tools_json(backend):
    body = {"tool": "echo", "arguments": {"text": "hi"}, "call_id": "c1", "idempotency_key": None}
    result, _ = run(backend, [], stdin=json.dumps(body).encode())
    assert result.outcome is Outcome.OK, result.stderr
    assert json.loads(result.stdout)["ok"] is True


def test_runner_classified_tool_error_reaches_the_result(backend):
    body = {"tool": "fail", "arguments": {"class": "transient", "message": "try later"}, "call_id": "c2"}
    result, _ = run(backend, [], stdin=json.dumps(body).encode())
    assert result.outcome is Outcome.TOOL_ERROR
    assert result.error_class is ToolErrorClass.TRANSIENT


def test_write_to_root_filesystem_fails(backend):
    result, _ = run(backend, ["sh", "-c", "echo x > /etc/passwd"])
    assert result.outcome is Outcome.TOOL_ERROR
    assert b"Read-only file system" in result.stderr


def test_every_container_is_labelled_and_removed(backend, docker_client):
    since = int(time.time()) - 1
    _result, request = run(backend, ["true"])
    events = docker_client.events(
        since=since, until=int(time.time()) + 1, decode=True,
        filters={"type": "container", "event": "create", "label": f"{L.CALL_LABEL}={request.call_id}"},
    )
    created = [e["Actor"]["Attributes"] for e in events]
    assert len(created) == 1
    labels = created[0]
    assert labels[L.PRODUCT_LABEL] == "ringfence"
    assert labels[L.RUN_LABEL] == "itest" and labels[L.CALL_LABEL] == request.call_id
    assert labels[L.INSTANCE_LABEL] == L.instance_id()
    assert int(labels[L.DEADLINE_LABEL]) > since
    assert containers_of(docker_client, request) == []


def test_an_image_not_in_the_lock_is_refused_before_any_container(backend, docker_client):
    since = int(time.time()) - 1
    request = SandboxRequest(profile=SandboxProfile(image="not-pinned"), argv=("true",), run_id="unpinned")
    with pytest.raises(ImageError):
        backend.run(request)
    events = docker_client.events(
        since=since, until=int(time.time()) + 1, decode=True,
        filters={"type": "container", "event": "create", "label": f"{L.CALL_LABEL}={request.call_id}"},
    )
    assert list(events) == []


def test_a_tag_pointing_elsewhere_does_not_redirect_dispatch(backend, docker_client, pinned_images):
    """Dispatch uses the locked ID, never a tag: retagging ringfence/tool to the base image
    changes nothing about what runs."""
    tool_id = pinned_images.image_id("tool")
    base = docker_client.images.get(pinned_images.image_id("base"))
    base.tag("ringfence/tool", "latest")
    try:
        # The runner exists only in the tool image: seeing it proves what actually ran, not
        # merely which ID the result reports.
        result, _ = run(backend, ["test", "-f", "/opt/ringfence/runner.py"])
        assert result.outcome is Outcome.OK and result.image_id == tool_id
    finally:
        docker_client.images.get(tool_id).tag("ringfence/tool", "latest")


def test_threads_start_under_both_runtimes(backend, runtime):
    """Under gVisor our seccomp profile applies inside the sentry, which ignores errnoRet; the
    gVisor variant of the profile must still let glibc fall back from clone3 to clone."""
    code = "import threading; t = threading.Thread(target=print, args=('thread ran',)); t.start(); t.join()"
    result, _ = run(backend, ["python3", "-c", code], runtime=runtime)
    assert result.outcome is Outcome.OK, result.stderr
    assert result.stdout == b"thread ran\n"


def test_small_pids_budget_starts_under_gvisor(backend, gvisor_available):
    """The pids cgroup also counts gVisor's own host tasks: eight per task of the tool's budget
    (enforced inside the sentry) plus a base of 256, so the sentry never starves first."""
    if not gvisor_available:
        pytest.skip("no runsc runtime")
    result, _ = run(backend, ["sh", "-c", "echo started"], runtime="gvisor", pids=32)
    assert result.outcome is Outcome.OK and result.stdout == b"started\n"
    assert result.applied["pids_limit"] == 32 * 8 + 256


def test_oom_of_a_child_is_oom_even_when_the_parent_exits_otherwise(backend):
    """The memory cgroup's OOM notification (State.OOMKilled), not only exit 137: a shell whose
    child was OOM-killed exits 1, and the call is still classified `oom`."""
    script = 'python3 -c "x = b\\"x\\" * (1 << 30)"; echo child=$?; exit 1'
    result, _ = run(backend, ["sh", "-c", script], memory_bytes=64 * MiB)
    assert result.stdout == b"child=137\n" and result.exit_code == 1
    assert result.outcome is Outcome.OOM


# -- engine failures: before the tool could have started, or after ----------------------------


class _EngineDropsAfterStart(DockerBackend):
    """The engine's connection breaks while the tool runs (requests' own error, which docker-py
    does not wrap): the real container was started and ran its command."""

    @staticmethod
    def _pump(sock, stdin, streams, deadline, demux):
        DockerBackend._pump(sock, stdin, streams, deadline, demux)
        raise requests.exceptions.ConnectionError("connection to the engine reset")


class _EngineDropsBeforeCreate(DockerBackend):
    def _create(self, image_id, **kwargs):
        raise requests.exceptions.ConnectionError("connection to the engine refused")


def test_an_engine_failure_after_start_is_uncertain_never_start_failed(docker_client, pinned_images):
    """start_failed is retried; a tool that may have run must never be: `uncertain`."""
    backend = _EngineDropsAfterStart(docker_client, lock=pinned_images)
    result, request = run(backend, ["sh", "-c", "echo effect"])
    assert result.outcome is Outcome.UNCERTAIN, result
    assert "after the tool could have started" in result.message
    assert containers_of(docker_client, request) == []


def test_an_engine_failure_before_create_is_start_failed(docker_client, pinned_images):
    backend = _EngineDropsBeforeCreate(docker_client, lock=pinned_images)
    result, request = run(backend, ["true"])
    assert result.outcome is Outcome.START_FAILED and "ConnectionError" in result.message
    assert containers_of(docker_client, request) == []
