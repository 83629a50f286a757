"""The warm pool (ringfence_server.sandbox.pool) on the real engine: a pooled call keeps every guarantee of a cold one.

Each test proves that the calls it means to be pooled were (the pool's claim count grew by one
per call, and the container that ran it is one the pool made), then asserts what the pool
promises: the same hardening as the engine records it, the wall time counted from the claim,
one call per container and nothing crossing between calls, egress credentials bound at the
claim, kill_run reaching a claimed container from any instance, a pool drained on close, a
dead pool's containers reaped like any orphan, a pool that grows after a burst it could not
serve, and a refill that never begins beside a cold start.

Every backend a test makes has its own engine client and is closed at teardown (close() drains
its pool); run ids are unique per test, so kill_run can only ever reach this test's calls.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import docker
import docker.errors
import pytest
from egress_support import SANDBOX_CLIENT

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.egress.grant import EgressGrant
from ringfence_server.sandbox.pool import PoolSettings, claimed_prefix
from ringfence_server.sandbox.profile import SandboxProfile
from ringfence_server.sandbox.reaper import reap
from ringfence_server.sandbox.result import Outcome

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
EGRESS_CLIENT = ("python3", "-I", "-S", "-B", "-c", SANDBOX_CLIENT)
# What an egress call adds to its tool's environment (ringfence_server.sandbox.egress.proxy.EgressProxy.open_call).
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "NO_PROXY", "no_proxy")


class Recording(DockerBackend):
    """A DockerBackend that notes the ids of the warm containers its pool made and of those it
    gave a call: how a test knows which containers are the pool's, and that a call was pooled."""

    def __init__(self, *args, **kwargs) -> None:
        self.made: list[str] = []
        self.claimed: list[str] = []
        self.making: list[int] = []  # the cold starts running as each make began
        self.cold_gate: threading.Event | None = None  # set: a cold call's create waits for it
        super().__init__(*args, **kwargs)

    def _create(self, image_id, **kwargs):
        if self.cold_gate is not None and not kwargs["name"].startswith("rf-warm-"):
            assert self.cold_gate.wait(60)
        return super()._create(image_id, **kwargs)

    def _make_warm(self, key, spec):
        self.making.append(self._load().cold)
        warm = super()._make_warm(key, spec)
        self.made.append(warm.container.id)
        return warm

    def _run_warm(self, warm, request, reports):
        self.claimed.append(warm.container.id)
        return super()._run_warm(warm, request, reports)


@pytest.fixture
def pooled(pinned_images):
    """pooled(size=1, idle_s=600, **backend_kwargs) -> a Recording backend with a pool and its
    own engine client; every one is closed (its pool drained) after the test, pass or fail."""
    made: list[Recording] = []

    def make(size: int = 1, idle_s: float = 600, max_size: int | None = None, **kwargs) -> Recording:
        client = docker.from_env(timeout=120)
        # A fixed pool unless the test is about growth: what each test counts stays its own.
        settings = PoolSettings(size=size, max_size=size if max_size is None else max_size, idle_s=idle_s)
        try:
            b = Recording(client, lock=pinned_images, pool=settings, **kwargs)
        except BaseException:
            client.close()
            raise
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


def run_id(tag: str) -> str:
    return f"it-pool-{tag}-{uuid.uuid4().hex[:8]}"


def request_for(argv=(), *, run: str = "it-pool", warm: bool = True, stdin: bytes = b"", **limits) -> SandboxRequest:
    return SandboxRequest(profile=SandboxProfile(**limits), argv=tuple(argv), stdin=stdin, run_id=run, warm=warm)


def fill(backend: DockerBackend, *requests: SandboxRequest) -> None:
    """Warm the requests' shapes and wait until each has its ready containers."""
    pool = backend.pool
    assert pool is not None, "the backend has no warm pool"
    for r in requests:
        assert pool.prewarm(r), "the request cannot be pooled"
    assert pool.wait_filled(90), f"the pool did not fill: {pool.stats()}"


def run_warm(backend: Recording, request: SandboxRequest, *, prewarm: bool = True):
    """Run `request` and prove it was pooled: one more claim, and a container the pool made."""
    if prewarm:
        fill(backend, request)
    pool = backend.pool
    assert pool is not None, "the backend has no warm pool"
    before = pool.stats()["claims"]
    result = backend.run(request)
    assert pool.stats()["claims"] == before + 1, "the call was not pooled"
    assert backend.claimed and backend.claimed[-1] in backend.made
    assert result.warm, "a pooled call's result says it was warm (its trace shows a warm_claim)"
    return result


