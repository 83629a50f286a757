# Case 9: /proc/sys knobs that turn into host code execution when writable. Only opened for
# writing, never written. The attacker's next step (unmounting the read-only /proc/sys bind
# that Docker lays over the writable proc mount) is tried too, in a child.
TARGETS = ["/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe",
           "/proc/sys/fs/binfmt_misc/register", "/proc/sys/fs/suid_dumpable"]


def unmask_then_open():
    out = {"umount": umount("/proc/sys")}
    out["open_for_write"] = {t: open_for_write(t) for t in TARGETS}
    return out


emit({
    "open_for_write": {t: open_for_write(t) for t in TARGETS},
    "exists": {t: os.path.lexists(t) for t in TARGETS},
    "readonly": is_readonly("/proc/sys"),
    "after_unmask": in_child(unmask_then_open),
})
