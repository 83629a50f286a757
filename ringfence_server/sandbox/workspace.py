"""A run's workspace: files that persist across the run's calls, never processes.

Every call still runs in a fresh, single-use container; a workspace is a Docker volume of type
tmpfs (capped in bytes and inodes; nosuid, nodev, noexec; owned by the sandbox user, mode 0700)
that the calls of one run mount at /workspace. Docker unmounts a tmpfs volume, and so loses its
files, when the last container using it stops, so each workspace has a *keeper*: a minimal,
hardened container (no network, no capabilities, read-only root, a few MiB, nothing but a
sleeping PID 1) whose only job is to hold the volume mounted for the run's lifetime.

Names are derived from the deployment's scope and the run's store key, so every instance of one
deployment on the same engine finds the same workspace (a run continued by another instance
after a crash keeps its files), while two deployments on one engine (two stores, each with its
own run X of tenant A) never share, find or remove each other's. The volume and its keeper carry
the product labels, the scope, the run key and the tenant; every lookup, removal and reap checks
the scope and the run key on the object itself (a name is only a digest), and a workspace whose
run ended or vanished is found and removed by `reap` (the server runs it at start-up and on a
timer).

The control plane decides who may use a workspace; this module only makes, finds and removes
them. `WorkspaceStore` is the seam: `DockerWorkspaces` is the real one, `ringfence_server.sandbox.fake` has an
in-memory one for control-flow unit tests.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox import listing, seccomp
from ringfence_server.sandbox.errors import EngineError, ProfileError
from ringfence_server.sandbox.hardening import INIT
from ringfence_server.sandbox.pinned_images import Lock as ImageLock
from ringfence_server.sandbox.pinned_images import resolve_pinned
from ringfence_server.sandbox.profile import WORKSPACE_PATH, KiB, MiB

if TYPE_CHECKING:
    # The engine's client library is imported where DockerWorkspaces uses it: the constants and
    # values above are imported by the control plane's config, which must not load docker.
    import docker
    from docker.models.containers import Container
    from docker.models.volumes import Volume


log = logging.getLogger("ringfence.sandbox.workspace")

WORKSPACE_LABEL = "ringfence.workspace"  # the run key whose workspace a volume or keeper is
TENANT_LABEL = "ringfence.tenant"
SCOPE_LABEL = "ringfence.workspace-scope"  # the deployment a workspace belongs to (DockerWorkspaces)

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


def _digest(run_key: str, scope: str | None) -> str:
    # JSON keeps the two apart whatever either holds (no separator a key could forge); an
    # unscoped store keeps the digest of the key alone.
    text = run_key if scope is None else json.dumps([scope, run_key])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def volume_name(run_key: str, scope: str | None = None) -> str:
    """The volume of `run_key`'s workspace in the deployment `scope` (DockerWorkspaces): the
    same on every instance of that deployment, another in every other deployment, and safe as
    a Docker name whatever the key holds (a key may contain `/`)."""
    return "rf-ws-" + _digest(run_key, scope)


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


# -- the Docker implementation ------------------------------------------------------------------

SANDBOX_UID = SANDBOX_GID = 10001  # the image's `sandbox` user, who owns every workspace
PURPOSE_VOLUME = "workspace"
PURPOSE_VIEW = "workspace-view"
PURPOSE_KEEPER = "workspace-keeper"
KEEPER_PREFIX = "rf-wskeeper-"
# A workspace is two volumes: the run's capped tmpfs, which `workspace: write` calls mount, and
# a read-only *view* of it (this suffix), which `read` calls mount: the local driver binds the
# tmpfs's host mount point `bind,ro,nosuid,nodev,noexec`. Not the tmpfs with Docker's
# read-only flag: runc makes a bind read-only by remounting it (MS_REMOUNT|MS_BIND|MS_RDONLY)
# without the flags the bind inherited, so a read-only workspace lost nosuid, nodev and noexec
# and a binary an earlier call wrote there ran (runc 1.1.5; runc#1247; battery case 48).
WORKSPACE_VIEW_SUFFIX = "-ro"
# The keeper holds a mount and sleeps: a few MiB and pids are plenty, and its CPU share is a
# sliver (it never wakes). Files written to the workspace are charged to the calls that wrote
# them, not to the keeper.
KEEPER_MEMORY = 16 * MiB
KEEPER_PIDS = 8
KEEPER_NANO_CPUS = 50_000_000
KEEPER_ARGV = ["sleep", "infinity"]
# How long remove() waits for calls still using the volume to be gone (a run's calls are
# killed before its workspace is removed; their containers take a moment to go).
_IN_USE_WAIT_S = 10.0


def keeper_name(run_key: str, scope: str | None = None) -> str:
    """The keeper container of `run_key`'s workspace (the same digest as its volume)."""
    return KEEPER_PREFIX + _digest(run_key, scope)