def exists(client, container_id: str) -> bool:
    return bool(client.containers.list(all=True, filters={"id": container_id}))


def named(client, name: str) -> bool:
    try:
        client.containers.get(name)
        return True
    except docker.errors.NotFound:
        return False


def pool_containers(client, instance: str) -> list:
    return client.containers.list(all=True, filters={"label": [f"{L.PURPOSE_LABEL}=pool",
                                                               f"{L.INSTANCE_LABEL}={instance}"]})


# -- the hardening: the engine's record of a pooled container is a cold one's --------------------


@pytest.mark.parametrize("argv", [(), ("python3", "-c", "print('hi')")], ids=["runner", "launcher"])
def test_applied_settings_of_a_pooled_call_equal_a_cold_calls(backend, pooled, runtime, argv):
    """`applied` is read back from the engine (docker inspect of the container that ran the
    call). Both modes of hand-over, both runtimes, and a profile that differs from the default
    in every limit it sets: the whole dict is equal, no field excepted."""
    limits = dict(runtime=runtime, memory_bytes=96 * 1024 * 1024, cpus=0.5, pids=48, timeout_s=20,
                  tmpfs_bytes=8 * 1024 * 1024, nofile=128, env={"RF_POOL_TEST": "1"})
    body = {"tool": "echo", "arguments": {"text": "hi"}, "call_id": "c1", "idempotency_key": None}
    stdin = json.dumps(body).encode() if not argv else b""
    cold = backend.run(request_for(argv, run=run_id("applied"), stdin=stdin, **limits))
    warm_backend = pooled()
    warm = run_warm(warm_backend, request_for(argv, run=run_id("applied"), stdin=stdin, **limits))
    assert cold.outcome is warm.outcome is Outcome.OK, (cold.message, warm.message, warm.stderr[-2000:])
    assert warm.stdout == cold.stdout
    assert warm.applied and warm.applied == cold.applied
    assert warm.runtime == cold.runtime == runtime and warm.image_id == cold.image_id


def test_the_tools_environment_is_a_cold_calls(backend, pooled, runtime):
    """The launcher hands over the call and execs the tool: the tool's environment must be
    exactly what it is in a cold container (case 24 of the battery, as a property)."""
    env = ["sh", "-c", "env | sort"]
    cold = backend.run(request_for(env, run=run_id("env"), runtime=runtime, env={"RF_DECLARED": "yes"}))
    warm = run_warm(pooled(), request_for(env, run=run_id("env"), runtime=runtime, env={"RF_DECLARED": "yes"}))
    assert cold.outcome is warm.outcome is Outcome.OK, (warm.message, warm.stderr)
    assert warm.stdout.decode().splitlines() == cold.stdout.decode().splitlines()


def test_the_tools_stdin_is_the_requests_byte_for_byte(pooled, runtime):
    """The launch line is read a byte at a time and is not part of the tool's input; what
    follows it is the request's stdin, unread, even when it looks like a launch line."""
    data = b'{"argv": ["x"]}\n' + bytes(range(256)) * 64 + b"\nlast line without newline"
    echo = ["python3", "-c", "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read())"]
    r = run_warm(pooled(), request_for(echo, run=run_id("stdin"), runtime=runtime, stdin=data))
    assert r.outcome is Outcome.OK and r.stdout == data, (r.outcome, r.stderr[-2000:])


# -- wall time: from the claim, never from the container's creation -----------------------------


def test_wall_time_counts_from_the_claim(pooled):
    b = pooled()
    # Both containers wait 3 s, longer than the call's whole wall time, before their calls.
    short = request_for(["sleep", "1"], run=run_id("wall"), timeout_s=2)
    fill(b, short)
    time.sleep(3)
    ok = run_warm(b, short, prewarm=False)
    assert ok.outcome is Outcome.OK and ok.exit_code == 0, (ok.outcome, ok.message)
    assert 900 <= ok.duration_ms < 2000

    long = request_for(["sleep", "5"], run=run_id("wall"), timeout_s=2)
    fill(b, long)
    time.sleep(3)
    cut = run_warm(b, long, prewarm=False)
    assert cut.outcome is Outcome.TIMEOUT, (cut.outcome, cut.message)
    # Killed at the wall time after the claim: not at once (as a deadline counted from the
    # creation, already past, would), and not after the sleep ended on its own.
    assert 1800 <= cut.duration_ms < 4500


