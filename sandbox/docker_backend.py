"""DockerBackend: one call, one fresh hardened container, one classified result.

The hardening is fixed here, not in the profile, so no caller can opt out of it:
non-root uid:gid, read-only root, every capability dropped, no-new-privileges, our seccomp
profile (Docker's default, tightened), private IPC, tini as PID 1 (inside the image), no network,
no host env, no host mounts but declared read-only inputs, a noexec size-capped /tmp, ulimits.

The call's stdin is written through an attach socket, stdout and stderr are read from the same
socket with byte caps, and the wall time is enforced by killing the container (killing a client
process would leave `setsid` children alive). The container is removed whatever happens.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import inspect
import json
import logging
import math
import os
import queue
import select
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import docker
import docker.errors
import requests
import urllib3.exceptions

# _create_container_args: containers.create's own mapping of its arguments (used by _create);
# private to docker-py, so its stubs do not have it.
from docker.models.containers import Container, _create_container_args  # type: ignore[attr-defined]  # private, so not in the stubs
from docker.types import DriverConfig, LogConfig, Mount, Ulimit

from sandbox import etc_files, launcher, listing, seccomp
from sandbox import labels as L
from sandbox.backend import OutputListener, SandboxRequest
from sandbox.errors import EngineError, ImageError, ProfileError
from sandbox.pool import AttachStream, Demux, PoolSettings, Warm, WarmPool
from sandbox.profile import ENGINE_RUNTIME, WORKSPACE_PATH, SandboxProfile, WorkspaceMount
from sandbox.result import Outcome, SandboxResult, ToolErrorClass, classify_exit, parse_runner_line
from sandbox.witness import InitWitness
from sandbox.workspace import WORKSPACE_LABEL, WORKSPACE_VIEW_SUFFIX

if TYPE_CHECKING:  # imported where used: most runs never start the egress proxy or the reaper
    from sandbox.egress.proxy import CallEgress, EgressProxy, EgressReport, ProxySettings
    from sandbox.images.lock import Lock
    from sandbox.reaper import PeriodicReaper

# The runner (images/tool) exits with this status after writing a structured tool error.
RUNNER_TOOL_ERROR_EXIT = 3
# A warm container's command when the call's command or environment is not known ahead of it:
# it reads one launch line on stdin and execs it (sandbox.launcher).
LAUNCHER_ARGV = ["python3", "-I", "-S", "-B", "-c", inspect.getsource(launcher)]
# How long a warm container may live past its pool's idle limit, for the reaper's deadline label:
# the longest wall time a call may have (SandboxProfile caps timeout_s) and a margin.
_POOL_DEADLINE_MARGIN_S = 3600 + 60
# A pool shape's key: what must be equal for a warm container to serve a call (image ID, runtime,
# hand-over mode, egress or not, digest of the container settings); and its spec: what a
# container of the shape is made from (image ID, the profile without its egress grant, mode,
# egress or not). See DockerBackend._pool_shape.
_ShapeKey = tuple[str, str, str, bool, str]
_ShapeSpec = tuple[str, SandboxProfile, str, bool]
# Receives each egress call's proxy decisions: (request, sandbox.egress.proxy.EgressReport).
EgressReportHook = Callable[[SandboxRequest, "EgressReport"], None]
_STDOUT, _STDERR = 1, 2
_HOSTNAME = etc_files.HOSTNAME
# DNS: a resolver on the sandbox's own loopback where nothing listens. Docker would otherwise
# copy the host's resolv.conf in, and a query name is an exfiltration channel.
_DNS = ["127.0.0.1"]
# Under gVisor the host's pids cgroup counts the sentry's own tasks, not the tool's: about 48
# threads at start, and more for each tool process's address-space stub. The tool's own budget
# is RLIMIT_NPROC inside the sentry (threads included); the host limit bounds the runtime. A
# fork bomb at the tool's budget can still make the sentry's stubs spike past it (measured:
# even a host limit of 640 for 32 tool tasks), and a sentry that cannot get a thread dies
# (exit 2, the whole sandbox gone): the call is then `killed` by its runtime (sandbox.witness),
# never the tool's error, and the host is unaffected.
GVISOR_PIDS_OVERHEAD = 64


def engine_pids_limit(profile: SandboxProfile) -> int:
    """The pids limit the engine enforces for `profile` (see GVISOR_PIDS_OVERHEAD)."""
    if profile.runtime == "gvisor":
        return profile.pids + GVISOR_PIDS_OVERHEAD
    return profile.pids


# Docker 20.10's default masked paths (HostConfig.MaskedPaths replaces the list, so it is
# repeated here) and what else tells a tool about the host: the kernel command line names the
# host's agents and ports; modules, partitions and disk statistics its hardware; DMI the
# machine's vendor. runc binds /dev/null over a masked file and an empty read-only tmpfs over a
# masked directory.
DOCKER_DEFAULT_MASKED_PATHS = (
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
)
HOST_INFO_MASKED_PATHS = (
    "/proc/cmdline", "/proc/bootconfig", "/proc/config.gz", "/proc/modules", "/proc/partitions",
    "/proc/diskstats", "/sys/devices/virtual/dmi",
)
MASKED_PATHS = DOCKER_DEFAULT_MASKED_PATHS + HOST_INFO_MASKED_PATHS

# PID 1. Under runc it is /usr/bin/tini, which the base image ships execute-only (0711, not
# readable by the sandbox user): the kernel makes a process that execs an unreadable binary
# non-dumpable, so /proc/1/mem, maps and environ of PID 1 are out of the tool's reach although
# both run as the same uid. gVisor's loader needs to read the binary, so there it is the
# readable tini-static; gVisor's own /proc refuses PID 1's memory to the tool already.
# `-v` makes tini report how the tool ended, which is how a runtime death is told apart from
# the tool's own exit (see InitWitness).
INIT = {"runc": "/usr/bin/tini", "gvisor": "/usr/bin/tini-static"}
# gVisor exposes /dev/fuse and /dev/net/tun (its own emulations) in every sandbox; runc's /dev
# has neither, so only gVisor needs them hidden.
GVISOR_HIDDEN_DEVICES = ("/dev/fuse",)
GVISOR_HIDDEN_DEVICE_DIRS = ("/dev/net",)


def _memory_fs(profile: SandboxProfile) -> str:
    """Options of every writable filesystem: the same byte and inode caps, never exec, setuid or
    device files."""
    return f"rw,noexec,nosuid,nodev,size={profile.tmpfs_bytes},nr_inodes={profile.tmpfs_inodes},mode=1777"


# A read-only, empty tmpfs: what stands where a writable filesystem must not be.
_ABSENT_FS = "ro,noexec,nosuid,nodev,size=4k,nr_inodes=1,mode=555"

# The purpose label of a volume the engine made by itself because a call named a workspace
# volume that was removed between our check and the container's creation (a run ending while a
# call of it was dispatched): Docker creates a missing named volume on use. It is made from the
# mount's own options below: an empty, read-only, 4 KiB tmpfs, never an uncapped, exec-able
# directory on the engine's disk; the reaper removes it (sandbox.reaper).
STRAY_WORKSPACE_PURPOSE = "workspace-stray"
_STRAY_VOLUME_OPTIONS = {"type": "tmpfs", "device": "tmpfs",
                         "o": "ro,nosuid,nodev,noexec,size=4k,nr_inodes=1,mode=0555"}


def workspace_source(workspace: WorkspaceMount) -> str:
    """The volume a call with `workspace` mounts: the tmpfs itself, or its read-only view
    (sandbox.workspace: why a view and not Docker's read-only flag)."""
    return workspace.volume + WORKSPACE_VIEW_SUFFIX if workspace.read_only else workspace.volume


def workspace_mount(profile: SandboxProfile) -> list[Mount]:
    """The run's workspace at /workspace, or nothing. Read-only through the view volume; the
    container's own read-only flag only under gVisor, where the sentry then refuses writes
    itself (without it the sentry accepted utime and chmod in its cache; the host's file was
    unchanged) and no runc remount can drop the host mount's flags. Under runc the view's host
    mount is read-only, nosuid, nodev, noexec already, and a plain bind keeps all four."""
    workspace = profile.workspace
    if workspace is None:
        return []
    labels = L.base_labels(STRAY_WORKSPACE_PURPOSE)
    return [Mount(target=WORKSPACE_PATH, source=workspace_source(workspace), type="volume",
                  read_only=workspace.read_only and profile.runtime == "gvisor",
                  labels=labels, driver_config=DriverConfig("local", dict(_STRAY_VOLUME_OPTIONS)))]


def host_config_kwargs(profile: SandboxProfile, seccomp_json: str) -> dict[str, Any]:
    """The container settings for `profile`: every hardening point, no switches."""
    gvisor = profile.runtime == "gvisor"
    tmpfs = {
        "/tmp": _memory_fs(profile),
        # Docker's own /dev/shm is 64 MiB whatever the profile says, with no inode cap.
        "/dev/shm": _memory_fs(profile),
        # POSIX message queues: Docker mounts a writable mqueue filesystem here. A tool has no
        # use for queues (our seccomp profile refuses the mq_* calls too), so it goes.
        "/dev/mqueue": _ABSENT_FS,
    }
    if gvisor:
        tmpfs.update({d: _ABSENT_FS for d in GVISOR_HIDDEN_DEVICE_DIRS})
    ulimits = [
        Ulimit(name="nofile", soft=profile.nofile, hard=profile.nofile),
        Ulimit(name="fsize", soft=profile.fsize_bytes, hard=profile.fsize_bytes),
        Ulimit(name="core", soft=0, hard=0),
    ]
    if gvisor:
        # gVisor runs the tool's threads inside its sentry, where the host's pids cgroup does
        # not see them (1,000 threads ran under --pids 32); the sentry enforces RLIMIT_NPROC on
        # every task, threads included. Not under runc: there the limit would count every
        # process of uid 10001 on the host, across all sandboxes.
        ulimits.append(Ulimit(name="nproc", soft=profile.pids, hard=profile.pids))
    return dict(
        user=profile.user,
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges:true", f"seccomp={seccomp_json}"],
        privileged=False,
        ipc_mode="private",
        # A private cgroup namespace: the sandbox sees its own cgroup as the root, not the
        # engine's /docker/<id> path (a host path in mountinfo, case 16).
        cgroupns="private",
        network_mode="none",
        dns=_DNS,
        dns_search=["."],
        hostname=_HOSTNAME,
        mem_limit=profile.memory_bytes,
        memswap_limit=profile.memory_bytes,
        nano_cpus=int(profile.cpus * 1e9),
        pids_limit=engine_pids_limit(profile),
        ulimits=ulimits,
        tmpfs=tmpfs,
        masked_paths=list(MASKED_PATHS),
        mounts=etc_files.mounts()
        + (etc_files.hide(GVISOR_HIDDEN_DEVICES) if gvisor else [])
        + [
            Mount(target=m.container_path, source=m.host_path, type="bind", read_only=True)
            for m in profile.inputs
        ]
        + workspace_mount(profile),
        environment=dict(profile.env),
        working_dir=profile.workdir,
        runtime=ENGINE_RUNTIME[profile.runtime],
        entrypoint=[INIT[profile.runtime], "-v", "--"],
        # Output is read through the attach socket; a log driver would also copy a flood to disk.
        log_config=LogConfig(type=LogConfig.types.NONE),
        init=False,
        stdin_open=True,
        tty=False,
        # detach=False is what makes docker-py set StdinOnce: closing our write half then closes
        # the tool's stdin instead of ending the whole attach session.
        detach=False,
    )


def applied_settings(attrs: dict[str, Any]) -> dict[str, Any]:
    """The hardening as the engine reports it for the created container (`docker inspect`)."""
    host = attrs.get("HostConfig") or {}
    config = attrs.get("Config") or {}
    security_opt = []
    for opt in host.get("SecurityOpt") or []:
        # The seccomp entry holds the whole profile; show which profile instead.
        if opt.startswith("seccomp="):
            body = opt[len("seccomp="):]
            name = "unconfined" if body == "unconfined" else "ringfence-default"
            digest = next(
                (seccomp.profile_digest(rt) for rt in ("runc", "gvisor") if body == seccomp.profile_json(rt)),
                "unknown",
            )
            security_opt.append(f"seccomp={name} ({digest})")
        else:
            security_opt.append(opt)
    return {
        "user": config.get("User"),
        "read_only": host.get("ReadonlyRootfs"),
        "cap_drop": host.get("CapDrop"),
        "cap_add": host.get("CapAdd"),
        "privileged": host.get("Privileged"),
        "security_opt": security_opt,
        "network_mode": host.get("NetworkMode"),
        "ipc_mode": host.get("IpcMode"),
        "cgroupns": host.get("CgroupnsMode"),
        "memory": host.get("Memory"),
        "memory_swap": host.get("MemorySwap"),
        "nano_cpus": host.get("NanoCpus"),
        "pids_limit": host.get("PidsLimit"),
        "tmpfs": host.get("Tmpfs"),
        "masked_paths": host.get("MaskedPaths"),
        "entrypoint": config.get("Entrypoint"),
        "ulimits": [
            {"name": u.get("Name"), "soft": u.get("Soft"), "hard": u.get("Hard")}
            for u in host.get("Ulimits") or []
        ],
        "runtime": host.get("Runtime"),
        "dns": host.get("Dns"),
        "mounts": [
            {"source": m.get("Source"), "target": m.get("Target"), "read_only": bool(m.get("ReadOnly"))}
            for m in host.get("Mounts") or []
        ],
        "env": _redact_proxy_credentials(config.get("Env")),
    }


def _redact_proxy_credentials(env: list[str] | None) -> list[str] | None:
    """The proxy URL in an egress call's env carries the call's password; results and
    events keep the variable (and the user name) but never the password."""
    if not env:
        return env
    out = []
    for item in env:
        name, sep, value = item.partition("=")
        if sep and name.lower() in ("http_proxy", "https_proxy", "all_proxy") and "@" in value:
            scheme, _, rest = value.partition("://")
            userinfo, _, hostport = rest.rpartition("@")
            value = f"{scheme}://{userinfo.split(':', 1)[0]}:***@{hostport}"
        out.append(f"{name}{sep}{value}")
    return out


# What docker-py raises, and what it lets through unwrapped when the engine's connection
# breaks (requests' and urllib3's errors, socket errors): all of it is the engine's failure.
log = logging.getLogger("ringfence.sandbox.docker")

ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException,
                 urllib3.exceptions.HTTPError, OSError)


