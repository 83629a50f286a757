"""The engine's settings for one call's container, and the same settings read back.

`host_config_kwargs` turns a profile and the fixed hardening (ringfence_server.sandbox.hardening) into the
arguments docker-py creates a container from; `applied_settings` reads what the engine reports
it applied (`docker inspect`), which every result carries. No switches: every hardening point
is always on.
"""

from __future__ import annotations

from typing import Any

from docker.types import DriverConfig, LogConfig, Mount, Ulimit

from ringfence_server.sandbox import etc_files, seccomp
from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.hardening import (
    ABSENT_FS,
    DNS,
    GVISOR_HIDDEN_DEVICE_DIRS,
    GVISOR_HIDDEN_DEVICES,
    INIT,
    MASKED_PATHS,
    STRAY_VOLUME_OPTIONS,
    STRAY_WORKSPACE_PURPOSE,
    engine_pids_limit,
    memory_fs,
)
from ringfence_server.sandbox.profile import ENGINE_RUNTIME, WORKSPACE_PATH, SandboxProfile, WorkspaceMount
from ringfence_server.sandbox.workspace import WORKSPACE_VIEW_SUFFIX


def workspace_source(workspace: WorkspaceMount) -> str:
    """The volume a call with `workspace` mounts: the tmpfs itself, or its read-only view
    (ringfence_server.sandbox.workspace: why a view and not Docker's read-only flag)."""
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
                  labels=labels, driver_config=DriverConfig("local", dict(STRAY_VOLUME_OPTIONS)))]


def host_config_kwargs(profile: SandboxProfile, seccomp_json: str) -> dict[str, Any]:
    """The container settings for `profile`: every hardening point, no switches."""
    gvisor = profile.runtime == "gvisor"
    tmpfs = {
        "/tmp": memory_fs(profile),
        # Docker's own /dev/shm is 64 MiB whatever the profile says, with no inode cap.
        "/dev/shm": memory_fs(profile),
        # POSIX message queues: Docker mounts a writable mqueue filesystem here. A tool has no
        # use for queues (our seccomp profile refuses the mq_* calls too), so it goes.
        "/dev/mqueue": ABSENT_FS,
    }
    if gvisor:
        tmpfs.update({d: ABSENT_FS for d in GVISOR_HIDDEN_DEVICE_DIRS})
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
        dns=list(DNS),
        dns_search=["."],
        hostname=etc_files.HOSTNAME,
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