# -- one call per container, nothing crosses -----------------------------------------------------

WRITE_MARKER = r"""
import os, subprocess
open("/tmp/marker", "w").write("call one was here")
subprocess.Popen(["sleep", "300"], start_new_session=True)  # a process that outlives the call
print("written")
"""

LOOK_FOR_MARKER = r"""
import json, os
procs = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        procs.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode().strip())
    except OSError:
        pass
print(json.dumps({"marker": os.path.exists("/tmp/marker"), "tmp": sorted(os.listdir("/tmp")), "procs": procs}))
"""


def test_each_container_serves_one_call_and_is_removed_after_it(pooled, docker_client):
    b = pooled()
    results = []
    for n in range(3):
        r = run_warm(b, request_for(["python3", "-c", "print('call', 1)"], run=run_id(f"one-{n}")))
        assert r.outcome is Outcome.OK and r.stdout == b"call 1\n", (r.outcome, r.message)
        # Removed right after its call, off the call's path (the backend's remover thread):
        # gone within moments, never given to another call meanwhile (it has exited).
        deadline = time.monotonic() + 20
        while (named(docker_client, r.container_name) or exists(docker_client, b.claimed[-1])) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not named(docker_client, r.container_name)
        assert not exists(docker_client, b.claimed[-1])
        results.append(r)
    assert len({r.container_name for r in results}) == 3
    assert len(set(b.claimed)) == 3
    stats = b.pool.stats()
    assert stats["claims"] == 3 and stats["created"] >= stats["claims"]


def test_no_file_or_process_of_one_call_reaches_the_next(pooled):
    b = pooled()
    first = run_warm(b, request_for(["python3", "-c", WRITE_MARKER], run=run_id("marker")))
    assert first.outcome is Outcome.OK and first.stdout == b"written\n", (first.outcome, first.stderr)
    second = run_warm(b, request_for(["python3", "-c", LOOK_FOR_MARKER], run=run_id("marker")))
    assert second.outcome is Outcome.OK, (second.outcome, second.stderr)
    seen = json.loads(second.stdout)
    assert seen["marker"] is False and seen["tmp"] == []
    assert not any("sleep 300" in p for p in seen["procs"]), seen["procs"]
    assert b.claimed[0] != b.claimed[1]


# -- egress: the call's credentials are bound at the claim ---------------------------------------