@dataclass
class _Progress:
    """How far one call got: once its start request is issued, the tool may have run; a
    `killed_reason` says we killed it on purpose (cancel, run deadline), not the kernel."""

    start_issued: bool = False
    killed_reason: str | None = None

    def killed(self) -> bool:
        """Whether a kill came: kill_run and kill_all set `killed_reason` from other threads."""
        return self.killed_reason is not None


@dataclass
class _Streams:
    """Output read so far, capped. PID 1's own lines are taken out of stdout first (tini writes
    its reports there; they are not the tool's output and do not count against its cap)."""

    stdout_limit: int
    stderr_limit: int
    stdout: bytearray
    stderr: bytearray
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    witness: InitWitness = dataclasses.field(default_factory=InitWitness)
    on_output: OutputListener | None = None
    """Told each piece kept, as it is kept (SandboxRequest.on_output); dropped after it raises."""

    def add(self, stream: int, data: bytes) -> bool:
        """Keep what fits; return True when a cap was exceeded."""
        if stream == _STDERR:
            room = self.stderr_limit - len(self.stderr)
            kept = data[: max(room, 0)]
            self.stderr += kept
            if len(data) > room:
                self.stderr_truncated = True
            self._tell("stderr", kept)
        else:
            self._keep_stdout(self.witness.feed(data))
        return self.stdout_truncated or self.stderr_truncated

    def finish(self) -> None:
        """The container is gone: what the witness still held back is the tool's stdout."""
        self._keep_stdout(self.witness.finish())

    def _keep_stdout(self, data: bytes) -> None:
        room = self.stdout_limit - len(self.stdout)
        kept = data[: max(room, 0)]
        self.stdout += kept
        if len(data) > room:
            self.stdout_truncated = True
        self._tell("stdout", kept)

    def _tell(self, name: str, kept: bytes) -> None:
        """Pass exactly the kept bytes on. The listener runs on the call's reading thread: one
        that raises is the caller's bug, and must not end (or misclassify) the call, so it is
        logged once and not called again; the result still holds every byte."""
        if not kept or self.on_output is None:
            return
        try:
            self.on_output(name, kept)
        except Exception:  # noqa: BLE001 - any error of the caller's listener; logged once
            log.warning("the output listener raised; it gets no more of this call's output", exc_info=True)
            self.on_output = None


