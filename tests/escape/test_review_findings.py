"""Escape battery, cases 40-45: what an independent black-box review found while cases 1-39
passed (docs/escape-battery.md, "Found by an independent review"). Egress cases 46-47 are in
test_egress.py.

Each green test runs the attack in the real sandbox; each red check removes exactly the
protection it covers (through tests/escape/weaken.py) and shows the same attack succeed. Where
a runtime cannot close a gap, the case is a strict xfail that names the reason.
"""

from __future__ import annotations

import json

import probes
import pytest
from weaken import WeakenedBackend, with_readable_init

from ringfence_server.sandbox import seccomp
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.hardening import DOCKER_DEFAULT_MASKED_PATHS
from ringfence_server.sandbox.profile import KiB, SandboxProfile
from ringfence_server.sandbox.result import Outcome

pytestmark = pytest.mark.docker


# ---- case 40: code executed from memory (memfd_create + execve) ----------------------------------


def test_case_40_memfd_exec_refused(attack, runtime):
    """memfd_create is refused by our profile, so no anonymous file exists to be exec'd."""
    p = probes.report(attack(probes.argv("memfd"), runtime=runtime))
    assert p["memfd_create"] == {"ret": -1, "errno": "EPERM"}
    assert "exec" not in p


@pytest.mark.parametrize("runtime", ["runc", "gvisor"], indirect=True)
def test_case_40_red_memfd_allowed(weakened, runtime):
    """With Docker's default rule for memfd_create back in our profile, a copy of /bin/true
    written into a memfd runs (exit 0): noexec on /tmp and /dev/shm would not have stopped it."""
    profile = json.loads(seccomp.profile_json(runtime))
    profile["syscalls"].append({"names": ["memfd_create"], "action": "SCMP_ACT_ALLOW"})
    run = weakened(probes.with_seccomp(json.dumps(profile)))
    p = probes.report(run(probes.argv("memfd"), runtime=runtime))
    assert p["memfd_create"]["ret"] >= 0
    assert p["exec"] == {"rc": 0}


# ---- case 41: PID 1's memory -----------------------------------------------------------------------


def test_case_41_pid1_memory_unreachable(attack, runtime):
    p = probes.report(attack(probes.argv("procmem"), runtime=runtime))
    assert p["mem_read"] == {"ok": False, "errno": "EACCES"}
    assert p["mem_write"] == {"ok": False, "errno": "EACCES"}
    if runtime == "runc":
        # tini is non-dumpable (it was exec'd from an unreadable binary): its /proc files
        # belong to root, so neither its maps nor its environment are the tool's to read.
        assert p["pid1"] == "/usr/bin/tini"
        assert p["dumpable_owner"] == 0
        assert p["maps"] == p["environ"] == "EACCES"


def test_case_41_red_readable_init(weakened, readable_tini):
    """The same tini, readable: PID 1 stays dumpable, the tool opens /proc/1/mem read-write and
    writes into tini's memory (the very bytes it read, so nothing changes)."""
    p = probes.report(weakened(lambda s: with_readable_init(s, readable_tini))(probes.argv("procmem")))
    assert p["mem_write"]["ok"] and p["mem_write"]["wrote"] == 16
    assert p["mem_read"]["read"] == p["mem_write"]["read"]
    assert p["dumpable_owner"] == 10001 and p["maps"] == "ok"


# ---- case 42: every writable filesystem is capped, noexec, nosuid, nodev ----------------------------

TRY_FILES = 600
TRY_BYTES = 2 * 1024 * KiB
SMALL = dict(tmpfs_bytes=512 * KiB, tmpfs_inodes=64)
GVISOR_NO_INODE_CAP = ("gVisor 20221219's tmpfs ignores nr_inodes (its files are sentry memory, bounded only by "
                       "the container's memory limit); runc honours it")


def _writable(runtime, run):
    return probes.report(run(probes.argv("writable_fs", str(TRY_FILES), str(TRY_BYTES)), runtime=runtime, **SMALL))


def test_case_42_only_capped_memory_filesystems_are_writable(attack, runtime):
    p = _writable(runtime, attack)
    assert sorted(p["writable"]) == ["/dev/shm", "/tmp"]
    for point, fs in p["writable"].items():
        assert fs["fstype"] == "tmpfs", point
        assert "noexec" in fs["options"], point
        # Bytes: the cap, not Docker's 64 MiB /dev/shm.
        assert fs["bytes"] <= SMALL["tmpfs_bytes"] and fs["errno"] in ("ENOSPC", "EFBIG"), point
        if runtime == "runc":
            assert {"nosuid", "nodev"} <= set(fs["options"]), point
            assert f"nr_inodes={SMALL['tmpfs_inodes']}" in fs["super"], point
        # gVisor's mountinfo shows only rw/noexec and its tmpfs ignores nodev: no device node
        # can be made there by our seccomp rule (case 44), and no-new-privileges makes
        # setuid bits inert on both runtimes (case 4).
    # No message queue can be made, through /dev/mqueue or the syscall.
    assert p["mqueue_create"] in ("EROFS", "EACCES", "ENOENT")
    assert p["mq_open"] == {"ret": -1, "errno": "EPERM"}