def test_egress_credentials_are_bound_at_the_claim(pooled, docker_client, proxy, testbed):
    from ringfence_server.sandbox.egress.proxy import SANDBOX_EGRESS_DIR

    reports: dict[str, object] = {}
    b = pooled(size=2, egress_proxy=proxy, on_egress_report=lambda req, rep: reports.__setitem__(req.call_id, rep))
    ops = [{"op": "env"},
           {"op": "http_raw", "url": "http://allowed.test/", "host": "allowed.test"},
           {"op": "http_raw", "url": "http://denied.test/", "host": "denied.test"}]

    def egress_request() -> SandboxRequest:
        return SandboxRequest(profile=SandboxProfile(egress=EgressGrant(allow=("allowed.test",)), timeout_s=60),
                              argv=EGRESS_CLIENT, stdin=json.dumps(ops).encode(), run_id=run_id("egress"))

    requests = [egress_request(), egress_request()]
    fill(b, requests[0])
    # Before any claim: two ready containers, and nothing of any call's in them.
    ready = [c for c in pool_containers(docker_client, L.instance_id()) if c.id in b.made]
    assert len(ready) == 2
    for c in ready:
        c.reload()
        env = c.attrs["Config"]["Env"] or []
        assert not [e for e in env if e.split("=", 1)[0] in PROXY_VARS or "@" in e], env
        [mount] = [m for m in c.attrs["Mounts"] if m["Destination"] == SANDBOX_EGRESS_DIR]
        assert mount["RW"] is False and os.listdir(mount["Source"]) == []  # no socket before the claim

    allowed, denied = testbed.decoys["allowed"], testbed.decoys["denied"]
    allowed_before, denied_before = len(allowed.connections()), len(denied.connections())
    users = []
    for r in requests:
        result = run_warm(b, r, prewarm=False)
        assert result.outcome is Outcome.OK, (result.outcome, result.message, result.stderr[-2000:])
        env, own, other = json.loads(result.stdout)
        users.append(env["proxy"].split("//", 1)[1].split(":", 1)[0])
        assert own["status"] == 200 and own["body"] == "hello from allowed\n"
        assert (other["status"], other["reason"]) == (403, "not_allowlisted")
        # The proxy attributes both requests to this call, and to no other.
        assert reports[r.call_id].call_id == r.call_id
        assert [(e["call_id"], e["host"], e["decision"]) for e in result.egress_events] == [
            (r.call_id, "allowed.test", "allowed"), (r.call_id, "denied.test", "denied")]
    assert users[0] != users[1]  # each call its own credentials
    assert len(allowed.connections()) - allowed_before == 2  # exactly the two calls' own requests
    assert len(denied.connections()) == denied_before

    # A cold egress call of the same profile, for `applied`: equal but for what is bound to the
    # call. The call's directory (a mount source) is each call's own, cold or warm; and a warm
    # container's configuration never holds the credentials (they reach the tool in the launch
    # line at the claim), so its `env` lacks the proxy variables a cold call's records redacted.
    cold_request = dataclasses.replace(egress_request(), warm=False)
    cold = b.run(cold_request)
    assert cold.outcome is Outcome.OK and b.claimed[-1] != cold.container_name
    cold_env = [e for e in cold.applied["env"] if e.split("=", 1)[0] not in PROXY_VARS]
    assert sorted(e.split("=", 1)[0] for e in cold.applied["env"] if e not in cold_env) == sorted(PROXY_VARS)
    assert cold_env == result.applied["env"]

    def without_egress_dir(applied):
        mounts = [m for m in applied["mounts"] if m["target"] != SANDBOX_EGRESS_DIR]
        return {**applied, "env": None, "mounts": mounts}

    assert without_egress_dir(result.applied) == without_egress_dir(cold.applied)


# -- kill_run reaches a claimed container from any instance --------------------------------------


def test_kill_run_from_another_instance_kills_only_that_runs_warm_call(pooled, docker_client, pinned_images):
    b = pooled(size=2)
    target, bystander = run_id("kill"), run_id("keep")
    fill(b, request_for(["sleep", "30"], timeout_s=60))
    claims = b.pool.stats()["claims"]
    results: dict[str, object] = {}
    ended: dict[str, float] = {}

    def call(run: str, argv) -> None:
        results[run] = b.run(request_for(argv, run=run, timeout_s=60))
        ended[run] = time.monotonic()

    threads = [threading.Thread(target=call, args=(target, ["sleep", "30"])),
               threading.Thread(target=call, args=(bystander, ["sleep", "6"]))]
    for t in threads:
        t.start()
    try:
        prefix = claimed_prefix(target)
        deadline = time.monotonic() + 30
        while not [c for c in docker_client.containers.list(filters={"name": prefix}) if c.name.startswith(prefix)]:
            assert time.monotonic() < deadline, "the target's warm container was never claimed"
            time.sleep(0.1)
        time.sleep(0.5)  # the call's command is running
        other = DockerBackend(docker.from_env(timeout=120), lock=pinned_images)
        try:
            killed_at = time.monotonic()
            assert other.kill_run(target, "test: kill from another instance") == 1
        finally:
            other.close()
    finally:
        for t in threads:
            t.join(90)
    assert b.pool.stats()["claims"] == claims + 2, "the calls were not pooled"
    killed, kept = results[target], results[bystander]
    # Ended by the kill, at once, with SIGKILL's status: not run to its end, not cut at its wall
    # time. (The killing instance is not the one running the call, so the call's own backend
    # did not cause the kill: its 137 comes without the init's report of the tool's end, which
    # classify_exit reads as an outside kill, not the OOM killer's.)
    assert killed.outcome is Outcome.KILLED, (killed.outcome, killed.message)
    assert killed.exit_code == 137 and ended[target] - killed_at < 5
    assert kept.outcome is Outcome.OK and kept.exit_code == 0, (kept.outcome, kept.message)
    assert kept.duration_ms >= 5500


# -- drained on close ----------------------------------------------------------------------------


