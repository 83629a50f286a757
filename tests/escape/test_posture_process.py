"""Escape battery, Posture 18-24: namespaces, ptrace, kernel interfaces, io_uring, socket
families, file descriptors and workdir, host credentials.

Every attack runs inside the real sandbox through the `attack` fixture; each red check removes
the protection its case covers and shows the same probe then succeeds.

Red checks run under runc only: each removes an engine or host-kernel protection (a
capability, the seccomp profile, a namespace, a mount flag) that gVisor does not rely on in
the same way (its sentry is the boundary), so under gVisor they would prove nothing about our
settings. The green tests run under both runtimes.
"""

from __future__ import annotations

import json
import os
import re

import probes
import pytest
from weaken import with_readable_init, without_security_opt

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.errors import ProfileError
from ringfence_server.sandbox.hardening import INIT
from ringfence_server.sandbox.profile import SandboxProfile

pytestmark = pytest.mark.docker



def host_ns(kind: str) -> str:
    return os.readlink(f"/proc/self/ns/{kind}")


# ---- case 18: private PID, IPC and UTS namespaces ---------------------------------------------


def test_case_18_private_namespaces(attack, runtime):
    p = probes.report(attack(probes.argv("namespaces"), runtime=runtime))
    assert p["pid1"] == INIT[runtime]
    assert len(p["pids"]) == 2 and p["pids"][0] == 1  # tini and the probe, nothing else
    assert p["hostname"] == p["uname_node"] == "sandbox"
    if runtime == "runc":
        for kind in ("pid", "ipc", "uts", "net", "mnt"):
            assert p["ns"][kind] != host_ns(kind), kind
        assert p["sysvipc"] == {"shm": 0, "msg": 0, "sem": 0}
    else:
        # gVisor: every namespace is the sentry's; those it exposes are not the host's.
        assert p["ns"]["pid"] != host_ns("pid") and p["ns"]["net"] != host_ns("net")


def test_case_18_red_host_pid(weakened):
    """pid_mode=host: the host's processes are visible and PID 1 is the host's init."""
    p = probes.report(weakened(lambda s: {**s, "pid_mode": "host"})(probes.argv("namespaces")))
    assert p["ns"]["pid"] == host_ns("pid")
    assert p["pid1"] != INIT["runc"] and len(p["pids"]) > 10


def test_case_18_red_host_ipc(weakened):
    """ipc_mode=host instead of private: the sandbox shares the host's IPC namespace."""
    p = probes.report(weakened(lambda s: {**s, "ipc_mode": "host"})(probes.argv("namespaces")))
    assert p["ns"]["ipc"] == host_ns("ipc")


def test_case_18_red_host_uts(weakened):
    """uts_mode=host (the engine refuses it together with a hostname, so that goes too): the
    sandbox sees the host's name."""
    def change(s):
        return {**{k: v for k, v in s.items() if k != "hostname"}, "uts_mode": "host"}

    p = probes.report(weakened(change)(probes.argv("namespaces")))
    assert p["ns"]["uts"] == host_ns("uts")
    assert p["hostname"] == os.uname().nodename


# ---- case 19: ptrace and process_vm_readv on PID 1 ---------------------------------------------------


def test_case_19_no_ptrace_of_init(attack, runtime):
    p = probes.report(attack(probes.argv("ptrace"), runtime=runtime))
    assert p["pid1"] == INIT[runtime]
    assert p["attach"]["ret"] == -1 and p["attach"]["errno"] == "EPERM"
    # Refused by the seccomp profile, which gVisor applies too (runsc --oci-seccomp).
    assert p["process_vm_readv"] == {"ret": -1, "errno": "EPERM"}


def test_case_19_process_vm_readv_refused(attack):
    """process_vm_readv needs CAP_SYS_PTRACE, which is dropped."""
    p = probes.report(attack(probes.argv("ptrace")))
    assert p["process_vm_readv"] == {"ret": -1, "errno": "EPERM"}


def test_case_19_seccomp_unconfined_still_meets_the_non_dumpable_init(weakened):
    """Two walls stand between the tool and PID 1: our profile's removal of ptrace, and a
    non-dumpable tini (case 41). With seccomp unconfined the second still refuses both."""
    p = probes.report(weakened(without_security_opt("seccomp"))(probes.argv("ptrace")))
    assert p["attach"] == {"ret": -1, "errno": "EPERM"}
    assert p["process_vm_readv"] == {"ret": -1, "errno": "EPERM"}