@pytest.mark.parametrize(
    "runtime", ["runc", pytest.param("gvisor", marks=pytest.mark.xfail(strict=True, reason=GVISOR_NO_INODE_CAP))],
    indirect=True,
)
def test_case_42_inode_cap(attack, runtime):
    p = _writable(runtime, attack)
    for point in ("/tmp", "/dev/shm"):
        # The filesystem's root takes one inode of the cap, the probe's directory another.
        assert p["writable"][point]["files"] <= SMALL["tmpfs_inodes"], point
        assert p["writable"][point]["errno"] is None or p["writable"][point]["files"] < TRY_FILES


def _without_tmpfs(point):
    def change(s):
        return {**s, "tmpfs": {k: v for k, v in s["tmpfs"].items() if k != point}}

    return change


def test_case_42_red_docker_dev_shm(weakened):
    """Without our /dev/shm, Docker's own is there: 64 MiB and no inode cap (the probe fills
    past the profile's caps)."""
    p = _writable("runc", weakened(_without_tmpfs("/dev/shm")))
    shm = p["writable"]["/dev/shm"]
    assert "size=65536k" in shm["super"] and not any(o.startswith("nr_inodes") for o in shm["super"])
    assert shm["files"] == TRY_FILES and shm["bytes"] >= TRY_BYTES


def test_case_42_red_tmp_without_inode_cap(weakened):
    """A /tmp with a byte cap only: far more files than the inode cap fit into 512 KiB."""
    def change(s):
        opts = ",".join(o for o in s["tmpfs"]["/tmp"].split(",") if not o.startswith("nr_inodes"))
        return {**s, "tmpfs": {**s["tmpfs"], "/tmp": opts}}

    p = _writable("runc", weakened(change))
    assert p["writable"]["/tmp"]["files"] == TRY_FILES


def test_case_42_red_docker_mqueue(weakened):
    """Without our read-only stand-in, Docker's mqueue filesystem is writable at /dev/mqueue."""
    p = _writable("runc", weakened(_without_tmpfs("/dev/mqueue")))
    assert "/dev/mqueue" in p["writable"]
    assert p["writable"]["/dev/mqueue"]["fstype"] == "mqueue"


@pytest.mark.parametrize("runtime", ["runc", "gvisor"], indirect=True)
def test_case_42_red_mq_syscalls(weakened, runtime):
    """With Docker's rule for the mq_* calls back, mq_open(O_CREAT) makes a queue: no
    /dev/mqueue is needed for it."""
    profile = json.loads(seccomp.profile_json(runtime))
    profile["syscalls"].append({"names": list(seccomp.MQ_SYSCALLS), "action": "SCMP_ACT_ALLOW"})
    p = _writable(runtime, weakened(probes.with_seccomp(json.dumps(profile))))
    assert p["mq_open"]["ret"] >= 0


# ---- case 43: host information ---------------------------------------------------------------------


def _host(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 16).decode("latin-1")
    except OSError:
        return None


def test_case_43_host_information_masked(attack, runtime):
    p = probes.report(attack(probes.argv("hostinfo"), runtime=runtime))
    host_cmdline = _host("/proc/cmdline")
    assert host_cmdline, "the host has a kernel command line to compare with"
    assert p["/proc/cmdline"] != host_cmdline
    assert host_cmdline.strip() not in json.dumps(p)
    for path in ("/proc/modules", "/proc/partitions", "/proc/diskstats"):
        host = _host(path)
        if host and host.strip():
            assert p[path] != host, path
    for path in ("/sys/devices/virtual/dmi/id/product_name", "/sys/class/dmi/id/product_name"):
        host = _host(path)
        if host and host.strip():
            assert host.strip() not in json.dumps(p[path]), path
    if runtime == "runc":
        assert p["/proc/cmdline"] == "" and p["/proc/partitions"] == ""


def test_case_43_red_docker_default_masks(weakened):
    """With Docker's default masked paths only, the sandbox reads the host's command line
    (which names this host's own agents and ports) and its disks."""
    p = probes.report(weakened(lambda s: {**s, "masked_paths": list(DOCKER_DEFAULT_MASKED_PATHS)})(
        probes.argv("hostinfo")))
    assert p["/proc/cmdline"] == _host("/proc/cmdline")
    assert p["/proc/partitions"] == _host("/proc/partitions")


# ---- case 44: gVisor: threads bounded, no device nodes, minimal devices ------------------------------

PIDS = 32
MINIMAL_CHAR_DEVICES = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty",
                        "/dev/ptmx", "/dev/pts/ptmx", "/dev/console"}


def _limits(run, runtime, threads=300):
    return probes.report(run(probes.argv("gvisor_limits", str(threads)), runtime=runtime, pids=PIDS))


