"""Escape battery, Posture 5-11: namespaces, mounts, cgroups, /proc/sys, masked /proc, /sys.

Every attack runs inside the real sandbox through the `attack` fixture; each red check removes
the protection its case covers and shows the same probe then succeeds. No host-wide knob is
ever written: core_pattern, release_agent and the /sys files are only *opened* for writing,
which proves the write would be possible without performing it. The only writes a red check
makes land in the container's own cgroup (a child cgroup created and removed again, a
devices.allow entry for /dev/null) and die with it.

Several red checks use `probes.as_root("SYS_ADMIN")` (uid 0 plus exactly CAP_SYS_ADMIN, still
no other capability, seccomp still on): it is the narrowest setting that takes away what holds
these cases (a non-root uid with no capability), far narrower than privileged=True.

Red checks run under runc only: each removes an engine or host-kernel protection (a
capability, the seccomp profile, a namespace, a mount flag) that gVisor does not rely on in
the same way (its sentry is the boundary), so under gVisor they would prove nothing about our
settings. The green tests run under both runtimes.
"""

from __future__ import annotations

import probes
import pytest
from weaken import without_security_opt

pytestmark = pytest.mark.docker

ROOT_WITH_SYS_ADMIN = probes.as_root("SYS_ADMIN")


# ---- case 5: new namespaces fail ---------------------------------------------------------------


def test_case_05_no_new_namespaces(attack, runtime):
    p = probes.report(attack(probes.argv("unshare"), runtime=runtime))
    assert probes.errnos(p["unshare"]) == {
        n: "EPERM" for n in ("user", "mnt", "net", "pid", "ipc", "uts", "cgroup")
    }
    assert p["unshare_cmd"]["rc"] == 1
    assert "Operation not permitted" in p["unshare_cmd"]["err"]


def test_case_05_red_seccomp_unconfined(weakened):
    """Docker's profile only allows unshare with CAP_SYS_ADMIN; with seccomp=unconfined an
    unprivileged user namespace is created and `unshare -Ur id -u` prints 0."""
    p = probes.report(weakened(without_security_opt("seccomp"))(probes.argv("unshare")))
    assert p["unshare"]["user"] == {"ret": 0, "errno": None}
    assert (p["unshare_cmd"]["rc"], p["unshare_cmd"]["out"].strip()) == (0, "0")


# ---- case 6: mount fails -------------------------------------------------------------------------


def test_case_06_mount_fails(attack, runtime):
    p = probes.report(attack(probes.argv("mount"), runtime=runtime))
    assert probes.errnos({k: p[k] for k in ("tmpfs", "proc", "sysfs", "cgroup")}) == {
        "tmpfs": "EPERM", "proc": "EPERM", "sysfs": "EPERM", "cgroup": "EPERM",
    }
    assert p["mount_cmd"]["rc"] == 32 and "must be superuser" in p["mount_cmd"]["err"]


def test_case_06_red_root_with_sys_admin(weakened):
    """uid 0 with CAP_SYS_ADMIN mounts all four (inside the container's own mount namespace)."""
    p = probes.report(weakened(ROOT_WITH_SYS_ADMIN)(probes.argv("mount")))
    assert probes.errnos({k: p[k] for k in ("tmpfs", "proc", "sysfs", "cgroup")}) == {
        "tmpfs": "ok", "proc": "ok", "sysfs": "ok", "cgroup": "ok",
    }
    assert p["mount_cmd"]["rc"] == 0


# ---- case 7: release_agent, child cgroups (CVE-2022-0492) ------------------------------------


def test_case_07_cgroup_release_agent(attack, runtime):
    p = probes.report(attack(probes.argv("cgroups"), runtime=runtime))
    assert p["release_agents"] == {}  # no release_agent is visible at all
    assert p["fresh_hierarchy"] == {"mounted": False, "errno": "EPERM"}
    if runtime == "runc":
        assert p["controllers"] == ["blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids",
                                    "systemd"]
        assert set(probes.errnos(p["mkdir"]).values()) == {"EROFS"}
        assert all(p["readonly"].values())
        assert probes.errnos(p["remount"]) == {"memory": "EPERM", "devices": "EPERM"}
        assert probes.errnos(p["mkdir_after_remount"]) == {"memory": "EROFS"}
    else:
        # gVisor: no cgroupfs is mounted at all, and the sentry's cgroups are its own.
        assert p["controllers"] == [] and p["mkdir"] == {}