def test_close_removes_every_ready_container(pooled, docker_client):
    b = pooled(size=2)
    fill(b, request_for(), request_for(["true"]))
    assert len(b.made) >= 4
    labelled = {c.id for c in pool_containers(docker_client, L.instance_id())}
    assert set(b.made) <= labelled  # the label a drain (and the reaper) goes by is on each
    b.close()
    assert not [cid for cid in b.made if exists(docker_client, cid)]
    assert not {c.id for c in pool_containers(docker_client, L.instance_id())} & set(b.made)


def test_close_while_the_pool_is_filling_leaves_nothing(pooled, docker_client):
    b = pooled(size=2)
    b.pool.prewarm(request_for())
    time.sleep(0.3)  # the refill thread is creating its first container
    b.close()
    time.sleep(1)
    assert not [cid for cid in b.made if exists(docker_client, cid)]


# -- a dead pool's containers are reaped like any orphan -----------------------------------------

DEAD_POOL = r"""
import sys
import docker
from ringfence_server.sandbox import etc_files, labels as L
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.pool import PoolSettings
from ringfence_server.sandbox.profile import SandboxProfile

b = DockerBackend(docker.from_env(timeout=120), pool=PoolSettings(size=2, idle_s=600))
for argv in ((), ("true",)):
    b.pool.prewarm(SandboxRequest(profile=SandboxProfile(), argv=argv))
if not b.pool.wait_filled(120):
    print("NOT-FILLED", b.pool.stats(), flush=True)
    sys.exit(1)
print("READY", L.instance_id(), etc_files._directory(), flush=True)
sys.stdin.read()
"""


class _Only:
    """The engine client as reap() uses it, listing only the objects that carry `label`: the
    pass is the reaper's own, but it may only ever reach this test's orphans (other runs on
    this engine keep theirs)."""

    def __init__(self, client, label: str) -> None:
        self._client, self._label = client, label

    @property
    def containers(self):
        return _OnlyListed(self._client.containers, self._label)

    @property
    def networks(self):
        return _OnlyListed(self._client.networks, self._label)


class _OnlyListed:
    def __init__(self, collection, label: str) -> None:
        self._collection, self._label = collection, label

    def list(self, *args, filters=None, **kwargs):
        filters = dict(filters or {})
        labels = filters.get("label", [])
        filters["label"] = ([labels] if isinstance(labels, str) else list(labels)) + [self._label]
        return self._collection.list(*args, filters=filters, **kwargs)


def test_a_dead_pools_containers_are_reaped(docker_client, pinned_images):
    python = ROOT / ".venv" / "bin" / "python"
    proc = subprocess.Popen([str(python) if python.exists() else sys.executable, "-c", DEAD_POOL], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    instance = etc_dir = None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 180)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("READY "), (line, proc.poll())
        _, instance, etc_dir = line.split()
        mine = f"{L.INSTANCE_LABEL}={instance}"
        pid = proc.pid
        live = pool_containers(docker_client, instance)
        assert len(live) == 4 and all(c.status == "running" for c in live)
        for c in live:
            assert c.labels[L.PID_LABEL] == str(pid) and int(c.labels[L.DEADLINE_LABEL]) > time.time() + 3600
        # While its process lives, the reaper leaves them alone.
        assert reap(_Only(docker_client, mine)) == []
        os.kill(pid, signal.SIGKILL)
        proc.wait(30)
        # Nothing removes them but the reaper: the dead process cannot, and they are still there.
        assert {c.id for c in pool_containers(docker_client, instance)} == {c.id for c in live}
        reaped = reap(_Only(docker_client, mine))
        assert sorted(r.name for r in reaped if r.kind == "container") == sorted(c.name for c in live)
        assert {r.reason for r in reaped} == {f"owner process {pid} is gone"}
        assert pool_containers(docker_client, instance) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        proc.stdout.close()
        proc.stdin.close()
        proc.stderr.close()
        if instance is not None:
            for c in docker_client.containers.list(all=True, filters={"label": f"{L.INSTANCE_LABEL}={instance}"}):
                c.remove(force=True)
        if etc_dir and os.path.basename(etc_dir).startswith("ringfence-etc-") and os.path.isdir(etc_dir):
            os.chmod(etc_dir, 0o755)  # the killed process could not remove its files
            shutil.rmtree(etc_dir, ignore_errors=True)


# -- who does not claim, and what a miss does --------------------------------------------------


