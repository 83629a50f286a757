"""A farm of real, separate Docker engines on this host, for tests of sandbox workers.

A sandbox worker runs on a host of its own with a Docker engine of its own (docs/workers.md). A
test cannot have several hosts, so it gets the nearest thing: several `dockerd` processes, each
with its own data root, exec root, socket, containerd and network namespace, started here (as
root) and removed afterwards. No registry exists here: the pinned images are saved once from the
host's main engine, kept as a tar, and loaded into each farm engine, which must then hold them
under their locked IDs.

    with EngineFarm(3, Path("/tmp/ringfence-engine-farm/x"), images=["tool"]) as farm:
        for engine in farm.engines:
            engine.client().containers.list()

Why each part is separate:

- **containerd.** Each engine gets a containerd of its own (`--containerd` to its socket). When a
  system containerd runs (`/run/containerd/containerd.sock`, as with Debian's docker.io 28), every
  dockerd started without `--containerd` uses it, all in its one `moby` namespace; each dockerd then
  sees the others' tasks and, at start, deletes those it does not know. One containerd per engine
  is the same on every version (dockerd 20.10's own managed containerd included).
- **network.** Each engine runs in a named network namespace (`ip netns add`, entered with
  `nsenter --net`: only the network namespace, so the engine's mounts stay in ours, where the
  teardown can see and remove them). Only loopback is up: the sandbox's containers use network
  "none" and reach their egress proxy by a unix socket, so the engines need no bridge, iptables
  or NAT (`--bridge=none --iptables=false ...`), and a farm engine cannot reach anything.
- **cgroups.** Each engine puts its containers under a cgroup parent of its own (named as its
  network namespace), not the main engine's `/docker`: a container's processes carry no path of
  the farm on their command line (a `sleep` is just `sleep`), and when its engine was killed with
  it (a killed session) they live on as orphans; the cgroup is how the teardown finds and kills
  them, and then it removes the cgroups.
- **configuration.** Each engine has its own `--config-file`: without one, dockerd reads the host's
  /etc/docker/daemon.json, whose `data-root` clashes with our `--data-root` (dockerd refuses a key
  given both ways) and would point every engine at the main engine's data.

Nothing may outlive a farm: `close()` (also run when the start fails half way, and safe to call
twice) removes every container, stops each dockerd and containerd, kills what is left of their
processes (shims, gVisor's sandboxes, fuse-overlayfs), unmounts what is left under the farm's
root, deletes the namespaces and the root. A farm whose test session was killed leaves a marker
file in its root naming its owner and namespaces; `reap_leftover_farms` removes such farms.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import docker
import docker.errors

# On each dockerd's command line (`--label ringfence.engine-farm=<farm id>`), so that a stray one
# is found with `pgrep -f ringfence.engine-farm=`, whatever its paths.
FARM_LABEL = "ringfence.engine-farm"
# In each farm's root: who owns the farm and what it made outside that root (its namespaces).
MARKER = "engine-farm.json"
NETNS_PREFIX = "rf-farm-"
NETNS_DIR = Path("/run/netns")
CGROUP_FS = Path("/sys/fs/cgroup")
# The suite's farms live here (short: a unix socket path has at most 107 bytes), one folder each.
DEFAULT_BASE = Path("/tmp/ringfence-engine-farm")
REPO = Path(__file__).resolve().parents[1]
# The saved images, one tar per set of IDs; under images/.build/, which git ignores.
IMAGE_CACHE = REPO / "images" / ".build" / "engine-farm"
# As scripts/ensure-runsc.sh registers it on the main engine: no network inside gVisor, and the
# container's seccomp profile applied (without --oci-seccomp runsc ignores it).
RUNSC_ARGS = ("--network=none", "--oci-seccomp")

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
LOAD_TIMEOUT_S = 600
SOCKET_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1
# containerd 1.6+ puts each shim's socket here, named by sha256("<address>/<namespace>/<id>").
SHIM_SOCKET_DIR = Path("/run/containerd/s")


class EngineFarmError(RuntimeError):
    """An engine of the farm did not start, load its images or go away."""


def _progress(message: str) -> None:
    # Slow steps (saving, loading) say so on stderr: a silent minute looks like a hang.
    print(f"engine-farm: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Engine:
    """One running engine of a farm: where it keeps its state and how to reach it."""

    name: str
    base_url: str  # unix:///.../docker.sock
    root: Path  # this engine's folder in the farm's root
    data_root: Path
    exec_root: Path
    pid: int  # of its dockerd
    containerd_pid: int
    netns: str  # the name under /run/netns (`ip netns list`)
    netns_inode: int  # what /proc/<pid>/ns/net of a process in it stats to
    cgroup_parent: str  # its containers' cgroups are below this one (/rf-farm-...)
    log: Path  # dockerd's and containerd's output

    @property
    def socket(self) -> Path:
        return Path(self.base_url.removeprefix("unix://"))

    def client(self, timeout: int = 120) -> docker.DockerClient:
        # max_pool_size as DockerBackend's own default client: concurrent calls each hold a
        # connection, and docker-py's default of 10 drops connections past that.
        return docker.DockerClient(base_url=self.base_url, timeout=timeout, max_pool_size=64)


@dataclass
class _Slot:
    """An engine being started or stopped: its processes as far as they got (mutable, private)."""

    index: int
    root: Path
    netns: str
    containerd: subprocess.Popen[bytes] | None = None
    dockerd: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"engine-{self.index}"

    @property
    def cgroup_parent(self) -> str:
        return f"/{self.netns}"

    @property
    def data_root(self) -> Path:
        return self.root / "data"

    @property
    def exec_root(self) -> Path:
        return self.root / "exec"

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def containerd_socket(self) -> Path:
        return self.exec_root / "containerd.sock"

    @property
    def log(self) -> Path:
        return self.root / "engine.log"

    def log_tail(self, size: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-size:]
        except OSError as e:
            return f"(no log: {e})"


def resolve_images(images: Iterable[str]) -> tuple[str, ...]:
    """Image IDs (sha256:...) as given, lock names (images/images.lock) as their locked IDs;
    sorted, each once."""
    ids: set[str] = set()
    lock = None
    for image in images:
        if image.startswith("sha256:"):
            ids.add(image)
            continue
        if lock is None:
            from ringfence_server.sandbox.pinned_images import load_lock

            lock = load_lock()
        ids.add(lock.image_id(image))
    return tuple(sorted(ids))


def image_tar(ids: Sequence[str], cache_dir: Path = IMAGE_CACHE, source: docker.DockerClient | None = None) -> Path:
    """The `docker save` tar of `ids` from the main engine, saved once: it is keyed by the sorted
    IDs, and an ID names its content, so a tar once written is right for good."""
    key = hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:24]
    tar = cache_dir / f"{key}.tar"
    if tar.exists():
        _progress(f"images: cached {tar} ({tar.stat().st_size >> 20} MiB)")
        return tar
    cache_dir.mkdir(parents=True, exist_ok=True)
    client = source or docker.from_env(timeout=LOAD_TIMEOUT_S)
    try:
        for image_id in ids:
            client.images.get(image_id)  # ImageNotFound names the one missing (`make images`)
        started = time.monotonic()
        _progress(f"images: saving {len(ids)} image(s) from the main engine to {tar}")
        # One save of all the IDs, not one per image: the images share their base layer, which
        # is then written (and later loaded) once. docker-py saves one image per call only, so
        # this is its own request to the engine's /images/get, as `docker save a b c` does.
        api = client.api
        response = api.get(f"{api.base_url}/v{api.api_version}/images/get", params={"names": list(ids)},
                           stream=True, timeout=LOAD_TIMEOUT_S)
        response.raise_for_status()
        # Written under another name and renamed: a second session never sees half a tar, and two
        # sessions saving at once each rename a whole one.
        partial = tar.with_name(f"{tar.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}.partial")
        try:
            with partial.open("wb") as out:
                for chunk in response.iter_content(chunk_size=1 << 20):
                    out.write(chunk)
            os.replace(partial, tar)
        finally:
            partial.unlink(missing_ok=True)
        _progress(f"images: saved {tar.stat().st_size >> 20} MiB in {time.monotonic() - started:.1f} s")
    finally:
        if source is None:
            client.close()
    return tar


def _host_storage_driver() -> str:
    """The main engine's storage driver, so the farm's engines keep image layers as it does (here
    fuse-overlayfs, which gVisor's runsc is run on by the suite); overlay2 without a main engine."""
    try:
        client = docker.from_env(timeout=30)
        try:
            return str(client.info().get("Driver") or "overlay2")
        finally:
            client.close()
    except docker.errors.DockerException:
        return "overlay2"


def _proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in ticks since boot): with the pid, it names one
    process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def processes_under(root: Path) -> dict[int, str]:
    """Every process whose command line names a path in `root` (pid -> command line): dockerd,
    containerd, their shims, gVisor's sandboxes and gofers, fuse-overlayfs. Each of them is given
    its paths on its command line, so this finds them all, whoever their parent now is."""
    needle = str(root).rstrip("/") + "/"
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        line = _cmdline(int(entry.name))
        if needle in line:
            found[int(entry.name)] = line
    return found


