"""A run's workspace: files that persist across the run's calls, never processes.

Every call still runs in a fresh, single-use container; a workspace is a Docker volume of type
tmpfs (capped in bytes and inodes; nosuid, nodev, noexec; owned by the sandbox user, mode 0700)
that the calls of one run mount at /workspace. Docker unmounts a tmpfs volume, and so loses its
files, when the last container using it stops, so each workspace has a *keeper*: a minimal,
hardened container (no network, no capabilities, read-only root, a few MiB, nothing but a
sleeping PID 1) whose only job is to hold the volume mounted for the run's lifetime.

Names are derived from the run's store key, so every instance on the same engine finds the same
workspace (a run continued by another instance after a crash keeps its files); the volume and
its keeper carry the product labels, the run key and the tenant, so a workspace whose run ended
or vanished is found and removed by `reap` (the server runs it at start-up and on a timer).

The control plane decides who may use a workspace; this module only makes, finds and removes
them. `WorkspaceStore` is the seam: `DockerWorkspaces` is the real one, `sandbox.fake` has an
in-memory one for control-flow unit tests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sandbox.errors import ProfileError
from sandbox.profile import KiB, MiB

WORKSPACE_LABEL = "ringfence.workspace"  # the run key whose workspace a volume or keeper is
TENANT_LABEL = "ringfence.tenant"

MIN_BYTES = 64 * KiB
MAX_BYTES = 4096 * MiB
MIN_INODES = 16
MAX_INODES = 1_000_000


@dataclass(frozen=True)
class WorkspaceSpec:
    """The caps of one workspace (the control plane holds them to its configured maximums)."""

    bytes: int = 64 * MiB
    """Bytes of file data the workspace may hold; past it a write fails with ENOSPC."""
    inodes: int = 4096
    """Files and directories it may hold; past it creating one fails with ENOSPC."""

    def __post_init__(self) -> None:
        for name, low, high in (("bytes", MIN_BYTES, MAX_BYTES), ("inodes", MIN_INODES, MAX_INODES)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ProfileError(f"workspace.{name}", f"{value!r} is outside [{low}, {high}]")


@dataclass(frozen=True)
class WorkspaceInfo:
    """A workspace as found on the engine."""

    run_key: str
    tenant: str
    volume: str
    keeper_running: bool


def volume_name(run_key: str) -> str:
    """The volume of `run_key`'s workspace: the same on every instance, safe as a Docker name
    whatever the key holds (a key may contain `/`)."""
    return "rf-ws-" + hashlib.sha256(run_key.encode()).hexdigest()[:32]


@runtime_checkable
class WorkspaceStore(Protocol):
    def create(self, run_key: str, tenant: str, spec: WorkspaceSpec) -> str:
        """Make the run's workspace (volume and keeper) and return the volume's name. Idempotent:
        an existing workspace of the run is returned as it is (a retried StartRun, recovery)."""
        ...

    def remove(self, run_key: str) -> bool:
        """Remove the keeper and the volume (with every file); False when there was none."""
        ...

    def find(self, run_key: str) -> WorkspaceInfo | None:
        """The run's workspace, or None."""
        ...

    def list(self) -> list[WorkspaceInfo]:
        """Every workspace on the engine (of any instance)."""
        ...

    def reap(self, keep: Callable[[WorkspaceInfo], bool]) -> int:
        """Remove every workspace for which `keep` says False (its run ended or is unknown);
        returns how many were removed."""
        ...
