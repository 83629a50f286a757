"""File transfer through a real sandbox (docs/escape-battery.md cases 38-39), on runc and gVisor.

Copy-out: a tool fills /tmp/out with links (to /etc/shadow, to a host file, hardlinks), files
that it keeps swapping for links while it tars them, and hand-made tar streams; it writes the
tar to stdout with the stdlib's tarfile; the host runs `extract_output`. Nothing outside the
destination is read or written: asserted on content and on lstat, never by following a link.

Copy-in: `stage_files` -> an InputMount at /input: readable inside, not writable (EROFS), and an
archive with a `..` entry is refused before any container is created (the engine's own event
stream, filtered by the call's label, shows no `create`).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import secrets
import stat
import tarfile
import time
from pathlib import Path

import pytest
from docker.types import Mount

from ringfence_server.sandbox import labels as L
from ringfence_server.sandbox.archive import OutputLink, extract_output, stage_archive, stage_files
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.errors import ArchiveError
from ringfence_server.sandbox.profile import InputMount, MiB, SandboxProfile
from ringfence_server.sandbox.result import Outcome, SandboxResult

pytestmark = pytest.mark.docker

SENTINEL = b"host sentinel: must never change\n"


class Host:
    """tmp/a holding a sentinel file and directory; dest = tmp/a/dest. Watched by lstat."""

    def __init__(self, tmp: Path) -> None:
        self.a = tmp / "a"
        self.a.mkdir()
        self.dest = self.a / "dest"
        self.sentinel = self.a / "sentinel"
        self.sentinel.write_bytes(SENTINEL)
        self.outside = self.a / "outside"
        self.outside.mkdir()
        self.shadow_before = _lstat_key(Path("/etc/shadow"))
        self.before = self.snapshot()

    def snapshot(self) -> dict[str, tuple]:
        seen = {}
        for root, dirs, files in os.walk(self.a):
            for name in dirs + files:
                p = Path(root, name)
                if p == self.dest or self.dest in p.parents:
                    continue
                st = os.lstat(p)
                digest = hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else ""
                seen[str(p.relative_to(self.a))] = (st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, digest)
        return seen

    def assert_untouched(self) -> None:
        assert self.snapshot() == self.before
        assert self.sentinel.read_bytes() == SENTINEL
        # /etc/shadow is only lstat'ed, never read: same inode, size and mtime as before.
        assert _lstat_key(Path("/etc/shadow")) == self.shadow_before

    def dest_entries(self) -> dict[str, os.stat_result]:
        return {
            str(Path(root, n).relative_to(self.dest)): os.lstat(Path(root, n))
            for root, dirs, files in os.walk(self.dest)
            for n in dirs + files
        }


def _lstat_key(path: Path) -> tuple:
    st = os.lstat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def stdout_tar(result: SandboxResult) -> bytes:
    assert result.outcome is Outcome.OK, (result.outcome, result.message, result.stderr[-2000:])
    assert not result.stdout_truncated
    return result.stdout


# -- 38. copy-out -----------------------------------------------------------------------------------

# Builds /tmp/out, keeps swapping files for links while tarring it, writes the tar to stdout.
# argv[1] is the host's sentinel path: inside the container it names nothing, but a host that
# followed a link to it would write to the sentinel.
LINKY_OUTPUT = r"""
import io, os, signal, sys, tarfile
host_sentinel = sys.argv[1]
out = "/tmp/out"
os.mkdir(out)
with open(f"{out}/result.txt", "w") as f:
    f.write("the tool's real result\n")
os.mkdir(f"{out}/sub")
with open(f"{out}/sub/nested.txt", "w") as f:
    f.write("nested\n")
os.symlink("/etc/shadow", f"{out}/shadow")
os.symlink(host_sentinel, f"{out}/sentinel")
os.symlink("/etc", f"{out}/etc-dir")
os.symlink("../../..", f"{out}/up")
os.link(f"{out}/result.txt", f"{out}/zz-hard")  # after result.txt in sorted order
notes = []
try:
    os.link("/etc/passwd", f"{out}/passwd")
except OSError as e:
    notes.append(f"hardlink to /etc/passwd: {e.strerror}")
# Files swapped for links (and back) while tarfile walks the tree.
targets = ["/etc/passwd", host_sentinel]
names = [f"{out}/swap{i}" for i in range(40)]
for n in names:
    open(n, "w").write("plain file\n")
