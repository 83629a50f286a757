# Case 41: PID 1's memory through /proc/1/mem (no ptrace syscall needed: the kernel checks only
# ptrace *access*, which a same-uid, dumpable process grants). Writing puts back exactly the
# bytes just read, so a successful attack changes nothing in tini.
def first_mapping(pid):
    try:
        with open(f"/proc/{pid:d}/maps") as f:
            return int(f.readline().split("-")[0], 16)
    except (OSError, ValueError, IndexError):
        return None


def try_mem(flags):
    try:
        fd = os.open("/proc/1/mem", flags)
    except OSError as e:
        return {"ok": False, "errno": ename(e.errno)}
    out = {"ok": True}
    addr = first_mapping(1)
    try:
        if addr is not None:
            data = os.pread(fd, 16, addr)
            out["read"] = data.hex()
            if flags & os.O_RDWR:
                out["wrote"] = os.pwrite(fd, data, addr)
    except OSError as e:
        out["io_errno"] = ename(e.errno)
    finally:
        os.close(fd)
    return out


def readable(path):
    try:
        with open(path, "rb") as f:
            f.read(64)
        return "ok"
    except OSError as e:
        return ename(e.errno)


emit({"pid1": open("/proc/1/cmdline", "rb").read().split(b"\0")[0].decode(),
      "dumpable_owner": os.stat("/proc/1/mem").st_uid,
      "mem_read": in_child(lambda: try_mem(os.O_RDONLY)),
      "mem_write": in_child(lambda: try_mem(os.O_RDWR)),
      "maps": readable("/proc/1/maps"), "environ": readable("/proc/1/environ")})
