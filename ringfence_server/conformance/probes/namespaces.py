# Case 18: PID, IPC and UTS namespaces from inside.
def sysvipc(kind):
    try:
        with open("/proc/sysvipc/" + kind) as f:
            return len(f.read().splitlines()) - 1
    except OSError as e:
        return ename(e.errno)


pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
ns = {}
for n in ("pid", "ipc", "uts", "net", "mnt", "cgroup", "user"):
    try:
        ns[n] = os.readlink("/proc/self/ns/" + n)
    except OSError as e:
        ns[n] = ename(e.errno)
with open("/proc/1/cmdline", "rb") as f:
    pid1 = f.read().split(b"\0")[0].decode()
emit({"pids": pids, "pid1": pid1, "hostname": socket.gethostname(), "uname_node": os.uname().nodename,
      "ns": ns, "sysvipc": {k: sysvipc(k) for k in ("shm", "msg", "sem")}})
