"""The engine farm (tests/engine_farm.py): three real Docker engines on this host, each with its
own data root, socket, containerd and network namespace, holding the pinned images by ID; our
sandbox backend runs hardened calls on each, seen only there; and nothing of a farm outlives it,
whether it is closed, fails to start, or its session is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import docker.errors
import pytest
from engine_farm import (
    DEFAULT_BASE,
    FARM_LABEL,
    NETNS_DIR,
    EngineFarm,
    EngineFarmError,
    cgroup_dirs,
    mounts_under,
    processes_in_cgroups,
    processes_under,
    reap_leftover_farms,
)
from engine_farm_fixtures import start_engine_farm

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.profile import SandboxProfile
from ringfence_server.sandbox.result import Outcome

pytestmark = pytest.mark.docker

TESTS = Path(__file__).resolve().parents[1]
# Says it is ready, then holds its container until the test has looked for it everywhere and
# touched /tmp/go (by an exec through the container's own engine).
HELD = ("import os, time\n"
        "print('ready', flush=True)\n"
        "while not os.path.exists('/tmp/go'):\n"
        "    time.sleep(0.05)\n"
        "print(1)\n")


def _netns_of(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def _listed(client: docker.DockerClient, call_id: str) -> list[str]:
    return [str(c.name) for c in client.containers.list(all=True, filters={"label": f"{L.CALL_LABEL}={call_id}"})]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _farm_remains(farm_id: str, root: Path, pids: list[int], netns: list[str]) -> list[str]:
    """Everything of a farm still on the host: processes (by its root's paths, by its dockerd
    label, by the pids it had, in its engines' cgroups), mounts, cgroups, namespaces, its
    folder. (An engine's cgroup parent is named as its namespace.)"""
    cgroups = [f"/{n}" for n in netns]
    left = [f"process {pid}: {line[:100]}" for pid, line in processes_under(root).items()]
    left += [f"container process {pid}" for pid in processes_in_cgroups(cgroups)]
    left += [f"cgroup {d}" for d in cgroup_dirs(cgroups)]
    pgrep = subprocess.run(["pgrep", "-af", f"{FARM_LABEL}={farm_id}"], capture_output=True, text=True)
    left += [f"pgrep: {line}" for line in pgrep.stdout.splitlines()]
    left += [f"pid {pid} alive" for pid in pids if _alive(pid)]
    left += [f"mount {m}" for m in mounts_under(root)]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left += [f"netns {n}" for n in netns if n in listed or (NETNS_DIR / n).exists()]
    if root.exists():
        left.append(f"dir {root}")
    return left


def test_three_engines_each_with_its_own_socket_data_root_and_containerd(engine_farm, docker_client):
    engines = engine_farm.engines
    assert len(engines) == 3
    host_root = docker_client.info()["DockerRootDir"]
    for field in ("base_url", "data_root", "exec_root", "pid", "containerd_pid", "netns", "log"):
        assert len({getattr(e, field) for e in engines}) == 3, field
    for engine in engines:
        client = engine.client()
        try:
            info = client.info()
        finally:
            client.close()
        assert info["DockerRootDir"] == str(engine.data_root) != host_root
        assert f"{FARM_LABEL}={engine_farm.farm_id}" in info["Labels"]
        assert engine.socket.is_socket()
        # Its own containerd, given to it by socket, with its state in this engine's roots.
        containerd = Path(f"/proc/{engine.containerd_pid}/cmdline").read_bytes().decode()
        assert str(engine.root) in containerd
        dockerd = Path(f"/proc/{engine.pid}/cmdline").read_bytes().decode().split("\0")
        assert f"--containerd={engine.exec_root}/containerd.sock" in dockerd
        assert "--bridge=none" in dockerd and "--iptables=false" in dockerd
        assert f"--cgroup-parent={engine.cgroup_parent}" in dockerd


def test_each_engine_runs_in_a_network_namespace_of_its_own(engine_farm):
    host = _netns_of(os.getpid())
    inodes = [_netns_of(e.pid) for e in engine_farm.engines]
    assert inodes == [e.netns_inode for e in engine_farm.engines]
    assert len(set(inodes)) == 3 and host not in inodes
    for engine in engine_farm.engines:
        assert _netns_of(engine.containerd_pid) == engine.netns_inode
        # Loopback only, and up: the engines need no network and can reach none.
        links = subprocess.run(["ip", "-n", engine.netns, "-o", "link"], capture_output=True, text=True,
                               check=True).stdout.splitlines()
        assert len(links) == 1 and ": lo:" in links[0] and "UP" in links[0], links


def test_each_engine_holds_exactly_the_pinned_images_by_id(engine_farm, pinned_images):
    assert set(engine_farm.image_ids) == set(pinned_images.ids())
    for engine in engine_farm.engines:
        client = engine.client()
        try:
            held = {image.id for image in client.images.list(all=True)}
        finally:
            client.close()
        assert held == set(pinned_images.ids()), engine.name


def test_a_plain_call_runs_on_each_engine(engine_farm, pinned_images):
    for engine in engine_farm.engines:
        backend = DockerBackend(client=engine.client(), lock=pinned_images)
        try:
            result = backend.run(SandboxRequest(argv=("python3", "-c", "print(1)"), run_id="farm"))
        finally:
            backend.close()
        assert result.outcome is Outcome.OK, (engine.name, result)
        assert result.stdout == b"1\n"
        assert result.image_id == pinned_images.image_id("tool")


def test_a_hardened_call_is_listed_only_on_its_own_engine(engine_farm, pinned_images, docker_client, runtime):
    """On each engine in turn (under runc, and under gVisor, which the farm registers as the host
    does), a call holds its container while every engine and the host's are asked for it."""
    clients = {e.name: e.client() for e in engine_farm.engines}
    try:
        for engine in engine_farm.engines:
            backend = DockerBackend(client=engine.client(), lock=pinned_images)
            try:
                if runtime == "gvisor":
                    assert "runsc" in backend.runtimes()
                result, seen, host_seen = _run_held(backend, clients, docker_client, engine, runtime)
            finally:
                backend.close()
            assert result.outcome is Outcome.OK, (engine.name, result)
            assert (result.stdout, result.runtime) == (b"ready\n1\n", runtime)
            assert result.applied["read_only"] is True and result.applied["network_mode"] == "none"
            assert seen == {name: [result.container_name] if name == engine.name else [] for name in clients}
            assert host_seen == []
    finally:
        for client in clients.values():
            client.close()


def _run_held(backend, clients, host, engine, runtime):
    ready = threading.Event()
    request = SandboxRequest(profile=SandboxProfile(runtime=runtime, timeout_s=120), argv=("python3", "-c", HELD),
                             run_id="farm-held", on_output=lambda stream, data: ready.set())
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(backend.run, request)
        try:
            if not ready.wait(90):
                pytest.fail(f"the call on {engine.name} never said it was ready: {future.result(timeout=30)}")
            seen = {name: _listed(client, request.call_id) for name, client in clients.items()}
            host_seen = _listed(host, request.call_id)
            own = clients[engine.name]
            for name in seen[engine.name]:
                container = own.containers.get(name)
                # Its processes are in its engine's cgroups, not the main engine's /docker.
                assert container.attrs["State"]["Pid"] in processes_in_cgroups([engine.cgroup_parent])
                container.exec_run(["touch", "/tmp/go"])
        except BaseException:
            backend.kill_run(request.run_id, "the test failed")
            raise
        return future.result(timeout=120), seen, host_seen


def test_closing_a_farm_leaves_nothing(pinned_images, docker_client, gvisor_available):
    """Containers running on its engines (under runc and gVisor) included: no dockerd, containerd,
    shim, sandbox, mount, namespace or file of the farm remains; closing again does nothing."""
    tool = pinned_images.image_id("tool")
    with start_engine_farm(2, images=sorted(pinned_images.ids())) as farm:
        root, farm_id = farm.root_dir, farm.farm_id
        pids = [p for e in farm.engines for p in (e.pid, e.containerd_pid)]
        netns = [e.netns for e in farm.engines]
        runtimes = ["runc", "runsc"] if gvisor_available else ["runc"]
        for engine in farm.engines:
            client = engine.client()
            try:
                for rt in runtimes:
                    client.containers.run(tool, ["600"], entrypoint=["/bin/sleep"], detach=True, network_mode="none",
                                          runtime=rt, labels={L.TEST_SESSION_LABEL: os.environ[L.TEST_SESSION_ENV]})
                assert len(client.containers.list()) == len(runtimes)
            finally:
                client.close()
        assert processes_under(root) and mounts_under(root)
        assert processes_in_cgroups([e.cgroup_parent for e in farm.engines])
    assert _farm_remains(farm_id, root, pids, netns) == []
    farm.close()  # again: nothing to do, no error


def _own_root(name: str) -> Path:
    return DEFAULT_BASE / f"{os.environ[L.TEST_SESSION_ENV]}-{name}"


def test_a_farm_that_cannot_start_says_why_and_leaves_nothing(engine_farm):
    # engine_farm: a farm of the session runs beside it (and must go on running).
    farm = EngineFarm(2, _own_root("broken"), dockerd_args=("--no-such-flag",), start_timeout_s=30)
    with pytest.raises(EngineFarmError) as failed:
        farm.start()
    message = str(failed.value)
    assert "exited" in message and "no-such-flag" in message  # dockerd's own words, from its log
    netns = [f"rf-farm-{farm.farm_id}-{i}" for i in range(2)]
    assert _farm_remains(farm.farm_id, farm.root_dir, [], netns) == []
    assert all(e.client().ping() for e in engine_farm.engines)


def test_an_engine_that_does_not_answer_in_time_is_an_error_not_a_hang():
    farm = EngineFarm(1, _own_root("slow"), start_timeout_s=0.0)
    with pytest.raises(EngineFarmError, match="did not answer within 0 s"):
        farm.start()
    assert _farm_remains(farm.farm_id, farm.root_dir, [], [f"rf-farm-{farm.farm_id}-0"]) == []


_KILLED_SESSION = """
import sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from engine_farm import EngineFarm
farm = EngineFarm(1, Path(sys.argv[2]), images=sys.argv[5:], farm_id=sys.argv[3]).start()
engine = farm.engines[0]
container = engine.client().containers.run(sys.argv[4], ["600"], entrypoint=["/bin/sleep"], detach=True,
                                           network_mode="none")
container.reload()
print(engine.pid, engine.containerd_pid, container.attrs["State"]["Pid"], engine.netns, flush=True)
time.sleep(600)
"""


def test_reaping_removes_the_farm_of_a_killed_session_and_spares_live_ones(engine_farm, pinned_images):
    farm_id = f"{os.environ[L.TEST_SESSION_ENV]}-killed"
    root = DEFAULT_BASE / farm_id
    child = subprocess.Popen([sys.executable, "-c", _KILLED_SESSION, str(TESTS), str(root), farm_id,
                              pinned_images.image_id("tool"), *sorted(pinned_images.ids())],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline() if child.stdout else ""
        assert line, "the child's farm did not start"
    finally:
        child.send_signal(signal.SIGKILL)  # no teardown runs: what it started stays
        child.wait()
        if child.stdout:
            child.stdout.close()
    dockerd, containerd, sleeper, netns = line.split()
    # The container's `sleep` names no path of the farm: only its cgroup tells it is the farm's.
    pids = [int(dockerd), int(containerd), int(sleeper)]
    try:
        assert all(_alive(p) for p in pids) and (NETNS_DIR / netns).exists() and mounts_under(root)
        removed = reap_leftover_farms(DEFAULT_BASE)
        assert any(r.startswith("process") for r in removed) and f"netns {netns}" in removed
        assert _farm_remains(farm_id, root, pids, [netns]) == []
        # The session's own farm, whose owner (this process) runs, is untouched.
        for engine in engine_farm.engines:
            client = engine.client()
            try:
                assert client.ping()
            finally:
                client.close()
    finally:
        if root.exists():
            reap_leftover_farms(DEFAULT_BASE)

