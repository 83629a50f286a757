# Case 11: writes under /sys. Files are only opened for writing, never written. The attacker's
# next step when that fails with EROFS (remounting /sys read-write) is tried too.
MS_REMOUNT, MS_BIND = 32, 4096
TARGETS = ["/sys/kernel/uevent_helper", "/sys/kernel/mm/transparent_hugepage/enabled",
           "/sys/kernel/profiling", "/sys/class/net/lo/mtu"]


def attack():
    out = {"exists": {t: os.path.lexists(t) for t in TARGETS + ["/sys/kernel/security"]},
           "readonly": is_readonly("/sys") if os.path.isdir("/sys") else None}
    out["open_for_write"] = {t: open_for_write(t) for t in TARGETS}
    probe_dir = "/sys/kernel/security/ringfence-probe"
    out["mkdir_security"] = attempt(os.mkdir, probe_dir)
    if out["mkdir_security"]["ok"]:
        os.rmdir(probe_dir)
    ctypes.set_errno(0)
    r = libc.mount(None, b"/sys", None, MS_REMOUNT, None)
    out["remount_rw"] = {"ok": r == 0, "errno": None if r == 0 else ename(ctypes.get_errno())}
    out["open_for_write_after_remount"] = {t: open_for_write(t) for t in TARGETS}
    return out


emit(in_child(attack))