class _Demuxer:
    """Splits Docker's multiplexed attach stream (8-byte headers) into (stream, bytes) frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        frames = []
        while len(self._buf) >= 8:
            stream, size = self._buf[0], struct.unpack(">I", self._buf[4:8])[0]
            if len(self._buf) < 8 + size:
                # Hand over a partial frame's payload now so a frame larger than the cap is
                # seen (and cut) without buffering all of it.
                if len(self._buf) > 8:
                    payload = bytes(self._buf[8:])
                    frames.append((stream, payload))
                    self._buf = bytearray(self._buf[:8])
                    struct.pack_into(">I", self._buf, 4, size - len(payload))
                break
            frames.append((stream, bytes(self._buf[8 : 8 + size])))
            del self._buf[: 8 + size]
        return frames


class DockerBackend:
    """Runs each request in a fresh container on the local engine."""

    def __init__(self, client: docker.DockerClient | None = None, *, lock: Lock | None = None,
                 egress_proxy: EgressProxy | None = None, on_egress_report: EgressReportHook | None = None,
                 egress_settings: ProxySettings | None = None, pool: PoolSettings | None = None) -> None:
        try:
            # max_pool_size: every concurrent call talks to the engine; past docker-py's default
            # of 10 connections per URL, urllib3 drops connections, and docker-py's per-URL pool
            # cache can close a pool another thread is using (seen at 20 concurrent calls).
            self._client = client or docker.from_env(timeout=60, max_pool_size=64)
            self._client.ping()
        except docker.errors.DockerException as e:
            raise EngineError(f"cannot reach the Docker engine: {e}") from e
        # Every container is made with our seccomp profile, derived from Docker's default: without
        # that file nothing can run, so say so now, not as each call's transient failure.
        seccomp.profile_json("runc")
        self._lock = lock
        self._runtimes: set[str] | None = None
        # run id -> {container id: progress} of the calls running now (for kill_run).
        self._inflight: dict[str, dict[str, _Progress]] = {}
        self._inflight_mutex = threading.Lock()
        self._reaper: PeriodicReaper | None = None
        self._stopping: str | None = None
        self._image_cmds: dict[str, list[str]] = {}
        # The egress proxy (sandbox.egress.proxy.EgressProxy) for
        # calls whose profile has an egress grant; created on first use unless one is given.
        # `on_egress_report(request, EgressReport)` receives each call's proxy decisions.
        self._egress_proxy = egress_proxy
        self._owns_egress_proxy = egress_proxy is None
        # ProxySettings for the proxy this backend starts itself (e.g. the operator's services).
        self._egress_settings = egress_settings
        self._egress_mutex = threading.Lock()
        self._on_egress_report = on_egress_report
        # Warm containers (sandbox.pool): None unless asked for, and never for size 0.
        self.pool: WarmPool[_ShapeKey, _ShapeSpec] | None = None
        self._shape_digests: dict[str, str] = {}
        # Warm containers are removed after their call off its critical path (drained on close).
        self._removals: queue.SimpleQueue[Container | None] = queue.SimpleQueue()
        self._remover: threading.Thread | None = None
        if pool is not None and pool.size > 0:
            self.pool = WarmPool(pool, shape=self._pool_shape, make=self._make_warm, discard=self._discard_warm,
                                 alive=self._warm_alive, busy=self._busy)

    @property
    def client(self) -> docker.DockerClient:
        return self._client

    @property
    def egress_proxy(self) -> EgressProxy | None:
        """The egress proxy in use (started on the first egress call), or None."""
        return self._egress_proxy

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()  # before the proxy: warm egress containers hold its directories
        if self._remover is not None:
            self._removals.put(None)
            self._remover.join(60)
            self._remover = None
        if self._reaper is not None:
            self._reaper.stop()
            self._reaper = None
        if self._owns_egress_proxy and self._egress_proxy is not None:
            self._egress_proxy.close()
            self._egress_proxy = None
        self._client.close()

    def _egress(self) -> EgressProxy:
        """The egress proxy, started on the first egress call (most runs never need one)."""
        with self._egress_mutex:
            if self._egress_proxy is None:
                from sandbox.egress.proxy import EgressProxy

                self._egress_proxy = EgressProxy(self._client, lock=self._lock, settings=self._egress_settings)
            return self._egress_proxy

    def _apply_egress(self, settings: dict[str, Any], call: CallEgress) -> dict[str, Any]:
        """An egress call's sandbox keeps network_mode none (only lo): a Docker network of its
        own would bring the engine's embedded resolver (127.0.0.11, which answers container
        names and forwards the rest), a gateway, and a network to create per call. Its one way
        out is its own socket directory (sandbox.egress.proxy.CallEgress), bind-mounted
        read-only; the relay (sandbox.egress.relay, put in front of the command by `_run`) runs
        after the init and before the tool, and the environment names it as the HTTP proxy, with
        the call's credentials. Tests
        subclass this to remove one protection and show what it stops."""
        settings = dict(settings)
        settings["mounts"] = list(settings.get("mounts") or []) + [call.mount()]
        settings["environment"] = {**dict(settings.get("environment") or {}), **dict(call.env)}
        return settings

    def runtimes(self) -> set[str]:
        if self._runtimes is None:
            self._runtimes = set((self._client.info().get("Runtimes") or {}).keys())
        return self._runtimes

    def _image_id(self, name: str) -> str:
        from sandbox.images import load_lock, resolve_pinned  # the lock lives with the builder

        if self._lock is None:
            # Read once, on first dispatch (not at construction: a backend may exist before
            # `make images`). A server keeps trusting the lock it started with.
            self._lock = load_lock()
        return resolve_pinned(self._client, name, self._lock)

    def run(self, request: SandboxRequest) -> SandboxResult:
        reports: list[EgressReport] = []
        try:
            result = self._run(request, reports)
        except ENGINE_ERRORS as e:
            # Before any container existed (the image look-up, the runtime list): the engine's
            # failure, raised as the sandbox layer's own error so callers can classify it.
            raise EngineError(f"the Docker engine failed: {type(e).__name__}: {e}") from e
        if reports and reports[0].events:
            # The proxy's decisions arrive when the call's credentials are revoked, after the
            # container is gone: they become part of the call's result.
            result = dataclasses.replace(result, egress_events=tuple(reports[0].events))
        return result

    def _run(self, request: SandboxRequest, reports: list[EgressReport]) -> SandboxResult:
        profile = request.profile
        image_id = self._image_id(profile.image)
        if profile.runtime == "gvisor" and "runsc" not in self.runtimes():
            raise ProfileError("runtime", "the engine has no runsc runtime (run `make gvisor`)")
        if self.pool is not None and self._stopping is None:
            shaped = self._pool_shape(request, image_id)
            warm = self.pool.claim(request, shaped) if shaped is not None else None
            if warm is not None:
                return self._run_warm(warm, request, reports)
        name = f"rf-{request.run_id[:24]}-{request.call_id[:24]}-{uuid.uuid4().hex[:6]}".replace(":", "_")
        container_labels = L.base_labels("call", deadline_s=profile.timeout_s + 60)
        container_labels.update({L.RUN_LABEL: request.run_id, L.CALL_LABEL: request.call_id})
        kwargs = self._container_settings(profile)
        started = time.monotonic()
        container: Container | None = None
        progress = _Progress()
        egress_call: CallEgress | None = None  # the call's socket and credentials at the proxy, while it runs
        try:
            if profile.egress is not None:
                if profile.runtime != "runc":
                    # runsc is registered with --network=none and without --host-uds: a gVisor
                    # sandbox could not connect to the call's socket.
                    raise ProfileError("egress", "egress tools run on runc only")
                from sandbox.egress.channel import EgressError

                try:
                    egress_call = self._egress().open_call(request.call_id, profile.egress)
                except EgressError as e:
                    return self._start_failed(profile, image_id, started, f"egress: {e}")
                kwargs = self._apply_egress(kwargs, egress_call)
            if profile.workspace is not None:
                missing = self._workspace_missing(profile.workspace)
                if missing:
                    return self._start_failed(profile, image_id, started, missing)
            command = list(request.argv) or self._default_command(image_id)
            if egress_call is not None:
                # The init's child is the relay, which execs the command: the tool keeps that
                # process, so its pid, streams and exit status are its own. (In the command, not
                # the entrypoint: `applied` reports the entrypoint, and need not carry the
                # relay's source in every result.)
                command = egress_call.relay_argv() + command
            try:
                container = self._create(
                    image_id,
                    command=command,
                    name=name,
                    labels=container_labels,
                    **kwargs,
                )
            except docker.errors.ImageNotFound as e:
                raise ImageError(f"pinned image {image_id} vanished from the engine: {e}") from e
            except docker.errors.APIError as e:
                return self._start_failed(profile, image_id, started, f"create failed: {e}")
            applied = applied_settings(container.attrs)
            self._track(request.run_id, _container_id(container), progress)
            return self._attach_and_run(container, request, image_id, applied, started, progress)
        except ENGINE_ERRORS as e:
            if progress.start_issued:
                # The start request went out: the tool may be running or may have run, and its
                # effect may have happened. Never `start_failed` (which is retried).
                return self._failed(Outcome.UNCERTAIN, profile, image_id, started,
                                    f"engine error after the tool could have started: {type(e).__name__}: {e}")
            return self._start_failed(profile, image_id, started, f"engine error: {type(e).__name__}: {e}")
        finally:
            if container is not None:
                self._untrack(request.run_id, _container_id(container))
                self._remove(container)
            if egress_call is not None:
                self._close_egress(request, egress_call, reports)

    def _workspace_missing(self, workspace: WorkspaceMount) -> str | None:
        """Why the call's workspace cannot be mounted, or None. Docker would create a named
        volume that does not exist: the run's workspace is gone (its run ended), or was never
        made, and the call must not run with another filesystem at /workspace."""
        source = workspace_source(workspace)
        try:
            labels = self._client.volumes.get(source).attrs.get("Labels") or {}
        except docker.errors.NotFound:
            return f"workspace volume {source} does not exist (the run's workspace is gone)"
        if WORKSPACE_LABEL not in labels:
            return f"volume {source} is not a ringfence workspace"
        return None

    def _track(self, run_id: str, container_id: str, progress: _Progress) -> None:
        """A call's container, running now: kill_run and kill_all find it here."""
        with self._inflight_mutex:
            self._inflight.setdefault(run_id, {})[container_id] = progress
            if self._stopping is not None:
                progress.killed_reason = self._stopping

    def _untrack(self, run_id: str, container_id: str) -> None:
        with self._inflight_mutex:
            calls = self._inflight.get(run_id, {})
            calls.pop(container_id, None)
            if not calls:
                self._inflight.pop(run_id, None)

    def _close_egress(self, request: SandboxRequest, egress_call: CallEgress, reports: list[EgressReport]) -> None:
        """After the container is gone: revoke the credentials, close the call's socket, remove
        its directory, and collect the proxy's decisions."""
        report = self._egress().close_call(egress_call)
        reports.append(report)
        if self._on_egress_report is not None:
            self._on_egress_report(request, report)

    # -- warm containers (sandbox.pool) ------------------------------------------------------

    def _busy(self) -> bool:
        """Live calls first: the pool refills while fewer calls run than there are CPUs."""
        with self._inflight_mutex:
            running = sum(len(calls) for calls in self._inflight.values())
        return running >= (os.cpu_count() or 1)

    def _pool_shape(self, request: SandboxRequest, image_id: str | None = None) -> tuple[_ShapeKey, _ShapeSpec] | None:
        """The request's pool key and what a container of that shape is made from: everything
        fixed at creation (image, runtime, the full container settings of the profile without
        its per-call egress grant), and how the call is handed over (the runner reading its
        request, or the launcher for a command or credentials known only at the claim)."""
        profile = request.profile
        # A workspace is fixed at creation (the run's volume), and a container made ahead of
        # its call cannot know which run it will serve: calls with one always go cold.
        if not request.warm or profile.workspace is not None or (profile.egress is not None
                                                                 and profile.runtime != "runc"):
            return None
        image_id = image_id or self._image_id(profile.image)
        base = dataclasses.replace(profile, egress=None)
        mode = "runner" if not request.argv and profile.egress is None else "launcher"
        egress = profile.egress is not None
        spec: _ShapeSpec = (image_id, base, mode, egress)
        # The settings' digest per shape, computed once (serialising them is not free per call).
        memo = repr(base)  # the profile holds dicts: not hashable, but its repr is exact
        fingerprint = self._shape_digests.get(memo)
        if fingerprint is None:
            settings = json.dumps(self._container_settings(base), sort_keys=True, default=repr)
            fingerprint = hashlib.sha256(settings.encode()).hexdigest()
            if len(self._shape_digests) < 256:
                self._shape_digests[memo] = fingerprint
        return (image_id, profile.runtime, mode, egress, fingerprint), spec

    def _make_warm(self, key: _ShapeKey, spec: _ShapeSpec) -> Warm:
        """Create, attach and start one container of the shape: the same settings as a cold
        call's (one code path, _container_settings), blocked reading its stdin."""
        image_id, base, mode, egress = spec
        kwargs = self._container_settings(base)
        reserved = None
        if egress:
            from sandbox.egress.proxy import egress_mount

            reserved = self._egress().reserve_call_dir()
            kwargs = {**kwargs, "mounts": list(kwargs.get("mounts") or []) + [egress_mount(reserved[1])]}
        command = self._default_command(image_id) if mode == "runner" else LAUNCHER_ARGV
        assert self.pool is not None
        labels = L.base_labels("pool", deadline_s=self.pool.settings.idle_s + _POOL_DEADLINE_MARGIN_S)
        container: Container | None = None
        try:
            container = self._create(image_id, command=command, name=f"rf-warm-{uuid.uuid4().hex[:12]}",
                                     labels=labels, **kwargs)
            applied = applied_settings(container.attrs)
            attach, sock = self._attach(container)
            try:
                container.start()
            except BaseException:
                self._close_attach(attach, sock)
                raise
        except BaseException:
            if container is not None:
                self._remove(container)
            if reserved is not None:
                self._egress().release_call_dir(reserved[1])
            raise
        return Warm(key, container, attach, sock, applied, image_id,
                    extra={"mode": mode, "egress_dir": reserved, "demux": _Demuxer(), "early": []})

    def _discard_warm(self, warm: Warm) -> None:
        self._close_attach(warm.attach, warm.sock)
        self._remove(warm.container)
        reserved = warm.extra.get("egress_dir")
        if reserved is not None:
            self._egress().release_call_dir(reserved[1])

    @staticmethod
    def _warm_alive(warm: Warm) -> bool:
        """Still blocked on its stdin: its stream has not ended. What it wrote meanwhile (the
        init's report of its child) is kept for the call's streams, in order."""
        sock = warm.sock
        try:
            sock.setblocking(False)
            while select.select([sock], [], [], 0)[0]:
                data = sock.recv(65536)
                if not data:
                    return False
                warm.extra["early"].extend(warm.extra["demux"].feed(data))
        except BlockingIOError:
            return True
        except (OSError, ValueError):
            return False
        return True

    def _rename(self, container: Container, name: str) -> None:
        try:
            container.rename(name)
        except ENGINE_ERRORS:
            pass  # it ended already; this instance still kills it by id while it runs

    def _remove_later(self, container: Container) -> None:
        """Remove an ended call's container on the remover thread (close() waits for it)."""
        with self._inflight_mutex:
            if self._remover is None:
                self._remover = threading.Thread(target=self._remove_queued, name="rf-remover", daemon=True)
                self._remover.start()
        self._removals.put(container)

    def _remove_queued(self) -> None:
        while (container := self._removals.get()) is not None:
            # This thread serves every removal of the backend's life: an unexpected error on
            # one container must not end it (seen: requests iterating os.environ while a test
            # changed it raised KeyError, and every later container stayed behind).
            for attempt in (1, 2):
                try:
                    self._remove(container)
                    break
                except Exception:  # the reaper removes it later by label if both attempts fail
                    log.warning("removing container %s failed (attempt %d)", container.id, attempt,
                                exc_info=True)

    def _remove(self, container: Container) -> None:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except ENGINE_ERRORS:
            pass  # the reaper removes it later by label

    def _run_warm(self, warm: Warm, request: SandboxRequest, reports: list[EgressReport]) -> SandboxResult:
        """The call in a container that was started before it: bound to the call now (its
        name, its egress credentials, its command when it is not the runner), then the same
        pump, wait and classification as a cold call, the wall time counted from here."""
        profile = request.profile
        started = time.monotonic()
        container = warm.container
        progress = _Progress()
        egress_call: CallEgress | None = None
        registered = False
        try:
            env: dict[str, str] = {}
            if profile.egress is not None:
                from sandbox.egress.channel import EgressError

                try:
                    egress_call = self._egress().open_call(request.call_id, profile.egress,
                                                           reserved=warm.extra["egress_dir"])
                except EgressError as e:
                    return self._start_failed(profile, warm.image_id, started, f"egress: {e}")
                finally:
                    warm.extra["egress_dir"] = None  # the call's now: close_call removes it
                env = dict(egress_call.env)
            if warm.extra["mode"] == "launcher":
                command = list(request.argv) or self._default_command(warm.image_id)
                if egress_call is not None:
                    command = egress_call.relay_argv() + command
                payload = json.dumps({"argv": command, "env": env}).encode() + b"\n" + request.stdin
            else:
                payload = request.stdin
            # Labels are fixed at creation; the name is not: it says whose call this is, so that
            # kill_run finds it from any instance (_claimed_name). Renamed while the request goes
            # in (not before: a round trip less on the call's path); this instance kills it by id
            # meanwhile, another instance finds it once the rename is done (milliseconds).
            renaming = threading.Thread(target=self._rename, args=(container, _claimed_name(request)), daemon=True)
            renaming.start()
            self._track(request.run_id, _container_id(container), progress)
            registered = True
            streams = _Streams(profile.stdout_limit, profile.stderr_limit, bytearray(), bytearray(),
                           on_output=request.on_output)
            for stream, data in warm.extra["early"]:
                streams.add(stream, data)
            try:
                if progress.killed_reason is not None:
                    return self._failed(Outcome.KILLED, profile, warm.image_id, started,
                                        f"not started: {progress.killed_reason}")
                progress.start_issued = True  # the request's first byte may reach the tool now
                run_started = time.monotonic()
                deadline = run_started + profile.timeout_s
                killed_for = self._pump(warm.sock, payload, streams, deadline, warm.extra["demux"])
            finally:
                self._close_attach(warm.attach, warm.sock)
                renaming.join()
            return self._conclude(container, request, warm.image_id, warm.applied, started, run_started, deadline,
                                  progress, streams, killed_for)
        except ENGINE_ERRORS as e:
            if progress.start_issued:
                return self._failed(Outcome.UNCERTAIN, profile, warm.image_id, started,
                                    f"engine error after the tool could have started: {type(e).__name__}: {e}")
            return self._start_failed(profile, warm.image_id, started, f"engine error: {type(e).__name__}: {e}")
        finally:
            if registered:
                self._untrack(request.run_id, _container_id(container))
            self._close_attach(warm.attach, warm.sock)
            self._remove_later(container)
            reserved = warm.extra.get("egress_dir")
            if reserved is not None:
                self._egress().release_call_dir(reserved[1])
            if egress_call is not None:
                self._close_egress(request, egress_call, reports)

    def ping(self) -> None:
        """Raise EngineError unless the engine answers /_ping within a few seconds (the client's
        own timeout is 60 s, far too long for a health check)."""
        api = self._client.api
        try:
            # The versioned URL docker-py's own ping() asks (APIClient._url), with a timeout of its own.
            response = api.get(f"{api.base_url}/v{api.api_version}/_ping", timeout=5)
            response.raise_for_status()
        except ENGINE_ERRORS as e:
            raise EngineError(f"the Docker engine does not answer: {type(e).__name__}: {e}") from e

    def kill_all(self, reason: str) -> int:
        """Kill every container this backend has running (a SIGTERM to the CLI or the server):
        nothing of ours may outlive us with nobody enforcing its wall time. Each call ends
        `killed` with `reason`; the calls' own code then removes the containers."""
        with self._inflight_mutex:
            self._stopping = reason  # and nothing starts from now on
            targets = [(cid, p) for calls in self._inflight.values() for cid, p in calls.items()]
        killed = 0
        for container_id, progress in targets:
            progress.killed_reason = reason
            try:
                self._client.api.kill(container_id)
                killed += 1
            except ENGINE_ERRORS:
                pass  # it exited meanwhile
        return killed

    def start_reaper(self, interval_s: float = 30.0) -> None:
        """Reap orphans now (a killed predecessor's containers) and then every `interval_s`
        (containers past their deadline label), until close()."""
        from sandbox.reaper import PeriodicReaper

        if self._reaper is None:
            self._reaper = PeriodicReaper(self._client, interval_s)
            self._reaper.start()

    def kill_run(self, run_id: str, reason: str) -> int:
        """Kill the run's containers now, ours and any other instance's (by label). Ours end
        `killed` with `reason`; the kill is the engine's, so setsid children die too."""
        with self._inflight_mutex:
            for progress in self._inflight.get(run_id, {}).values():
                progress.killed_reason = reason
        killed = 0
        try:
            found = listing.containers(self._client, {"label": f"{L.RUN_LABEL}={run_id}"}, stopped=False)
            # Warm containers were created before their calls: their names say whose call they run.
            prefix = _claimed_prefix(run_id)
            found += [c for c in listing.containers(self._client, {"name": prefix}, stopped=False)
                      if (c.name or "").startswith(prefix)]
        except ENGINE_ERRORS as e:
            raise EngineError(f"cannot list the run's containers: {e}") from e
        for container in found:
            try:
                container.kill()
                killed += 1
            except ENGINE_ERRORS:
                pass  # it exited meanwhile
        return killed

    def _default_command(self, image_id: str) -> list[str]:
        """The image's own Cmd: our entrypoint (tini with its flags) replaces the image's, and
        the engine then drops the image's Cmd too, so a request without argv names it."""
        if image_id not in self._image_cmds:
            config = self._client.images.get(image_id).attrs.get("Config") or {}  # the image's inspect
            self._image_cmds[image_id] = list(config.get("Cmd") or [])
        return self._image_cmds[image_id]

    def _create(self, image_id: str, **kwargs: Any) -> Container:
        """containers.create, plus the settings docker-py has no argument for (MaskedPaths)."""
        masked_paths = kwargs.pop("masked_paths", None)
        kwargs.update(image=image_id, version=self._client.api.api_version)
        create_kwargs = _create_container_args(kwargs)
        if masked_paths is not None:
            create_kwargs["host_config"]["MaskedPaths"] = list(masked_paths)
        created = self._client.api.create_container(**create_kwargs)
        try:
            return self._client.containers.get(created["Id"])
        except BaseException:
            # Created but not ours to hold: never left behind because its inspect failed.
            try:
                self._client.api.remove_container(created["Id"], force=True)
            except ENGINE_ERRORS:
                pass  # the reaper removes it by label
            raise

    def _container_settings(self, profile: SandboxProfile) -> dict[str, Any]:
        # One place for the settings, so the escape battery can subclass and remove exactly one
        # protection to prove that its attack then succeeds. Nothing outside tests overrides it.
        return host_config_kwargs(profile, seccomp.profile_json(profile.runtime))

    def _start_failed(self, profile: SandboxProfile, image_id: str, started: float, message: str) -> SandboxResult:
        return self._failed(Outcome.START_FAILED, profile, image_id, started, message)

    @staticmethod
    def _failed(outcome: Outcome, profile: SandboxProfile, image_id: str, started: float,
                message: str) -> SandboxResult:
        return SandboxResult(
            outcome=outcome,
            exit_code=None,
            stdout=b"",
            stderr=b"",
            stdout_truncated=False,
            stderr_truncated=False,
            duration_ms=int((time.monotonic() - started) * 1000),
            image_id=image_id,
            runtime=profile.runtime,
            message=message,
        )

    def _attach(self, container: Container) -> tuple[AttachStream, socket.socket]:
        attach = self._client.api.attach_socket(
            _container_id(container), params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        )
        # docker-py's SocketIO over the engine's socket: the socket itself is its `_sock`.
        sock: socket.socket = getattr(attach, "_sock", attach)
        return attach, sock

    @staticmethod
    def _close_attach(attach: AttachStream, sock: socket.socket) -> None:
        # Close before killing: the engine will not finish a kill while its copy of the
        # container's output is blocked on a socket nobody reads any more.
        # shutdown, not only close: the HTTP response object still holds the fd open.
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            attach.close()
            sock.close()
        except OSError:
            pass

    def _attach_and_run(
        self, container: Container, request: SandboxRequest, image_id: str, applied: dict[str, Any], started: float,
        progress: _Progress,
    ) -> SandboxResult:
        profile = request.profile
        attach, sock = self._attach(container)
        streams = _Streams(profile.stdout_limit, profile.stderr_limit, bytearray(), bytearray(),
                           on_output=request.on_output)
        killed_for: Outcome | None = None
        try:
            if progress.killed_reason is not None:
                return self._failed(Outcome.KILLED, profile, image_id, started,
                                    f"not started: {progress.killed_reason}")
            progress.start_issued = True
            try:
                container.start()
            except docker.errors.APIError as e:
                # The engine answered that it could not start the container: nothing ran.
                return self._start_failed(profile, image_id, started, f"start failed: {e}")
            if progress.killed():
                self._kill(container)  # a kill_all that came between the check and the start
            run_started = time.monotonic()
            deadline = run_started + profile.timeout_s
            killed_for = self._pump(sock, request.stdin, streams, deadline, _Demuxer())
        finally:
            self._close_attach(attach, sock)
        return self._conclude(container, request, image_id, applied, started, run_started, deadline, progress,
                              streams, killed_for)

    def _conclude(self, container: Container, request: SandboxRequest, image_id: str, applied: dict[str, Any],
                  started: float,
                  run_started: float, deadline: float, progress: _Progress, streams: _Streams,
                  killed_for: Outcome | None) -> SandboxResult:
        """After the tool's streams ended (or it was cut): its exit, classified."""
        profile = request.profile
        if killed_for is None and progress.killed_reason is not None:
            killed_for = Outcome.KILLED  # we killed it (its 137 is not the OOM killer's)
        if killed_for is not None:
            self._kill(container)
        remaining = max(deadline - time.monotonic(), 0) + 10
        try:
            status = container.wait(timeout=remaining)
            exit_code = status.get("StatusCode")
        except Exception:  # the engine did not report an exit within the deadline
            self._kill(container)
            killed_for = killed_for or Outcome.TIMEOUT
            exit_code = None
        duration_ms = int((time.monotonic() - run_started) * 1000)
        container.reload()
        state = container.attrs.get("State") or {}
        if exit_code is None:
            exit_code = state.get("ExitCode")
        streams.finish()
        tool_ended = self._tool_ended(streams.witness)
        oom_killed = bool(state.get("OOMKilled"))
        if exit_code == 137 and killed_for is None and not oom_killed and not tool_ended:
            # SIGKILL from neither us nor (by its report) the OOM killer's usual victim: under
            # gVisor the OOM killer can take the whole sentry, and the engine then logs its
            # `oom` event after `die` without setting State.OOMKilled (seen 1 in 30 warm
            # calls). An outside kill (`docker kill`, another instance's kill_run) logs `kill`.
            oom_killed = engine_reported_oom(self._client, container.id or "", started)
        outcome = classify_exit(
            exit_code=exit_code, killed_for=killed_for, oom_killed=oom_killed, tool_ended=tool_ended,
        )
        error_class, message, retry_after = None, "", None
        if outcome is Outcome.KILLED and progress.killed_reason is not None:
            message = f"container killed: {progress.killed_reason}"
        elif outcome is Outcome.KILLED and not tool_ended:
            message = (f"the sandbox ended with status {exit_code} before its init reported the tool's "
                       f"end: the {profile.runtime} runtime (or an outside kill) stopped it, not the tool")
        elif outcome is Outcome.TOOL_ERROR:
            error_class, message, retry_after = _tool_error(request, exit_code, bytes(streams.stdout))
        elif outcome is Outcome.OOM:
            message = f"memory limit of {profile.memory_bytes} bytes reached"
        elif outcome is Outcome.TIMEOUT:
            message = f"wall time of {profile.timeout_s}s reached; container killed"
        elif outcome is Outcome.OUTPUT_LIMIT:
            message = "output cap reached; container killed"
        return SandboxResult(
            outcome=outcome,
            exit_code=exit_code,
            stdout=bytes(streams.stdout),
            stderr=bytes(streams.stderr),
            stdout_truncated=streams.stdout_truncated,
            stderr_truncated=streams.stderr_truncated,
            duration_ms=duration_ms,
            image_id=image_id,
            runtime=profile.runtime,
            error_class=error_class,
            message=message,
            retry_after_s=retry_after,
            container_name=container.name or "",  # docker-py types it optional; a created container has one
            applied=applied,
            setup_ms=int((run_started - started) * 1000),
        )

    @staticmethod
    def _tool_ended(witness: InitWitness) -> bool:
        # One place, so the battery's red check can show what happens when it is not asked.
        return witness.tool_ended

    @staticmethod
    def _pump(sock: socket.socket, stdin: bytes, streams: _Streams, deadline: float,
              demux: Demux) -> Outcome | None:
        """Write stdin and read output until EOF, the deadline, or a cap. Returns why we must
        kill the container, or None when it ended on its own."""
        sock.setblocking(False)
        pending = memoryview(stdin)
        if not pending:
            sock.shutdown(socket.SHUT_WR)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return Outcome.TIMEOUT
            want_write = [sock] if pending else []
            readable, writable, _ = select.select([sock], want_write, [], min(left, 1.0))
            if writable and pending:
                try:
                    sent = sock.send(pending[:65536])
                    pending = pending[sent:]
                except BlockingIOError:
                    pass
                except OSError as e:  # the tool closed stdin without reading it all
                    if e.errno not in (errno.EPIPE, errno.ECONNRESET):
                        raise
                    pending = memoryview(b"")
                if not pending:
                    try:
                        sock.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
            if readable:
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except ConnectionResetError:
                    return None
                if not data:
                    return None
                for stream, payload in demux.feed(data):
                    if streams.add(stream, payload):
                        return Outcome.OUTPUT_LIMIT

    @staticmethod
    def _kill(container: Container) -> None:
        try:
            container.kill()
        except docker.errors.APIError:
            pass  # already exited


