"""The sandbox's /etc/hosts, /etc/hostname and /etc/resolv.conf, written by us, and the empty
file that hides a device node gVisor would otherwise expose.

Docker would otherwise bind its own copies from /var/lib/docker/containers/<id>/, which shows
the engine's data root, the container id and the host's block device in the sandbox's
mountinfo (docs/escape-battery.md case 16), and would copy the host's resolver in when no DNS is set.
Ours are static: localhost only, and a resolver on the sandbox's own loopback where nothing
listens, so a DNS query has nowhere to go.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading

from docker.types import Mount

HOSTNAME = "sandbox"
FILES = {
    "hosts": f"127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{HOSTNAME}\n",
    "hostname": f"{HOSTNAME}\n",
    "resolv.conf": "nameserver 127.0.0.1\noptions ndots:0 attempts:1 timeout:1\n",
}
# Bound read-only over device nodes that must not exist in the sandbox: an empty regular file
# is no device, and being read-only it cannot even be opened for writing.
EMPTY = "empty"

_lock = threading.Lock()
_dir: str | None = None


def _directory() -> str:
    global _dir
    with _lock:
        if _dir is None or not os.path.isdir(_dir):
            path = tempfile.mkdtemp(prefix="ringfence-etc-")
            for name, content in {**FILES, EMPTY: ""}.items():
                with open(os.path.join(path, name), "w", encoding="ascii") as f:
                    f.write(content)
                os.chmod(os.path.join(path, name), 0o444)
            os.chmod(path, 0o555)
            atexit.register(shutil.rmtree, path, True)
            _dir = path
        return _dir


def hide(targets: tuple[str, ...]) -> list[Mount]:
    """Read-only binds of an empty regular file over each of `targets` (device nodes)."""
    source = os.path.join(_directory(), EMPTY)
    return [Mount(target=t, source=source, type="bind", read_only=True) for t in targets]


def mounts() -> list[Mount]:
    """Read-only binds of our three files over Docker's."""
    directory = _directory()
    return [
        Mount(target=f"/etc/{name}", source=os.path.join(directory, name), type="bind", read_only=True)
        for name in FILES
    ]
