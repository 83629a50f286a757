"""SandboxProfile: the limits one call runs under.

Only the limits are settable. The hardening itself (non-root, read-only root, no capabilities,
no-new-privileges, seccomp, private IPC, no network) is not a field: there is nothing to switch
off. Every field is validated on construction so a bad profile never reaches the engine.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ringfence_server.sandbox.egress.grant import EgressGrant
from ringfence_server.sandbox.errors import ProfileError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

RUNTIMES = ("runc", "gvisor")
# Docker's names for the runtimes above.
ENGINE_RUNTIME = {"runc": "runc", "gvisor": "runsc"}

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables that would let a caller change how the loader or interpreter behaves inside.
_FORBIDDEN_ENV = frozenset({"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONSTARTUP"})


@dataclass(frozen=True)
class InputMount:
    """A host directory shown read-only inside the sandbox (prepared by `archive.stage_files`)."""

    host_path: str
    container_path: str

    def __post_init__(self) -> None:
        if not posixpath.isabs(self.host_path):
            raise ProfileError("inputs.host_path", "must be absolute")
        _check_container_path("inputs.container_path", self.container_path)
        if self.container_path.rstrip("/") in ("", "/tmp", "/proc", "/sys", "/dev"):
            raise ProfileError("inputs.container_path", f"{self.container_path!r} is reserved")


WORKSPACE_PATH = "/workspace"
_VOLUME_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class WorkspaceMount:
    """A run's workspace (ringfence_server.sandbox.workspace: a capped tmpfs volume held by its keeper) shown at
    /workspace: writable for a tool that declares `workspace: write`, read-only otherwise."""

    volume: str
    read_only: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.volume, str) or not _VOLUME_NAME.match(self.volume):
            raise ProfileError("workspace.volume", f"{self.volume!r} is not a workspace volume name")
        if not isinstance(self.read_only, bool):
            raise ProfileError("workspace.read_only", "must be a bool")


def _check_container_path(name: str, path: str) -> None:
    if not posixpath.isabs(path):
        raise ProfileError(name, "must be an absolute path")
    norm = posixpath.normpath(path)
    if norm != path.rstrip("/") and path != "/":
        raise ProfileError(name, f"{path!r} is not in normal form")
    # CVE-2024-21626: a workdir under /proc/self/fd leaks a host fd into the container.
    for reserved in ("/proc", "/sys", "/dev"):
        if norm == reserved or norm.startswith(reserved + "/"):
            raise ProfileError(name, f"{path!r} is under {reserved}")


def _in_range(name: str, value: int | float, low: int | float, high: int | float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(name, "must be a number")
    if not low <= value <= high:
        raise ProfileError(name, f"{value} is outside [{low}, {high}]")


LIMIT_RANGES: Mapping[str, tuple[int | float, int | float]] = {
    "memory_bytes": (8 * MiB, 8 * GiB),
    "cpus": (0.01, 2.0),
    "pids": (8, 4096),
    "timeout_s": (0.1, 3600),
    "stdout_limit": (1, 64 * MiB),
    "stderr_limit": (1, 64 * MiB),
}
"""The range of each ceiling a tool's manifest may set (the rest are the sandbox's own); a
profile outside them is refused, and `ringfence tools check` reports against the same table."""


@dataclass(frozen=True)
class SandboxProfile:
    """Limits and inputs for one call. Defaults suit a small stdlib-Python tool."""

    image: str = "tool"
    """Name of an image in images/images.lock; dispatch resolves it to the pinned ID."""

    runtime: str = "runc"
    """`runc` (default) or `gvisor` (runsc; only for tools without network)."""

    uid: int = 10001
    gid: int = 10001
    """Never 0: the image's `sandbox` user."""

    memory_bytes: int = 256 * MiB
    """Memory limit; swap is set equal so the container cannot swap past it."""

    cpus: float = 1.0
    """CPU quota in cores (Docker's nano_cpus)."""

    pids: int = 128
    """Maximum number of tasks (processes and threads) in the container."""

    timeout_s: float = 10.0
    """Wall time from start to kill. The *container* is killed, so setsid children die too."""

    stdout_limit: int = 1 * MiB
    stderr_limit: int = 64 * KiB
    """Byte caps; past either the container is killed and the outcome is `output_limit`."""

    tmpfs_bytes: int = 16 * MiB
    """Size of each writable memory filesystem (/tmp and /dev/shm, both noexec, nosuid, nodev)."""

    tmpfs_inodes: int = 4096
    """Files (inodes) each of them may hold: a byte cap alone let 200,000 empty files into a
    1 MiB /tmp, and every inode costs kernel memory."""

    nofile: int = 256
    fsize_bytes: int = 16 * MiB
    """ulimits: open files and largest file written. core is always 0."""

    workdir: str = "/tmp"
    env: Mapping[str, str] = field(default_factory=dict)
    """Explicit environment; the host's is never passed through."""

    inputs: tuple[InputMount, ...] = ()

    workspace: WorkspaceMount | None = None
    """The run's workspace at /workspace, or None (the default: nothing survives the call)."""

    # None = no network at all (the default). A grant gives the call one way out: its own
    # socket to the egress proxy, which admits only the grant's hosts (ringfence_server.sandbox.egress).
    egress: EgressGrant | None = None
    """Hosts and ceilings this call may use through the egress proxy (runc only)."""

    def __post_init__(self) -> None:
        if not isinstance(self.image, str) or not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", self.image):
            raise ProfileError("image", f"{self.image!r} is not an image name from images.lock")
        if self.runtime not in RUNTIMES:
            raise ProfileError("runtime", f"{self.runtime!r} is not one of {', '.join(RUNTIMES)}")
        for name in ("uid", "gid"):
            value = getattr(self, name)
            _in_range(name, value, 1, 2**31 - 2)
            if value == 0:
                raise ProfileError(name, "root (0) is never allowed")
        for name, (low, high) in LIMIT_RANGES.items():
            _in_range(name, getattr(self, name), low, high)
        _in_range("tmpfs_bytes", self.tmpfs_bytes, 64 * KiB, 1 * GiB)
        _in_range("tmpfs_inodes", self.tmpfs_inodes, 16, 1_000_000)
        _in_range("nofile", self.nofile, 16, 65536)
        _in_range("fsize_bytes", self.fsize_bytes, 4 * KiB, 1 * GiB)
        _check_container_path("workdir", self.workdir)
        for key, value in self.env.items():
            if not isinstance(key, str) or not _ENV_NAME.match(key):
                raise ProfileError("env", f"{key!r} is not a valid variable name")
            if key in _FORBIDDEN_ENV:
                raise ProfileError("env", f"{key} is not allowed")
            if not isinstance(value, str) or "\0" in value:
                raise ProfileError("env", f"{key} must be a string without NUL")
        # Freeze the mapping so a caller cannot mutate a profile after validation.
        object.__setattr__(self, "env", dict(sorted(self.env.items())))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        seen = set()
        for mount in self.inputs:
            if not isinstance(mount, InputMount):
                raise ProfileError("inputs", "entries must be InputMount")
            if mount.container_path in seen:
                raise ProfileError("inputs", f"{mount.container_path} mounted twice")
            seen.add(mount.container_path)
        if self.workspace is not None:
            if not isinstance(self.workspace, WorkspaceMount):
                raise ProfileError("workspace", "must be a WorkspaceMount or None")
            if WORKSPACE_PATH in seen:
                raise ProfileError("inputs", f"{WORKSPACE_PATH} is the workspace's")
        # A grant is a validated EgressGrant. gVisor is registered without --host-uds, so its
        # sandbox cannot connect to the host-side socket that is the call's way out.
        if self.egress is not None:
            if not isinstance(self.egress, EgressGrant):
                raise ProfileError("egress", "must be an EgressGrant or None")
            if self.runtime == "gvisor":
                raise ProfileError("egress", "egress tools run on runc: gvisor here cannot reach the proxy's socket")

    @property
    def user(self) -> str:
        return f"{self.uid}:{self.gid}"
