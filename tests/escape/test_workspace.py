"""Escape battery, cases 48-53: a run's workspace (ringfence_server.sandbox.workspace), the one filesystem whose
files outlive a call. Every case is a real pair of calls on a real workspace (a capped tmpfs
volume held by its keeper): call 1 plants something, call 2, in a fresh container, tries to use
it. Under runc and gVisor; every case that is not a red check runs its calls cold (a container
created for the call) and warm (one made ahead for that workspace's pool shape and claimed:
`in_workspace`, tests/escape/conftest.py).

Each red check removes exactly one protection (an option of the volume, or the call's mounts,
through `make_workspace(options=...)` or `weakened`) and shows the same attack succeed.
"""

from __future__ import annotations

import json
import uuid

import probes
import pytest
from docker.types import Mount

from ringfence_server.sandbox import seccomp
from ringfence_server.sandbox.profile import KiB, MiB, WorkspaceMount
from ringfence_server.sandbox.workspace import WorkspaceSpec, keeper_name

pytestmark = pytest.mark.docker

LIB = (probes.HERE / "_lib.py").read_text()
CAP_BYTES = 1 * MiB
CAP_INODES = 64
SPEC = WorkspaceSpec(bytes=CAP_BYTES, inodes=CAP_INODES)


def probe(code: str, *args: str) -> list[str]:
    """A probe run with `python3 -I -c` after the shared helpers of probes/_lib.py."""
    return ["python3", "-I", "-c", LIB + "\n# ---- workspace probe\n" + code, *args]


def call(run, code: str, *args: str, volume: str, runtime: str = "runc", read_only: bool = False, **limits) -> dict:
    """One call with the workspace mounted; its probe's JSON report."""
    result = run(probe(code, *args), runtime=runtime, workspace=WorkspaceMount(volume, read_only), **limits)
    return probes.report(result)


def without_option(name: str):
    """The volume's options without `name` (a flag, or a key=value option)."""

    def change(options: dict[str, str]) -> dict[str, str]:
        kept = [o for o in options["o"].split(",") if o != name and not o.startswith(name + "=")]
        assert len(kept) < len(options["o"].split(",")), f"{name} is not among {options['o']}"
        return {**options, "o": ",".join(kept)}

    return change


def host_mount_options(docker_client, volume: str) -> set[str]:
    """The per-mount options of the volume's host mount point (the engine's mount, which the
    gVisor gofer serves files from), as this host sees it."""
    mountpoint = docker_client.volumes.get(volume).attrs["Mountpoint"]
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == mountpoint:
                return set(fields[5].split(","))
    raise AssertionError(f"{mountpoint} is not mounted on the host (is the keeper running?)")


MOUNT_OPTIONS = """
def workspace_mount():
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == "/workspace":
                return {"options": fields[5].split(","), "super": line.split(" - ")[1].split()}
    return None
"""


# ---- case 48: setuid and exec of a binary an earlier call wrote ----------------------------------

PLANT_BINARY = """
import shutil
shutil.copyfile("/usr/bin/id", "/workspace/id-suid")
os.chmod("/workspace/id-suid", 0o4755)
with open("/workspace/script.py", "w") as f:
    f.write("print('script ran')\\n")
st = os.stat("/workspace/id-suid")
emit({"mode": oct(st.st_mode & 0o7777), "owner": st.st_uid})
"""

USE_BINARY = MOUNT_OPTIONS + """
import mmap
LOADER = "/lib64/ld-linux-x86-64.so.2"


def mmap_exec():
    with open("/workspace/id-suid", "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC, flags=mmap.MAP_PRIVATE)
        first = m[0]  # touch it: gVisor maps lazily, and the host's refusal comes at the fault
        m.close()
        return {"ok": True, "first": first}


def mapped():
    try:
        return mmap_exec()
    except OSError as e:
        return {"ok": False, "errno": ename(e.errno)}


emit({
    "exec": run(["/workspace/id-suid", "-u"]),
    "via_loader": run([LOADER, "/workspace/id-suid", "-u"]),
    # in a child: under gVisor a refused mapping is a fault, which would end the probe
    "mmap_exec": in_child(mapped),
    "script": run(["python3", "/workspace/script.py"]),
    "mount": workspace_mount(),
    "euid": os.geteuid(),
})
"""


