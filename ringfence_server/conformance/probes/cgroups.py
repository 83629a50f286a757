# Cases 7 and 8: cgroup release_agent, child cgroups, devices.allow (CVE-2022-0492 family).
# The escalation an attacker would try: write directly; failing that, remount the cgroup
# mount read-write; and mount a fresh hierarchy to reach the root's release_agent.
# Nothing is ever written to a release_agent: it is only opened for writing.
MS_REMOUNT, MS_BIND = 32, 4096
ROOT = "/sys/fs/cgroup"


def remount_rw(path):
    ctypes.set_errno(0)
    r = libc.mount(None, path.encode(), None, MS_REMOUNT | MS_BIND, None)
    return {"ok": r == 0, "errno": None if r == 0 else ename(ctypes.get_errno())}


def release_agents(top, depth=3):
    found = []
    if not os.path.isdir(top):
        return found
    for dirpath, dirnames, filenames in os.walk(top):
        if dirpath.count("/") - top.count("/") >= depth:
            dirnames[:] = []
        if "release_agent" in filenames:
            found.append(os.path.join(dirpath, "release_agent"))
    return sorted(found)


def mkdir_child(controller):
    path = os.path.join(ROOT, controller, "ringfence-probe-child")
    r = attempt(os.mkdir, path)
    if r["ok"]:
        os.rmdir(path)  # never leave a child cgroup: it would keep the container's cgroup busy
    return r


def write_devices_allow():
    def go():
        fd = os.open(os.path.join(ROOT, "devices", "devices.allow"), os.O_WRONLY)
        try:
            os.write(fd, b"c 1:3 rwm")  # /dev/null, which the container may use anyway
        finally:
            os.close(fd)
    return attempt(go)


def fresh_hierarchy():
    ctypes.set_errno(0)
    r = libc.mount(b"cgroup", b"/mnt", b"cgroup", 0, b"memory")
    if r != 0:
        return {"mounted": False, "errno": ename(ctypes.get_errno())}
    agents = release_agents("/mnt", depth=0)
    return {"mounted": True, "release_agents": agents,
            "open_for_write": {a: open_for_write(a) for a in agents}}


def attack():
    controllers = sorted(os.listdir(ROOT)) if os.path.isdir(ROOT) else []
    out = {
        "controllers": controllers,
        "release_agents": {a: open_for_write(a) for a in release_agents(ROOT)},
        "mkdir": {c: mkdir_child(c) for c in controllers},
        "devices_allow": write_devices_allow(),
        "readonly": {c: is_readonly(os.path.join(ROOT, c)) for c in controllers},
    }
    out["remount"] = {c: remount_rw(os.path.join(ROOT, c)) for c in ("memory", "devices") if c in controllers}
    out["mkdir_after_remount"] = {c: mkdir_child(c) for c in ("memory",) if c in controllers}
    out["devices_allow_after_remount"] = write_devices_allow()
    out["fresh_hierarchy"] = fresh_hierarchy()
    return out


emit(in_child(attack))