swapper = os.fork()  # a process, not a thread: the swaps race tarfile's lstat/open for real
if swapper == 0:
    i = 0
    while True:
        n = names[i % len(names)]
        flip = i // len(names)  # each name flips between file and link on every pass
        tmp = f"{n}.new{flip % 2}"
        try:
            if flip % 2:
                os.symlink(targets[flip % 4 // 2], tmp)
            else:
                open(tmp, "w").write("plain file\n")
            os.replace(tmp, n)
        except OSError:
            pass
        i += 1
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
    for round in range(3):
        for root, dirs, files in os.walk(out):
            for name in sorted(set(dirs + files)):  # readdir may repeat a name renamed under it
                path = os.path.join(root, name)
                arc = os.path.relpath(path, out) if round == 0 else f"round{round}/" + os.path.relpath(path, out)
                try:
                    tar.add(path, arcname=arc, recursive=False)
                except OSError:
                    pass  # a swap target that does not exist in here
os.kill(swapper, signal.SIGKILL)
os.waitpid(swapper, 0)
sys.stderr.write("\n".join(notes))
sys.stdout.buffer.write(buf.getvalue())
"""


def test_links_in_a_tools_output_are_never_followed(attack, runtime, host: Host) -> None:
    result = attack(["python3", "-I", "-c", LINKY_OUTPUT, str(host.sentinel)], runtime=runtime, stdout_limit=8 * MiB)
    tree = extract_output(stdout_tar(result), host.dest)

    # The real results arrive.
    assert (host.dest / "result.txt").read_bytes() == b"the tool's real result\n"
    assert (host.dest / "sub" / "nested.txt").read_bytes() == b"nested\n"
    # The links are metadata only.
    links = {link.path: link for link in tree.links}
    assert links["shadow"] == OutputLink("shadow", "symlink", "/etc/shadow")
    assert links["sentinel"] == OutputLink("sentinel", "symlink", str(host.sentinel))
    assert links["etc-dir"] == OutputLink("etc-dir", "symlink", "/etc")
    assert links["up"] == OutputLink("up", "symlink", "../../..")
    assert links["zz-hard"] == OutputLink("zz-hard", "hardlink", "result.txt")
    # The kernel refused the cross-filesystem hardlink inside (rootfs vs /tmp tmpfs).
    assert b"hardlink to /etc/passwd" in result.stderr
    # On the host: only regular files (nlink 1) and directories, nothing named after a link.
    entries = host.dest_entries()
    for rel, st in entries.items():
        assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode), f"{rel} is neither file nor dir"
        if stat.S_ISREG(st.st_mode):
            assert st.st_nlink == 1 and stat.S_IMODE(st.st_mode) == 0o644
    for name in ("shadow", "sentinel", "etc-dir", "up", "zz-hard"):
        assert name not in entries
    # The swapped files: each ended up either as a plain file (with the content the tool had
    # inside, never host content) or as a recorded link.
    host_passwd = Path("/etc/passwd").read_bytes()
    swaps = [rel for rel in entries if os.path.basename(rel).startswith("swap")]
    swapped_links = [link for link in tree.links if os.path.basename(link.path).startswith("swap")]
    assert len(swaps) + len(swapped_links) >= 40
    for rel in swaps:
        assert (host.dest / rel).read_bytes() != host_passwd
        assert (host.dest / rel).read_bytes() != SENTINEL
    host.assert_untouched()


# Hand-made tar streams: the tool controls every header byte, not just what is in /tmp/out.
CRAFTED = r"""
import base64, io, json, sys, tarfile
sentinel, outside, a = sys.argv[1], sys.argv[2], sys.argv[3]
def tar(*members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, kind, value in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(value)
                t.addfile(info, io.BytesIO(value))
            else:
                info.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
                info.linkname = value
                t.addfile(info)
    return base64.b64encode(buf.getvalue()).decode()
print(json.dumps({
    "symlink-then-write": tar(("x", "sym", sentinel), ("x", "file", b"PWNED")),
    "hardlink-then-write": tar(("h", "hard", sentinel), ("h", "file", b"PWNED")),
    "symlink-dir-then-child": tar(("d", "sym", outside), ("d/escaped", "file", b"PWNED")),
    "dotdot": tar(("../escaped", "file", b"PWNED")),
    "absolute": tar((a + "/escaped", "file", b"PWNED")),
}))
"""


def _crafted(attack, runtime: str, host: Host) -> dict[str, bytes]:
    result = attack(
        ["python3", "-I", "-c", CRAFTED, str(host.sentinel), str(host.outside), str(host.a)], runtime=runtime
    )
    assert result.outcome is Outcome.OK, result.stderr
    return {k: base64.b64decode(v) for k, v in json.loads(result.stdout).items()}


def test_crafted_output_archives_are_refused(attack, runtime, host: Host) -> None:
    archives = _crafted(attack, runtime, host)
    for name, data in archives.items():
        with pytest.raises(ArchiveError, match="member"):
            extract_output(data, host.dest)
        assert not host.dest.exists(), name
    assert not (host.a / "escaped").exists() and list(host.outside.iterdir()) == []
    host.assert_untouched()


def test_red_check_crafted_archives_escape_an_unchecked_extraction(attack, host: Host, tmp_path: Path) -> None:
    """The same tool-made archives, extracted on the host with plain tarfile and no filter."""
    archives = _crafted(attack, "runc", host)
    for name, data in archives.items():
        scratch = host.a / f"scratch-{name}"
        scratch.mkdir()
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(scratch)
    assert host.sentinel.read_bytes() != SENTINEL  # written through the planted link
    assert (host.a / "escaped").exists() and (host.outside / "escaped").exists()


# -- 39. copy-in -----------------------------------------------------------------------------------

READ_AND_WRITE = r"""
import errno, json, os
def attempt(fn):
    try:
        fn(); return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
out = {
    "read": open("/input/data/in.txt").read(),
    "listing": sorted(os.listdir("/input")),
    "create": attempt(lambda: open("/input/new.txt", "w").write("x")),
    "append": attempt(lambda: open("/input/data/in.txt", "a").write("x")),
    "mkdir": attempt(lambda: os.mkdir("/input/newdir")),
    "unlink": attempt(lambda: os.unlink("/input/cfg.json")),
    "rename": attempt(lambda: os.rename("/input/cfg.json", "/input/moved.json")),
}
print(json.dumps(out))
"""


def _staged(host: Host) -> Path:
    tree = stage_files({"data/in.txt": b"hello from the host\n", "cfg.json": b"{}"}, host.dest)
    # Open everything up so that only the read-only mount can be what stops a write.
    for p in (tree.root, tree.root / "data"):
        p.chmod(0o777)
    for f in tree.files:
        (tree.root / f.path).chmod(0o666)
    return tree.root


def test_staged_input_is_readable_but_not_writable(attack, runtime, host: Host) -> None:
    root = _staged(host)
    result = attack(
        ["python3", "-I", "-c", READ_AND_WRITE], runtime=runtime, inputs=(InputMount(str(root), "/input"),)
    )
    assert result.outcome is Outcome.OK, result.stderr
    report = json.loads(result.stdout)
    assert report["read"] == "hello from the host\n"
    assert report["listing"] == ["cfg.json", "data"]
    writes = ("create", "append", "mkdir", "unlink", "rename")
    assert {k: report[k] for k in writes} == dict.fromkeys(writes, "EROFS")
    assert sorted(os.listdir(root)) == ["cfg.json", "data"]
    assert (root / "data" / "in.txt").read_bytes() == b"hello from the host\n"
    assert [m for m in result.applied["mounts"] if m["target"] == "/input"] == [
        {"source": str(root), "target": "/input", "read_only": True}
    ]


def test_red_check_a_writable_input_mount_lets_the_tool_write_the_host(weakened, host: Host) -> None:
    root = _staged(host)

    def writable(settings: dict) -> dict:
        settings["mounts"] = [
            Mount(target=m["Target"], source=m["Source"], type="bind", read_only=False)
            if m["Target"] == "/input" else m
            for m in settings["mounts"]
        ]
        return settings

    result = weakened(writable)(["python3", "-I", "-c", READ_AND_WRITE], inputs=(InputMount(str(root), "/input"),))
    report = json.loads(result.stdout)
    assert report["create"] == "ok" and report["append"] == "ok"
    assert (root / "new.txt").read_bytes() == b"x"


def _creates_by_call(docker_client, since: float) -> dict[str, int]:
    """The engine's own record: container `create` events since `since`, counted per call label."""
    events = docker_client.events(
        since=int(since) - 1,
        until=int(time.time()) + 1,
        filters={"type": "container", "event": "create", "label": f"{L.RUN_LABEL}=transfer"},
        decode=True,
    )
    counts: dict[str, int] = {}
    for event in events:
        call = event.get("Actor", {}).get("Attributes", {}).get(L.CALL_LABEL, "")
        counts[call] = counts.get(call, 0) + 1
    return counts


def _staged_call(backend, tar_bytes: bytes, dest: Path, call_id: str, runtime: str) -> SandboxResult:
    """What a caller does: stage the archive, then run the tool with it mounted."""
    tree = stage_archive(tar_bytes, dest)
    profile = SandboxProfile(runtime=runtime, inputs=(InputMount(str(tree.root), "/input"),))
    request = SandboxRequest(profile=profile, argv=("cat", "/input/in.txt"), run_id="transfer", call_id=call_id)
    return backend.run(request)


def _tar(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_bad_input_archive_is_refused_before_any_container_exists(
    backend, docker_client, runtime, host: Host, tmp_path: Path
) -> None:
    started = time.time()
    bad_call = secrets.token_hex(8)
    with pytest.raises(ArchiveError, match=r"member '\.\./in\.txt'"):
        _staged_call(backend, _tar("../in.txt", b"PWNED"), host.dest, bad_call, runtime)
    assert not (host.a / "in.txt").exists() and not host.dest.exists()
    # The positive control: the same flow with a clean archive creates exactly one container.
    good_call = secrets.token_hex(8)
    result = _staged_call(backend, _tar("in.txt", b"clean input"), tmp_path / "good", good_call, runtime)
    assert result.outcome is Outcome.OK and result.stdout == b"clean input"
    creates = _creates_by_call(docker_client, started)
    assert creates.get(good_call) == 1
    assert bad_call not in creates
    host.assert_untouched()