def test_case_44_threads_devices_and_nodes(attack, runtime):
    p = _limits(attack, runtime)
    # Threads count against the budget (the probe's own main thread and tini take two).
    assert p["threads"] < PIDS and p["thread_error"]
    for name in ("char-null", "char-fuse", "char-tun", "block"):
        assert p["nodes"][name] == {"ok": False, "errno": "EPERM"}, name
    assert p["nodes"]["fifo"]["ok"] and p["nodes"]["regular"]["ok"]
    assert set(p["devices"]) <= MINIMAL_CHAR_DEVICES, p["devices"]
    assert "blk" not in p["devices"].values()
    assert not p["opens"]["/dev/fuse"]["ok"] and p["opens"]["/dev/net/tun"] == {"ok": False, "errno": "ENOENT"}


def test_case_44_red_gvisor_threads_without_nproc(weakened):
    """Without the nproc rlimit, gVisor's threads are invisible to the host's pids cgroup until
    they exhaust the *sentry's* host budget: the thread bomb then kills the runtime itself (the
    review's "exited with status 2"), or, with room to spare, far more threads than the budget
    start. Either way the budget did not bound them."""
    def change(s):
        return {**s, "ulimits": [u for u in s["ulimits"] if u["Name"] != "nproc"]}

    result = weakened(change)(probes.argv("gvisor_limits", "300"), runtime="gvisor", pids=PIDS)
    if result.exit_code == 0:
        assert probes.report(result)["threads"] > 2 * PIDS
    else:
        assert result.outcome is Outcome.KILLED and result.exit_code == 2 and "runtime" in result.message


def test_case_44_red_gvisor_mknod(weakened):
    """Without our mknod rule (Docker's unconditional one back), gVisor's sentry creates device
    nodes in /tmp and opens them: it checks neither CAP_MKNOD nor nodev."""
    profile = json.loads(seccomp.profile_json("gvisor"))
    profile["syscalls"].append({"names": ["mknod", "mknodat"], "action": "SCMP_ACT_ALLOW"})
    p = _limits(weakened(probes.with_seccomp(json.dumps(profile))), "gvisor", threads=1)
    assert p["nodes"]["char-fuse"]["ok"] and p["nodes"]["char-fuse"]["opened"]["ok"]
    assert p["nodes"]["char-null"]["ok"]


def test_case_44_red_gvisor_devices(weakened):
    """Without the stand-ins over /dev/fuse and /dev/net, gVisor offers both devices and they open."""
    def change(s):
        return {**s, "tmpfs": {k: v for k, v in s["tmpfs"].items() if k != "/dev/net"},
                "mounts": [m for m in s["mounts"] if m["Target"] != "/dev/fuse"]}

    p = _limits(weakened(change), "gvisor", threads=1)
    assert {"/dev/fuse", "/dev/net/tun"} <= set(p["devices"])
    assert p["opens"]["/dev/fuse"]["ok"] and p["opens"]["/dev/net/tun"]["ok"]


# ---- case 45: a runtime that dies is not the tool's error ---------------------------------------------

THREADS = ["python3", "-I", "-c",
           "import threading, time\n"
           "ts = [threading.Thread(target=time.sleep, args=(2,)) for _ in range(60)]\n"
           "[t.start() for t in ts]\n"
           "[t.join() for t in ts]\n"]
# The host pids cgroup of a gVisor sandbox set below what its sentry needs once the tool starts
# threads: the sentry's Go runtime cannot create an OS thread and exits 2 (a provocation, not a
# weakening: the tool itself is within its own budget).
SENTRY_STARVED = 45


class _TrustingBackend(WeakenedBackend):
    """Takes the engine's exit status at its word (no witness of the tool's end asked)."""

    @staticmethod
    def _tool_ended(witness) -> bool:
        return True


def _starve_sentry(s):
    return {**s, "pids_limit": SENTRY_STARVED}


def _run(backend, argv, runtime):
    profile = SandboxProfile(runtime=runtime, pids=128)
    return backend.run(SandboxRequest(profile=profile, argv=tuple(argv), run_id="escape"))


def test_case_45_the_tools_own_exit_is_the_tools(attack, runtime):
    result = attack(["sh", "-c", "echo out; echo err >&2; exit 2"], runtime=runtime)
    assert result.outcome is Outcome.TOOL_ERROR and result.exit_code == 2
    assert result.stdout == b"out\n" and result.stderr == b"err\n"  # tini's report is not output


def test_case_45_runtime_death_is_killed_not_tool_error(docker_client, pinned_images):
    backend = WeakenedBackend(docker_client, pinned_images, _starve_sentry)
    result = _run(backend, THREADS, "gvisor")
    assert result.outcome is Outcome.KILLED, result
    assert result.exit_code == 2
    assert "runtime" in result.message and "not the tool" in result.message
    assert result.error_class is None


def test_case_45_red_exit_status_alone(docker_client, pinned_images):
    """Without the init's report, the same death is blamed on the tool: `tool_error`, "exited
    with status 2" (what the review saw)."""
    backend = _TrustingBackend(docker_client, pinned_images, _starve_sentry)
    result = _run(backend, THREADS, "gvisor")
    assert result.outcome is Outcome.TOOL_ERROR and result.message == "exited with status 2"