# How long an unexplained SIGKILL waits for the engine's account of it: the `oom` event follows
# `die` by a few milliseconds; an outside kill's `kill` event precedes it.
_KILL_ACCOUNT_WAIT_S = 2.0


def oom_in_events(actions: list[str]) -> bool | None:
    """What the engine's events of one container say about a SIGKILL: True (the OOM killer),
    False (someone killed it through the engine), None (nothing yet)."""
    if "kill" in actions:
        return False
    if "oom" in actions:
        return True
    return None


def engine_reported_oom(client: docker.DockerClient, container_id: str, since_monotonic: float,
                        *, wait_s: float = _KILL_ACCOUNT_WAIT_S) -> bool:
    """Whether the engine logged an `oom` (and no `kill`) for the container since the call began.
    Asked only for an unexplained exit 137, so the wait costs nothing on the usual paths."""
    since = int(time.time() - (time.monotonic() - since_monotonic)) - 1
    give_up = time.monotonic() + wait_s
    while True:
        try:
            # `until` as a fractional string: an int would cut off this second's events, and a
            # later one would hold the stream open until then. The stubs say int; the API
            # takes Docker's "seconds.fraction" form.
            now = cast(int, f"{time.time():.6f}")
            events = client.events(since=since, until=now, decode=True,
                                   filters={"container": container_id, "event": ["oom", "kill"]})
            verdict = oom_in_events([str(e.get("Action") or e.get("status") or "") for e in events])
        except (docker.errors.APIError, requests.exceptions.RequestException):
            return False  # no account from the engine: the kill stays unexplained (`killed`)
        if verdict is not None or time.monotonic() >= give_up:
            return bool(verdict)
        time.sleep(0.05)