def test_case_19_red_seccomp_unconfined_and_readable_init(weakened, readable_tini):
    """With seccomp=unconfined and a readable (so dumpable) tini, process_vm_readv reads PID 1's
    memory (its ELF header) and the attach succeeds."""
    change = without_security_opt("seccomp")
    p = probes.report(weakened(lambda s: with_readable_init(change(s), readable_tini))(probes.argv("ptrace")))
    assert p["attach"]["ret"] == 0 and p["attach"]["detach"]["ret"] == 0
    assert p["process_vm_readv"]["ret"] == 16
    assert p["process_vm_readv"]["bytes"].startswith("7f454c46")  # "\x7fELF"


# ---- case 20: keyctl, add_key, bpf, perf_event_open, userfaultfd, kexec_load, init_module,
# ---- open_by_handle_at, setns, pivot_root ------------------------------------------------------------

KERNEL_CALLS = ("keyctl", "add_key", "bpf", "perf_event_open", "userfaultfd", "kexec_load",
                "init_module", "open_by_handle_at", "setns", "pivot_root")


def test_case_20_kernel_interfaces_refused(attack, runtime):
    p = probes.report(attack(probes.argv("syscalls"), runtime=runtime))
    assert sorted(p) == sorted(KERNEL_CALLS)
    if runtime == "runc":
        assert probes.errnos(p) == {name: "EPERM" for name in KERNEL_CALLS}
    else:
        # gVisor implements or stubs these itself (EACCES, ENOSYS, ENOTSUP, ENODEV...): none
        # succeeds, none reaches the host kernel.
        assert all(r["ret"] == -1 for r in p.values()), p
        assert "ok" not in probes.errnos(p).values()


def test_case_20_red_seccomp_unconfined(weakened):
    """Without seccomp the calls our profile holds reach the kernel and succeed (keyctl, add_key,
    perf_event_open, userfaultfd) or get past the filter to the kernel's own checks (setns ->
    EBADF). bpf, pivot_root and the rest stay refused by the capability layer or the kernel's
    configuration: a second, independent wall, visible here."""
    p = probes.report(weakened(without_security_opt("seccomp"))(probes.argv("syscalls")))
    got = probes.errnos(p)
    assert {k: got[k] for k in ("keyctl", "add_key", "perf_event_open", "userfaultfd")} == {
        "keyctl": "ok", "add_key": "ok", "perf_event_open": "ok", "userfaultfd": "ok",
    }
    assert got["setns"] == "EBADF"
    assert got["bpf"] == got["pivot_root"] == "EPERM"


# ---- case 21: io_uring --------------------------------------------------------------------------------


def test_case_21_io_uring_refused(attack, runtime):
    p = probes.report(attack(probes.argv("io_uring"), runtime=runtime))
    assert probes.errnos(p) == {"io_uring_setup": "EPERM", "io_uring_enter": "EPERM", "io_uring_register": "EPERM"}


def test_case_21_red_docker_default_profile(weakened):
    """Docker 20.10's own default profile (without our tightening) allows io_uring: a ring is
    set up (on this kernel io_uring_disabled=0)."""
    p = probes.report(weakened(probes.with_seccomp(probes.docker_stock_seccomp()))(probes.argv("io_uring")))
    assert p["io_uring_setup"]["ret"] >= 0 and p["io_uring_setup"]["errno"] is None


# ---- case 22: AF_PACKET, SOCK_RAW and AF_VSOCK ---------------------------------------------------------

RAW = ("AF_PACKET/SOCK_RAW", "AF_PACKET/SOCK_DGRAM", "AF_INET/SOCK_RAW/ICMP", "AF_INET/SOCK_RAW/RAW",
       "AF_INET6/SOCK_RAW/ICMPV6")
VSOCK = ("AF_VSOCK/SOCK_STREAM", "AF_VSOCK/SOCK_DGRAM")


def test_case_22_socket_families_refused(attack, runtime):
    p = probes.errnos(probes.report(attack(probes.argv("families"), runtime=runtime)))
    assert {k: p[k] for k in RAW} == {k: "EPERM" for k in RAW}
    # runc: our seccomp rule; gVisor: no vsock transport in the sentry at all.
    assert {k: p[k] for k in VSOCK} == {k: "EPERM" for k in VSOCK}  # seccomp, both runtimes


def test_case_22_red_docker_default_profile_vsock(weakened):
    """With Docker's stock profile (no AF_VSOCK rule) a vsock stream socket is created: on this
    Firecracker guest it would reach the hypervisor's host side. It is never connected."""
    stock = weakened(probes.with_seccomp(probes.docker_stock_seccomp()))
    p = probes.errnos(probes.report(stock(probes.argv("families"))))
    assert p["AF_VSOCK/SOCK_STREAM"] == "ok"
    assert p["AF_PACKET/SOCK_RAW"] == "EPERM"  # still no CAP_NET_RAW


