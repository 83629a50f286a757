# Case 20: kernel interfaces a tool never needs. Each call is made so that, were it allowed, it
# would succeed or reach the kernel proper (a valid request), never with garbage that fails
# on its own. Each runs in its own child.
class PerfAttr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
                ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64), ("rest", ctypes.c_uint8 * 64)]


class BpfMapAttr(ctypes.Structure):
    _fields_ = [("map_type", ctypes.c_uint32), ("key_size", ctypes.c_uint32), ("value_size", ctypes.c_uint32),
                ("max_entries", ctypes.c_uint32), ("rest", ctypes.c_uint8 * 112)]


def perf():
    # software cpu-clock of this process, user space only: allowed to anyone at paranoid <= 2
    attr = PerfAttr(type=1, size=ctypes.sizeof(PerfAttr), config=0, flags=(1 << 0) | (1 << 5) | (1 << 6))
    return syscall(298, ctypes.byref(attr), 0, -1, -1, 0)


def bpf():
    attr = BpfMapAttr(map_type=2, key_size=4, value_size=4, max_entries=1)  # BPF_MAP_TYPE_ARRAY
    return syscall(321, 0, ctypes.byref(attr), ctypes.sizeof(attr))


CALLS = {
    "keyctl": lambda: syscall(250, 0, -3, 0),  # KEYCTL_GET_KEYRING_ID(session keyring)
    "add_key": lambda: syscall(248, b"user", b"ringfence-probe", b"x", 1, -2),  # into the process keyring
    "bpf": bpf,
    "perf_event_open": perf,
    "userfaultfd": lambda: syscall(323, 0o2000000 | 1),  # O_CLOEXEC | UFFD_USER_MODE_ONLY
    "kexec_load": lambda: syscall(246, 0, 0, 0, 0),
    "init_module": lambda: syscall(175, 0, 0, b""),
    "open_by_handle_at": lambda: syscall(304, -100, 0, 0),
    "setns": lambda: syscall(308, -1, 0),  # reaching the kernel would give EBADF
    "pivot_root": lambda: syscall(155, b"/tmp", b"/tmp"),
}
emit({name: in_child(fn) for name, fn in CALLS.items()})