def _planted(run, volume, runtime):
    p = call(run, PLANT_BINARY, volume=volume, runtime=runtime)
    assert p == {"mode": "0o4755", "owner": 10001}  # a setuid file can be written: it must not run
    return p


@pytest.mark.parametrize("read_only", [False, True], ids=["rw", "ro"])
def test_case_48_setuid_binary_from_an_earlier_call_never_runs(in_workspace, make_workspace, docker_client,
                                                              runtime, read_only):
    """Call 1 writes a setuid copy of `id`; call 2 (writable, or read-only through the view)
    cannot run it: not by exec, not through the dynamic loader, not by mapping it executable.
    A script handed to an interpreter still runs (noexec is about binaries, like /tmp)."""
    _, volume = make_workspace(SPEC)
    _planted(in_workspace, volume, runtime)
    p = call(in_workspace, USE_BINARY, volume=volume, runtime=runtime, read_only=read_only)
    assert "10001" not in p["exec"]["out"] and "10001" not in p["via_loader"]["out"]
    assert p["script"] == {"rc": 0, "out": "script ran\n", "err": ""}
    if runtime == "runc":
        assert p["exec"] == {"rc": None, "errno": "EACCES", "out": "", "err": ""}
        assert p["via_loader"]["rc"] == 127 and "failed to map segment" in p["via_loader"]["err"]
        assert p["mmap_exec"] == {"ok": False, "errno": "EPERM"}
        assert {"nosuid", "nodev", "noexec"} <= set(p["mount"]["options"])
        assert ("ro" in p["mount"]["options"]) is read_only
    else:
        # FINDING (gVisor 20221219): the sentry's own mount shows none of the flags (a 9p mount
        # of the gofer, "rw"/"ro" only) and execve itself succeeds: the sentry reads the ELF.
        # Its segments are then mapped from the gofer's host file descriptor, which lives on
        # the host's noexec mount: the host refuses the executable mapping and the process dies
        # of SIGSEGV before one instruction of the file runs (through the loader the same).
        assert p["exec"]["rc"] == -11 and p["exec"]["out"] == ""
        assert p["via_loader"]["rc"] == -11 and p["via_loader"]["out"] == ""
        assert p["mmap_exec"] is None  # the child touching the mapping died of the fault
        assert p["mount"]["options"][0] == ("ro" if read_only else "rw")
    assert {"nosuid", "nodev", "noexec"} <= host_mount_options(docker_client, volume)


@pytest.mark.parametrize("runtime", ["runc", "gvisor"], indirect=True)
def test_case_48_red_volume_without_noexec(cold, make_workspace, runtime):
    """The volume made without noexec: call 2 runs call 1's binary (euid 10001 still: nosuid and
    no-new-privileges stay, and the file is the sandbox user's own)."""
    _, volume = make_workspace(SPEC, options=without_option("noexec"))
    _planted(cold, volume, runtime)
    p = call(cold, USE_BINARY, volume=volume, runtime=runtime)
    assert p["exec"] == {"rc": 0, "out": "10001\n", "err": ""}


def test_case_48_red_docker_read_only_flag(cold, make_workspace, weakened):
    """FINDING (runc 1.1.5): the workspace volume mounted with Docker's own read-only flag, not
    through the read-only view: runc makes the bind read-only with a remount that drops the
    nosuid, nodev and noexec the bind inherited (runc#1247), and call 2 runs the binary."""
    _, volume = make_workspace(SPEC)
    _planted(cold, volume, "runc")

    def docker_read_only(s):
        mounts = [m for m in s["mounts"] if m["Target"] != "/workspace"]
        return {**s, "mounts": [*mounts, Mount(target="/workspace", source=volume, type="volume", read_only=True)]}

    p = call(weakened(docker_read_only), USE_BINARY, volume=volume, read_only=True)
    assert "ro" in p["mount"]["options"] and "noexec" not in p["mount"]["options"]
    assert p["exec"] == {"rc": 0, "out": "10001\n", "err": ""}


