"""The sandbox's fixed hardening: the values every call's container is made with.

Fixed here, not in the profile, so no caller can opt out of them. This module only states the
values (no engine client is loaded): ringfence_server.sandbox.host_config turns them and a profile into the
engine's container settings; ringfence_server.sandbox.workspace starts its keeper with the same PID 1.
"""

from __future__ import annotations

from ringfence_server.sandbox.profile import SandboxProfile

# Under gVisor the host's pids cgroup counts the sentry's own tasks, not the tool's. The tool's
# budget is RLIMIT_NPROC inside the sentry (threads included); the host limit bounds the runtime,
# and must leave it room: a sentry that cannot get a thread dies (exit 2, the whole sandbox gone,
# the call `killed` by its runtime: ringfence_server.sandbox.witness). runsc's ptrace platform
# spends host tasks per tool task (an address-space stub per process, a stub thread per sentry
# thread that ran it) and the Go runtime adds threads when the host is busy. Measured on 2 cores,
# sampling the container's pids.current while the battery's probes ran 3 sandboxes at a time:
# 32 tool threads peak at 60 host tasks idle and 145 with both cores busy; 32 tool processes at
# 201-246. The old `pids + 64` (96 for 32) killed
# the sentry of a 32-thread tool about once in ten runs on a busy host. So: eight host tasks per
# tool task plus a base, capped so that one sandbox never holds more host tasks than the largest
# runc budget (pids ≤ 4096) plus the base. Past the cap (pids > 512) a fork bomb can still starve
# the sentry: killed by its runtime, never the tool's error, the host unaffected.
GVISOR_HOST_TASKS_PER_TOOL_TASK = 8
GVISOR_BASE_TASKS = 256
GVISOR_HOST_TASKS_CAP = 4096 + GVISOR_BASE_TASKS


def engine_pids_limit(profile: SandboxProfile) -> int:
    """The pids limit the engine enforces for `profile` (under gVisor, the sentry's: see above)."""
    if profile.runtime == "gvisor":
        return min(profile.pids * GVISOR_HOST_TASKS_PER_TOOL_TASK + GVISOR_BASE_TASKS, GVISOR_HOST_TASKS_CAP)
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

# DNS: a resolver on the sandbox's own loopback where nothing listens. Docker would otherwise
# copy the host's resolv.conf in, and a query name is an exfiltration channel.
DNS = ("127.0.0.1",)


def memory_fs(profile: SandboxProfile) -> str:
    """Options of every writable filesystem: the same byte and inode caps, never exec, setuid or
    device files."""
    return f"rw,noexec,nosuid,nodev,size={profile.tmpfs_bytes},nr_inodes={profile.tmpfs_inodes},mode=1777"


# A read-only, empty tmpfs: what stands where a writable filesystem must not be.
ABSENT_FS = "ro,noexec,nosuid,nodev,size=4k,nr_inodes=1,mode=555"

# The purpose label of a volume the engine made by itself because a call named a workspace
# volume that was removed between our check and the container's creation (a run ending while a
# call of it was dispatched): Docker creates a missing named volume on use. It is made from the
# mount's own options below: an empty, read-only, 4 KiB tmpfs, never an uncapped, exec-able
# directory on the engine's disk; the reaper removes it (ringfence_server.sandbox.reaper).
STRAY_WORKSPACE_PURPOSE = "workspace-stray"
STRAY_VOLUME_OPTIONS = {"type": "tmpfs", "device": "tmpfs",
                        "o": "ro,nosuid,nodev,noexec,size=4k,nr_inodes=1,mode=0555"}