def test_warm_false_never_claims(pooled):
    b = pooled()
    argv = ["python3", "-c", "print('cold by choice')"]
    fill(b, request_for(argv))
    before = b.pool.stats()
    result = b.run(request_for(argv, run=run_id("optout"), warm=False))
    assert result.outcome is Outcome.OK and result.stdout == b"cold by choice\n"
    after = b.pool.stats()
    assert (after["claims"], after["misses"], after["ready"]) == (before["claims"], before["misses"], before["ready"])
    assert b.claimed == [] and not result.container_name.startswith("rf-w-") and not result.warm


def test_a_miss_falls_back_to_a_cold_call(pooled):
    b = pooled()
    before = b.pool.stats()
    assert before["ready"] == 0
    result = b.run(request_for(["python3", "-c", "print('cold after a miss')"], run=run_id("miss")))
    assert result.outcome is Outcome.OK and result.stdout == b"cold after a miss\n"
    after = b.pool.stats()
    assert after["claims"] == before["claims"] and after["misses"] == before["misses"] + 1
    assert b.claimed == [] and not result.container_name.startswith("rf-w-") and not result.warm
    # The miss registered the shape: the pool fills it now, and the next such call is pooled.
    again = run_warm(b, request_for(["python3", "-c", "print('warm now')"], run=run_id("miss")), prewarm=False) \
        if b.pool.wait_filled(90) else pytest.fail(f"the missed shape was not filled: {b.pool.stats()}")
    assert again.outcome is Outcome.OK and again.stdout == b"warm now\n"


# -- how many are ready, and when they are made -----------------------------------------------------


