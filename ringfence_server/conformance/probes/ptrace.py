# Case 19: ptrace(PTRACE_ATTACH) and process_vm_readv against PID 1 (the init of the sandbox).
PTRACE_ATTACH, PTRACE_DETACH, WALL = 16, 17, 0x40000000


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def first_mapping(pid):
    try:
        with open(f"/proc/{pid:d}/maps") as f:
            return int(f.readline().split("-")[0], 16)
    except (OSError, ValueError, IndexError):
        return 0x400000


def attach():
    r = syscall(101, PTRACE_ATTACH, 1, 0, 0)
    if r["ret"] == 0:
        # Let the init run on: wait for its attach stop, then detach, or it stays stopped.
        os.waitpid(1, WALL)
        r["detach"] = syscall(101, PTRACE_DETACH, 1, 0, 0)
    return r


def vm_readv():
    buf = ctypes.create_string_buffer(16)
    local = IoVec(ctypes.cast(buf, ctypes.c_void_p), 16)
    remote = IoVec(first_mapping(1), 16)
    r = syscall(310, 1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if r["ret"] > 0:
        r["bytes"] = buf.raw[: r["ret"]].hex()
    return r


emit({"pid1": open("/proc/1/cmdline", "rb").read().split(b"\0")[0].decode(),
      "attach": in_child(attach), "process_vm_readv": in_child(vm_readv)})