def test_case_07_red_root_with_sys_admin(weakened):
    """With uid 0 + CAP_SYS_ADMIN and the host's cgroup namespace, the attacker remounts its
    cgroup read-write and creates a child (removed again by the probe), and a freshly mounted
    hierarchy exposes the host root's release_agent, openable for writing: the CVE-2022-0492
    escape, stopped one write short. (Our private cgroup namespace alone already hides the
    root's release_agent from a fresh mount; the non-root uid and the dropped capability stop
    the mount itself.)"""
    change = lambda s: {**ROOT_WITH_SYS_ADMIN(s), "cgroupns": "host"}  # noqa: E731 - a one-line helper reads better as a lambda here
    p = probes.report(weakened(change)(probes.argv("cgroups")))
    assert probes.errnos(p["remount"]) == {"memory": "ok", "devices": "ok"}
    assert probes.errnos(p["mkdir_after_remount"]) == {"memory": "ok"}
    fresh = p["fresh_hierarchy"]
    assert fresh["mounted"] is True and fresh["release_agents"] == ["/mnt/release_agent"]
    assert probes.errnos(fresh["open_for_write"]) == {"/mnt/release_agent": "ok"}


# ---- case 8: devices.allow ----------------------------------------------------------------------


def test_case_08_devices_allow(attack, runtime):
    p = probes.report(attack(probes.argv("cgroups"), runtime=runtime))
    if runtime == "runc":
        # 0200 root:root on a read-only mount: the uid check answers first.
        assert probes.errnos({"direct": p["devices_allow"], "after": p["devices_allow_after_remount"]}) == {
            "direct": "EACCES", "after": "EACCES",
        }
        assert p["readonly"]["devices"] is True
    else:
        assert probes.errnos({"direct": p["devices_allow"]}) == {"direct": "ENOENT"}  # no cgroupfs in gVisor


def test_case_08_red_root_with_sys_admin(weakened):
    """uid 0 alone still hits the read-only mount (EROFS); with CAP_SYS_ADMIN it remounts and
    writes devices.allow (an entry for /dev/null, which the container already has)."""
    p = probes.report(weakened(ROOT_WITH_SYS_ADMIN)(probes.argv("cgroups")))
    assert probes.errnos({"direct": p["devices_allow"], "after": p["devices_allow_after_remount"]}) == {
        "direct": "EROFS", "after": "ok",
    }


# ---- case 9: /proc/sys writes ---------------------------------------------------------------------

PROC_SYS = ["/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe",
            "/proc/sys/fs/binfmt_misc/register", "/proc/sys/fs/suid_dumpable"]


def test_case_09_proc_sys_unwritable(attack, runtime):
    p = probes.report(attack(probes.argv("procsys"), runtime=runtime))
    # This kernel has no modules (no kernel/modprobe) and binfmt_misc is not mounted: those two
    # are absent. The two that exist are refused to the sandbox uid.
    expected = {t: ("EACCES" if p["exists"][t] else "ENOENT") for t in PROC_SYS}
    assert probes.errnos(p["open_for_write"]) == expected
    assert probes.errnos(p["after_unmask"]["open_for_write"]) == expected
    assert p["after_unmask"]["umount"] == {"ok": False, "errno": "EPERM"}
    if runtime == "runc":
        assert p["exists"]["/proc/sys/kernel/core_pattern"] and p["exists"]["/proc/sys/fs/suid_dumpable"]
        assert p["readonly"] is True


def test_case_09_red_root_with_sys_admin(weakened):
    """Two layers hold /proc/sys: the uid (EACCES) and Docker's read-only bind over /proc/sys.
    uid 0 alone still meets EROFS; with CAP_SYS_ADMIN it peels the bind off and core_pattern and
    suid_dumpable open for writing (nothing is written)."""
    p = probes.report(weakened(ROOT_WITH_SYS_ADMIN)(probes.argv("procsys")))
    direct = probes.errnos(p["open_for_write"])
    assert direct["/proc/sys/kernel/core_pattern"] == direct["/proc/sys/fs/suid_dumpable"] == "EROFS"
    assert p["after_unmask"]["umount"]["ok"] is True
    after = probes.errnos(p["after_unmask"]["open_for_write"])
    assert after["/proc/sys/kernel/core_pattern"] == after["/proc/sys/fs/suid_dumpable"] == "ok"


# ---- case 10: sysrq-trigger, kcore, kallsyms, sched_debug, dmesg ------------------------------------


