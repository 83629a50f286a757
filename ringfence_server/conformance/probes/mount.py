# Case 6: mount tmpfs, proc, sysfs and a cgroup hierarchy (each in its own child).
def mount(source, target, fstype, data=None):
    def go():
        ctypes.set_errno(0)
        r = libc.mount(source.encode(), target.encode(), fstype.encode(), 0, data.encode() if data else None)
        return {"ok": r == 0, "errno": None if r == 0 else ename(ctypes.get_errno())}
    return in_child(go)


emit({
    "tmpfs": mount("none", "/mnt", "tmpfs"),
    "proc": mount("proc", "/mnt", "proc"),
    "sysfs": mount("sysfs", "/mnt", "sysfs"),
    "cgroup": mount("cgroup", "/mnt", "cgroup", "memory"),
    "mount_cmd": run(["mount", "-t", "tmpfs", "none", "/mnt"]),
})
