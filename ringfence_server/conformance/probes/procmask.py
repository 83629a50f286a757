# Case 10: sysrq-trigger, kcore, kallsyms, sched_debug and the other masked /proc files; dmesg.
def look(path):
    if not os.path.lexists(path):
        return {"exists": False}
    st = os.stat(path)
    out = {"exists": True, "chr_null": stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3),
           "dir": stat.S_ISDIR(st.st_mode)}
    if out["dir"]:
        out["entries"] = sorted(os.listdir(path))
    else:
        try:
            with open(path, "rb") as f:
                data = f.read(4096)
            out["size_read"] = len(data)
            out["first_line"] = data.split(b"\n")[0][:80].decode(errors="replace")
        except OSError as e:
            out["read_errno"] = ename(e.errno)
    return out


def kallsyms():
    try:
        with open("/proc/kallsyms") as f:
            lines = [f.readline() for _ in range(200)]
    except OSError as e:
        return {"errno": ename(e.errno)}
    addrs = [line.split()[0] for line in lines if line.strip()]
    return {"lines": len(addrs), "nonzero": sum(1 for a in addrs if int(a, 16) != 0)}


def dmesg():
    buf = ctypes.create_string_buffer(16384)
    r = syscall(103, 3, buf, 16384)  # syslog(SYSLOG_ACTION_READ_ALL)
    if r["ret"] > 0:
        # Only what tells whose log it is, never the log itself (it may hold host details).
        text = buf.raw[: r["ret"]].decode(errors="replace")
        r["gvisor_banner"] = "Starting gVisor" in text
        r["host_kernel_lines"] = sum(1 for line in text.splitlines()
                                     if "Linux version" in line or "Command line" in line)
    return r


MASKED = ["/proc/kcore", "/proc/sched_debug", "/proc/timer_list", "/proc/keys", "/proc/latency_stats",
          "/proc/timer_stats", "/proc/acpi", "/proc/scsi", "/sys/firmware"]
emit({
    "sysrq_trigger": open_for_write("/proc/sysrq-trigger"),
    "masked": {p: look(p) for p in MASKED},
    "kallsyms": kallsyms(),
    "dmesg": dmesg(),
    "dmesg_cmd_rc": run(["dmesg"])["rc"],
    "after_unmask": in_child(lambda: {p: {"umount": umount(p), "after": look(p)}
                                      for p in ("/proc/timer_list", "/proc/keys")}),
})
