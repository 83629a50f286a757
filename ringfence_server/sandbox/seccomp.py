"""The seccomp profile every tool container runs under.

It is Docker's own default profile (profiles/seccomp/default.json of Docker's source, which the
Debian package golang-github-docker-docker-dev ships; source_path() says where it is read) with
these tightenings the battery asks for:

- io_uring_setup/enter/register are removed: the 20.10 engine's default still allows them, and
  io_uring has been a steady source of kernel privilege escalations (docs/escape-battery.md case 21);
- socket(AF_VSOCK, ...) is refused: vsock reaches the hypervisor's host side and needs no
  capability (case 22). AF_PACKET and SOCK_RAW already need CAP_NET_RAW, which is dropped;
- ptrace is removed: Docker allows it on kernels >= 4.8, and without Yama a tool (uid 10001)
  could attach to tini (PID 1, same uid), stop it or inject code into it (case 19);
- memfd_create is removed. What the noexec /tmp is meant to stop is a *dropped binary*: a
  program the tool writes and then hands to the kernel's exec path (execve, or the dynamic
  loader's PROT_EXEC mapping). An anonymous memory file lives on the kernel's internal shmem
  mount, which has no noexec, so `memfd_create` + `execve(/proc/self/fd/N)` ran any copied
  binary (case 40). Every writable filesystem is noexec and memfd is gone, so the kernel never
  execs a file the tool wrote. (Code an *interpreter* runs is another matter: the tool may run
  arbitrary Python already; the walls against it are uid, capabilities and this profile.)
- POSIX message queues (mq_*) are removed: a queue is writable kernel memory outside every
  filesystem cap, charged to RLIMIT_MSGQUEUE of uid 10001, which all sandboxes share on a runc
  host; gVisor ignores that rlimit. A tool has no use for them (case 42; /dev/mqueue itself is
  replaced by a read-only empty tmpfs in the container settings);
- mknod/mknodat may create only regular files, fifos and sockets, never a character or block
  device: under runc CAP_MKNOD is dropped anyway, but gVisor's sentry does not check it and
  ignores `nodev` on its tmpfs, so a tool could make and open /dev/fuse's or /dev/net/tun's
  device numbers in /tmp (case 44).

Under gVisor (runsc --oci-seccomp) the profile is applied inside the sentry, which does not
honour `errnoRet`: Docker's "clone3 -> ENOSYS" rule comes back as EPERM there, and glibc only
falls back to clone(2) on ENOSYS, so no thread could start. The gVisor variant therefore lets
clone3 through to the sentry, which does not implement it and answers ENOSYS itself.

The profile is derived, not vendored: the repository holds no copy of Docker's file. It is read
at run time from, in order, $RINGFENCE_SECCOMP_BASE (an operator's own copy), the Debian
package's file (so a host with the package follows it when Debian updates it), the copy the
server's wheel carries next to this module (setup.py copies it in at build time, from the
checkout's build/ copy or the Debian package's: an installed server needs nothing else), and a
checkout's build/seccomp/docker-default.json (`bash scripts/ensure-packages.sh` extracts it).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ringfence_server.sandbox.errors import EngineError

AF_VSOCK = 40
MQ_SYSCALLS = ("mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr")
REMOVED_SYSCALLS = frozenset({"io_uring_setup", "io_uring_enter", "io_uring_register", "ptrace",
                              "memfd_create", *MQ_SYSCALLS})
# mknod(path, mode, dev) and mknodat(dirfd, path, mode, dev): the index of `mode`.
MKNOD_MODE_ARG = {"mknod": 1, "mknodat": 2}
S_IFMT = 0o170000
# File types a tool may create with mknod: 0 (means regular), regular, fifo, socket.
MKNOD_ALLOWED_TYPES = (0, 0o100000, 0o010000, 0o140000)
SOURCE_ENV = "RINGFENCE_SECCOMP_BASE"
DEBIAN_PACKAGE = "golang-github-docker-docker-dev"
SYSTEM_SOURCE = Path("/usr/share/gocode/src/github.com/docker/docker/profiles/seccomp/default.json")
# The copy the server's wheel carries (setup.py's build_py writes it there; never in the repository).
SHIPPED_SOURCE = Path(__file__).resolve().with_name("docker-default-seccomp.json")
# A checkout's copy (scripts/ensure-packages.sh): ringfence_server/sandbox/ is two below the checkout.
CHECKOUT_SOURCE = Path(__file__).resolve().parents[2] / "build" / "seccomp" / "docker-default.json"


def _candidates() -> tuple[Path, ...]:
    """Where Docker's default profile is looked for, in order (read at call time: tests point
    these at tmp)."""
    return (SYSTEM_SOURCE, SHIPPED_SOURCE, CHECKOUT_SOURCE)


def source_path() -> Path:
    """Docker's default profile to derive from: the operator's override, else the first candidate
    present (the module docstring says why in this order)."""
    override = os.environ.get(SOURCE_ENV)
    if override:
        return Path(override)
    looked = _candidates()
    for candidate in looked:
        if candidate.is_file():
            return candidate
    # An installed server always has the shipped copy, so this is a source checkout (or an
    # install someone pruned): name the package, the override and the checkout's script.
    raise EngineError(
        "Docker's default seccomp profile was not found "
        f"(looked in {', '.join(str(c) for c in looked)}). It is profiles/seccomp/default.json "
        f"of Docker's source, shipped by the Debian package {DEBIAN_PACKAGE} at {SYSTEM_SOURCE}, and carried "
        f"by the ringfence-server wheel: install that package, reinstall ringfence-server from its wheel, or set "
        f"{SOURCE_ENV} to a copy of the file; in a ringfence checkout, `bash scripts/ensure-packages.sh` "
        "extracts it into build/seccomp/ without installing the package"
    )


def derive(docker_default: dict[str, Any], runtime: str = "runc") -> dict[str, Any]:
    """Docker's default profile minus io_uring, ptrace, memfd_create and message queues, with
    AF_VSOCK sockets and device-node mknod refused."""
    profile = copy.deepcopy(docker_default)
    if runtime == "gvisor":
        profile["syscalls"] = [
            r for r in profile["syscalls"] if not (r["names"] == ["clone3"] and r["action"] == "SCMP_ACT_ERRNO")
        ]
        profile["syscalls"].append(
            {"names": ["clone3"], "action": "SCMP_ACT_ALLOW", "comment": "ringfence: gVisor answers ENOSYS itself"}
        )
    saw_socket = False
    for rule in profile["syscalls"]:
        names = [n for n in rule["names"] if n not in REMOVED_SYSCALLS]
        if rule.get("action") == "SCMP_ACT_ALLOW" and not rule.get("args"):
            # Unconditional mknod goes; the conditional rules below allow the harmless types.
            names = [n for n in names if n not in MKNOD_MODE_ARG]
        if rule.get("action") == "SCMP_ACT_ALLOW" and not rule.get("args") and "socket" in names:
            names.remove("socket")
            saw_socket = True
        rule["names"] = names
    if not saw_socket:
        raise EngineError("unexpected Docker seccomp profile: no unconditional socket rule")
    profile["syscalls"] = [r for r in profile["syscalls"] if r["names"]]
    profile["syscalls"].append(
        {
            "names": ["socket"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": AF_VSOCK, "op": "SCMP_CMP_NE"}],
            "comment": "ringfence: every address family but AF_VSOCK",
        }
    )
    # Rules for one syscall are OR-ed: one rule per allowed file type (seccomp compares
    # masked values for equality only, so "not a device" is spelled as the list of the rest).
    for name, index in sorted(MKNOD_MODE_ARG.items()):
        for file_type in MKNOD_ALLOWED_TYPES:
            profile["syscalls"].append(
                {
                    "names": [name],
                    "action": "SCMP_ACT_ALLOW",
                    "args": [{"index": index, "value": S_IFMT, "valueTwo": file_type, "op": "SCMP_CMP_MASKED_EQ"}],
                    "comment": "ringfence: regular files, fifos and sockets; never device nodes",
                }
            )
    return profile


@functools.lru_cache(maxsize=4)
def profile_json(runtime: str = "runc") -> str:
    """The derived profile as the compact JSON string the engine takes in SecurityOpt."""
    path = source_path()
    try:
        with open(path, encoding="utf-8") as f:
            base = json.load(f)
    except (OSError, ValueError) as e:
        raise EngineError(f"cannot read Docker's default seccomp profile at {path}: {e}") from e
    return json.dumps(derive(base, runtime), separators=(",", ":"), sort_keys=True)


def profile_digest(runtime: str = "runc") -> str:
    return "sha256:" + hashlib.sha256(profile_json(runtime).encode()).hexdigest()