def view_name(run_key: str, scope: str | None = None) -> str:
    """The read-only view of `run_key`'s workspace."""
    return volume_name(run_key, scope) + WORKSPACE_VIEW_SUFFIX


def volume_options(spec: WorkspaceSpec) -> dict[str, str]:
    """The local driver's options of a workspace volume: a tmpfs capped in bytes and inodes,
    never exec, setuid or device files, owned by the sandbox user and closed to everyone else."""
    return {
        "type": "tmpfs",
        "device": "tmpfs",
        "o": (f"size={spec.bytes},nr_inodes={spec.inodes},nosuid,nodev,noexec,"
              f"uid={SANDBOX_UID},gid={SANDBOX_GID},mode=0700"),
    }


def view_options(mountpoint: str) -> dict[str, str]:
    """The local driver's options of the read-only view: a bind of the workspace's host mount
    point, read-only, nosuid, nodev, noexec (the driver binds, then remounts with all four)."""
    return {"type": "none", "device": mountpoint, "o": "bind,ro,nosuid,nodev,noexec"}


def _engine_errors() -> tuple[type[BaseException], ...]:
    # Imported here, as docker itself is in this module: loading ringfence_server.sandbox.engine loads the
    # engine's client library, which the control plane's config must not.
    from ringfence_server.sandbox.engine import ENGINE_ERRORS

    return ENGINE_ERRORS