# ---- case 49: device nodes ---------------------------------------------------------------------------

MAKE_NODES = """
import stat
out = {}
for name, mode, dev in (("char-null", stat.S_IFCHR, os.makedev(1, 3)), ("block-loop", stat.S_IFBLK, os.makedev(7, 0))):
    path = "/workspace/" + name
    out[name] = attempt(os.mknod, path, mode | 0o666, dev)
    if out[name]["ok"]:
        os.chmod(path, 0o666)
emit(out)
"""

OPEN_NODE = MOUNT_OPTIONS + """
def use():
    fd = os.open("/workspace/char-null", os.O_RDWR)
    try:
        return {"wrote": os.write(fd, b"x"), "read": os.read(fd, 1).decode()}
    finally:
        os.close(fd)


try:
    result = {"ok": True, **use()}
except OSError as e:
    result = {"ok": False, "errno": ename(e.errno)}
emit({"open": result, "mount": workspace_mount(), "uid": os.getuid()})
"""


def _mknod_provoked(s):
    """Root with CAP_MKNOD (and DAC_OVERRIDE for the sandbox user's 0700 directory), and our
    seccomp rule on mknod lifted (Docker's unconditional one back): all a node needs."""
    profile = json.loads(seccomp.profile_json("runc"))
    profile["syscalls"].append({"names": ["mknod", "mknodat"], "action": "SCMP_ACT_ALLOW"})
    return probes.with_seccomp(json.dumps(profile))(probes.as_root("MKNOD", "DAC_OVERRIDE")(s))


def test_case_49_no_device_node_can_be_made(in_workspace, make_workspace, runtime):
    _, volume = make_workspace(SPEC)
    p = call(in_workspace, MAKE_NODES, volume=volume, runtime=runtime)
    assert p == {"char-null": {"ok": False, "errno": "EPERM"}, "block-loop": {"ok": False, "errno": "EPERM"}}


def test_case_49_nodev_holds_for_a_node_made_anyway(make_workspace, weakened, in_workspace):
    """Provoked (runc): call 1 is given everything mknod needs (_mknod_provoked) and makes
    /dev/null's device number in the workspace. Call 2, the real sandbox, cannot open it: the
    workspace is nodev."""
    _, volume = make_workspace(SPEC)
    made = call(weakened(_mknod_provoked), MAKE_NODES, volume=volume)
    assert made["char-null"] == {"ok": True, "value": None}
    p = call(in_workspace, OPEN_NODE, volume=volume)
    assert p["uid"] == 10001 and "nodev" in p["mount"]["options"]
    assert p["open"] == {"ok": False, "errno": "EACCES"}


def test_case_49_red_volume_without_nodev(make_workspace, weakened, cold):
    """The same node in a volume made without nodev: call 2 opens it and writes to the device."""
    _, volume = make_workspace(SPEC, options=without_option("nodev"))
    call(weakened(_mknod_provoked), MAKE_NODES, volume=volume)
    p = call(cold, OPEN_NODE, volume=volume)
    assert p["open"] == {"ok": True, "wrote": 1, "read": ""}


# ---- case 50: links ------------------------------------------------------------------------------------

PLANT_LINKS = """
with open("/workspace/own", "w") as f:
    f.write("own file\\n")
out = {"hardlink_out": attempt(os.link, "/etc/passwd", "/workspace/passwd"),
       "hardlink_in": attempt(os.link, "/workspace/own", "/workspace/own-again")}
host_file, host_dir = sys.argv[1:3]
for name, target in (("shadow", "/etc/shadow"), ("pid1-root", "/proc/1/root"), ("host-file", host_file),
                     ("host-dir", host_dir)):
    os.symlink(target, "/workspace/" + name)
out["links"] = sorted(os.listdir("/workspace"))
emit(out)
"""