def _at_once(backend: Recording, requests: list[SandboxRequest]) -> list:
    results: list = [None] * len(requests)

    def one(i: int) -> None:
        results[i] = backend.run(requests[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_a_burst_the_pool_could_not_serve_grows_it_and_the_next_burst_is_warm(pooled):
    b = pooled(size=1, max_size=3)
    argv = ["python3", "-c", "print('burst')"]
    fill(b, request_for(argv))
    first = _at_once(b, [request_for(argv, run=run_id(f"burst1-{i}")) for i in range(4)])
    assert all(r.outcome is Outcome.OK and r.stdout == b"burst\n" for r in first)
    after_first = b.pool.stats()
    # One ready: one claim; the other three found none (a miss, or a wait for the one being made).
    # One was ready: the other three found none (each went cold, or queued for the pool).
    assert after_first["claims"] + after_first["misses"] == 4
    assert after_first["target"] == 3  # 1 + the shortfalls, capped at max_size
    assert b.pool.wait_filled(120) and b.pool.stats()["ready"] == 3
    claimed_before = len(b.claimed)
    second = _at_once(b, [request_for(argv, run=run_id(f"burst2-{i}")) for i in range(3)])
    assert all(r.outcome is Outcome.OK and r.stdout == b"burst\n" for r in second)
    assert b.pool.stats()["claims"] == after_first["claims"] + 3  # each of the three was warm
    assert len(b.claimed) == claimed_before + 3 and set(b.claimed[-3:]) <= set(b.made)


def test_calls_announced_by_expect_are_made_for_before_they_run_and_each_runs_warm(pooled):
    """A batch's reads announced together (backend.expect): the pool makes one per call past
    its ready one before any of them runs, and each then runs in a container made ahead."""
    b = pooled(size=1, max_size=4)
    argv = ["python3", "-c", "print('announced')"]
    fill(b, request_for(argv))
    requests = [request_for(argv, run=run_id(f"announced-{i}")) for i in range(4)]
    b.expect(requests)
    deadline = time.monotonic() + 120
    while b.pool.stats()["ready"] < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b.pool.stats()["ready"] == 4 and len(b.made) == 4  # before any call ran
    results = _at_once(b, requests)
    assert all(r.outcome is Outcome.OK and r.stdout == b"announced\n" for r in results)
    stats = b.pool.stats()
    assert stats["claims"] == 4 and stats["misses"] == 0 and stats["announced"] == 0
    assert set(b.claimed) <= set(b.made[:4])


def test_expect_is_a_hint_that_never_raises(pooled):
    """An image the lock does not pin, or a call that may not be pooled, is announced without
    an error and nothing is made for it: the call reports its own refusal when it runs."""
    b = pooled(size=1)
    b.expect([SandboxRequest(profile=SandboxProfile(image="no-such-image"), run_id=run_id("x")),
              request_for(run=run_id("cold"), warm=False)])
    assert b.pool.stats()["shapes"] == 0 and b.made == []


def test_the_refill_never_begins_while_the_engine_starts_a_container_per_maker(pooled):
    """Cold starts and the pool's makes share one container start per maker (pool.MAKERS, one
    per CPU): with that many cold starts held in their create, nothing is made."""
    from ringfence_server.sandbox import pool as pool_module

    makers = pool_module.MAKERS
    b = pooled(size=1)
    b.cold_gate = threading.Event()
    cold = [request_for(["python3", "-c", "print('cold')"], run=run_id(f"cold-{i}"), warm=False)
            for i in range(makers)]
    results: list = []
    threads = [threading.Thread(target=lambda r=r: results.append(b.run(r))) for r in cold]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while b._load().cold < makers and time.monotonic() < deadline:
            time.sleep(0.02)
        assert b._load().cold == makers
        b.pool.prewarm(request_for(["python3", "-c", "print('warm')"]))  # a shape with none ready
        assert not b.pool.wait_filled(1.5)
        assert b.made == []  # not begun while the cold starts hold every maker's CPU
    finally:
        b.cold_gate.set()
        for t in threads:
            t.join(120)
    assert [r.outcome for r in results] == [Outcome.OK] * makers
    assert b.pool.wait_filled(90) and len(b.made) >= 1
    assert max(b.making) < makers  # every make began with a CPU free of cold starts


# -- a run's workspace ----------------------------------------------------------------------------


def _holders(client, volume: str) -> list:
    """Warm containers (the pool's) that mount `volume`."""
    from ringfence_server.sandbox import listing

    # listing.containers: a claimed container removed while the list is read is left out.
    return listing.containers(client, {"volume": volume, "label": f"{L.PURPOSE_LABEL}=pool"})


def test_a_runs_workspace_calls_are_pooled_for_that_run_alone_and_go_with_it(pooled, docker_client, pinned_images):
    from ringfence_server.sandbox.profile import MiB, WorkspaceMount
    from ringfence_server.sandbox.workspace import DockerWorkspaces, WorkspaceSpec

    b = pooled(size=1)
    store = DockerWorkspaces(docker_client, pinned_images)
    run_a, run_b = run_id("ws-a"), run_id("ws-b")
    try:
        vol_a = store.create(run_a, "t", WorkspaceSpec(bytes=4 * MiB, inodes=64))
        vol_b = store.create(run_b, "t", WorkspaceSpec(bytes=4 * MiB, inodes=64))
        write = request_for(["sh", "-c", "echo one > /workspace/f; cat /workspace/f"], run=run_a,
                            workspace=WorkspaceMount(vol_a, False))
        assert run_warm(b, write).stdout == b"one\n"
        # The run's next call: warm again, in another container, and the file is there.
        again = run_warm(b, request_for(["cat", "/workspace/f"], run=run_a, workspace=WorkspaceMount(vol_a, False)))
        assert again.outcome is Outcome.OK and again.stdout == b"one\n"
        assert len(set(b.claimed)) == 2
        # Another run's call of the same tool and limits never gets one made for run A's volume.
        fill(b, write)
        assert _holders(docker_client, vol_a)  # ready for run A, mounting A's volume
        before = b.pool.stats()
        other = b.run(request_for(["sh", "-c", "ls -A /workspace; echo end"], run=run_b,
                                  workspace=WorkspaceMount(vol_b, False)))
        assert other.outcome is Outcome.OK and other.stdout == b"end\n"  # B's own, empty workspace
        after = b.pool.stats()
        assert after["claims"] == before["claims"] and after["misses"] == before["misses"] + 1
        # The run ends: its ready containers are gone when end_run returns, so the workspace can
        # be removed at once (a volume a container mounts cannot be).
        fill(b, write)
        assert _holders(docker_client, vol_a)
        assert b.end_run(run_a) >= 1
        assert _holders(docker_client, vol_a) == []
        assert store.remove(run_a) is True
        assert b.pool.stats()["ready"] == len(_holders(docker_client, vol_b))  # only run B's shape is kept
    finally:
        b.end_run(run_a)
        b.end_run(run_b)
        for run in (run_a, run_b):
            store.remove(run)
