"""Ceilings (docs/escape-battery.md cases 30-37): what a tool runs into, and that it ends classified.

Every attack runs inside the real sandbox (pinned tool image, DockerBackend) on runc and on
gVisor; each protection that is a container setting has a red check that removes exactly that
setting and shows the same (bounded!) attack then succeeds. The unbounded attacks (fork bomb,
floods, CPU burn) only ever run fully hardened.

Some evidence is read from the host side, from the container's own cgroup while the call runs
(`CgroupWatch`): the kernel's counters (pids.current, pids.events, cpu.stat nr_throttled) are the
ground truth for "the limit held", and they are the same for runc and gVisor (runsc puts the
whole sandbox in the container's cgroup). No assertion is about time.

The attack scripts live in the product (ringfence_server.conformance.attacks): `ringfence conformance`
runs the same ones against a user's engine and image.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import docker
import pytest
from weaken import Settings, WeakenedBackend

from ringfence_server.conformance.attacks import (
    BINARY_FLOOD,
    CPU_BURN,
    FD_OPENER,
    FLOODS,
    FORK_BOMB,
    FORK_COUNTER,
    LINGERERS,
    MEMORY_BOMB,
    ORPHANS,
    WRITER,
)
from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.docker_backend import DockerBackend
from ringfence_server.sandbox.hardening import engine_pids_limit
from ringfence_server.sandbox.profile import KiB, MiB, SandboxProfile
from ringfence_server.sandbox.result import Outcome, SandboxResult

pytestmark = pytest.mark.docker



# -- helpers -----------------------------------------------------------------------------------


def call(backend: DockerBackend, argv, *, runtime: str = "runc", call_id: str | None = None, **limits) -> SandboxResult:
    request = SandboxRequest(
        profile=SandboxProfile(runtime=runtime, **limits),
        argv=tuple(argv),
        run_id="ceilings",
        call_id=call_id or secrets.token_hex(8),
    )
    return backend.run(request)


def containers_of(client, call_id: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{L.CALL_LABEL}={call_id}"})


def parsed(result: SandboxResult) -> dict:
    text = result.stdout.decode(errors="replace").strip()
    assert text, f"no output: outcome={result.outcome} exit={result.exit_code} stderr={result.stderr[-500:]!r}"
    return json.loads(text.splitlines()[-1])


def _cgroup_dir(controller: str, container_id: str) -> Path | None:
    for candidate in (
        Path("/sys/fs/cgroup", controller, "docker", container_id),  # v1, cgroupfs driver
        Path("/sys/fs/cgroup", controller, "system.slice", f"docker-{container_id}.scope"),  # v1, systemd
    ):
        if candidate.is_dir():
            return candidate
    return None


class CgroupWatch(threading.Thread):
    """Reads the cgroup files of one call's container from the host while the call runs.

    `files` maps a name to "controller/file"; `samples` collects {name: text} snapshots.
    """

    def __init__(self, call_id: str, files: dict[str, str], *, scan_token: str | None = None) -> None:
        super().__init__(daemon=True)
        # Its own client: the backend's attach stream is busy on the shared one.
        self.client = docker.from_env(timeout=30)
        self.call_id, self.files = call_id, files
        self.samples: list[dict[str, str]] = []
        self.container_seen = False
        self.token_pids_seen: set[int] = set()
        self.errors: list[str] = []
        self._scan_token = scan_token
        self._done = threading.Event()

    def run(self) -> None:
        container_id = None
        while not self._done.is_set():
            if container_id is None:
                # The low-level list: one request, no per-container inspect that could race
                # with the container's removal.
                try:
                    found = self.client.api.containers(all=True, filters={"label": f"{L.CALL_LABEL}={self.call_id}"})
                except Exception as e:  # noqa: BLE001 - recorded, the test reports it
                    self.errors.append(repr(e))
                    found = []
                if found and found[0].get("State") == "running":
                    container_id = found[0]["Id"]
                    self.container_seen = True
                else:
                    time.sleep(0.02)
                    continue
            sample = {}
            for name, rel in self.files.items():
                controller, file = rel.split("/", 1)
                directory = _cgroup_dir(controller, container_id)
                try:
                    sample[name] = (directory / file).read_text() if directory else ""
                except OSError:
                    sample[name] = ""
            # Only whole snapshots count: a file that could not be read means the cgroup was
            # being removed between two reads (a half sample once failed the pids.max check).
            if all(sample.values()):
                self.samples.append(sample)
            if self._scan_token:
                self.token_pids_seen |= host_pids_with(self._scan_token)
            time.sleep(0.1)

    def __enter__(self) -> CgroupWatch:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self.join(timeout=10)
        self.client.close()


def stat_values(text: str) -> dict[str, int]:
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    return values


def host_pids_with(token: str) -> set[int]:
    """Host processes whose command line contains `token` (runc's container processes are host
    processes; gVisor's are not visible to the host at all)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path("/proc", entry, "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.add(int(entry))
    return found


def pids_for(runtime: str, limit: int) -> int:
    # The backend bounds the tool's tasks with the same number under both runtimes (see
    # engine_pids_limit for what the engine's own limit is under gVisor).
    return limit


@pytest.fixture
def changed(docker_client, pinned_images):
    def make(change: Callable[[Settings], Settings]) -> DockerBackend:
        return WeakenedBackend(docker_client, pinned_images, change)

    return make


# -- 30. fork bomb -----------------------------------------------------------------------------



def test_fork_bomb_is_contained_and_classified(backend, docker_client, runtime) -> None:
    """Case 30: the bomb hits the pids limit, the call ends classified, the host still forks.

    On gVisor the tool's tasks are bounded inside the sentry (RLIMIT_NPROC) and the pids cgroup
    bounds the sentry's own host tasks (engine_pids_limit). The bomb's churn of address-space
    stubs exhausts the latter: the sentry dies with status 2 and the call is `killed` by its
    runtime, never the tool's error (case 45)."""
    limit = pids_for(runtime, 32)
    call_id = secrets.token_hex(8)
    files = {"current": "pids/pids.current", "events": "pids/pids.events", "max": "pids/pids.max"}
    with CgroupWatch(call_id, files) as watch:
        result = call(backend, FORK_BOMB, runtime=runtime, call_id=call_id, pids=limit, timeout_s=3)
    expected = (Outcome.TIMEOUT, Outcome.TOOL_ERROR) if runtime == "runc" else (Outcome.TIMEOUT, Outcome.KILLED)
    assert result.outcome in expected, result
    engine_limit = engine_pids_limit(SandboxProfile(runtime=runtime, pids=limit))
    assert all(s["max"].strip() == str(engine_limit) for s in watch.samples)
    assert all(int(s["current"] or 0) <= engine_limit for s in watch.samples)
    if runtime == "runc":
        assert watch.samples, "the watcher never saw the container's pids cgroup"
        denied = max(stat_values(s["events"]).get("max", 0) for s in watch.samples)
        assert denied > 0, "the kernel never refused a fork: the bomb did not reach the limit"
    elif result.outcome is Outcome.KILLED:
        assert result.exit_code == 2 and "runtime" in result.message, result
    # The host is unaffected: this process can still fork, and nothing of the call is left.
    assert subprocess.run(["true"], check=False).returncode == 0
    assert containers_of(docker_client, call_id) == []


def test_fork_counter_stops_at_the_pids_limit(backend) -> None:
    """Case 30 measured: at most 32 tasks (tini + python + 30 children), then EAGAIN."""
    report = parsed(call(backend, ["python3", "-c", FORK_COUNTER, "64"], pids=32, timeout_s=10))
    assert report["error"] == "EAGAIN"
    assert report["spawned"] < 32 and report["procs"] <= 32


def test_red_check_without_pids_limit_the_counter_passes_32(changed) -> None:
    unlimited = changed(lambda s: {**s, "pids_limit": -1})
    report = parsed(call(unlimited, ["python3", "-c", FORK_COUNTER, "64"], pids=32, timeout_s=10))
    assert report["error"] is None
    assert report["spawned"] == 64 and report["procs"] > 32


# -- 31. memory bomb ---------------------------------------------------------------------------



def test_memory_bomb_ends_in_oom(attack, runtime) -> None:
    result = attack(MEMORY_BOMB, runtime=runtime, memory_bytes=64 * MiB, timeout_s=30)
    assert result.outcome is Outcome.OOM, result
    assert b"allocated" not in result.stdout


def test_red_check_without_memory_limit_1gib_is_allocated(weakened) -> None:
    def no_memory_limit(s: Settings) -> Settings:
        s = dict(s)
        s.pop("mem_limit")
        s.pop("memswap_limit")
        return s

    result = weakened(no_memory_limit)(MEMORY_BOMB, memory_bytes=64 * MiB, timeout_s=30)
    assert result.outcome is Outcome.OK, result
    assert result.stdout.strip() == b"allocated %d" % (1 << 30)


# -- 32. CPU burn ------------------------------------------------------------------------------

CPU_FILES = {"stat": "cpu/cpu.stat", "quota": "cpu/cpu.cfs_quota_us", "period": "cpu/cpu.cfs_period_us"}


def test_cpu_burn_is_throttled_and_killed_at_the_wall_limit(backend, docker_client, runtime) -> None:
    """Case 32: three busy processes at cpus=0.5 are throttled by CFS (the kernel's nr_throttled
    and throttled_time grow) and the container is killed at the wall limit (`timeout`)."""
    call_id = secrets.token_hex(8)
    with CgroupWatch(call_id, CPU_FILES) as watch:
        result = call(backend, CPU_BURN, runtime=runtime, call_id=call_id, cpus=0.5, timeout_s=2)
    assert result.outcome is Outcome.TIMEOUT, result
    assert containers_of(docker_client, call_id) == []
    assert watch.samples, f"the watcher never saw the container's cpu cgroup: {watch.errors}"
    last = watch.samples[-1]
    assert int(last["quota"]) == 50_000 and int(last["period"]) == 100_000
    throttled = max(stat_values(s["stat"]).get("nr_throttled", 0) for s in watch.samples)
    throttled_ns = max(stat_values(s["stat"]).get("throttled_time", 0) for s in watch.samples)
    assert throttled > 0 and throttled_ns > 0


def test_red_check_without_cpu_quota_nothing_is_throttled(changed, docker_client) -> None:
    no_quota = changed(lambda s: {k: v for k, v in s.items() if k != "nano_cpus"})
    call_id = secrets.token_hex(8)
    with CgroupWatch(call_id, CPU_FILES) as watch:
        result = call(no_quota, CPU_BURN, call_id=call_id, cpus=0.5, timeout_s=1.5)
    assert result.outcome is Outcome.TIMEOUT
    assert watch.samples
    assert int(watch.samples[-1]["quota"]) == -1
    assert max(stat_values(s["stat"]).get("nr_throttled", 0) for s in watch.samples) == 0


# -- 33. disk fill and fsize ---------------------------------------------------------------------



def test_tmp_fill_stops_at_the_tmpfs_cap(attack, runtime) -> None:
    cap = 4 * MiB
    report = parsed(attack(["python3", "-c", WRITER, str(cap + MiB)], runtime=runtime, tmpfs_bytes=cap,
                           fsize_bytes=64 * MiB))
    assert report["error"] == "ENOSPC"
    assert report["written"] <= cap


def test_red_check_tmpfs_without_size_takes_more_than_the_cap(weakened) -> None:
    cap = 4 * MiB

    def unsized(s: Settings) -> Settings:
        return {**s, "tmpfs": {"/tmp": "rw,noexec,nosuid,nodev,mode=1777"}}

    report = parsed(weakened(unsized)(["python3", "-c", WRITER, str(cap + MiB)], tmpfs_bytes=cap, fsize_bytes=64 * MiB))
    assert report == {"written": cap + MiB, "error": None}


def test_write_over_fsize_gets_efbig(attack, runtime) -> None:
    limit = 1 * MiB
    report = parsed(attack(["python3", "-c", WRITER, str(limit + 64 * KiB)], runtime=runtime, fsize_bytes=limit))
    assert report["error"] == "EFBIG"
    assert report["written"] == limit


def _without_ulimit(name: str) -> Callable[[Settings], Settings]:
    def change(s: Settings) -> Settings:
        return {**s, "ulimits": [u for u in s["ulimits"] if u["Name"] != name]}

    return change


def test_red_check_without_fsize_ulimit_the_write_passes(weakened) -> None:
    limit = 1 * MiB
    report = parsed(weakened(_without_ulimit("fsize"))(["python3", "-c", WRITER, str(limit + 64 * KiB)],
                                                       fsize_bytes=limit))
    assert report == {"written": limit + 64 * KiB, "error": None}


# -- 34. file descriptors ------------------------------------------------------------------------



def test_file_descriptors_stop_at_nofile(attack, runtime) -> None:
    report = parsed(attack(["python3", "-c", FD_OPENER, "1000"], runtime=runtime, nofile=64))
    assert report["error"] == "EMFILE"
    assert report["highest"] == 63  # fds are 0..nofile-1


def test_red_check_without_nofile_ulimit_more_files_open(weakened) -> None:
    report = parsed(weakened(_without_ulimit("nofile"))(["python3", "-c", FD_OPENER, "200"], nofile=64))
    assert report["error"] is None and report["opened"] == 200 and report["highest"] > 64


# -- 35. output floods ---------------------------------------------------------------------------

STDOUT_CAP, STDERR_CAP = 64 * KiB, 16 * KiB


@pytest.mark.parametrize("flood", sorted(FLOODS))
def test_output_flood_is_cut_at_the_cap(attack, runtime, flood: str) -> None:
    """Case 35: the read loop keeps exactly the cap, kills the container, says output_limit.

    There is no container setting to remove here: the cap is enforced by DockerBackend's read
    loop, not by the engine. The red check below shows instead that each flood really produces
    more than the cap when the cap is raised (bounded with `head -c`)."""
    argv, stream = FLOODS[flood]
    result = attack(argv, runtime=runtime, stdout_limit=STDOUT_CAP, stderr_limit=STDERR_CAP, timeout_s=20)
    assert result.outcome is Outcome.OUTPUT_LIMIT, result.message
    if stream == "stdout":
        assert len(result.stdout) == STDOUT_CAP and result.stdout_truncated
    else:
        assert len(result.stderr) == STDERR_CAP and result.stderr_truncated
    if flood.startswith("binary"):
        assert b"\n" not in (result.stdout if stream == "stdout" else result.stderr)


def test_flood_keeps_host_memory_bounded(attack) -> None:
    """Case 35, host side: an endless flood costs the host about twice the cap (the buffer and
    the result's copy of it), however much the tool writes; traced by tracemalloc."""
    cap = 4 * MiB
    tracemalloc.start()
    try:
        result = attack(["sh", "-c", "exec cat /dev/zero"], stdout_limit=cap, timeout_s=20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.outcome is Outcome.OUTPUT_LIMIT and len(result.stdout) == cap
    assert peak < 3 * cap + 1 * MiB, f"peak {peak} bytes for a {cap}-byte cap"


@pytest.mark.parametrize("flood", sorted(FLOODS))
def test_red_check_each_flood_exceeds_the_cap_when_it_is_raised(attack, flood: str) -> None:
    argv, stream = FLOODS[flood]
    cap = STDOUT_CAP if stream == "stdout" else STDERR_CAP
    amount = 3 * cap
    # The same producer, bounded: its stream piped through head -c to the original stream.
    if argv[0] == "python3":
        program = BINARY_FLOOD.format("stdout")
        bounded = f"python3 -c \"{program}\" 2>/dev/null | head -c {amount}"
    else:
        bounded = argv[2].replace("exec ", "").replace(" >&2", "") + f" | head -c {amount}"
    if stream == "stderr":
        bounded = f"({bounded}) >&2"
    result = attack(["sh", "-c", bounded], stdout_limit=4 * MiB, stderr_limit=4 * MiB, timeout_s=20)
    assert result.outcome is Outcome.OK, result.message
    assert len(getattr(result, stream)) == amount > cap


# -- 36. setsid and TERM-trapping processes --------------------------------------------------------



def test_setsid_and_term_trapping_processes_die_with_the_container(backend, docker_client, runtime) -> None:
    """Case 36: at the deadline the container is killed, not the client: nothing of it is left.

    The wall limit is enforced by DockerBackend's read loop (there is no setting to remove);
    the script itself shows the attack is real: its TERM-trapping child survives a TERM."""
    token = str(secrets.randbelow(10**9)).zfill(9)
    call_id = secrets.token_hex(8)
    with CgroupWatch(call_id, {}, scan_token=token if runtime == "runc" else None) as watch:
        result = call(backend, ["sh", "-c", LINGERERS.format(token=token)], runtime=runtime, call_id=call_id,
                      timeout_s=2)
    assert result.outcome is Outcome.TIMEOUT, result
    assert b"survived TERM" in result.stdout
    assert watch.container_seen
    assert containers_of(docker_client, call_id) == []  # docker ps -a --filter label=ringfence.call=...
    if runtime == "runc":
        # The host scan is not vacuous: it saw the sleepers while the call ran.
        assert len(watch.token_pids_seen) >= 3
        assert host_pids_with(token) == set()


# -- 37. orphans and zombies ---------------------------------------------------------------------



def test_orphans_and_zombies_are_reaped(backend, docker_client, runtime) -> None:
    """Case 37: tini (PID 1) reaps the orphans; the long-lived one dies at teardown."""
    token = str(secrets.randbelow(10**9)).zfill(9)
    call_id = secrets.token_hex(8)
    result = call(backend, ["python3", "-c", ORPHANS, token], runtime=runtime, call_id=call_id, timeout_s=10)
    assert result.outcome is Outcome.OK, result
    report = parsed(result)
    assert report["pid"] != 1, "the tool must not be PID 1: tini is"
    assert report["zombies"] == 0
    assert report["others"] == 1  # only the long-lived sleeper
    assert containers_of(docker_client, call_id) == []
    if runtime == "runc":
        assert host_pids_with(token) == set()


def test_red_check_without_tini_orphans_stay_zombies(changed) -> None:
    """Replace the image's entrypoint (tini) so the tool is PID 1: nobody reaps the orphans."""
    no_init = changed(lambda s: {**s, "entrypoint": ["/usr/bin/env"]})
    token = str(secrets.randbelow(10**9)).zfill(9)
    report = parsed(call(no_init, ["python3", "-c", ORPHANS, token], timeout_s=10))
    assert report["pid"] == 1
    assert report["zombies"] == 5