FOLLOW_LINKS = """
def read(path):
    try:
        with open(path, "rb") as f:
            return {"ok": True, "data": f.read(200).decode(errors="replace")}
    except OSError as e:
        return {"ok": False, "errno": ename(e.errno)}


def same_file(a, b):
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError as e:
        return ename(e.errno)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


with open("/etc/hostname") as f:
    own_hostname = f.read()
emit({
    "host_file": read("/workspace/host-file"),
    "host_dir": attempt(os.listdir, "/workspace/host-dir"),
    "shadow_is_own": same_file("/workspace/shadow", "/etc/shadow"),
    "shadow": read("/workspace/shadow"),
    "pid1_root_hostname": read("/workspace/pid1-root/etc/hostname"),
    "own_hostname": own_hostname,
})
"""


@pytest.fixture
def host_marker(tmp_path):
    """A file on the host, with text no sandbox can know: (its path, its directory, the text)."""
    text = f"host marker {uuid.uuid4().hex}"
    marker = tmp_path / "marker"
    marker.write_text(text)
    # Readable by the sandbox user, were it ever reached (the red check binds the directory).
    tmp_path.chmod(0o755)
    marker.chmod(0o644)
    return str(marker), str(tmp_path), text


def test_case_50_links_stay_inside_the_calls_own_container(in_workspace, make_workspace, runtime, host_marker):
    """A hardlink out of the workspace fails (another filesystem); symlinks call 1 leaves behind
    resolve, in call 2, inside call 2's own container: to its own /etc/shadow (unreadable), its
    own PID 1 (unreadable under runc), never to the host's file they name."""
    marker, marker_dir, text = host_marker
    _, volume = make_workspace(SPEC)
    planted = call(in_workspace, PLANT_LINKS, marker, marker_dir, volume=volume, runtime=runtime)
    assert planted["hardlink_out"] == {"ok": False, "errno": "EXDEV"}
    assert planted["hardlink_in"] == {"ok": True, "value": None}  # links are possible: not this one
    assert {"shadow", "pid1-root", "host-file", "host-dir"} <= set(planted["links"])
    p = call(in_workspace, FOLLOW_LINKS, volume=volume, runtime=runtime, read_only=True)
    assert p["host_file"] == {"ok": False, "errno": "ENOENT"}
    assert p["host_dir"] == {"ok": False, "errno": "ENOENT"}
    assert p["shadow_is_own"] is True and p["shadow"] == {"ok": False, "errno": "EACCES"}
    assert p["pid1_root_hostname"] in ({"ok": False, "errno": "EACCES"}, {"ok": True, "data": p["own_hostname"]})
    if runtime == "runc":
        assert p["pid1_root_hostname"] == {"ok": False, "errno": "EACCES"}  # tini is not dumpable
    assert text not in str(p)


def test_case_50_red_host_path_mounted(make_workspace, weakened, cold, host_marker):
    """With the host directory the link names bound into call 2 (an undeclared mount), the
    same link reads the host's file."""
    marker, marker_dir, text = host_marker
    _, volume = make_workspace(SPEC)
    call(cold, PLANT_LINKS, marker, marker_dir, volume=volume)

    def bind_host_dir(s):
        host_dir = Mount(target=marker_dir, source=marker_dir, type="bind", read_only=True)
        return {**s, "mounts": [*s["mounts"], host_dir]}

    p = call(weakened(bind_host_dir), FOLLOW_LINKS, volume=volume, read_only=True)
    assert p["host_file"] == {"ok": True, "data": text}


# ---- case 51: a full workspace stops at its caps ------------------------------------------------------

FILL_BYTES = """
limit = int(sys.argv[1])
written, error = 0, None
try:
    with open("/workspace/fill", "wb") as f:
        while written < limit:
            written += f.write(b"x" * (64 * 1024))
            f.flush()
except OSError as e:
    error = ename(e.errno)
emit({"written": written, "error": error})
"""

FILL_INODES = """
limit = int(sys.argv[1])
made, error = 0, None
os.makedirs("/workspace/files", exist_ok=True)
try:
    while made < limit:
        open("/workspace/files/%d" % made, "w").close()
        made += 1
except OSError as e:
    error = ename(e.errno)
more = attempt(lambda: open("/workspace/one-more-byte", "ab").write(b"x"))
emit({"made": made, "error": error, "write_after": more})
"""