class DockerWorkspaces:
    """Workspaces on the local engine: per run a capped tmpfs volume, its read-only view, and a
    keeper container that holds the volume mounted (this module's docstring). Every engine
    failure is an EngineError; an object of the same name that is not the run's, ProfileError."""

    def __init__(self, client: docker.DockerClient, lock: ImageLock, *, scope: str | None = None) -> None:
        """`scope`: the deployment whose workspaces these are (e.g. a digest of its store's
        address): part of every name, labelled on every object made, and checked on every object
        found, removed, listed or reaped. Two deployments with different stores on one engine
        may each have a run of the same key (tenant A's run X); without a scope they would share
        its workspace, and each would remove or reap the other's. Without one (tests, the
        escape battery) the store sees only unscoped workspaces."""
        self._client = client
        self._lock = lock
        self._scope = scope
        self._errors = _engine_errors()

    # -- the protocol ----------------------------------------------------------------------

    def create(self, run_key: str, tenant: str, spec: WorkspaceSpec) -> str:
        name = volume_name(run_key, self._scope)
        try:
            volume, made = self._volume(name, run_key, tenant, self._volume_options(spec), PURPOSE_VOLUME)
            try:
                self._ensure_keeper(run_key, tenant, volume)
                # After the keeper: the view binds whatever is mounted at the volume's host
                # mount point when a call mounts it; that is the tmpfs while the keeper holds it.
                self._volume(view_name(run_key, self._scope), run_key, tenant,
                             view_options(str(volume.attrs["Mountpoint"])), PURPOSE_VIEW)
            except BaseException:
                if made:  # ours alone: never leave half a workspace behind (a retry makes it whole)
                    self._remove_all(run_key)
                raise
        except self._errors as e:
            raise EngineError(f"cannot create the workspace of run {run_key!r}: {type(e).__name__}: {e}") from e
        return name

    def remove(self, run_key: str) -> bool:
        try:
            return self._remove_all(run_key)
        except self._errors as e:
            raise EngineError(f"cannot remove the workspace of run {run_key!r}: {type(e).__name__}: {e}") from e

    def find(self, run_key: str) -> WorkspaceInfo | None:
        import docker.errors

        try:
            name = volume_name(run_key, self._scope)
            try:
                volume = self._client.volumes.get(name)
            except docker.errors.NotFound:
                return None
            labels = volume.attrs.get("Labels") or {}
            if not self._ours(labels, run_key):
                return None  # not this run's of this deployment (the name is only a digest)
            return WorkspaceInfo(run_key, labels.get(TENANT_LABEL, ""), name, self._keeper_running(run_key))
        except self._errors as e:
            raise EngineError(f"cannot look up the workspace of run {run_key!r}: {type(e).__name__}: {e}") from e

    def list(self) -> list[WorkspaceInfo]:
        """Every workspace on the engine: a run key with a volume, a view or a keeper (a crash
        can leave any part without the others; reap removes all of them)."""
        wanted = [f"{L.PRODUCT_LABEL}={L.PRODUCT}", WORKSPACE_LABEL]
        if self._scope is not None:
            wanted.append(f"{SCOPE_LABEL}={self._scope}")
        session = os.environ.get(L.TEST_SESSION_ENV)
        if session:
            # A test session's servers (each with a store of its own) reap only the session's
            # workspaces, never those of another session sharing the engine.
            wanted.append(f"{L.TEST_SESSION_LABEL}={session}")
        selector: dict[str, Any] = {"label": wanted}
        try:
            volumes = listing.volumes(self._client, selector)
            keepers = listing.containers(self._client, selector)
        except self._errors as e:
            raise EngineError(f"cannot list workspaces: {type(e).__name__}: {e}") from e
        tenants: dict[str, str] = {}
        names: dict[str, str] = {}  # the volume as found (one an earlier version named is found too)
        running: set[str] = set()
        for volume in volumes:
            labels = volume.attrs.get("Labels") or {}
            key = labels[WORKSPACE_LABEL]
            if not self._ours(labels, key):  # the filter's job too; an unscoped store sees only the unscoped
                continue
            tenants.setdefault(key, labels.get(TENANT_LABEL, ""))
            if labels.get(L.PURPOSE_LABEL) == PURPOSE_VOLUME:
                names[key] = str(volume.name)
        for keeper in keepers:
            key = keeper.labels[WORKSPACE_LABEL]
            if not self._ours(keeper.labels, key):
                continue
            tenants.setdefault(key, keeper.labels.get(TENANT_LABEL, ""))
            if keeper.status == "running":
                running.add(key)
        return [WorkspaceInfo(key, tenant, names.get(key, volume_name(key, self._scope)), key in running)
                for key, tenant in sorted(tenants.items())]

    def reap(self, keep: Callable[[WorkspaceInfo], bool]) -> int:
        removed = 0
        for info in self.list():
            if keep(info):
                continue
            try:
                if self._remove_all(info.run_key):
                    removed += 1
            except self._errors as e:  # one stuck workspace must not keep the others
                log.warning("could not reap the workspace of run %r: %s: %s", info.run_key, type(e).__name__, e)
        return removed

    # -- internals ---------------------------------------------------------------------------

    def _volume_options(self, spec: WorkspaceSpec) -> dict[str, str]:
        # One place, so the escape battery can remove exactly one option and show what it stops.
        return volume_options(spec)

    def _ours(self, labels: dict[str, str], run_key: str) -> bool:
        """Whether an object with these labels is `run_key`'s workspace in this store's scope
        (names are digests: the labels hold the key and the scope themselves)."""
        return labels.get(WORKSPACE_LABEL) == run_key and labels.get(SCOPE_LABEL) == self._scope

    def _labels(self, run_key: str, tenant: str, purpose: str) -> dict[str, str]:
        # No run label (ringfence_server.sandbox.labels.RUN_LABEL): kill_run kills a run's calls, never the
        # keeper of its workspace.
        labels = {**L.base_labels(purpose), WORKSPACE_LABEL: run_key, TENANT_LABEL: tenant}
        if self._scope is not None:
            labels[SCOPE_LABEL] = self._scope
        return labels

    def _volume(self, name: str, run_key: str, tenant: str, options: dict[str, str],
                purpose: str) -> tuple[Volume, bool]:
        """The named volume, made now if missing; and whether it was made now. One that exists
        must be this run's: the name is a digest of the key, the label the key itself."""
        import docker.errors

        made = False
        try:
            volume = self._client.volumes.get(name)
        except docker.errors.NotFound:
            try:
                volume = self._client.volumes.create(name=name, driver="local", driver_opts=options,
                                                     labels=self._labels(run_key, tenant, purpose))
                made = True
            except docker.errors.APIError:
                volume = self._client.volumes.get(name)  # another instance made it meanwhile
        labels = volume.attrs.get("Labels") or {}
        if not self._ours(labels, run_key) or labels.get(TENANT_LABEL) != tenant:
            raise ProfileError("workspace", f"volume {name} exists and is not run {run_key!r}'s of tenant {tenant!r} "
                                            "in this deployment")
        return volume, made

    def _keeper_running(self, run_key: str) -> bool:
        import docker.errors

        try:
            keeper = self._client.containers.get(keeper_name(run_key, self._scope))
        except docker.errors.NotFound:
            return False
        return self._ours(keeper.labels, run_key) and keeper.status == "running"

    def _ensure_keeper(self, run_key: str, tenant: str, volume: Volume) -> None:
        """The run's keeper, running: started again when it stopped, made anew when it cannot
        be started or does not exist."""
        import docker.errors

        name = keeper_name(run_key, self._scope)
        for _ in range(3):  # bounded: each round ends with a running keeper or a change seen
            try:
                keeper: Container | None = self._client.containers.get(name)
            except docker.errors.NotFound:
                keeper = None
            if keeper is not None:
                if not self._ours(keeper.labels, run_key):
                    raise ProfileError("workspace", f"container {name} exists and is not run {run_key!r}'s keeper "
                                                    "in this deployment")
                if keeper.status == "running":
                    return
                try:
                    keeper.start()
                    return
                except docker.errors.APIError as e:
                    log.warning("the workspace keeper %s did not start again (%s); making a new one", name, e)
                    self._remove_container(keeper)
                    continue
            try:
                keeper = self._client.containers.create(**self._keeper_settings(run_key, tenant, volume))
            except docker.errors.APIError as e:
                if e.status_code == 409:
                    continue  # another instance made it meanwhile: use theirs
                raise
            try:
                keeper.start()
            except BaseException:
                self._remove_container(keeper)
                raise
            return
        raise EngineError(f"the workspace keeper {name} does not stay up")

    def _keeper_settings(self, run_key: str, tenant: str, volume: Volume) -> dict[str, Any]:
        """A container that holds the volume mounted and does nothing else: the tool image
        (pinned), runc, the sandbox user, read-only root, no capabilities, no-new-privileges,
        our seccomp profile, no network, a few MiB and pids, no log; tini as PID 1 (the way the
        backend starts it: execute-only in the image, so not even the calls' uid can read the
        keeper's memory), whose child sleeps forever."""
        from docker.types import DriverConfig, LogConfig, Mount, Ulimit

        # The volume's own options and labels on the mount: were it removed between our look
        # and this create (a racing remove), the engine would make it again from these, capped,
        # never as an uncapped directory on its disk.
        mount = Mount(target=WORKSPACE_PATH, source=str(volume.name), type="volume",
                      labels=self._labels(run_key, tenant, PURPOSE_VOLUME),
                      driver_config=DriverConfig("local", dict(volume.attrs.get("Options") or {})))
        return dict(
            image=resolve_pinned(self._client, "tool", self._lock),
            name=keeper_name(run_key, self._scope),
            labels=self._labels(run_key, tenant, PURPOSE_KEEPER),
            entrypoint=[INIT["runc"], "--"],
            command=list(KEEPER_ARGV),
            runtime="runc",
            user=f"{SANDBOX_UID}:{SANDBOX_GID}",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true", f"seccomp={seccomp.profile_json('runc')}"],
            privileged=False,
            network_mode="none",
            ipc_mode="private",
            cgroupns="private",
            mem_limit=KEEPER_MEMORY,
            memswap_limit=KEEPER_MEMORY,
            pids_limit=KEEPER_PIDS,
            nano_cpus=KEEPER_NANO_CPUS,
            ulimits=[Ulimit(name="core", soft=0, hard=0), Ulimit(name="nofile", soft=64, hard=64)],
            log_config=LogConfig(type=LogConfig.types.NONE),
            mounts=[mount],
            working_dir="/",
            init=False,
        )

    def _remove_all(self, run_key: str) -> bool:
        """Keeper, view, volume, in that order (a volume in use cannot be removed)."""
        import docker.errors

        # A scoped store also removes what an earlier version named by the key alone (it carried
        # the scope label already, so `_ours` tells it apart): a run that spanned the upgrade
        # still leaves nothing behind.
        scopes = [self._scope] if self._scope is None else [self._scope, None]
        found = False
        for scope in scopes:
            try:
                keeper = self._client.containers.get(keeper_name(run_key, scope))
                if self._ours(keeper.labels, run_key):  # never another deployment's or run's
                    self._remove_container(keeper)
                    found = True
            except docker.errors.NotFound:
                pass
        for scope in scopes:
            for name in (view_name(run_key, scope), volume_name(run_key, scope)):
                found = self._remove_volume(name, run_key) or found
        return found

    def _remove_volume(self, name: str, run_key: str) -> bool:
        import docker.errors

        give_up = time.monotonic() + _IN_USE_WAIT_S
        while True:
            try:
                volume = self._client.volumes.get(name)
                if not self._ours(volume.attrs.get("Labels") or {}, run_key):
                    return False  # not this run's of this deployment: never remove another's
                volume.remove()
                return True
            except docker.errors.NotFound:
                return False
            except docker.errors.APIError as e:
                # 409: a call's container still uses it (it is being killed and removed).
                if e.status_code != 409 or time.monotonic() >= give_up:
                    raise
                time.sleep(0.2)

    @staticmethod
    def _remove_container(container: Container) -> None:
        import docker.errors

        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)