def _claimed_prefix(run_id: str) -> str:
    """The name prefix of a warm container claimed by one of `run_id`'s calls: a digest of the
    whole run id (a container name cannot hold every character a run id may, and a prefix of
    the id could match another run)."""
    return f"rf-w-{hashlib.sha256(run_id.encode()).hexdigest()[:24]}-"


def _claimed_name(request: SandboxRequest) -> str:
    return _claimed_prefix(request.run_id) + uuid.uuid4().hex[:12]


def _container_id(container: Container) -> str:
    """docker-py types Model.id as optional (it reads attrs["Id"]); a container the engine
    created and inspected always has one."""
    container_id = container.id
    assert container_id is not None, "the engine described a container without an Id"
    return container_id


def _tool_error(request: SandboxRequest, exit_code: int | None,
                stdout: bytes) -> tuple[ToolErrorClass, str, float | None]:
    """The tool's own classified error when the runner reported one; otherwise `fatal`."""
    if not request.argv and exit_code == RUNNER_TOOL_ERROR_EXIT:
        try:
            line = stdout.strip().splitlines()[-1]
            body = parse_runner_line(line)  # strict: a NaN here would reach the log as the retry hint
            error = body["error"]
            cls = ToolErrorClass(error["class"])
            retry_after = error.get("retry_after_s")
            hint = float(retry_after) if retry_after is not None else None
            if hint is not None and not math.isfinite(hint):  # float("nan") takes the string too
                raise ValueError(f"retry_after_s {retry_after!r} is not a finite number")
            return cls, str(error.get("message", "")), hint
        except (ValueError, KeyError, IndexError, TypeError):
            return ToolErrorClass.FATAL, "runner reported an error it could not describe", None
    return ToolErrorClass.FATAL, f"exited with status {exit_code}", None