def test_case_51_a_full_workspace_stops_at_its_caps(in_workspace, make_workspace, runtime):
    """Call 1 fills the bytes (ENOSPC at the cap); call 2 finds it still full and fills the
    inodes (ENOSPC at the cap). Under gVisor the caps are the host tmpfs's, enforced through the
    gofer, so they hold there too (unlike the sentry's own /tmp, case 42)."""
    _, volume = make_workspace(SPEC)
    p = call(in_workspace, FILL_BYTES, str(8 * CAP_BYTES), volume=volume, runtime=runtime)
    assert p["error"] == "ENOSPC" and CAP_BYTES - 128 * KiB <= p["written"] <= CAP_BYTES
    p = call(in_workspace, FILL_INODES, str(10 * CAP_INODES), volume=volume, runtime=runtime)
    assert p["error"] == "ENOSPC" and CAP_INODES - 8 <= p["made"] < CAP_INODES
    assert p["write_after"] == {"ok": False, "errno": "ENOSPC"}


@pytest.mark.parametrize("runtime", ["runc", "gvisor"], indirect=True)
def test_case_51_red_volume_without_size(cold, make_workspace, runtime):
    _, volume = make_workspace(SPEC, options=without_option("size"))
    p = call(cold, FILL_BYTES, str(4 * CAP_BYTES), volume=volume, runtime=runtime)
    assert p == {"written": 4 * CAP_BYTES, "error": None}


@pytest.mark.parametrize("runtime", ["runc", "gvisor"], indirect=True)
def test_case_51_red_volume_without_nr_inodes(cold, make_workspace, runtime):
    _, volume = make_workspace(SPEC, options=without_option("nr_inodes"))
    p = call(cold, FILL_INODES, str(10 * CAP_INODES), volume=volume, runtime=runtime)
    assert p["made"] == 10 * CAP_INODES and p["error"] is None


# ---- case 52: another run's workspace is unreachable -------------------------------------------------

WRITE_SECRET = """
with open("/workspace/secret-" + sys.argv[1], "w") as f:
    f.write(sys.argv[1])
emit({"ok": True})
"""

LOOK_FOR_SECRET = MOUNT_OPTIONS + """
name = "secret-" + sys.argv[1]
found = []
for top, dirs, files in os.walk("/"):
    if top in ("/proc", "/sys"):
        dirs[:] = []
        continue
    found += [os.path.join(top, f) for f in files if f == name]
mounts = []
with open("/proc/self/mountinfo") as f:
    for line in f:
        point = line.split()[4]
        if point.startswith("/workspace") or "volumes" in line:
            mounts.append(line.strip())
vfs = os.statvfs("/workspace")
emit({
    "found": found,
    "listing": sorted(os.listdir("/workspace")),
    "mounts": mounts,
    "workspace": workspace_mount(),
    "size": vfs.f_blocks * vfs.f_frsize,
    "by_engine_path": attempt(os.stat, "/var/lib/docker/volumes/" + sys.argv[2] + "/_data/" + name),
})
"""


def test_case_52_another_runs_workspace_is_unreachable(in_workspace, make_workspace, runtime):
    """Run A's file is nowhere in run B's call (searched through its whole tree and by the
    engine's path of A's volume), and B's call has exactly one mount at /workspace: its own
    (B's workspace has twice A's size, so the mount says whose it is)."""
    secret = uuid.uuid4().hex
    _, volume_a = make_workspace(SPEC)
    _, volume_b = make_workspace(WorkspaceSpec(bytes=2 * CAP_BYTES, inodes=CAP_INODES))
    call(in_workspace, WRITE_SECRET, secret, volume=volume_a, runtime=runtime)
    p = call(in_workspace, LOOK_FOR_SECRET, secret, volume_a, volume=volume_b, runtime=runtime)
    assert p["found"] == [] and p["listing"] == []
    assert p["by_engine_path"] == {"ok": False, "errno": "ENOENT"}
    assert len(p["mounts"]) == 1 and p["mounts"][0].split()[4] == "/workspace", p["mounts"]
    assert p["size"] == 2 * CAP_BYTES
    if runtime == "runc":
        assert "size=2048k" in p["workspace"]["super"][-1].split(",")


