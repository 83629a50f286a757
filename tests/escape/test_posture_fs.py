"""Escape battery, Posture 12-17: root filesystem, noexec /tmp, engine sockets, /proc/net/unix,
mountinfo and /dev.

Every attack runs inside the real sandbox through the `attack` fixture; each red check removes
the protection its case covers and shows the same probe then succeeds. Where the real thing
cannot be shown safely (a reachable Docker socket), a decoy stands in for it.

Red checks run under runc only: each removes an engine or host-kernel protection (a
capability, the seccomp profile, a namespace, a mount flag) that gVisor does not rely on in
the same way (its sentry is the boundary), so under gVisor they would prove nothing about our
settings. The green tests run under both runtimes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
import time

import docker.errors
import probes
import pytest
from docker.types import Mount

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.hardening import GVISOR_HIDDEN_DEVICES
from ringfence_server.sandbox.profile import InputMount

pytestmark = pytest.mark.docker

GVISOR_NOEXEC_MMAP = (
    "FINDING: gVisor (runsc 20221219) refuses execve from the noexec /tmp but still allows "
    "mmap(PROT_EXEC) of a file there, so `ld-linux-x86-64.so.2 /tmp/binary` runs it"
)


# ---- case 12: root filesystem writes fail with EROFS -------------------------------------------


def test_case_12_root_fs_readonly(attack, runtime):
    p = probes.report(attack(probes.argv("rootfs"), runtime=runtime))
    # /var/tmp is world-writable in the image: only the read-only mount stops this one.
    assert probes.errnos({"var_tmp": p["create_var_tmp"]}) == {"var_tmp": "EROFS"}
    # /etc/passwd is root's 0644: the uid answers first, before the mount is consulted.
    assert probes.errnos({"w": p["write_passwd"], "a": p["append_passwd"]}) == {"w": "EACCES", "a": "EACCES"}
    if runtime == "runc":
        errnos = probes.errnos({"root": p["create_root"], "chmod": p["chmod_runner"]})
        assert errnos == {"root": "EROFS", "chmod": "EROFS"}
        assert p["readonly"] is True
    else:
        # gVisor checks the directory permission before the read-only mount, and does not
        # report ST_RDONLY through statvfs; the writes still fail.
        errnos = probes.errnos({"root": p["create_root"], "chmod": p["chmod_runner"]})
        assert errnos == {"root": "EACCES", "chmod": "EPERM"}


def test_case_12_red_without_read_only(weakened):
    """With read_only=False the sandbox user writes into the image's /var/tmp."""
    p = probes.report(weakened(lambda s: {**s, "read_only": False})(probes.argv("rootfs")))
    assert p["create_var_tmp"] == {"ok": True, "value": None}
    assert p["readonly"] is False


# ---- case 13: noexec /tmp -------------------------------------------------------------------------


def test_case_13_tmp_noexec(attack, runtime):
    p = probes.report(attack(probes.argv("noexec"), runtime=runtime))
    for d in ("/tmp", "/dev/shm"):
        assert p[d]["exec"]["rc"] is None and p[d]["exec"]["errno"] == "EACCES", d
    if runtime == "runc":
        assert p["/tmp"]["noexec_flag"] is True and p["/dev/shm"]["noexec_flag"] is True
    # noexec does not stop an interpreter reading a script: documented, not a protection.
    assert (p["sh_script"]["rc"], p["sh_script"]["out"]) == (0, "script-ran\n")


@pytest.mark.parametrize(
    "runtime", ["runc", pytest.param("gvisor", marks=pytest.mark.xfail(strict=True, reason=GVISOR_NOEXEC_MMAP))],
    indirect=True,
)
def test_case_13_tmp_no_exec_mapping(attack, runtime):
    """The classic noexec bypass: map the binary executable yourself (or let ld.so do it)."""
    p = probes.report(attack(probes.argv("noexec"), runtime=runtime))
    for d in ("/tmp", "/dev/shm"):
        assert p[d]["mmap_exec"] == {"ok": False, "errno": "EPERM"}, d
        assert p[d]["via_loader"]["rc"] == 127 and "failed to map segment" in p[d]["via_loader"]["err"], d


def test_case_13_red_tmpfs_exec(weakened):
    """With /tmp mounted `exec` instead of `noexec`, the copied binary runs, directly and via ld.so."""
    def change(s):
        return {**s, "tmpfs": {"/tmp": s["tmpfs"]["/tmp"].replace("noexec", "exec")}}

    p = probes.report(weakened(change)(probes.argv("noexec")))
    assert p["/tmp"]["exec"]["rc"] == 0
    assert p["/tmp"]["mmap_exec"]["ok"] is True
    assert p["/tmp"]["via_loader"]["rc"] == 0