def _unescape_mount_path(text: str) -> str:
    # /proc/self/mountinfo writes space, tab, newline and backslash as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def mounts_under(root: Path) -> list[str]:
    """The mount points at or below `root` in our mount namespace, deepest first."""
    prefix = str(root).rstrip("/")
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = _unescape_mount_path(line.split()[4])
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


def _netns_inode(name: str) -> int:
    return os.stat(NETNS_DIR / name).st_ino


def _run(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def _kill_and_wait(pids: Iterable[int], timeout: float) -> None:
    """SIGTERM, then SIGKILL to whatever still runs after `timeout`; waits until they are gone.
    (A SIGTERMed shim removes its socket; a SIGKILLed one leaves it, which _remove_shim_sockets
    picks up.)"""
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Running (a zombie is not: it only waits for its parent to collect it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _shim_socket(command_line: str) -> Path | None:
    """The socket of a containerd shim, from its command line (-namespace NS -id ID -address A)."""
    args = command_line.split()
    if not args or "containerd-shim" not in args[0]:
        return None
    opts = dict(zip(args[1::2], args[2::2], strict=False))
    if not {"-namespace", "-id", "-address"} <= opts.keys():
        return None
    digest = hashlib.sha256(f"{opts['-address']}/{opts['-namespace']}/{opts['-id']}".encode()).hexdigest()
    return SHIM_SOCKET_DIR / digest


def _in_cgroup(pid: int, parents: Sequence[str]) -> bool:
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return False
    # "<id>:<controllers>:<path>" (v1: one line per hierarchy; v2: one line, "0::<path>").
    paths = {line.split(":", 2)[2] for line in lines if line.count(":") >= 2}
    return any(p == parent or p.startswith(parent + "/") for p in paths for parent in parents)


def processes_in_cgroups(parents: Sequence[str]) -> list[int]:
    """The processes in a cgroup at or below one of `parents` (e.g. "/rf-farm-x-0"): a farm
    engine's containers."""
    if not parents:
        return []
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and _in_cgroup(int(e.name), parents)]


def cgroup_dirs(parents: Sequence[str]) -> list[Path]:
    """The cgroup folders of `parents` in every hierarchy (v1: one per controller; v2: one)."""
    found: set[Path] = set()
    hierarchies = [CGROUP_FS] + ([p for p in CGROUP_FS.iterdir() if p.is_dir()] if CGROUP_FS.is_dir() else [])
    for hierarchy in hierarchies:
        for parent in parents:
            folder = hierarchy / parent.lstrip("/")
            if folder.is_dir() and not folder.is_symlink():
                found.add(Path(os.path.realpath(folder)))
    return sorted(found)


def _remove_cgroups(parents: Sequence[str]) -> list[str]:
    removed = []
    for folder in cgroup_dirs(parents):
        # Children first; a cgroup folder is removed with rmdir (its files are the kernel's).
        for dirpath, _dirs, _files in sorted(os.walk(folder), key=lambda w: -w[0].count("/")):
            for _ in range(50):  # a killed process leaves its cgroup a moment after it died
                try:
                    os.rmdir(dirpath)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        removed.append(f"cgroup {folder}")
    return removed


def teardown_root(root: Path, netns: Iterable[str] = (), cgroups: Sequence[str] = ()) -> list[str]:
    """Remove everything of a farm rooted at `root` that is not a Popen of ours: its processes
    (those naming its paths, and those in its engines' `cgroups`: its containers), mounts,
    cgroups, network namespaces and files. Used by close() after it stopped the engines in order,
    and by reap_leftover_farms for a farm whose session was killed. Returns what it removed."""
    removed: list[str] = []
    root = Path(os.path.realpath(root))
    # Its containers' processes first, with SIGKILL: a container's PID 1 ignores SIGTERM.
    strays = processes_in_cgroups(cgroups)
    for pid in strays:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    removed += [f"container process {pid}" for pid in strays]
    # Unmount first: fuse-overlayfs exits when its mount goes, and a mount kept busy by a live
    # process is detached (-l) rather than left.
    for point in mounts_under(root):
        _run("umount", "-l", point)
        removed.append(f"mount {point}")
    left = processes_under(root)
    if left:
        sockets = [s for s in map(_shim_socket, left.values()) if s is not None]
        _kill_and_wait(left, timeout=5)
        removed += [f"process {pid} {line[:120]}" for pid, line in left.items()]
        for sock in sockets:
            sock.unlink(missing_ok=True)
    for point in mounts_under(root):  # what the processes just killed held
        _run("umount", "-l", point)
        removed.append(f"mount {point}")
    removed += _remove_cgroups(cgroups)
    for name in netns:
        if (NETNS_DIR / name).exists():
            _run("ip", "netns", "delete", name)
            removed.append(f"netns {name}")
    if root.exists():
        # The marker goes last, so a teardown cut short leaves the record of what is left.
        for child in root.iterdir():
            if child.name != MARKER:
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        (root / MARKER).unlink(missing_ok=True)
        root.rmdir()
        removed.append(f"dir {root}")
    return removed


def _owner_alive(marker: dict[str, object]) -> bool:
    pid = marker.get("owner_pid")
    return isinstance(pid, int) and _proc_start_time(pid) == marker.get("owner_start")


def reap_leftover_farms(base: Path = DEFAULT_BASE) -> list[str]:
    """Remove the farms under `base` whose owning process is gone (a test session killed before
    its teardown): their engines' processes, mounts, namespaces and folders. A farm whose owner
    still runs (another session at the same time) is left alone. Returns what was removed."""
    removed: list[str] = []
    if not base.is_dir():
        return removed
    for root in sorted(base.iterdir()):
        marker_path = root / MARKER
        try:
            marker = json.loads(marker_path.read_text())
        except FileNotFoundError:
            # A farm writes its marker right after making its folder and before it starts
            # anything, so a folder without one holds no process; one still young may be a farm
            # starting this moment.
            if root.is_dir() and time.time() - root.stat().st_mtime > 60:
                shutil.rmtree(root, ignore_errors=True)
                removed.append(f"dir {root}")
            continue
        except (OSError, ValueError):
            continue
        if _owner_alive(marker):
            continue
        netns = [str(n) for n in marker.get("netns", [])]
        cgroups = [str(n) for n in marker.get("cgroups", [])]
        removed += teardown_root(root, netns, cgroups)
    return removed


@dataclass
class EngineFarm:
    """`count` Docker engines, each with its own data root, socket, containerd and network
    namespace, holding `images` (IDs or lock names) by ID. A context manager: entering starts the
    farm (or, when it cannot, removes what it started and raises EngineFarmError with the log's
    tail), leaving removes everything of it."""

    count: int
    root_dir: Path
    images: Sequence[str] = ()
    # Runtimes as a worker host would have them: gVisor as "runsc" when it is installed.
    runsc: str | None = field(default_factory=lambda: shutil.which("runsc"))
    storage_driver: str | None = None  # None: the main engine's
    start_timeout_s: float = START_TIMEOUT_S
    dockerd_args: Sequence[str] = ()  # more flags for every dockerd (a test's broken engine)
    farm_id: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    engines: tuple[Engine, ...] = field(default=(), init=False)
    image_ids: tuple[str, ...] = field(default=(), init=False)
    _slots: list[_Slot] = field(default_factory=list, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)
    _started: bool = field(default=False, init=False, repr=False)
    # Set once root_dir was made by this farm: close() never removes a folder it did not make.
    _own_root: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.root_dir = Path(os.path.realpath(self.root_dir))
        if self.count < 1:
            raise ValueError("a farm has at least one engine")

    # -- start --------------------------------------------------------------------------

    def start(self) -> EngineFarm:
        if self._started:
            raise EngineFarmError("a farm starts once")
        self._started = True
        try:
            self._start()
        except BaseException as failure:
            # Also on KeyboardInterrupt: nothing of a half-started farm may stay. The start's
            # error is the one raised; what closing found left over is added to it.
            try:
                self.close()
            except Exception as closing:  # noqa: BLE001 - reported with the start's own error
                failure.add_note(f"and closing the farm failed: {closing}")
            raise
        return self

    def _start(self) -> None:
        if os.geteuid() != 0:
            raise EngineFarmError("an engine farm runs dockerd, which needs root")
        for tool in ("dockerd", "containerd", "nsenter", "ip", "umount"):
            if shutil.which(tool) is None:
                raise EngineFarmError(f"{tool} is not installed (Debian: docker.io, util-linux, iproute2)")
        self.image_ids = resolve_images(self.images)
        driver = self.storage_driver or _host_storage_driver()
        self.root_dir.mkdir(parents=True, exist_ok=False)
        self._own_root = True
        self._slots = [_Slot(i, self.root_dir / f"e{i}", f"{NETNS_PREFIX}{self.farm_id}-{i}")
                       for i in range(self.count)]
        longest = max(len(str(s.containerd_socket)) + len(".ttrpc") for s in self._slots)
        if longest > SOCKET_PATH_MAX:
            raise EngineFarmError(f"{self.root_dir} is too long for a unix socket path below it: take a shorter one")
        # Before anything exists outside the root: a session killed from here on is reapable.
        self._write_marker()
        started = time.monotonic()
        for slot in self._slots:
            self._start_containerd(slot)
        self._wait(lambda s: s.containerd_socket.exists(), "containerd", lambda s: s.containerd)
        for slot in self._slots:
            self._start_dockerd(slot, driver)
        self._wait(self._answers, "dockerd", lambda s: s.dockerd)
        self.engines = tuple(self._engine(s) for s in self._slots)
        _progress(f"{self.count} engine(s) up in {time.monotonic() - started:.1f} s under {self.root_dir}")
        if self.image_ids:
            self._load_images()

    def _write_marker(self) -> None:
        # Who owns this farm (pid and start time: the pid alone may be reused) and what lies
        # outside its root (namespaces), for reap_leftover_farms.
        marker = {
            "farm_id": self.farm_id,
            "owner_pid": os.getpid(),
            "owner_start": _proc_start_time(os.getpid()),
            "netns": [s.netns for s in self._slots],
            "cgroups": [s.cgroup_parent for s in self._slots],
            "pids": [p.pid for s in self._slots for p in (s.containerd, s.dockerd) if p is not None],
        }
        tmp = self.root_dir / f"{MARKER}.tmp"
        tmp.write_text(json.dumps(marker, indent=2))
        os.replace(tmp, self.root_dir / MARKER)

    def _spawn(self, slot: _Slot, argv: list[str]) -> subprocess.Popen[bytes]:
        # nsenter enters the network namespace only and then execs the daemon, so the Popen's
        # pid is the daemon's own. A session of its own: a Ctrl-C at the terminal reaches pytest,
        # whose teardown stops the engines in order, not the engines themselves.
        with slot.log.open("ab") as log:  # the child holds its own copy of the descriptor
            return subprocess.Popen(["nsenter", f"--net={NETNS_DIR / slot.netns}", *argv], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _start_containerd(self, slot: _Slot) -> None:
        slot.exec_root.mkdir(parents=True)
        slot.data_root.mkdir(parents=True)
        # The namespace is made (and recorded in the marker) before the daemon that runs in it.
        if (NETNS_DIR / slot.netns).exists():
            raise EngineFarmError(f"network namespace {slot.netns} exists already")
        for argv in (("ip", "netns", "add", slot.netns), ("ip", "-n", slot.netns, "link", "set", "lo", "up")):
            proc = _run(*argv)
            if proc.returncode != 0:
                raise EngineFarmError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
        config = slot.root / "containerd.toml"
        # As dockerd's own managed containerd is configured, with every path in this engine's
        # roots; the CRI plugin (Kubernetes') is off, as there.
        config.write_text("\n".join([
            "version = 2",
            f'root = "{slot.data_root / "containerd"}"',
            f'state = "{slot.exec_root / "containerd"}"',
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]',
            "[grpc]",
            f'  address = "{slot.containerd_socket}"',
            "",
        ]))
        slot.containerd = self._spawn(slot, ["containerd", "--config", str(config)])
        self._write_marker()

    def _start_dockerd(self, slot: _Slot, driver: str) -> None:
        config: dict[str, object] = {"storage-driver": driver}
        if self.runsc:
            config["runtimes"] = {"runsc": {"path": self.runsc, "runtimeArgs": list(RUNSC_ARGS)}}
        config_file = slot.root / "daemon.json"
        config_file.write_text(json.dumps(config, indent=2))
        slot.dockerd = self._spawn(slot, [
            "dockerd",
            f"--config-file={config_file}",
            f"--data-root={slot.data_root}",
            f"--exec-root={slot.exec_root}",
            f"--pidfile={slot.root / 'docker.pid'}",
            f"--host=unix://{slot.socket}",
            f"--containerd={slot.containerd_socket}",
            "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-masq=false",
            f"--label={FARM_LABEL}={self.farm_id}",
            f"--cgroup-parent={slot.cgroup_parent}",
            *self.dockerd_args,
        ])
        self._write_marker()

    def _answers(self, slot: _Slot) -> bool:
        if not slot.socket.exists():
            return False
        try:
            client = docker.DockerClient(base_url=f"unix://{slot.socket}", timeout=5)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except docker.errors.DockerException:
            return False

    def _wait(self, ready: Callable[[_Slot], bool], what: str,
              process: Callable[[_Slot], subprocess.Popen[bytes] | None]) -> None:
        """Until every slot is `ready`, or raise, with the log's tail, when a deadline passes or a
        daemon exits: never an endless wait."""
        deadline = time.monotonic() + self.start_timeout_s
        pending = list(self._slots)
        while pending:
            for slot in list(pending):
                proc = process(slot)
                if ready(slot):
                    pending.remove(slot)
                elif proc is None or proc.poll() is not None:
                    code = None if proc is None else proc.returncode
                    raise EngineFarmError(f"{what} of {slot.name} exited ({code}) before it answered; "
                                          f"{slot.log}:\n{slot.log_tail()}")
            if pending and time.monotonic() > deadline:
                slot = pending[0]
                raise EngineFarmError(f"{what} of {slot.name} did not answer within {self.start_timeout_s:.0f} s; "
                                      f"{slot.log}:\n{slot.log_tail()}")
            if pending:
                time.sleep(0.1)

    def _engine(self, slot: _Slot) -> Engine:
        assert slot.dockerd is not None and slot.containerd is not None
        return Engine(name=slot.name, base_url=f"unix://{slot.socket}", root=slot.root, data_root=slot.data_root,
                      exec_root=slot.exec_root, pid=slot.dockerd.pid, containerd_pid=slot.containerd.pid,
                      netns=slot.netns, netns_inode=_netns_inode(slot.netns), cgroup_parent=slot.cgroup_parent,
                      log=slot.log)

    # -- images -------------------------------------------------------------------------

    def _load_images(self) -> None:
        tar = image_tar(self.image_ids)
        started = time.monotonic()
        _progress(f"images: loading {len(self.image_ids)} image(s) into {self.count} engine(s)")
        # One thread per engine: each engine unpacks its own copy of the layers.
        with ThreadPoolExecutor(max_workers=self.count) as pool:
            problems = [p for p in pool.map(lambda e: self._load_into(e, tar), self.engines) if p]
        if problems:
            raise EngineFarmError("; ".join(problems))
        _progress(f"images: loaded in {time.monotonic() - started:.1f} s")

    def _load_into(self, engine: Engine, tar: Path) -> str | None:
        client = engine.client(timeout=LOAD_TIMEOUT_S)
        try:
            with tar.open("rb") as f:
                client.images.load(f)
            held = {image.id for image in client.images.list(all=True)}
        except docker.errors.DockerException as e:
            return f"{engine.name}: loading {tar} failed: {e}"
        finally:
            client.close()
        missing = sorted(set(self.image_ids) - held)
        if missing:
            return f"{engine.name}: after loading {tar} these image IDs are missing: {missing}"
        return None

    # -- stop ---------------------------------------------------------------------------

    def close(self) -> None:
        """Remove the farm: containers, daemons, their leftovers, mounts, namespaces, files.
        Idempotent; every step runs even when an earlier one failed, and what could not be
        removed is raised as one EngineFarmError at the end."""
        if self._closed:
            return
        self._closed = True
        if not self._own_root:
            return
        errors: list[str] = []
        threads = [threading.Thread(target=self._stop_slot, args=(slot, errors)) for slot in self._slots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cgroups = [s.cgroup_parent for s in self._slots]
        if self.root_dir.exists() or any((NETNS_DIR / s.netns).exists() for s in self._slots) or cgroup_dirs(cgroups):
            try:
                teardown_root(self.root_dir, [s.netns for s in self._slots], cgroups)
            except (OSError, subprocess.SubprocessError) as e:
                errors.append(f"removing {self.root_dir}: {e}")
        left = [f"process {pid}" for pid in processes_under(self.root_dir)] + \
               [f"mount {m}" for m in mounts_under(self.root_dir)] + \
               [f"netns {s.netns}" for s in self._slots if (NETNS_DIR / s.netns).exists()] + \
               [f"container process {pid}" for pid in processes_in_cgroups(cgroups)] + \
               [f"cgroup {d}" for d in cgroup_dirs(cgroups)]
        if left:
            errors.append(f"left behind: {left}")
        if errors:
            raise EngineFarmError("closing the engine farm: " + "; ".join(errors))

    def _stop_slot(self, slot: _Slot, errors: list[str]) -> None:
        # Containers first, through the engine: that stops their shims and gVisor sandboxes and
        # unmounts their layers in order; dockerd then unmounts its own on a clean stop.
        if slot.dockerd is not None and slot.dockerd.poll() is None and slot.socket.exists():
            try:
                client = docker.DockerClient(base_url=f"unix://{slot.socket}", timeout=30)
                try:
                    for container in client.containers.list(all=True):
                        with contextlib.suppress(docker.errors.NotFound):
                            container.remove(force=True)
                finally:
                    client.close()
            except docker.errors.DockerException as e:
                errors.append(f"{slot.name}: removing containers: {e}")
        for proc in (slot.dockerd, slot.containerd):  # dockerd first: it still talks to containerd
            if proc is None:
                continue
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
            else:
                proc.wait()  # collect it: no zombie of ours stays either

    # -- context manager ----------------------------------------------------------------

    def __enter__(self) -> EngineFarm:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