def test_case_22_red_cap_net_raw(weakened):
    """Packet and raw sockets need CAP_NET_RAW, which needs uid 0 and the capability: with both
    (cap_drop=ALL otherwise kept) they open, on the container's own loopback-only namespace."""
    p = probes.errnos(probes.report(weakened(probes.as_root("NET_RAW"))(probes.argv("families"))))
    assert {k: p[k] for k in RAW} == {k: "ok" for k in RAW}


# ---- case 23: only fds 0-2; a workdir under /proc is refused before any container starts --------------


def test_case_23_only_standard_fds(attack, runtime):
    p = probes.report(attack(probes.argv("fds"), runtime=runtime))
    assert p["own_fds_at_start"] == [0, 1, 2]
    target = re.compile(r"^pipe:\[\d+\]$" if runtime == "runc" else r"^host:\[\d+\]$")
    assert sorted(p["processes"], key=int)[0] == "1"
    for pid, proc in p["processes"].items():
        if pid == "1" and runtime == "runc":
            # tini is non-dumpable (case 41): its fds and cwd are not the tool's to read.
            assert proc == {"fds": {"errno": "EACCES"}, "cwd": "?EACCES"}
            continue
        fds = {k: v for k, v in proc["fds"].items() if not (pid == p["self"] and v == "?ENOENT")}
        assert sorted(fds) == ["0", "1", "2"], (pid, proc)
        assert all(target.match(v) for v in fds.values()), (pid, proc)
    assert p["cwd"] == "/tmp"
    if runtime == "runc":
        assert {proc["cwd"] for pid, proc in p["processes"].items() if pid != "1"} == {"/tmp"}


def _session_containers(client) -> int:
    """This session's containers made for a call. The warm pool's (purpose `pool`) come and go on
    their own while the battery's [warm] cases run, so they are not counted; and the low-level
    list, because the high-level one inspects each container and a warm one removed meanwhile
    would fail it."""
    selector = f"{L.TEST_SESSION_LABEL}={os.environ[L.TEST_SESSION_ENV]}"
    return sum(1 for c in client.api.containers(all=True, filters={"label": selector})
               if (c.get("Labels") or {}).get(L.PURPOSE_LABEL) != "pool")


@pytest.mark.parametrize("workdir", [
    "/proc/self/fd/7", "/proc/1/cwd", "/proc", "/proc/self/fd/7/../../..", "/tmp/../proc/self/fd/7",
    "/sys/fs/cgroup", "/dev/fd/3",
])
def test_case_23_workdir_under_proc_refused(docker_client, workdir):
    before = _session_containers(docker_client)
    with pytest.raises(ProfileError) as info:
        SandboxProfile(workdir=workdir)
    assert info.value.field == "workdir"
    assert _session_containers(docker_client) == before


def test_case_23_red_engine_accepts_proc_workdir(weakened):
    """Without the profile's check nothing refuses a /proc workdir before the container starts:
    set straight in the settings, the engine starts the container with its cwd inside /proc
    (/proc/self/fd/7 itself is only refused later, by runc's own CVE-2024-21626 patch)."""
    p = probes.report(weakened(lambda s: {**s, "working_dir": "/proc/self"})(probes.argv("fds")))
    assert p["cwd"].startswith("/proc/")


# ---- case 24: no host credentials in env or /proc/*/environ ---------------------------------------------

CANARY = "RINGFENCE_CANARY_SECRET"
CONTAINER_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                 "HOSTNAME": "sandbox", "HOME": "/tmp"}


@pytest.fixture
def canary(monkeypatch):
    """A fake credential in the host process's environment (real ones are never used)."""
    value = "rf-canary-" + os.urandom(8).hex()
    monkeypatch.setenv(CANARY, value)
    return value


def test_case_24_no_host_credentials(attack, runtime, canary):
    p = probes.report(attack(probes.argv("environ"), runtime=runtime, env={"RF_DECLARED": "yes"}))
    assert p["pid1"] == INIT[runtime]
    assert len(p["environ"]) == 2
    for pid, env in p["environ"].items():
        if pid == "1" and runtime == "runc":
            assert env == {"errno": "EACCES"}  # non-dumpable tini (case 41)
            continue
        # Exactly the image's variables and the declared one: nothing from the host.
        assert env == {**CONTAINER_ENV, "RF_DECLARED": "yes"}, pid
    assert canary not in json.dumps(p)
    assert p["credential_files"] == []


def test_case_24_red_host_env_passthrough(weakened, canary):
    """Passing the host's environment through (here only the canary) puts it in every process's
    environ, where the probe finds it."""
    def change(s):
        return {**s, "environment": {**s["environment"], CANARY: os.environ[CANARY]}}

    p = probes.report(weakened(change)(probes.argv("environ")))
    readable = {pid: env for pid, env in p["environ"].items() if "errno" not in env}
    assert len(readable) == 1  # the probe's; tini's environ is not readable (case 41)
    assert all(env.get(CANARY) == canary for env in readable.values())