def test_case_52_red_other_volume_mounted(cold, make_workspace, weakened):
    """A's volume mounted into B's call as well (one mount more than the call's own): the
    search finds A's file and the mounts show two workspaces."""
    secret = uuid.uuid4().hex
    _, volume_a = make_workspace(SPEC)
    _, volume_b = make_workspace(WorkspaceSpec(bytes=2 * CAP_BYTES, inodes=CAP_INODES))
    call(cold, WRITE_SECRET, secret, volume=volume_a)

    def also_a(s):
        return {**s, "mounts": [*list(s["mounts"]), Mount(target="/workspace-a", source=volume_a, type="volume")]}

    p = call(weakened(also_a), LOOK_FOR_SECRET, secret, volume_a, volume=volume_b)
    assert p["found"] == [f"/workspace-a/secret-{secret}"] and len(p["mounts"]) == 2


# ---- case 53: files survive across calls, processes do not ------------------------------------------

LEAVE_A_PROCESS = """
sleeper = subprocess.Popen(["sleep", sys.argv[1]], start_new_session=True, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
with open("/workspace/state.txt", "w") as f:
    f.write("written by call 1\\n")
with open("/workspace/sleeper.pid", "w") as f:
    f.write(str(sleeper.pid))
emit({"pid": sleeper.pid, "alive": os.path.exists("/proc/%d" % sleeper.pid)})
"""

LOOK_FOR_PROCESSES = """
procs = {}
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            with open("/proc/%s/cmdline" % name, "rb") as f:
                procs[name] = f.read().replace(b"\\0", b" ").decode(errors="replace").strip()
        except OSError as e:
            procs[name] = ename(e.errno)
with open("/workspace/state.txt") as f:
    state = f.read()
with open("/workspace/sleeper.pid") as f:
    pid = f.read()
emit({"state": state, "pid": pid, "procs": procs, "self": os.getpid()})
"""


def _own_processes_only(p, marker):
    """Every process call 2 sees is its own: its init (pid 1) and the probe."""
    assert marker not in str(p["procs"])
    for pid, cmdline in p["procs"].items():
        assert pid == "1" or int(pid) == p["self"], (pid, cmdline)


def test_case_53_files_survive_processes_do_not(in_workspace, make_workspace, runtime):
    """Call 1 writes a file and leaves a `setsid` sleeper behind, its pid in the workspace;
    call 2 reads the file, and sees no such process, nor any process but its own (not the
    keeper's either)."""
    marker = str(900000 + uuid.uuid4().int % 99999)  # the sleeper's unique argument
    _, volume = make_workspace(SPEC)
    left = call(in_workspace, LEAVE_A_PROCESS, marker, volume=volume, runtime=runtime)
    assert left["alive"] is True
    p = call(in_workspace, LOOK_FOR_PROCESSES, volume=volume, runtime=runtime)
    assert p["state"] == "written by call 1\n" and p["pid"] == str(left["pid"])
    _own_processes_only(p, marker)


def test_case_53_red_calls_in_the_keepers_pid_namespace(make_workspace, weakened):
    """Call 2 in the pid namespace of the workspace's keeper, which lives as long as the run:
    it sees processes that are not its own (the keeper's init and its sleep)."""
    run_key, volume = make_workspace(SPEC)
    cold_in_keeper = weakened(lambda s: {**s, "pid_mode": f"container:{keeper_name(run_key)}"})
    call(cold_in_keeper, LEAVE_A_PROCESS, "987650", volume=volume)
    p = call(cold_in_keeper, LOOK_FOR_PROCESSES, volume=volume)
    assert "sleep infinity" in p["procs"].values()
    with pytest.raises(AssertionError):
        _own_processes_only(p, "987650")