# ---- case 14: no engine socket answers GET /info ----------------------------------------------------


class DecoyEngine:
    """A unix socket on the host that answers like a Docker engine and logs every request."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="rf-decoy-")
        os.chmod(self.dir, 0o755)
        self.path = os.path.join(self.dir, "docker.sock")
        self.requests: list[str] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        os.chmod(self.path, 0o777)  # the sandbox uid must be able to connect
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(2)
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    self.requests.append(data.split(b"\r\n")[0].decode(errors="replace"))
                    body = b'{"ID":"ringfence-decoy-engine","ServerVersion":"decoy"}'
                    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
        os.unlink(self.path)
        os.rmdir(self.dir)


@pytest.fixture
def decoy_engine():
    decoy = DecoyEngine()
    yield decoy
    decoy.close()


def test_case_14_no_engine_socket(attack, runtime, decoy_engine):
    p = probes.report(attack(probes.argv("engine_socket"), runtime=runtime))
    assert p["filesystem_sockets"] == []
    assert p["abstract_sockets"] == []
    assert p["well_known_present"] == []
    assert p["answers"] == {}
    assert decoy_engine.requests == []  # the engine-like socket on the host was never reached


def test_case_14_red_decoy_socket_mounted(weakened, decoy_engine):
    """Mounting the real Docker socket into a container is never done, not even read-only (a
    read-only bind does not stop connect(2)). The decoy engine socket stands in for it: bound
    read-only at /var/run/docker.sock, the probe finds it and GET /info is answered."""
    def change(s):
        mount = Mount(target="/var/run/docker.sock", source=decoy_engine.path, type="bind", read_only=True)
        return {**s, "mounts": [*list(s["mounts"]), mount]}

    p = probes.report(weakened(change)(probes.argv("engine_socket")))
    assert p["filesystem_sockets"] == ["/run/docker.sock"]  # /var/run is a link to /run
    answer = p["answers"]["/run/docker.sock"]
    assert answer["answered"] is True
    assert answer["response"].startswith("HTTP/1.0 200 OK") and "ringfence-decoy-engine" in answer["response"]
    assert decoy_engine.requests == ["GET /info HTTP/1.0"]


# ---- case 15: /proc/net/unix shows no host sockets ---------------------------------------------------


def test_case_15_no_foreign_unix_sockets(attack, runtime):
    p = probes.report(attack(probes.argv("netunix"), runtime=runtime))
    assert p["header"].split()[:3] == ["Num", "RefCount", "Protocol"]
    assert p["entries"] == []


@pytest.fixture
def socket_holder(docker_client, pinned_images):
    """A container of ours (same image, no network, labelled) whose process holds an abstract
    unix socket: the stand-in for the host's sockets, which the sandbox would see if it shared
    a network namespace (network_mode=host is never used in tests)."""
    name = "@ringfence-decoy-" + os.urandom(4).hex()
    code = ("import socket,time\ns=socket.socket(socket.AF_UNIX)\ns.bind('\\0" + name[1:] + "')\n"
            "s.listen(1)\nprint('ready',flush=True)\ntime.sleep(120)\n")
    container = docker_client.containers.run(
        pinned_images.image_id("tool"), ["python3", "-I", "-c", code], detach=True,
        labels=L.base_labels("test", deadline_s=300), network_mode="none", user="10001:10001",
        read_only=True, cap_drop=["ALL"], security_opt=["no-new-privileges:true"],
    )
    try:
        deadline = time.monotonic() + 20
        while b"ready" not in container.logs():
            assert time.monotonic() < deadline, "decoy socket holder did not start"
            time.sleep(0.05)
        yield container, name
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


def test_case_15_red_shared_network_namespace(weakened, socket_holder):
    """In another process's network namespace (here: the socket holder's, via
    network_mode=container:<id>), /proc/net/unix lists that namespace's sockets. hostname and
    dns must go too: the engine refuses them with a joined network namespace."""
    container, name = socket_holder

    def change(s):
        s = {k: v for k, v in s.items() if k not in ("hostname", "dns", "dns_search")}
        return {**s, "network_mode": f"container:{container.id}"}

    p = probes.report(weakened(change)(probes.argv("netunix")))
    assert name in p["paths"]


# ---- case 16: mountinfo shows no host paths beyond declared read-only inputs ------------------------

DOCKER_NETWORK_FILES = {"/etc/resolv.conf", "/etc/hostname", "/etc/hosts"}


def host_backed(mounts: list[dict]) -> dict[str, dict]:
    """Mounts whose content comes from the host: a block device (runc) or a gofer (gVisor's 9p),
    other than the container's own root filesystem."""
    return {m["mountpoint"]: m for m in mounts
            if m["mountpoint"] != "/" and (not m["major_minor"].startswith("0:") or m["fstype"] == "9p")}


def undeclared(mounts: list[dict], declared: set[str]) -> list[str]:
    return sorted(set(host_backed(mounts)) - DOCKER_NETWORK_FILES - declared)


@pytest.fixture
def declared_input(tmp_path):
    os.chmod(tmp_path, 0o755)
    (tmp_path / "data.txt").write_text("input\n")
    return (InputMount(str(tmp_path), "/inputs"),)


def test_case_16_only_declared_host_mounts(attack, runtime, declared_input):
    p = probes.report(attack(probes.argv("mountinfo"), runtime=runtime, inputs=declared_input))
    mounts = p["mounts"]
    # Under gVisor an empty read-only file of ours stands over /dev/fuse (case 44).
    hidden = set(GVISOR_HIDDEN_DEVICES) if runtime == "gvisor" else set()
    assert undeclared(mounts, {"/inputs"} | hidden) == []
    backed = host_backed(mounts)
    assert set(backed) == DOCKER_NETWORK_FILES | {"/inputs"} | hidden
    for point, m in backed.items():
        assert "ro" in m["options"], point
    if runtime == "runc":
        assert backed["/inputs"]["root"] == declared_input[0].host_path
        # No mount is the host's root directory or the engine's data root.
        assert not [m for m in mounts
                    if m["root"] in ("/", "/var/lib/docker") and not m["major_minor"].startswith("0:")]
    assert not [m for m in mounts if m["mountpoint"] == "/var/run/docker.sock" or m["root"].endswith("docker.sock")]


def test_case_16_no_engine_paths_in_mountinfo(attack, runtime):
    """The battery's strict form: nothing under /var/lib/docker appears in mountinfo at all."""
    p = probes.report(attack(probes.argv("mountinfo"), runtime=runtime))
    leaks = [m["mountpoint"] + " <- " + m["root"] for m in p["mounts"] if "/var/lib/docker" in m["root"] + m["super"]]
    assert leaks == []


def test_case_16_red_undeclared_host_mount(weakened, tmp_path):
    """A read-only bind of a host directory that was not declared as an input (a harmless
    temporary directory of the test) appears in mountinfo and is caught."""
    os.chmod(tmp_path, 0o755)

    def change(s):
        hostdir = Mount(target="/hostdir", source=str(tmp_path), type="bind", read_only=True)
        return {**s, "mounts": [*list(s["mounts"]), hostdir]}

    p = probes.report(weakened(change)(probes.argv("mountinfo")))
    assert undeclared(p["mounts"], set()) == ["/hostdir"]
    assert host_backed(p["mounts"])["/hostdir"]["root"] == str(tmp_path)


# ---- case 17: /dev is minimal, no block devices --------------------------------------------------------

DEV_RUNC = ["fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty",
            "urandom", "zero"]
# gVisor's /dev also has fuse and net (its own emulated /dev/fuse and /dev/net/tun): both names
# stay, but as an empty read-only file and an empty read-only tmpfs (case 44).
DEV_GVISOR = sorted([*DEV_RUNC, "fuse", "net"])


def test_case_17_minimal_dev(attack, runtime):
    p = probes.report(attack(probes.argv("devices"), runtime=runtime))
    assert p["top"] == (DEV_RUNC if runtime == "runc" else DEV_GVISOR)
    assert p["block_devices"] == []
    assert "blk" not in p["entries"].values()
    # fdisk is not in the image (ENOENT); what it would do (open each partition the kernel
    # lists) finds no device node.
    assert p["fdisk"]["errno"] == "ENOENT"
    assert set(probes.errnos(p["open_partitions"]).values()) <= {"ENOENT"}
    # /proc/partitions is masked under runc (case 43) and empty under gVisor; a block node
    # cannot be made on either (no CAP_MKNOD, and our seccomp rule for gVisor, case 44).
    assert p["partitions"] == []
    assert p["mknod_block"] == {"ok": False, "errno": "EPERM"}


def test_case_17_red_privileged(weakened):
    """/dev is the minimal set because the container is not privileged: with privileged=True
    (uid 10001 kept: only a listing) the host's block devices appear. Nothing narrower removes
    the device whitelist as a whole."""
    p = probes.report(weakened(lambda s: {**s, "privileged": True})(probes.argv("devices")))
    assert p["block_devices"]
    assert {"/dev/" + part for part in p["partitions"]} <= set(p["block_devices"])
