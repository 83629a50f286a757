# Shared helpers for the posture probes. Prepended to each probe's text and run with
# `python3 -I -c` inside the sandbox, so: stdlib only, no imports from the repo.
import ctypes
import errno
import json
import os
import socket
import stat
import subprocess
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.prctl.restype = ctypes.c_int
libc.mount.restype = ctypes.c_int


def ename(code):
    return errno.errorcode.get(code, str(code))


def _arg(a):
    if isinstance(a, int):
        return ctypes.c_long(a)
    return a


def syscall(nr, *args):
    """Raw syscall: {"ret": value, "errno": name or None}."""
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr), *[_arg(a) for a in args])
    return {"ret": ret, "errno": ename(ctypes.get_errno()) if ret == -1 else None}


def prctl(option, a2=0, a3=0, a4=0, a5=0):
    ctypes.set_errno(0)
    ret = libc.prctl(option, ctypes.c_ulong(a2), ctypes.c_ulong(a3), ctypes.c_ulong(a4), ctypes.c_ulong(a5))
    return {"ret": ret, "errno": ename(ctypes.get_errno()) if ret == -1 else None}


def attempt(fn, *args, **kwargs):
    """Run fn; "ok" (or its JSON-able value under "value") or the errno name of its OSError."""
    try:
        value = fn(*args, **kwargs)
    except OSError as e:
        return {"ok": False, "errno": ename(e.errno)}
    out = {"ok": True}
    if isinstance(value, (int, str, bool, type(None))):
        out["value"] = value
    return out


def open_for_write(path):
    """Only opens the file for writing and closes it again: nothing is ever written."""
    def go():
        os.close(os.open(path, os.O_WRONLY))
    if not os.path.lexists(path):
        return {"ok": False, "errno": "ENOENT"}
    return attempt(go)


def in_child(fn):
    """Run fn in a forked child (so a successful attack cannot taint the next one); its JSON result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            data = json.dumps(fn())
        except BaseException as e:  # report, never hang the parent
            data = json.dumps({"ok": False, "exception": repr(e)})
        os.write(w, data.encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b"null")


def run(argv, timeout=5):
    try:
        p = subprocess.run(argv, capture_output=True, timeout=timeout)
    except OSError as e:
        return {"rc": None, "errno": ename(e.errno), "out": "", "err": ""}
    return {"rc": p.returncode, "out": p.stdout.decode(errors="replace"), "err": p.stderr.decode(errors="replace")}


def status_fields(path="/proc/self/status"):
    out = {}
    with open(path) as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def is_readonly(path):
    """The ST_RDONLY flag of the mount, or None where statvfs is not implemented (gVisor /proc)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return None


def umount(path):
    """umount2(path, MNT_DETACH): how an attacker with CAP_SYS_ADMIN would peel off a mask."""
    ctypes.set_errno(0)
    r = libc.umount2(path.encode(), 2)
    return {"ok": r == 0, "errno": None if r == 0 else ename(ctypes.get_errno())}


def emit(obj):
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()
