"""The cases of `ringfence conformance`: docs/escape-battery.md's cases that a user's run can hold.

A case is the battery's number and title, the probes it reads (ringfence_server.conformance.probes and
.attacks, the very scripts the battery's tests run) and a check: a function that reads what the
probes got and names every way it differs from the fail-closed outcome. Where the battery holds
a case for the product's own image and engine (an exact /dev listing, the image's own PATH), the
check says the property instead, so that it holds for any image that deserves it.

Left out are the cases that need the battery's harness (NOT_INCLUDED: decoy servers on test
networks, the egress testbed, host-side files and sentinels), and every red check: proving that
a protection matters takes a weakened sandbox, which only the battery has. A case that holds only
part of the battery's (the rest needing the harness) says which part in `partial`.

Image cases (`1.image`, `4.image`, `18.image`) run no sandbox: they are the checks of
ringfence_server.imagebuild.adopt on the image itself (the default user, setuid files, the init), numbered
after the battery's case they back: a run as uid 10001 under no-new-privileges holds cases 1 and
4 even in an image that ships a root default user or a setuid-root shell, and the image still
must not.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ringfence_server.conformance import attacks, probes
from ringfence_server.sandbox import etc_files
from ringfence_server.sandbox.errors import ProfileError
from ringfence_server.sandbox.hardening import GVISOR_HIDDEN_DEVICES, INIT
from ringfence_server.sandbox.profile import KiB, MiB, SandboxProfile
from ringfence_server.sandbox.result import Outcome, SandboxResult

# The battery's cases, numbered and worded as in docs/escape-battery.md (each one line there).
TITLES: dict[int, str] = {
    1: "uid is not 0 (`id -u`).",
    2: "All five capability sets are zero (`/proc/self/status` CapInh/Prm/Eff/Bnd/Amb).",
    3: "NoNewPrivs is 1 and Seccomp is 2.",
    4: "setuid binaries do not raise euid (find -perm -4000, run each).",
    5: "`unshare -Ur` and other new namespaces fail (EPERM).",
    6: "`mount` of tmpfs, proc or cgroup fails.",
    7: "cgroup `release_agent` is absent or unwritable; creating a child cgroup fails (CVE-2022-0492).",
    8: "cgroup `devices.allow` cannot be written.",
    9: "/proc/sys writes fail: core_pattern, kernel/modprobe, binfmt_misc/register, suid_dumpable.",
    10: "/proc/sysrq-trigger unwritable; kcore, kallsyms addresses, sched_debug masked or zeroed; dmesg denied.",
    11: "/sys writes fail (uevent_helper, /sys/kernel/security).",
    12: "Root filesystem writes fail (`/x`, `/etc/passwd`) with EROFS.",
    13: "Binaries copied into /tmp cannot be executed (noexec); note that `sh /tmp/x.sh` still runs.",
    14: "No Docker/containerd socket anywhere; nothing answers `GET /info` on any unix socket.",
    15: "/proc/net/unix shows no host sockets.",
    16: "mountinfo shows no host paths (/var/lib/docker, host /etc, /) beyond declared read-only inputs.",
    17: "/dev holds the minimal set, no block devices; `fdisk -l` shows nothing.",
    18: "Private PID, IPC and UTS namespaces: few pids, PID 1 is the init, container hostname.",
    19: "ptrace(ATTACH, 1) and process_vm_readv on pid 1 fail.",
    20: "keyctl, add_key, bpf, perf_event_open, userfaultfd, kexec_load, init_module, open_by_handle_at, "
        "setns, pivot_root fail with EPERM.",
    21: "io_uring_setup (syscall 425) fails (add a seccomp profile if the engine's default allows it).",
    22: "AF_PACKET, SOCK_RAW and AF_VSOCK sockets cannot be opened.",
    23: "Only fds 0-2 (and the protocol pipes) are open; a workdir under /proc is refused by the platform "
        "before any container starts (CVE-2024-21626).",
    24: "No host credentials in env or /proc/*/environ.",
    25: "No interface but lo, no route; TCP and UDP connects to a decoy on a test network fail.",
    26: "The cloud-metadata address and its names are unreachable, also for egress-enabled tools (no route to "
        "it; the proxy's address classifier refuses it, unit-tested without a socket).",
    27: "The host, the Docker bridge gateway, the engine's TCP ports and other containers are unreachable.",
    28: "DNS lookups get no answer (no exfiltration by query names).",
    29: "Egress-enabled tools: a host off the allowlist, a subdomain of an exact-match entry, HTTPS to a bare "
        "IP, an SNI/Host mismatch, an /etc/hosts spoof, a private range even if allowlisted, a CONNECT relayed "
        "through a second hop — all refused, and the decoy server behind each never sees a connection.",
    30: "Fork bomb stops at the pids limit; the host is unaffected; the call is classified.",
    31: "Memory bomb ends in `oom` (exit 137 / memory cgroup), not in a hang or a host OOM.",
    32: "CPU burn with several threads is throttled to the quota and killed at the wall limit.",
    33: "Disk fill of /tmp stops at the tmpfs cap (ENOSPC); `fsize` ulimit gives EFBIG.",
    34: "File descriptors stop at the nofile limit (EMFILE).",
    35: "Output floods (`yes`, /dev/zero, binary with no newline, on stdout and stderr) are cut at the cap; "
        "host memory stays bounded; the result says `output_limit`.",
    36: "`setsid sleep 1000 &` and a process that traps TERM: after the deadline nothing of the call is left "
        "running (`docker top` empty, container gone).",
    37: "Double-forked orphans and zombies are reaped and nothing survives teardown.",
    38: "Symlinks and hardlinks in a tool's output (`ln -s /etc/shadow out`, a file swapped for a link during "
        "copy-out) are never followed on the host.",
    39: "Input archives with `../`, absolute paths, links pointing out, or device nodes are refused (tarfile "
        "with `filter=\"data\"`, plus our own checks).",
    40: "Code executed from memory (`memfd_create` + `execve` of the descriptor) does not bypass what noexec on "
        "`/tmp` is meant to stop — or the battery documents why it need not.",
    41: "PID 1 is neither readable nor writable through `/proc/1/mem` (case 19's twin).",
    42: "Every writable filesystem (`/tmp`, `/dev/shm`, `/dev/mqueue`, anything else) is capped in bytes and "
        "inodes, noexec, nosuid, nodev — or absent.",
    43: "Host information stays masked: `/proc/cmdline` and similar host paths show nothing of the host.",
    44: "gVisor: threads are bounded (not only processes); no device node can be created; only the minimal "
        "devices exist.",
    45: "A runtime that dies (not the tool) is classified as such, never as the tool's error.",
    46: "Egress: a call's proxy credentials are useless from any other call's network, and every proxied request "
        "is attributed to the call whose network it came from.",
    47: "Egress-enabled calls reach no resolver at all, the engine's embedded one included.",
}

# The battery's cases a user's run cannot hold, and what each needs that only tests/ has.
NOT_INCLUDED: dict[int, str] = {
    27: "decoy containers on a test network, and a listener on the host",
    29: "the egress testbed: decoy servers, a proxy with a test resolver",
    38: "host-side files and sentinels around the product's copy-out",
    39: "host-side archives and sentinels around the product's input staging",
    46: "the egress testbed: two live calls' proxy sockets and a decoy",
    47: "the egress testbed: a proxy and decoys on a test network",
}

SANDBOX_UID = SandboxProfile().uid
RUN_ID = "conformance"

# ---- the probes: what runs in the sandbox, and with which limits ---------------------------------


@dataclass(frozen=True)
class Probe:
    """One call in a fresh sandbox: argv and the SandboxProfile fields it sets (image and runtime
    are the run's). `alone`: run after the others, one at a time (a fork bomb or a CPU burn
    would slow the calls beside it on a small machine, and their wall clocks run)."""

    key: str
    argv: tuple[str, ...]
    limits: Mapping[str, Any] = field(default_factory=dict)
    alone: bool = False
    stats_after_s: float | None = None
    """Ask the engine for the container's stats (`docker stats`: CPU use, CFS throttling) this
    long after it is seen running, while the call runs."""


STDOUT_CAP, STDERR_CAP = 64 * KiB, 16 * KiB
FORK_PIDS = 32
CPU_QUOTA = 0.5
WRITABLE_FILES, WRITABLE_BYTES = 600, 2 * 1024 * KiB
WRITABLE_CAPS = dict(tmpfs_bytes=512 * KiB, tmpfs_inodes=64)
THREADS, THREAD_PIDS = 300, 32
TMP_CAP, FSIZE = 4 * MiB, 1 * MiB
DECLARED_ENV = {"RF_DECLARED": "yes"}
# The workdirs case 23 must see refused before any container exists (the battery's list).
PROC_WORKDIRS = ("/proc/self/fd/7", "/proc/1/cwd", "/proc", "/proc/self/fd/7/../../..", "/tmp/../proc/self/fd/7",
                 "/sys/fs/cgroup", "/dev/fd/3")


def make_probes() -> dict[str, Probe]:
    """Every probe of a run, by key (fresh tokens each time: a lingering process or a query name
    is this run's)."""
    token = str(secrets.randbelow(10**9)).zfill(9)
    posture = {name: Probe(name, tuple(probes.argv(name))) for name in probes.names()}
    posture["environ"] = Probe("environ", tuple(probes.argv("environ")), {"env": DECLARED_ENV})
    posture["writable_fs"] = Probe("writable_fs", tuple(probes.argv("writable_fs", str(WRITABLE_FILES),
                                                                    str(WRITABLE_BYTES))), WRITABLE_CAPS)
    posture["gvisor_limits"] = Probe("gvisor_limits", tuple(probes.argv("gvisor_limits", str(THREADS))),
                                     {"pids": THREAD_PIDS})
    py = ("python3", "-I", "-c")
    others = [
        Probe("net_view", (*py, attacks.VIEW_PROBE)),
        Probe("dns", (*py, attacks.DNS_PROBE, f"exfil-{token}.example.com", "--local"),
              {"env": {"RES_OPTIONS": "timeout:1 attempts:1"}}),
        Probe("fork_counter", (*py, attacks.FORK_COUNTER, "64"), {"pids": FORK_PIDS, "timeout_s": 10}),
        Probe("fork_bomb", tuple(attacks.FORK_BOMB), {"pids": FORK_PIDS, "timeout_s": 3}, alone=True),
        Probe("memory_bomb", tuple(attacks.MEMORY_BOMB), {"memory_bytes": 64 * MiB, "timeout_s": 30}),
        Probe("cpu_quota", (*py, attacks.CPU_QUOTA, "3", "1.0"), {"cpus": CPU_QUOTA, "timeout_s": 3},
              alone=True, stats_after_s=0.8),
        Probe("tmp_fill", (*py, attacks.WRITER, str(TMP_CAP + MiB)), {"tmpfs_bytes": TMP_CAP, "fsize_bytes": 64 * MiB}),
        Probe("fsize", (*py, attacks.WRITER, str(FSIZE + 64 * KiB)), {"fsize_bytes": FSIZE}),
        Probe("fd_opener", (*py, attacks.FD_OPENER, "1000"), {"nofile": 64}),
        Probe("lingerers", ("sh", "-c", attacks.LINGERERS.format(token=token)), {"timeout_s": 2}),
        Probe("orphans", (*py, attacks.ORPHANS, token), {"timeout_s": 10}),
        Probe("tool_exit", ("sh", "-c", "echo out; echo err >&2; exit 2")),
    ]
    for flood, (argv, _stream) in sorted(attacks.FLOODS.items()):
        others.append(Probe(f"flood:{flood}", tuple(argv),
                            {"stdout_limit": STDOUT_CAP, "stderr_limit": STDERR_CAP, "timeout_s": 20}))
    return {**posture, **{p.key: p for p in others}}


# ---- what the checks read ------------------------------------------------------------------------


class ProbeBroken(Exception):
    """A probe did not run to completion: the case fails with this, naming what happened."""


@dataclass(frozen=True)
class Call:
    """One probe's call: its result (None when the backend raised: `error`), and the containers
    of the call the engine still listed after it ended (there must be none)."""

    probe: Probe
    result: SandboxResult | None
    error: str | None = None
    leftovers: tuple[str, ...] = ()
    stats: Mapping[str, Any] | None = None  # the engine's stats of the running container (stats_after_s)
    stats_error: str | None = None


@dataclass(frozen=True)
class Host:
    """What a check compares with on the side of the caller: the image's own environment (its
    config's Env), this process's namespaces and the host's files that must not show inside
    (read here, when this process runs where the engine does; empty otherwise)."""

    image_env: Mapping[str, str] = field(default_factory=dict)
    namespaces: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ImageCheck:
    """One check of ringfence_server.imagebuild.adopt on the image (`user`, `setuid`, `init`)."""

    name: str
    ok: bool
    detail: str


class Evidence:
    """The calls of one run and what the checks compare them with."""

    def __init__(self, runtime: str, calls: Mapping[str, Call], host: Host,
                 image_checks: Mapping[str, ImageCheck] | None = None, image_error: str | None = None) -> None:
        self.runtime = runtime
        self.calls = calls
        self.host = host
        self.image_checks = dict(image_checks or {})
        self.image_error = image_error

    @property
    def gvisor(self) -> bool:
        return self.runtime == "gvisor"

    def result(self, key: str) -> SandboxResult:
        call = self.calls.get(key)
        if call is None:
            raise ProbeBroken(f"probe {key} was not run")
        if call.result is None:
            raise ProbeBroken(f"probe {key} could not run: {call.error}")
        return call.result

    def leftovers(self, key: str) -> tuple[str, ...]:
        self.result(key)
        return self.calls[key].leftovers

    def stats(self, key: str) -> Mapping[str, Any]:
        self.result(key)
        call = self.calls[key]
        if call.stats is None:
            raise ProbeBroken(f"the engine's stats of the {key} call could not be read: {call.stats_error}")
        return call.stats

    def parsed(self, key: str) -> dict[str, Any]:
        """The JSON object on the last line of the probe's stdout, however the call ended."""
        result = self.result(key)
        text = result.stdout.decode(errors="replace").strip()
        try:
            value = json.loads(text.splitlines()[-1]) if text else None
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise ProbeBroken(f"probe {key} printed no JSON object: {_describe(result)}")
        return value

    def report(self, key: str) -> dict[str, Any]:
        """Like `parsed`, for a probe that must also have run to completion (exit 0)."""
        result = self.result(key)
        if result.exit_code != 0:
            raise ProbeBroken(f"probe {key} did not run to completion: {_describe(result)}")
        return self.parsed(key)


def _describe(result: SandboxResult) -> str:
    err = result.stderr.decode(errors="replace").strip().splitlines()
    return (f"outcome {result.outcome.value}, exit {result.exit_code}"
            + (f", {result.message}" if result.message else "") + (f", stderr: {err[-1][:200]}" if err else ""))


class Expect:
    """Collects what differs from the fail-closed outcome, one short line each."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def that(self, ok: object, problem: str) -> None:
        if not ok:
            self.problems.append(problem)

    def equal(self, got: object, want: object, what: str) -> None:
        if got != want:
            self.problems.append(f"{what}: {_short(got)}, expected {_short(want)}")

    def refused(self, attempts: Mapping[str, Any], what: str, *, errno: str | None = None) -> None:
        """Every attempt (a probe's {name: {"ok"/"ret", "errno"}}) failed, with `errno` if given."""
        got = errnos(attempts)
        bad = {k: v for k, v in got.items() if v == "ok" or (errno is not None and v != errno)}
        if bad:
            want = f" (expected {errno})" if errno else ""
            self.problems.append(f"{what}: " + ", ".join(f"{k} {v}" for k, v in sorted(bad.items())) + want)


def _short(value: object, width: int = 160) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def errno_of(attempt: Mapping[str, Any]) -> str:
    """"ok", or the errno name of one attempt ({"ok": bool, "errno"} or a syscall's {"ret", "errno"})."""
    if "ok" in attempt:
        return "ok" if attempt["ok"] else str(attempt.get("errno") or attempt.get("exception") or "failed")
    return "ok" if attempt.get("ret") != -1 else str(attempt.get("errno"))


def errnos(attempts: Mapping[str, Any]) -> dict[str, str]:
    return {name: errno_of(a) for name, a in attempts.items()}


# ---- the cases -----------------------------------------------------------------------------------

Check = Callable[[Evidence, Expect], None]


@dataclass(frozen=True)
class Finding:
    """A documented gap of a runtime (docs/escape-battery.md, "Known gaps"): where `check` fails
    under one of `runtimes`, the case is XFAIL with the reason, not FAIL."""

    check: Check
    runtimes: Mapping[str, str]


@dataclass(frozen=True)
class Case:
    case: str  # "13", or "4.image" for an image case
    number: int  # the battery's case number
    title: str
    probes: tuple[str, ...]
    check: Check
    finding: Finding | None = None
    partial: str = ""  # what of the battery's case only the battery holds
    image: bool = False

    @property
    def order(self) -> tuple[int, int]:
        return (self.number, 1 if self.image else 0)


CASES: list[Case] = []


def case(number: int, *needs: str, finding: Finding | None = None, partial: str = "",
         image: bool = False, title: str | None = None) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        CASES.append(Case(f"{number}.image" if image else str(number), number, title or TITLES[number], needs, check,
                          finding, partial, image))
        return check

    return register


# ---- posture 1-4 ---------------------------------------------------------------------------------


@case(1, "identity")
def _uid(ev: Evidence, x: Expect) -> None:
    p = ev.report("identity")
    x.equal([p["uid"], p["euid"], p["gid"], p["egid"]], [SANDBOX_UID] * 4, "uid, euid, gid, egid")
    x.that(0 not in p["groups"], f"supplementary groups include root's: {p['groups']}")
    x.equal((p["status"]["Uid"] or "").split(), [str(SANDBOX_UID)] * 4, "/proc/self/status Uid")
    x.equal((p["status"]["Gid"] or "").split(), [str(SANDBOX_UID)] * 4, "/proc/self/status Gid")


@case(1, image=True, title="The image's default user is not root, and exists in its /etc/passwd.")
def _image_user(ev: Evidence, x: Expect) -> None:
    _image(ev, x, "user")


@case(2, "identity")
def _capabilities(ev: Evidence, x: Expect) -> None:
    p = ev.report("identity")
    x.equal(p["capget"], {"effective": 0, "inheritable": 0, "permitted": 0}, "capget")
    x.equal(p["bounding"], [], "bounding set")
    x.equal(p["ambient"], [], "ambient set")
    status = p["status"]
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd"):
        x.that(status[name] is not None and int(status[name], 16) == 0, f"{name} is {status[name]}")
    if status["CapAmb"] is not None:  # gVisor's /proc has no CapAmb line; prctl above asked it
        x.that(int(status["CapAmb"], 16) == 0, f"CapAmb is {status['CapAmb']}")


@case(3, "identity")
def _nnp_seccomp(ev: Evidence, x: Expect) -> None:
    p = ev.report("identity")
    x.equal(p["no_new_privs"], 1, "no_new_privs")
    x.equal(p["seccomp_mode"].get("ret"), 2, "seccomp mode (2: filter)")
    x.equal(p["status"]["Seccomp"], "2", "/proc/self/status Seccomp")
    if not ev.gvisor:
        x.equal(p["status"]["NoNewPrivs"], "1", "/proc/self/status NoNewPrivs")


@case(4, "setuid", "identity",
      partial="the battery also runs a setuid-root `id` it plants in a declared input (a host-side fixture)")
def _setuid(ev: Evidence, x: Expect) -> None:
    p = ev.report("setuid")
    x.equal(ev.report("identity")["no_new_privs"], 1, "no_new_privs (what makes the bits inert)")
    for path, ran in sorted(p["ran"].items()):
        for what in ("euid", "egid"):
            out = ran[what]
            x.that(not (out.get("rc") == 0 and out.get("out", "").strip() == "0"),
                   f"{path} (mode {ran['mode']}) ran with {what} 0")


@case(4, image=True, title="The image ships no setuid-root or setgid-root file and no file capabilities.")
def _image_setuid(ev: Evidence, x: Expect) -> None:
    _image(ev, x, "setuid")


# ---- posture 5-11: namespaces, mounts, cgroups, /proc/sys, masks, /sys ---------------------------


@case(5, "unshare")
def _unshare(ev: Evidence, x: Expect) -> None:
    p = ev.report("unshare")
    x.refused(p["unshare"], "unshare", errno="EPERM")
    cmd = p["unshare_cmd"]
    x.that(cmd.get("rc") != 0, f"`unshare -Ur id -u` succeeded: {cmd.get('out', '').strip()!r}")


@case(6, "mount")
def _mount(ev: Evidence, x: Expect) -> None:
    p = ev.report("mount")
    x.refused({k: p[k] for k in ("tmpfs", "proc", "sysfs", "cgroup")}, "mount", errno="EPERM")
    x.that(p["mount_cmd"].get("rc") != 0, "`mount -t tmpfs` succeeded")


@case(7, "cgroups")
def _release_agent(ev: Evidence, x: Expect) -> None:
    p = ev.report("cgroups")
    x.equal(p["release_agents"], {}, "release_agent files visible")
    x.equal(p["fresh_hierarchy"].get("mounted"), False, "a fresh cgroup hierarchy mounted")
    x.refused(p["mkdir"], "child cgroup created")
    x.refused(p["remount"], "cgroup remounted read-write")
    x.refused(p["mkdir_after_remount"], "child cgroup created after a remount")
    x.that(all(p["readonly"].values()), f"cgroup mounts not read-only: {p['readonly']}")


@case(8, "cgroups")
def _devices_allow(ev: Evidence, x: Expect) -> None:
    p = ev.report("cgroups")
    x.refused({"direct": p["devices_allow"], "after a remount": p["devices_allow_after_remount"]},
              "devices.allow written")


@case(9, "procsys")
def _proc_sys(ev: Evidence, x: Expect) -> None:
    p = ev.report("procsys")
    x.refused(p["open_for_write"], "opened for writing")
    x.refused(p["after_unmask"]["open_for_write"], "opened for writing after an unmount")
    x.equal(errno_of(p["after_unmask"]["umount"]), "EPERM", "umount /proc/sys")
    if not ev.gvisor:
        x.equal(p["readonly"], True, "/proc/sys read-only")


@case(10, "procmask")
def _proc_masks(ev: Evidence, x: Expect) -> None:
    p = ev.report("procmask")
    x.refused({"/proc/sysrq-trigger": p["sysrq_trigger"]}, "opened for writing")
    for path, seen in sorted(p["masked"].items()):
        masked = (not seen["exists"]) or seen.get("chr_null") or seen.get("entries") == []
        x.that(masked, f"{path} is not masked")
        if seen.get("chr_null"):
            x.equal(seen.get("size_read"), 0, f"bytes read from {path}")
    for path, after in sorted(p["after_unmask"].items()):
        x.that(errno_of(after["umount"]) != "ok", f"{path}'s mask was unmounted")
    kallsyms = p["kallsyms"]
    x.that("errno" in kallsyms or kallsyms.get("nonzero") == 0, f"kallsyms shows addresses: {kallsyms}")
    x.equal(p["dmesg"].get("ret"), -1, "syslog(READ_ALL)")


@case(11, "sysfs")
def _sys(ev: Evidence, x: Expect) -> None:
    p = ev.report("sysfs")
    x.that(errno_of(p["remount_rw"]) != "ok", "/sys remounted read-write")
    x.that(errno_of(p["mkdir_security"]) != "ok", "mkdir under /sys/kernel/security succeeded")
    x.refused(p["open_for_write"], "opened for writing")
    x.refused(p["open_for_write_after_remount"], "opened for writing after a remount")
    if not ev.gvisor:
        x.equal(p["readonly"], True, "/sys read-only")


# ---- posture 12-17: root fs, noexec, sockets, mounts, /dev ---------------------------------------


@case(12, "rootfs")
def _rootfs(ev: Evidence, x: Expect) -> None:
    p = ev.report("rootfs")
    x.refused({k: p[k] for k in ("create_root", "create_var_tmp", "write_passwd", "append_passwd", "chmod_runner")},
              "root filesystem written")
    if not ev.gvisor:  # gVisor does not report ST_RDONLY through statvfs
        x.equal(p["readonly"], True, "/ mounted read-only")


GVISOR_NOEXEC_MMAP = ("known gVisor gap (runsc 20221219): execve from the noexec /tmp is refused, but "
                      "mmap(PROT_EXEC) of a file there is not, so `ld.so /tmp/binary` runs it")


def _noexec_mapping(ev: Evidence, x: Expect) -> None:
    p = ev.report("noexec")
    for d in ("/tmp", "/dev/shm"):
        x.that(errno_of(p[d]["mmap_exec"]) != "ok", f"{d}: a file there mapped PROT_EXEC")
        x.that(p[d]["via_loader"].get("rc") != 0, f"{d}: the binary ran through the dynamic loader")


@case(13, "noexec", finding=Finding(_noexec_mapping, {"gvisor": GVISOR_NOEXEC_MMAP}))
def _noexec(ev: Evidence, x: Expect) -> None:
    p = ev.report("noexec")
    for d in ("/tmp", "/dev/shm"):
        run = p[d]["exec"]
        x.that(run.get("rc") is None and run.get("errno") == "EACCES", f"{d}: a copied binary was executed: {run}")
        if not ev.gvisor:
            x.equal(p[d]["noexec_flag"], True, f"{d} noexec")


@case(14, "engine_socket", partial="the battery also shows that an engine-like socket on the host is never reached")
def _engine_socket(ev: Evidence, x: Expect) -> None:
    p = ev.report("engine_socket")
    x.equal(p["filesystem_sockets"], [], "unix sockets in the filesystem")
    x.equal(p["abstract_sockets"], [], "abstract unix sockets")
    x.equal(p["well_known_present"], [], "engine socket paths present")
    x.that(not any(a.get("answered") for a in p["answers"].values()), f"GET /info answered: {sorted(p['answers'])}")


@case(15, "netunix")
def _netunix(ev: Evidence, x: Expect) -> None:
    x.equal(ev.report("netunix")["entries"], [], "/proc/net/unix entries")


DOCKER_NETWORK_FILES = frozenset({"/etc/resolv.conf", "/etc/hostname", "/etc/hosts"})


def host_backed(mounts: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Mounts whose content comes from the host: a block device (runc) or a gofer (gVisor's 9p),
    other than the container's own root filesystem."""
    return {m["mountpoint"]: m for m in mounts
            if m["mountpoint"] != "/" and (not m["major_minor"].startswith("0:") or m["fstype"] == "9p")}


@case(16, "mountinfo")
def _mountinfo(ev: Evidence, x: Expect) -> None:
    mounts = ev.report("mountinfo")["mounts"]
    allowed = DOCKER_NETWORK_FILES | (frozenset(GVISOR_HIDDEN_DEVICES) if ev.gvisor else frozenset())
    backed = host_backed(mounts)
    x.equal(sorted(set(backed) - allowed), [], "host-backed mounts beyond the sandbox's own /etc files")
    for point, m in sorted(backed.items()):
        x.that("ro" in m["options"], f"{point} is a writable host mount")
    leaks = sorted(m["mountpoint"] for m in mounts if "/var/lib/docker" in m["root"] + m["super"])
    x.equal(leaks, [], "mounts from the engine's data root")
    if not ev.gvisor:
        roots = sorted(m["mountpoint"] for m in mounts
                       if m["root"] in ("/", "/var/lib/docker") and not m["major_minor"].startswith("0:"))
        x.equal(roots, [], "mounts of the host's root directory")


DEV_RUNC = ("fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty",
            "urandom", "zero")
DEV_GVISOR = (*DEV_RUNC, "fuse", "net")  # gVisor's own two, each under an empty read-only stand-in (case 44)


@case(17, "devices")
def _dev(ev: Evidence, x: Expect) -> None:
    p = ev.report("devices")
    allowed = DEV_GVISOR if ev.gvisor else DEV_RUNC
    x.equal(sorted(set(p["top"]) - set(allowed)), [], "entries in /dev beyond the minimal set")
    x.equal(p["block_devices"], [], "block devices")
    x.equal(p["partitions"], [], "partitions the kernel lists")
    x.refused(p["open_partitions"], "partition opened")
    x.equal(errno_of(p["mknod_block"]), "EPERM", "mknod of a block device")
    fdisk = p["fdisk"]
    x.that(fdisk.get("rc") is None or "Disk /dev/" not in fdisk.get("out", ""), "`fdisk -l` lists a disk")


# ---- posture 18-24: namespaces, ptrace, kernel interfaces, sockets, fds, environment --------------


@case(18, "namespaces")
def _namespaces(ev: Evidence, x: Expect) -> None:
    p = ev.report("namespaces")
    x.equal(p["pid1"], INIT[ev.runtime], "PID 1")
    x.that(len(p["pids"]) == 2 and p["pids"][0] == 1, f"processes besides the init and the probe: {p['pids']}")
    x.equal([p["hostname"], p["uname_node"]], [etc_files.HOSTNAME] * 2, "hostname")
    kinds = ("pid", "net") if ev.gvisor else ("pid", "ipc", "uts", "net", "mnt")
    for kind in kinds:
        mine = ev.host.namespaces.get(kind)
        x.that(mine is None or p["ns"].get(kind) != mine, f"the {kind} namespace is the caller's ({mine})")
    if not ev.gvisor:
        x.equal(p["sysvipc"], {"shm": 0, "msg": 0, "sem": 0}, "System V IPC objects visible")


@case(18, image=True, title="The image's entrypoint is an init (tini, dumb-init or catatonit), present and executable.")
def _image_init(ev: Evidence, x: Expect) -> None:
    _image(ev, x, "init")


@case(19, "ptrace")
def _ptrace(ev: Evidence, x: Expect) -> None:
    p = ev.report("ptrace")
    x.equal(errno_of(p["attach"]), "EPERM", "ptrace(ATTACH, 1)")
    x.equal(errno_of(p["process_vm_readv"]), "EPERM", "process_vm_readv(1)")


KERNEL_CALLS = ("keyctl", "add_key", "bpf", "perf_event_open", "userfaultfd", "kexec_load", "init_module",
                "open_by_handle_at", "setns", "pivot_root")


@case(20, "syscalls")
def _kernel_calls(ev: Evidence, x: Expect) -> None:
    p = ev.report("syscalls")
    x.equal(sorted(p), sorted(KERNEL_CALLS), "calls tried")
    # gVisor implements or stubs these itself (EACCES, ENOSYS, ...): none may succeed there.
    x.refused(p, "kernel interface reached", errno=None if ev.gvisor else "EPERM")


@case(21, "io_uring")
def _io_uring(ev: Evidence, x: Expect) -> None:
    x.refused(ev.report("io_uring"), "io_uring", errno="EPERM")


@case(22, "families")
def _families(ev: Evidence, x: Expect) -> None:
    x.refused(ev.report("families"), "socket created", errno="EPERM")


@case(23, "fds")
def _fds(ev: Evidence, x: Expect) -> None:
    p = ev.report("fds")
    x.equal(p["own_fds_at_start"], [0, 1, 2], "the tool's fds at start")
    pipe = "host:[" if ev.gvisor else "pipe:["
    for pid, proc in sorted(p["processes"].items(), key=lambda kv: int(kv[0])):
        fds = proc["fds"]
        if "errno" in fds:  # a non-dumpable init's fds are not the tool's to read (case 41)
            x.that(pid == "1", f"pid {pid}'s fds unreadable: {fds['errno']}")
            continue
        fds = {k: v for k, v in fds.items() if not (pid == p["self"] and v == "?ENOENT")}
        x.equal(sorted(fds, key=int), ["0", "1", "2"], f"pid {pid}'s fds")
        x.that(all(v.startswith(pipe) for v in fds.values()), f"pid {pid}'s fds are not the call's pipes: {fds}")
    x.equal(p["cwd"], SandboxProfile().workdir, "working directory")
    for workdir in PROC_WORKDIRS:
        try:
            SandboxProfile(workdir=workdir)
        except ProfileError:
            continue
        x.that(False, f"a profile with workdir {workdir} was accepted")


@case(24, "environ")
def _environ(ev: Evidence, x: Expect) -> None:
    p = ev.report("environ")
    x.equal(p["pid1"], INIT[ev.runtime], "PID 1")
    x.equal(len(p["environ"]), 2, "processes")
    expected = {**ev.host.image_env, "HOSTNAME": etc_files.HOSTNAME, **DECLARED_ENV}
    for pid, env in sorted(p["environ"].items(), key=lambda kv: int(kv[0])):
        if "errno" in env:
            x.that(pid == "1", f"pid {pid}'s environ unreadable: {env['errno']}")
            continue
        # Only the image's own variables, HOME (from the image's passwd) and what the call
        # declared: no name from anywhere else (a host passthrough would add the host's).
        extra = sorted(set(env) - set(expected) - {"HOME"})
        x.equal(extra, [], f"pid {pid}: variables neither the image's nor declared")
        changed = sorted(k for k, v in expected.items() if env.get(k) != v)
        x.equal(changed, [], f"pid {pid}: variables missing or not the image's")
    x.equal(p["credential_files"], [], "credential files")


# ---- network 25, 26, 28 (the sandbox's own view; the decoys are the battery's) ---------------------

NO_ROUTE = frozenset({"ENETUNREACH", "EHOSTUNREACH", "EADDRNOTAVAIL"})


@case(25, "net_view", partial="the battery also shows a decoy on a test network never sees a packet")
def _only_lo(ev: Evidence, x: Expect) -> None:
    view = ev.report("net_view")
    x.equal(view["ifaces"], ["lo"], "interfaces")
    x.equal(view["routes"], [], "IPv4 routes")
    x.equal(view["routes6"], [], "IPv6 routes")
    servers = sorted(w[1] for w in view["resolv"] if w and w[0] == "nameserver" and len(w) > 1)
    x.equal(servers, ["127.0.0.1"], "resolv.conf nameservers")


@case(26, "net_view", partial="the battery also aims at a decoy standing in for a metadata server; the egress "
                              "half is the proxy's address classifier, unit-tested")
def _metadata(ev: Evidence, x: Expect) -> None:
    view = ev.report("net_view")
    meta = view["metadata"]
    if not isinstance(meta, dict):
        x.that(False, f"not probed: {meta} (case 25)")
        return
    x.that(set(meta.values()) <= NO_ROUTE, f"metadata addresses: {meta}, expected no route")
    x.equal(sorted(set(view["metadata_names"].values())), ["gaierror"], "metadata names resolved")
    x.that("169.254" not in view["hosts"] and "metadata" not in view["hosts"], "/etc/hosts names a metadata address")


@case(28, "dns", partial="the battery also shows a decoy resolver on a test network never sees the query")
def _dns(ev: Evidence, x: Expect) -> None:
    p = ev.report("dns")
    x.equal(p["lookup"], "gaierror", "lookup of a fresh name")
    x.equal([p["tcp53"], p["udp53"]], ["ECONNREFUSED", "ECONNREFUSED"], "127.0.0.1:53 over TCP and UDP")


# ---- ceilings 30-37 -------------------------------------------------------------------------------


def _gone(ev: Evidence, x: Expect, key: str) -> None:
    x.equal(list(ev.leftovers(key)), [], f"containers of the {key} call left behind")


def _runtime_died(r: SandboxResult) -> bool:
    """The sandbox ended `killed` by its runtime (a gVisor sentry out of host tasks, case 45)."""
    return r.outcome is Outcome.KILLED and r.exit_code == 2 and "runtime" in r.message


def _fork_counted(ev: Evidence, x: Expect) -> None:
    counted = ev.parsed("fork_counter")
    x.equal(counted["error"], "EAGAIN", "fork error at the limit")
    x.that(counted["spawned"] < FORK_PIDS and counted["procs"] <= FORK_PIDS,
           f"{counted['spawned']} forks, {counted['procs']} processes under a budget of {FORK_PIDS}")


# Under gVisor the engine's pids limit leaves the sentry eight host tasks per tool task
# (ringfence_server.sandbox.hardening), so the counter meets the tool's budget first. A sentry
# that dies of it anyway (a budget past the cap, a starved host) is still the runtime's gap:
# reported, not failed.
GVISOR_FORKS = ("known gVisor gap: the tool's tasks are bounded inside the sentry (RLIMIT_NPROC), but the "
                "sentry's own host tasks (address-space stubs, Go threads) exhausted its host pids limit first: "
                "the sandbox died, `killed` by its runtime, never the tool's error, the host unaffected")


@case(30, "fork_counter", "fork_bomb", finding=Finding(_fork_counted, {"gvisor": GVISOR_FORKS}),
      partial="the battery also reads the container's pids cgroup from the host while the bomb runs")
def _fork_bomb(ev: Evidence, x: Expect) -> None:
    counter, bomb = ev.result("fork_counter"), ev.result("fork_bomb")
    # The counting call ends by itself, or (gVisor) with its runtime: never otherwise.
    x.that(counter.outcome is Outcome.OK or (ev.gvisor and _runtime_died(counter)),
           f"the fork counter ended {counter.outcome.value}: {counter.message}")
    # Classified: the wall limit (or, runc, the shell giving up on a failed fork), or (gVisor) the
    # sentry out of host tasks, `killed` by its runtime.
    classified = bomb.outcome is Outcome.TIMEOUT or (
        _runtime_died(bomb) if ev.gvisor else bomb.outcome is Outcome.TOOL_ERROR)
    x.that(classified, f"the bomb ended {bomb.outcome.value}: {bomb.message}")
    _gone(ev, x, "fork_counter")
    _gone(ev, x, "fork_bomb")


@case(31, "memory_bomb")
def _memory_bomb(ev: Evidence, x: Expect) -> None:
    r = ev.result("memory_bomb")
    x.equal(r.outcome.value, Outcome.OOM.value, "outcome of 1 GiB into 64 MiB")
    x.that(b"allocated" not in r.stdout, "the allocation succeeded")


@case(32, "cpu_quota")
def _cpu(ev: Evidence, x: Expect) -> None:
    r = ev.result("cpu_quota")
    x.equal(r.outcome.value, Outcome.TIMEOUT.value, "outcome at the wall limit")
    x.equal(r.applied.get("nano_cpus"), int(CPU_QUOTA * 1e9), "the CPU quota the engine reports")
    # The engine's own counters for the container's CPU cgroup (the same for runc and gVisor:
    # runsc puts the whole sandbox in it): CFS throttled it.
    throttling = ev.stats("cpu_quota").get("throttling_data") or {}
    x.that(throttling.get("throttled_periods", 0) > 0 and throttling.get("throttled_time", 0) > 0,
           f"the engine saw no CFS throttling: {throttling}")
    if not ev.gvisor:  # gVisor's sentry keeps its own account of its tasks' time, not the host's
        p = ev.parsed("cpu_quota")
        share = p["cpu_s"] / p["wall_s"] if p["wall_s"] > 0 else 0.0
        # 3 busy processes against half a core: within the quota, with room for the accounting's
        # granularity (a CFS period, clock ticks).
        x.that(share <= CPU_QUOTA * 1.3 + 0.05, f"{p['busy']} busy processes got {share:.2f} cores, quota {CPU_QUOTA}")
    _gone(ev, x, "cpu_quota")


@case(33, "tmp_fill", "fsize")
def _disk(ev: Evidence, x: Expect) -> None:
    fill = ev.parsed("tmp_fill")
    x.equal(fill["error"], "ENOSPC", "error filling /tmp")
    x.that(fill["written"] <= TMP_CAP, f"{fill['written']} bytes written into a {TMP_CAP}-byte /tmp")
    big = ev.parsed("fsize")
    x.equal([big["error"], big["written"]], ["EFBIG", FSIZE], "error and bytes at the fsize limit")


@case(34, "fd_opener")
def _nofile(ev: Evidence, x: Expect) -> None:
    p = ev.parsed("fd_opener")
    x.equal([p["error"], p["highest"]], ["EMFILE", 63], "error and highest fd at nofile 64")


@case(35, *(f"flood:{f}" for f in sorted(attacks.FLOODS)),
      partial="the battery also traces this process's memory during a flood")
def _floods(ev: Evidence, x: Expect) -> None:
    for flood, (_argv, stream) in sorted(attacks.FLOODS.items()):
        r = ev.result(f"flood:{flood}")
        cap = STDOUT_CAP if stream == "stdout" else STDERR_CAP
        data = r.stdout if stream == "stdout" else r.stderr
        cut = r.stdout_truncated if stream == "stdout" else r.stderr_truncated
        x.that(r.outcome is Outcome.OUTPUT_LIMIT and len(data) == cap and cut,
               f"{flood}: {r.outcome.value}, {len(data)} bytes kept of a {cap}-byte cap")
        if flood.startswith("binary"):
            x.that(b"\n" not in data, f"{flood}: a newline in a flood that has none")


@case(36, "lingerers", partial="the battery also scans the host's processes for the sleepers (runc)")
def _lingerers(ev: Evidence, x: Expect) -> None:
    r = ev.result("lingerers")
    x.equal(r.outcome.value, Outcome.TIMEOUT.value, "outcome at the deadline")
    x.that(b"survived TERM" in r.stdout, "the TERM-trapping child did not survive a TERM (the attack did not run)")
    _gone(ev, x, "lingerers")


@case(37, "orphans")
def _orphans(ev: Evidence, x: Expect) -> None:
    r = ev.result("orphans")
    x.equal(r.outcome.value, Outcome.OK.value, "outcome")
    p = ev.parsed("orphans")
    x.that(p["pid"] != 1, "the tool is PID 1 (nothing reaps its orphans)")
    x.equal(p["zombies"], 0, "zombies")
    x.equal(p["others"], 1, "processes besides the init, the tool and its long-lived orphan")
    _gone(ev, x, "orphans")


# ---- 40-45: what the independent review found ------------------------------------------------------


@case(40, "memfd")
def _memfd(ev: Evidence, x: Expect) -> None:
    p = ev.report("memfd")
    x.equal(errno_of(p["memfd_create"]), "EPERM", "memfd_create")
    x.that("exec" not in p, f"a binary ran from a memfd: {p.get('exec')}")


@case(41, "procmem")
def _procmem(ev: Evidence, x: Expect) -> None:
    p = ev.report("procmem")
    x.equal([errno_of(p["mem_read"]), errno_of(p["mem_write"])], ["EACCES", "EACCES"], "/proc/1/mem read, write")
    if not ev.gvisor:
        # A non-dumpable init (exec'd from a binary the tool cannot read): its /proc is root's.
        x.equal(p["pid1"], INIT["runc"], "PID 1")
        x.equal(p["dumpable_owner"], 0, "owner of /proc/1/mem (0: PID 1 is non-dumpable)")
        x.equal([p["maps"], p["environ"]], ["EACCES", "EACCES"], "/proc/1/maps, /proc/1/environ")


GVISOR_NO_INODE_CAP = ("known gVisor gap (runsc 20221219): its tmpfs ignores nr_inodes; files there are "
                       "sentry memory, bounded by the container's memory limit only")


def _inode_cap(ev: Evidence, x: Expect) -> None:
    p = ev.report("writable_fs")
    for point, fs in sorted(p["writable"].items()):
        x.that(fs["files"] <= WRITABLE_CAPS["tmpfs_inodes"],
               f"{point}: {fs['files']} files under an inode cap of {WRITABLE_CAPS['tmpfs_inodes']}")


@case(42, "writable_fs", finding=Finding(_inode_cap, {"gvisor": GVISOR_NO_INODE_CAP}))
def _writable(ev: Evidence, x: Expect) -> None:
    p = ev.report("writable_fs")
    x.equal(sorted(p["writable"]), ["/dev/shm", "/tmp"], "writable filesystems")
    for point, fs in sorted(p["writable"].items()):
        x.equal(fs["fstype"], "tmpfs", f"{point} filesystem")
        x.that("noexec" in fs["options"], f"{point} is not noexec")
        x.that(fs["bytes"] <= WRITABLE_CAPS["tmpfs_bytes"] and fs["errno"] in ("ENOSPC", "EFBIG"),
               f"{point}: {fs['bytes']} bytes written ({fs['errno']}) under a cap of {WRITABLE_CAPS['tmpfs_bytes']}")
        if not ev.gvisor:  # gVisor's mountinfo shows only rw/noexec (cases 4 and 44 hold the rest)
            x.that({"nosuid", "nodev"} <= set(fs["options"]), f"{point} options {fs['options']}")
            x.that(f"nr_inodes={WRITABLE_CAPS['tmpfs_inodes']}" in fs["super"], f"{point} has no inode cap")
    x.that(p["mqueue_create"] in ("EROFS", "EACCES", "ENOENT"), f"/dev/mqueue writable: {p['mqueue_create']}")
    x.equal(errno_of(p["mq_open"]), "EPERM", "mq_open")


HOST_INFO = ("/proc/cmdline", "/proc/modules", "/proc/partitions", "/proc/diskstats")
HOST_NAMES = ("/sys/devices/virtual/dmi/id/product_name", "/sys/class/dmi/id/product_name")


@case(43, "hostinfo")
def _hostinfo(ev: Evidence, x: Expect) -> None:
    p = ev.report("hostinfo")
    seen = json.dumps(p)
    for path in HOST_INFO:
        host = ev.host.files.get(path, "")
        if host.strip():
            x.that(p.get(path) != host, f"{path} is the host's")
    cmdline = ev.host.files.get("/proc/cmdline", "").strip()
    x.that(not cmdline or cmdline not in seen, "the host's kernel command line shows")
    for path in HOST_NAMES:
        name = ev.host.files.get(path, "").strip()
        x.that(not name or name not in seen, f"the host's {path} shows")
    if not ev.gvisor:
        x.equal([p["/proc/cmdline"], p["/proc/partitions"]], ["", ""], "/proc/cmdline, /proc/partitions")


MINIMAL_CHAR_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty",
                                  "/dev/ptmx", "/dev/pts/ptmx", "/dev/console"})


@case(44, "gvisor_limits")
def _threads_nodes(ev: Evidence, x: Expect) -> None:
    p = ev.report("gvisor_limits")
    x.that(p["threads"] < THREAD_PIDS and p["thread_error"],
           f"{p['threads']} threads started under a budget of {THREAD_PIDS}")
    x.refused({k: p["nodes"][k] for k in ("char-null", "char-fuse", "char-tun", "block")}, "device node made",
              errno="EPERM")
    x.equal(sorted(set(p["devices"]) - MINIMAL_CHAR_DEVICES), [], "devices beyond the minimal set")
    x.that(errno_of(p["opens"]["/dev/fuse"]) != "ok", "/dev/fuse opened")
    x.equal(errno_of(p["opens"]["/dev/net/tun"]), "ENOENT", "/dev/net/tun")


@case(45, "tool_exit", partial="the battery also starves a gVisor sentry (a weakened backend) to show a runtime's "
                               "death is `killed`")
def _tool_exit(ev: Evidence, x: Expect) -> None:
    r = ev.result("tool_exit")
    x.equal([r.outcome.value, r.exit_code], [Outcome.TOOL_ERROR.value, 2], "outcome and exit of the tool's `exit 2`")
    x.equal([r.stdout, r.stderr], [b"out\n", b"err\n"], "the tool's output (the init's report is not)")


# ---- the image cases ------------------------------------------------------------------------------


def _image(ev: Evidence, x: Expect, name: str) -> None:
    if ev.image_error is not None:
        x.that(False, f"the image could not be inspected: {ev.image_error}")
        return
    check = ev.image_checks.get(name)
    if check is None:
        x.that(False, f"the image's {name} check did not run")
        return
    x.that(check.ok, check.detail)


CASES.sort(key=lambda c: c.order)


def case_ids() -> list[str]:
    return [c.case for c in CASES]


def needed_probes(cases: Iterable[Case]) -> list[str]:
    seen: dict[str, None] = {}
    for c in cases:
        for key in c.probes:
            seen.setdefault(key, None)
    return list(seen)
