"""Workspaces (ringfence_server.sandbox.workspace.DockerWorkspaces) and live output (SandboxRequest.on_output)
on the real engine and the pinned tool image.

Workspaces: made, found, listed, reaped and removed as the engine reports them; the keeper's
hardening read back from the engine; a keeper that died or never started is brought back; files
survive across calls while the keeper holds the volume, and a removed workspace takes its files;
a call never runs with a workspace that is gone; the instance reaper leaves keepers alone.

Live output: the listener gets exactly the bytes the result holds, while the container still
runs (cold and warm), and a listener that raises does not break the call.

Every workspace a test makes is removed by the `workspaces` fixture, pass or fail, and carries
the test session's label (ringfence_server.sandbox.labels.base_labels) so tests/conftest.py finds leftovers.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
import uuid

import docker
import docker.errors
import pytest

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.errors import ProfileError
from ringfence_server.sandbox.hardening import STRAY_WORKSPACE_PURPOSE
from ringfence_server.sandbox.host_config import applied_settings
from ringfence_server.sandbox.pool import PoolSettings, claimed_prefix
from ringfence_server.sandbox.profile import KiB, MiB, SandboxProfile, WorkspaceMount
from ringfence_server.sandbox.reaper import orphan_reason, reap, reap_stray_volumes
from ringfence_server.sandbox.result import Outcome
from ringfence_server.sandbox.workspace import (
    KEEPER_MEMORY,
    KEEPER_PIDS,
    PURPOSE_KEEPER,
    PURPOSE_VIEW,
    PURPOSE_VOLUME,
    TENANT_LABEL,
    WORKSPACE_LABEL,
    DockerWorkspaces,
    WorkspaceSpec,
    WorkspaceStore,
    keeper_name,
    view_name,
    volume_name,
)

pytestmark = pytest.mark.docker

SPEC = WorkspaceSpec(bytes=2 * MiB, inodes=128)


class Workspaces:
    """A DockerWorkspaces for one test that remembers every run key it was asked to make."""

    def __init__(self, store: DockerWorkspaces) -> None:
        self.store = store
        self.keys: list[str] = []

    def key(self) -> str:
        run_key = f"itest-ws/{uuid.uuid4().hex[:12]}"  # a `/` as a store key may hold
        self.keys.append(run_key)
        return run_key

    def make(self, spec: WorkspaceSpec = SPEC, tenant: str = "tenant-a") -> tuple[str, str]:
        run_key = self.key()
        return run_key, self.store.create(run_key, tenant, spec)


@pytest.fixture
def workspaces(docker_client, pinned_images):
    made = Workspaces(DockerWorkspaces(docker_client, pinned_images))
    try:
        yield made
    finally:
        for run_key in made.keys:
            made.store.remove(run_key)


def call(backend, argv, volume, *, read_only=False, runtime="runc", **kwargs):
    profile = SandboxProfile(runtime=runtime, workspace=WorkspaceMount(volume, read_only))
    return backend.run(SandboxRequest(profile=profile, argv=tuple(argv), run_id="itest-ws", **kwargs))


def sh(backend, script, volume, **kwargs):
    return call(backend, ["sh", "-c", script], volume, **kwargs)


# -- the store on the engine ------------------------------------------------------------------------


def test_create_makes_the_volume_its_view_and_a_running_keeper(workspaces, docker_client):
    run_key, volume = workspaces.make()
    assert isinstance(workspaces.store, WorkspaceStore)
    assert volume == volume_name(run_key)
    attrs = docker_client.volumes.get(volume).attrs
    assert attrs["Driver"] == "local"
    assert attrs["Options"] == {
        "type": "tmpfs", "device": "tmpfs",
        "o": f"size={2 * MiB},nr_inodes=128,nosuid,nodev,noexec,uid=10001,gid=10001,mode=0700",
    }
    view = docker_client.volumes.get(view_name(run_key)).attrs
    assert view["Options"] == {"type": "none", "device": attrs["Mountpoint"], "o": "bind,ro,nosuid,nodev,noexec"}
    for labels, purpose in ((attrs["Labels"], PURPOSE_VOLUME), (view["Labels"], PURPOSE_VIEW)):
        assert labels[L.PRODUCT_LABEL] == "ringfence" and labels[L.PURPOSE_LABEL] == purpose
        assert labels[WORKSPACE_LABEL] == run_key and labels[TENANT_LABEL] == "tenant-a"
        assert labels[L.TEST_SESSION_LABEL] == os.environ[L.TEST_SESSION_ENV]
    keeper = docker_client.containers.get(keeper_name(run_key))
    assert keeper.status == "running"
    assert keeper.labels[L.PURPOSE_LABEL] == PURPOSE_KEEPER and keeper.labels[WORKSPACE_LABEL] == run_key
    assert L.RUN_LABEL not in keeper.labels  # kill_run kills calls, never a run's keeper
    found = workspaces.store.find(run_key)
    assert found is not None and found.keeper_running and found.tenant == "tenant-a"
    assert found in workspaces.store.list()


def test_the_keeper_is_hardened_as_the_engine_reports_it(workspaces, docker_client, pinned_images):
    run_key, volume = workspaces.make()
    keeper = docker_client.containers.get(keeper_name(run_key))
    applied = applied_settings(keeper.attrs)
    assert applied["user"] == "10001:10001"
    assert applied["read_only"] is True
    assert applied["cap_drop"] == ["ALL"] and not applied["cap_add"] and applied["privileged"] is False
    assert "no-new-privileges:true" in applied["security_opt"]
    assert any(o.startswith("seccomp=ringfence-default (sha256:") for o in applied["security_opt"])
    assert applied["network_mode"] == "none" and applied["ipc_mode"] == "private"
    assert applied["memory"] == applied["memory_swap"] == KEEPER_MEMORY
    assert applied["pids_limit"] == KEEPER_PIDS
    assert applied["runtime"] == "runc"
    assert applied["entrypoint"] == ["/usr/bin/tini", "--"]
    assert applied["mounts"] == [{"source": volume, "target": "/workspace", "read_only": False}]
    host = keeper.attrs["HostConfig"]
    assert host["LogConfig"]["Type"] == "none"
    assert keeper.attrs["Config"]["Cmd"] == ["sleep", "infinity"]
    assert keeper.attrs["Image"] == pinned_images.image_id("tool")
    # Nothing runs in it but its init and the sleep, both as the sandbox user.
    top = _settled_top(keeper)
    assert sorted(p[2] for p in top["Processes"]) == ["/usr/bin/tini -- sleep infinity", "sleep infinity"]
    assert {p[1] for p in top["Processes"]} == {"10001"}


def _settled_top(container, wait_s: float = 30.0):
    """`docker top` once the container's init has started its child and the child has exec'd
    (right after start it shows `runc init`, then tini alone, then tini's fork, which still
    carries tini's args until its execve)."""
    give_up = time.monotonic() + wait_s
    while True:
        top = container.top(ps_args="-o pid,uid,args")
        args = [p[2] for p in top["Processes"]]
        execed = len(args) >= 2 and len(set(args)) == len(args)
        if execed or time.monotonic() >= give_up:
            return top
        time.sleep(0.1)


def test_create_is_idempotent_and_refuses_another_tenants_key(workspaces, docker_client):
    run_key, volume = workspaces.make()
    keeper_id = docker_client.containers.get(keeper_name(run_key)).id
    assert workspaces.store.create(run_key, "tenant-a", WorkspaceSpec(bytes=4 * MiB, inodes=16)) == volume
    # The same volume and keeper, unchanged (a retried StartRun does not resize a workspace).
    assert docker_client.containers.get(keeper_name(run_key)).id == keeper_id
    assert f"size={2 * MiB}," in docker_client.volumes.get(volume).attrs["Options"]["o"]
    with pytest.raises(ProfileError):
        workspaces.store.create(run_key, "tenant-b", SPEC)


@pytest.mark.parametrize("damage", ["killed", "removed"])
def test_create_brings_back_a_keeper_that_died_or_vanished(workspaces, docker_client, damage):
    """A keeper that stopped is started again; one that is gone (a crash between the volume
    and the keeper) is made anew; either way create() answers with a running keeper."""
    run_key, volume = workspaces.make()
    keeper = docker_client.containers.get(keeper_name(run_key))
    if damage == "killed":
        keeper.kill()
    else:
        keeper.remove(force=True)
    assert workspaces.store.find(run_key).keeper_running is False
    assert workspaces.store.create(run_key, "tenant-a", SPEC) == volume
    assert workspaces.store.find(run_key).keeper_running is True
    assert docker_client.containers.get(keeper_name(run_key)).status == "running"


def test_find_list_remove_and_reap(workspaces, docker_client):
    kept_key, kept = workspaces.make(tenant="tenant-a")
    gone_key, gone = workspaces.make(tenant="tenant-b")
    infos = {i.run_key: i for i in workspaces.store.list()}
    assert infos[kept_key].tenant == "tenant-a" and infos[gone_key].tenant == "tenant-b"
    assert infos[kept_key].volume == kept and infos[gone_key].keeper_running
    assert workspaces.store.find("itest-ws/never-made") is None

    assert workspaces.store.reap(lambda info: info.run_key != gone_key) == 1
    assert workspaces.store.find(gone_key) is None and workspaces.store.find(kept_key) is not None
    for name in (gone, view_name(gone_key)):
        with pytest.raises(docker.errors.NotFound):
            docker_client.volumes.get(name)
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(keeper_name(gone_key))
    assert workspaces.store.remove(kept_key) is True
    assert workspaces.store.remove(kept_key) is False
    assert kept_key not in {i.run_key for i in workspaces.store.list()}


def test_reap_asks_about_every_workspace_of_the_session(workspaces):
    keys = [workspaces.make()[0] for _ in range(2)]
    asked = []
    assert workspaces.store.reap(lambda info: asked.append(info.run_key) or True) == 0
    assert set(keys) <= set(asked)


def test_a_scoped_store_sees_only_its_own_deployments_workspaces(workspaces, docker_client, pinned_images):
    scoped = DockerWorkspaces(docker_client, pinned_images, scope=f"scope-{uuid.uuid4().hex[:8]}")
    run_key = workspaces.key()
    scoped.create(run_key, "tenant-a", SPEC)
    unscoped_key, _ = workspaces.make()
    assert [i.run_key for i in scoped.list()] == [run_key]
    assert scoped.reap(lambda info: False) == 1
    assert workspaces.store.find(unscoped_key) is not None


# -- files across calls ---------------------------------------------------------------------------


def test_files_survive_across_calls_and_go_with_the_workspace(workspaces, backend, runtime):
    run_key, volume = workspaces.make()
    first = sh(backend, "mkdir -p /workspace/pkg && printf 'print(6 * 7)\\n' > /workspace/pkg/m.py", volume,
               runtime=runtime)
    assert first.outcome is Outcome.OK, first
    assert first.applied["mounts"][-1] == {"source": volume, "target": "/workspace", "read_only": False}
    second = call(backend, ["python3", "/workspace/pkg/m.py"], volume, read_only=True, runtime=runtime)
    assert second.outcome is Outcome.OK and second.stdout == b"42\n", second
    # Read-only calls mount the view (ringfence_server.sandbox.workspace: why not Docker's read-only flag).
    assert second.applied["mounts"][-1] == {"source": view_name(run_key), "target": "/workspace",
                                            "read_only": runtime == "gvisor"}
    denied = sh(backend, "echo x > /workspace/pkg/m.py", volume, read_only=True, runtime=runtime)
    assert denied.outcome is Outcome.TOOL_ERROR and b"Read-only file system" in denied.stderr
    assert workspaces.store.remove(run_key) is True
    assert workspaces.store.create(run_key, "tenant-a", SPEC) == volume
    empty = call(backend, ["python3", "-c", "import os; print(os.listdir('/workspace'))"], volume, runtime=runtime)
    assert empty.stdout == b"[]\n", empty


def test_the_workspace_is_the_sandbox_users_alone(workspaces, backend):
    _, volume = workspaces.make()
    result = call(backend, ["python3", "-c", "import os; s = os.stat('/workspace'); print(s.st_uid, s.st_gid, "
                                             "oct(s.st_mode & 0o7777))"], volume)
    assert result.stdout == b"10001 10001 0o700\n", result


def test_a_call_with_a_workspace_that_is_gone_never_runs(backend, docker_client):
    """Docker would make a missing named volume on use; the backend checks first and the call
    is start_failed, with no volume made."""
    volume = volume_name(f"itest-ws/never-{uuid.uuid4().hex}")
    for read_only in (False, True):
        result = call(backend, ["true"], volume, read_only=read_only)
        assert result.outcome is Outcome.START_FAILED and "does not exist" in result.message
    assert docker_client.volumes.list(filters={"name": volume}) == []


class _NoCheck(DockerBackend):
    """The race the check cannot close: the workspace removed between the check and create."""

    def _workspace_missing(self, workspace):
        return None


def test_a_workspace_removed_at_the_last_moment_becomes_an_inert_stray(docker_client, pinned_images):
    """The engine then makes the volume from the mount's own options: an empty, read-only,
    4 KiB tmpfs labelled as a stray (never an uncapped, exec-able directory on its disk), which
    the reaper removes once no container uses it."""
    volume = volume_name(f"itest-ws/raced-{uuid.uuid4().hex}")
    backend = _NoCheck(docker_client, lock=pinned_images)
    try:
        result = call(backend, ["sh", "-c", "grep ' /workspace ' /proc/self/mountinfo; echo x > /workspace/f"],
                      volume)
        stray = docker_client.volumes.get(volume)
        assert stray.attrs["Labels"][L.PURPOSE_LABEL] == STRAY_WORKSPACE_PURPOSE
        assert stray.attrs["Labels"][L.TEST_SESSION_LABEL] == os.environ[L.TEST_SESSION_ENV]
        assert result.outcome is Outcome.TOOL_ERROR and b"Read-only file system" in result.stderr
        options = result.stdout.split(b" - ")[0].split()[5].split(b",")
        assert {b"ro", b"nosuid", b"nodev", b"noexec"} <= set(options)
        assert any(r.name == volume for r in reap_stray_volumes(docker_client))
        assert docker_client.volumes.list(filters={"name": volume}) == []
    finally:
        for v in docker_client.volumes.list(filters={"name": volume}):
            v.remove(force=True)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


class _DeadInstance(DockerWorkspaces):
    """Labels its objects as an instance on this host whose process is gone."""

    pid = str(_dead_pid())

    def _labels(self, run_key, tenant, purpose):
        return {**super()._labels(run_key, tenant, purpose), L.PID_LABEL: self.pid}


class _Only:
    """The engine client as reap() uses it, listing only objects with `label`: the pass is the
    reaper's own, but it never reaches another test's orphans on this shared engine."""

    def __init__(self, client, label: str) -> None:
        self._client, self._label = client, label

    def __getattr__(self, name):  # containers, networks
        collection = getattr(self._client, name)
        label = self._label

        class Listed:
            def list(self, *args, filters=None, **kwargs):
                filters = dict(filters or {})
                wanted = filters.get("label", [])
                filters["label"] = ([wanted] if isinstance(wanted, str) else list(wanted)) + [label]
                return collection.list(*args, filters=filters, **kwargs)

        return Listed()


def test_the_instance_reaper_leaves_a_dead_instances_keeper_alone(workspaces, docker_client, pinned_images):
    """A keeper belongs to its run, not to the instance that made it: another instance goes on
    with the run and its files. (The control plane reaps workspaces by their runs.)"""
    store = _DeadInstance(docker_client, pinned_images)
    run_key = workspaces.key()
    store.create(run_key, "tenant-a", SPEC)
    keeper = docker_client.containers.get(keeper_name(run_key))
    assert keeper.labels[L.PID_LABEL] == _DeadInstance.pid
    # Without the exclusion the same labels are an orphan's (ringfence_server.sandbox.reaper.orphan_reason).
    labels = {k: v for k, v in keeper.labels.items() if k != L.PURPOSE_LABEL}
    assert "is gone" in (orphan_reason(labels, now=time.time(), host=keeper.labels[L.HOST_LABEL]) or "")
    assert reap(_Only(docker_client, f"{WORKSPACE_LABEL}={run_key}")) == []
    assert docker_client.containers.get(keeper.id).status == "running"


# -- the warm pool and a workspace ---------------------------------------------------------------


@pytest.fixture
def pooled(pinned_images):
    client = docker.from_env(timeout=120)
    b = DockerBackend(client, lock=pinned_images, pool=PoolSettings(size=1, max_size=1, idle_s=600))
    try:
        yield b
    finally:
        b.close()


def test_a_warm_container_without_the_workspace_never_serves_a_call_with_it(workspaces, pooled):
    """The mount is part of a pool shape: a container made ahead without it (or with another
    run's) is never given to a workspace call; the call's own shape is kept warm for its run,
    and the run's end removes it (tests/integration/test_pool_docker.py has the rest)."""
    _, volume = workspaces.make()
    request = SandboxRequest(profile=SandboxProfile(workspace=WorkspaceMount(volume)), argv=("true",),
                             run_id="itest-ws")
    plain = SandboxRequest(argv=("true",), run_id="itest-ws")
    assert pooled.pool.prewarm(plain) and pooled.pool.wait_filled(60)
    before = pooled.pool.stats()
    result = pooled.run(request)
    assert result.outcome is Outcome.OK and result.applied["mounts"][-1]["source"] == volume
    after = pooled.pool.stats()
    assert after["claims"] == before["claims"] and after["misses"] == before["misses"] + 1
    assert after["shapes"] == before["shapes"] + 1  # the workspace's own shape, now kept warm
    pooled.end_run("itest-ws")
    assert pooled.pool.stats()["shapes"] == before["shapes"]


def _running(docker_client, call_id: str) -> bool:
    found = docker_client.containers.list(filters={"label": f"{L.CALL_LABEL}={call_id}", "status": "running"})
    return len(found) == 1


class Listener:
    """Records every piece it is given and, at the first, whether the call's container was
    still running (asked of the engine) before it kills the run: a call whose output were only
    handed over at its end would have run on (its command sleeps) and ended `ok`."""

    def __init__(self, backend: DockerBackend, running) -> None:
        self.backend = backend
        self.running = running
        self.pieces: list[tuple[str, bytes]] = []
        self.running_at_first: bool | None = None
        self.request: SandboxRequest | None = None

    def __call__(self, stream: str, data: bytes) -> None:
        self.pieces.append((stream, data))
        if len(self.pieces) == 1:
            assert self.request is not None
            self.running_at_first = self.running(self.request)
            self.backend.kill_run(self.request.run_id, "the listener saw the first piece")

    def joined(self, stream: str) -> bytes:
        return b"".join(d for s, d in self.pieces if s == stream)


LIVE = ("sh", "-c", "echo first; sleep 60; echo never")


def test_live_output_arrives_while_the_call_runs_cold(backend, docker_client):
    listener = Listener(backend, lambda request: _running(docker_client, request.call_id))
    request = SandboxRequest(profile=SandboxProfile(timeout_s=120), argv=LIVE, run_id=f"live-{uuid.uuid4().hex[:8]}",
                             on_output=listener)
    listener.request = request
    result = backend.run(request)
    assert listener.running_at_first is True
    assert result.outcome is Outcome.KILLED and "the listener saw the first piece" in result.message
    assert listener.joined("stdout") == result.stdout == b"first\n"
    assert listener.joined("stderr") == result.stderr == b""


def test_live_output_arrives_while_the_call_runs_warm(pooled, docker_client):
    def running(request):
        # A claimed warm container is named for its call's run (ringfence_server.sandbox.pool.claimed_name).
        prefix = claimed_prefix(request.run_id)
        return any((c.name or "").startswith(prefix)
                   for c in docker_client.containers.list(filters={"name": prefix, "status": "running"}))

    listener = Listener(pooled, running)
    request = SandboxRequest(profile=SandboxProfile(timeout_s=120), argv=LIVE, run_id=f"live-{uuid.uuid4().hex[:8]}",
                             on_output=listener)
    listener.request = request
    assert pooled.pool.prewarm(request) and pooled.pool.wait_filled(60)
    before = pooled.pool.stats()["claims"]
    result = pooled.run(request)
    assert pooled.pool.stats()["claims"] == before + 1  # the warm path, really
    assert listener.running_at_first is True
    assert result.outcome is Outcome.KILLED and "the listener saw the first piece" in result.message
    assert listener.joined("stdout") == result.stdout == b"first\n"


@pytest.mark.parametrize("path", ["cold", "warm"])
def test_live_output_is_exactly_the_kept_bytes(backend, pooled, path):
    """Both streams, interleaved, over several reads; stdout past its cap: the pieces joined are
    the result's stdout and stderr byte for byte (tini's own lines in neither)."""
    script = ("for i in $(seq 1 200); do echo out-$i; echo err-$i >&2; done; "
              "head -c 100000 /dev/zero | tr '\\0' z")
    pieces: list[tuple[str, bytes]] = []
    request = SandboxRequest(profile=SandboxProfile(stdout_limit=64 * KiB), argv=("sh", "-c", script),
                             run_id="itest-live", on_output=lambda s, d: pieces.append((s, d)))
    target = backend
    if path == "warm":
        target = pooled
        assert pooled.pool.prewarm(request) and pooled.pool.wait_filled(60)
    result = target.run(request)
    assert result.outcome is Outcome.OUTPUT_LIMIT and len(result.stdout) == 64 * KiB
    assert b"".join(d for s, d in pieces if s == "stdout") == result.stdout
    assert b"".join(d for s, d in pieces if s == "stderr") == result.stderr
    assert result.stdout.startswith(b"out-1\nout-2\n") and b"tini" not in result.stdout
    assert {s for s, _ in pieces} <= {"stdout", "stderr"}


def test_a_listener_that_raises_does_not_break_the_call(backend, caplog):
    given: list[bytes] = []

    def broken(stream: str, data: bytes) -> None:
        given.append(data)
        raise RuntimeError("the listener's own bug")

    request = SandboxRequest(argv=("sh", "-c", "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three"),
                             run_id="itest-live", on_output=broken)
    with caplog.at_level(logging.WARNING, logger="ringfence.sandbox.docker"):
        result = backend.run(request)
    assert result.outcome is Outcome.OK
    assert (result.stdout, result.stderr) == (b"one\nthree\n", b"two\n")
    assert len(given) == 1  # told once, then never again
    warnings = [r for r in caplog.records if "output listener" in r.getMessage()]
    assert len(warnings) == 1 and "the listener's own bug" in str(warnings[0].exc_info[1])