def test_case_10_proc_masked(attack, runtime):
    p = probes.report(attack(probes.argv("procmask"), runtime=runtime))
    # This kernel has no /proc/sysrq-trigger, kcore or sched_debug (Docker masks them only where
    # they exist); each must be absent or masked, never readable.
    assert probes.errnos({"sysrq": p["sysrq_trigger"]}) == {"sysrq": "ENOENT"}
    for path, seen in p["masked"].items():
        assert (not seen["exists"]) or seen.get("chr_null") or seen.get("entries") == [], (path, seen)
        if seen.get("chr_null"):
            assert seen["size_read"] == 0, path
    for path in ("/proc/timer_list", "/proc/keys"):
        assert p["after_unmask"][path]["umount"] == {"ok": False, "errno": "EPERM"}
    if runtime == "runc":
        assert p["masked"]["/proc/timer_list"]["chr_null"] and p["masked"]["/proc/keys"]["chr_null"]
        assert p["kallsyms"] == {"lines": 200, "nonzero": 0}  # addresses zeroed without CAP_SYSLOG
        assert p["dmesg"] == {"ret": -1, "errno": "EPERM"}
        assert p["dmesg_cmd_rc"] == 1
    else:
        # gVisor has no kallsyms, and its syslog(2) is the sentry's own synthetic log, not the
        # host kernel's: the fail-closed property is that no host kernel line is readable.
        assert p["kallsyms"] == {"errno": "ENOENT"}
        # With --oci-seccomp our profile applies inside gVisor too: syslog(2) is refused.
        assert p["dmesg"] == {"ret": -1, "errno": "EPERM"}


def test_case_10_red_unmasked_proc(weakened):
    """With CAP_SYS_ADMIN (uid 0) the /dev/null masks come off: /proc/timer_list shows the host's
    timers and /proc/keys the kernel's keyrings."""
    p = probes.report(weakened(ROOT_WITH_SYS_ADMIN)(probes.argv("procmask")))
    timers = p["after_unmask"]["/proc/timer_list"]
    assert timers["umount"]["ok"] is True
    assert timers["after"]["chr_null"] is False and timers["after"]["first_line"].startswith("Timer List Version")
    assert p["after_unmask"]["/proc/keys"]["after"]["size_read"] > 0


def test_case_10_red_with_cap_syslog(weakened):
    """With CAP_SYSLOG (uid 0) kallsyms shows real kernel addresses and dmesg reads the host
    kernel's log (only its length is reported)."""
    p = probes.report(weakened(probes.as_root("SYSLOG"))(probes.argv("procmask")))
    assert p["kallsyms"]["nonzero"] == p["kallsyms"]["lines"] == 200
    assert p["dmesg"]["ret"] > 0 and p["dmesg"]["gvisor_banner"] is False
    assert p["dmesg_cmd_rc"] == 0


# ---- case 11: /sys writes -----------------------------------------------------------------------------

SYS_FILES = ["/sys/kernel/uevent_helper", "/sys/kernel/mm/transparent_hugepage/enabled",
             "/sys/kernel/profiling", "/sys/class/net/lo/mtu"]


def test_case_11_sys_unwritable(attack, runtime):
    p = probes.report(attack(probes.argv("sysfs"), runtime=runtime))
    assert p["remount_rw"] == {"ok": False, "errno": "EPERM"}
    assert probes.errnos({"mkdir": p["mkdir_security"]}) == {"mkdir": "ENOENT"}  # securityfs not mounted
    if runtime == "runc":
        # uevent_helper does not exist on this kernel (CONFIG_UEVENT_HELPER=n).
        expected = {t: ("EROFS" if p["exists"][t] else "ENOENT") for t in SYS_FILES}
        assert p["exists"]["/sys/kernel/mm/transparent_hugepage/enabled"] and p["exists"]["/sys/class/net/lo/mtu"]
        assert p["readonly"] is True
    else:
        # gVisor's /sys is a small synthetic tree: none of these files exist to be written.
        expected = {t: "ENOENT" for t in SYS_FILES}
    assert probes.errnos(p["open_for_write"]) == expected
    assert probes.errnos(p["open_for_write_after_remount"]) == expected


def test_case_11_red_root_with_sys_admin(weakened):
    """With uid 0 + CAP_SYS_ADMIN, /sys is remounted read-write and its files open for writing
    (the container's own netns sysfs instance; nothing is written)."""
    p = probes.report(weakened(ROOT_WITH_SYS_ADMIN)(probes.argv("sysfs")))
    assert p["remount_rw"]["ok"] is True
    after = probes.errnos(p["open_for_write_after_remount"])
    assert after["/sys/kernel/mm/transparent_hugepage/enabled"] == "ok"
    assert after["/sys/class/net/lo/mtu"] == "ok"
