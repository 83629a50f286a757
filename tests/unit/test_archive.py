"""ringfence_server.sandbox.archive: copy-in and copy-out refuse every way out of the destination (cases 38-39).

Each malicious archive is built with the stdlib's tarfile, exactly as a hostile tool could
write it. Every test works under `tmp_path/a/dest`, so an escape would land in `tmp_path/a`
(which the tests watch), never in a real system directory. The red checks show that plain
`tarfile.extractall` with no filter really does write outside the destination with the same
archives, so the refusals below are what stands between a tool and the host.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from ringfence_server.sandbox import archive
from ringfence_server.sandbox.archive import (
    ArchiveLimits,
    OutputLink,
    extract_output,
    pack_directory,
    stage_archive,
    stage_files,
)
from ringfence_server.sandbox.errors import ArchiveError, SandboxError

SENTINEL = b"host file: must never change\n"


# -- archive builders ---------------------------------------------------------------------------


def reg(name: str, data: bytes = b"data", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    return info, data


def special(name: str, type_: bytes, linkname: str = "", mode: int = 0o644) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = type_
    info.linkname = linkname
    info.mode = mode
    if type_ in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3  # /dev/null's numbers
    return info, None


def sym(name: str, target: str):
    return special(name, tarfile.SYMTYPE, target, 0o777)


def hard(name: str, target: str):
    return special(name, tarfile.LNKTYPE, target)


def directory(name: str, mode: int = 0o755):
    return special(name, tarfile.DIRTYPE, mode=mode)


def build(*members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


# -- a watched sandbox for each test -----------------------------------------------------------


class Area:
    """tmp/a with a sentinel file and a sentinel directory; dest = tmp/a/dest (not created)."""

    def __init__(self, tmp: Path) -> None:
        self.a = tmp / "a"
        self.a.mkdir()
        self.dest = self.a / "dest"
        self.sentinel = self.a / "sentinel"
        self.sentinel.write_bytes(SENTINEL)
        self.outside_dir = self.a / "outside"
        self.outside_dir.mkdir()
        self.before = self.snapshot()

    def snapshot(self) -> dict[str, tuple[int, int, str]]:
        """Every entry under tmp/a except dest: (mode, size, sha256) from lstat, never following."""
        seen = {}
        for root, dirs, files in os.walk(self.a):
            rel_root = Path(root).relative_to(self.a)
            if rel_root.parts[:1] == ("dest",):
                continue
            for name in dirs + files:
                p = Path(root) / name
                if p == self.dest:
                    continue
                st = os.lstat(p)
                digest = hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else ""
                seen[str(p.relative_to(self.a))] = (st.st_mode, st.st_size, digest)
        return seen

    def assert_untouched(self) -> None:
        assert self.snapshot() == self.before
        assert self.sentinel.read_bytes() == SENTINEL

    def links_in_dest(self) -> list[str]:
        if not self.dest.exists():
            return []
        return [
            str(Path(root, n).relative_to(self.dest))
            for root, dirs, files in os.walk(self.dest)
            for n in dirs + files
            if os.path.islink(os.path.join(root, n))
        ]


@pytest.fixture
def area(tmp_path: Path) -> Area:
    return Area(tmp_path)


# -- malicious archives, by what they aim at -------------------------------------------------


def escaping_archives(area: Area) -> dict[str, bytes]:
    """Archives whose unfiltered extraction writes outside dest (the red checks prove it)."""
    return {
        "dotdot": build(reg("../escaped", b"x")),
        "nested-dotdot": build(directory("sub"), reg("sub/../../escaped", b"x")),
        "absolute": build(reg(str(area.a / "escaped"), b"x")),
        "symlink-then-write-through": build(sym("l", str(area.sentinel)), reg("l", b"PWNED")),
        "symlink-dir-then-child": build(sym("d", str(area.outside_dir)), reg("d/escaped", b"x")),
        "relative-symlink-dir": build(sym("d", "../outside"), reg("d/escaped", b"x")),
        "hardlink-then-write-through": build(hard("h", str(area.sentinel)), reg("h", b"PWNED")),
    }


def escaped(area: Area) -> bool:
    return (
        (area.a / "escaped").exists()
        or (area.outside_dir / "escaped").exists()
        or area.sentinel.read_bytes() != SENTINEL
    )


ESCAPING = [
    "dotdot",
    "nested-dotdot",
    "absolute",
    "symlink-then-write-through",
    "symlink-dir-then-child",
    "relative-symlink-dir",
    "hardlink-then-write-through",
]


@pytest.mark.parametrize("case", ESCAPING)
def test_red_check_unfiltered_extractall_writes_outside_dest(area: Area, case: str) -> None:
    """Without our checks (and without PEP 706's filter) tarfile follows these archives out."""
    area.dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(escaping_archives(area)[case])) as tar:
        tar.extractall(area.dest)
    assert escaped(area), f"{case}: the unfiltered extraction did not escape; the test proves nothing"


@pytest.mark.parametrize("case", ESCAPING)
@pytest.mark.parametrize("func", [stage_archive, extract_output], ids=["stage_archive", "extract_output"])
def test_escaping_archives_are_refused_and_nothing_is_written(area: Area, case: str, func) -> None:
    with pytest.raises(ArchiveError, match="member"):
        func(escaping_archives(area)[case], area.dest)
    assert not escaped(area)
    assert not area.dest.exists(), "a refused archive must leave no partial tree"
    area.assert_untouched()


# -- copy-in refusals: every one names the offending member --------------------------------------


def refused_inputs(area: Area) -> dict[str, tuple[bytes, str]]:
    """case -> (archive, the member name the error must name)."""
    return {
        "dotdot": (build(reg("ok"), reg("../x")), "'../x'"),
        "absolute": (build(reg(str(area.a / "abs"))), str(area.a / "abs")),
        "symlink-to-etc-shadow": (build(sym("shadow", "/etc/shadow")), "'shadow'"),
        "hardlink-to-etc-passwd": (build(hard("passwd", "/etc/passwd")), "'passwd'"),
        # l -> "." is lexically inside, x -> "l/../sentinel" too; physically x is tmp/a/sentinel.
        "link-chain": (build(sym("l", "."), sym("x", "l/../sentinel")), "'l'"),
        "symlink-inside-tree": (build(reg("f"), sym("g", "f")), "'g'"),
        "hardlink-inside-tree": (build(reg("f"), hard("g", "f")), "'g'"),
        "char-device": (build(special("null", tarfile.CHRTYPE)), "'null'"),
        "block-device": (build(special("sda", tarfile.BLKTYPE)), "'sda'"),
        "fifo": (build(special("pipe", tarfile.FIFOTYPE)), "'pipe'"),
        "setuid-file": (build(reg("su", b"#!/bin/sh\n", mode=0o4755)), "'su'"),
        "setgid-dir": (build(directory("sg", mode=0o2755)), "'sg'"),
        "duplicate": (build(reg("twice", b"1"), reg("twice", b"2")), "'twice'"),
        "file-as-parent": (build(reg("f"), reg("f/child")), "'f/child'"),
        "empty-component-dotdot": (build(reg("a//../../x")), "'a//../../x'"),
    }


REFUSED_INPUTS = [
    "dotdot",
    "absolute",
    "symlink-to-etc-shadow",
    "hardlink-to-etc-passwd",
    "link-chain",
    "symlink-inside-tree",
    "hardlink-inside-tree",
    "char-device",
    "block-device",
    "fifo",
    "setuid-file",
    "setgid-dir",
    "duplicate",
    "file-as-parent",
    "empty-component-dotdot",
]


@pytest.mark.parametrize("case", REFUSED_INPUTS)
def test_stage_archive_refuses(area: Area, case: str) -> None:
    data, names = refused_inputs(area)[case]
    with pytest.raises(ArchiveError) as caught:
        stage_archive(data, area.dest)
    assert names in str(caught.value)
    assert not area.dest.exists()
    area.assert_untouched()


def test_link_chain_red_check_unfiltered_escapes(area: Area) -> None:
    """The chain really resolves outside: extracted without checks, x reads tmp/a/sentinel."""
    data, _ = refused_inputs(area)["link-chain"]
    area.dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(area.dest)
    assert (area.dest / "x").read_bytes() == SENTINEL


def test_device_node_red_check_data_filter_alone_would_also_refuse(area: Area) -> None:
    """Our refusal is not the only line: the stdlib data filter refuses a device too."""
    data, _ = refused_inputs(area)["char-device"]
    area.dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar, pytest.raises(tarfile.FilterError):
        tar.extractall(area.dest, filter="data")


def test_too_many_members_is_refused_at_the_cap(area: Area) -> None:
    limits = ArchiveLimits(max_members=5)
    stage_archive(build(*(reg(f"f{i}") for i in range(5))), area.a / "five", limits=limits)
    with pytest.raises(ArchiveError, match="more than 5 members"):
        stage_archive(build(*(reg(f"f{i}") for i in range(6))), area.dest, limits=limits)
    assert not area.dest.exists()


def test_oversize_is_refused_from_the_headers(area: Area) -> None:
    limits = ArchiveLimits(max_total_bytes=1000)
    stage_archive(build(reg("a", b"x" * 600), reg("b", b"x" * 400)), area.a / "exact", limits=limits)
    with pytest.raises(ArchiveError, match=r"member 'b'.*exceeds 1000 bytes"):
        stage_archive(build(reg("a", b"x" * 600), reg("b", b"x" * 401)), area.dest, limits=limits)
    assert not area.dest.exists()


def test_archive_stream_over_its_cap_is_refused_unread(area: Area) -> None:
    with pytest.raises(ArchiveError, match="over the 2048 cap"):
        stage_archive(build(reg("a", b"x" * 4096)), area.dest, limits=ArchiveLimits(max_archive_bytes=2048))


def test_header_lying_about_size_is_refused(area: Area) -> None:
    """A header that promises more bytes than the stream holds ends in an error, not a hang."""
    data = build(reg("big", b"x" * 10240))
    with pytest.raises(ArchiveError):
        stage_archive(data[: 512 + 2048], area.dest)
    assert not area.dest.exists()


def test_compressed_and_garbage_archives_are_refused(area: Area) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info, data = reg("f")
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ArchiveError, match="uncompressed tar"):
        stage_archive(buf.getvalue(), area.dest)
    with pytest.raises(ArchiveError):
        stage_archive(b"\x01" * 1024, area.dest)
    assert not area.dest.exists()


def test_destination_must_be_fresh(area: Area) -> None:
    area.dest.mkdir()
    with pytest.raises(ArchiveError, match="already exists"):
        stage_archive(build(reg("f")), area.dest)
    # Not even a symlink standing where dest should be is followed.
    area.dest.rmdir()
    area.dest.symlink_to(area.outside_dir)
    with pytest.raises(ArchiveError, match="already exists"):
        stage_files({"f": b"x"}, area.dest)
    assert list(area.outside_dir.iterdir()) == []


def test_archive_error_is_a_sandbox_error() -> None:
    assert issubclass(ArchiveError, SandboxError)


# -- stage_files -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected",
    [
        ("../x", "'..' component"),
        ("a/../../x", "'..' component"),
        ("/etc/passwd", "absolute path"),
        ("", "empty name"),
        ("a\0b", "NUL"),
        (".", "names the root"),
        ("x" * 300, "longer than 255"),
    ],
)
def test_stage_files_refuses_bad_names(area: Area, name: str, expected: str) -> None:
    with pytest.raises(ArchiveError, match=expected):
        stage_files({"fine": b"1", name: b"2"}, area.dest)
    assert not area.dest.exists()
    area.assert_untouched()


def test_stage_files_refuses_conflicts_and_caps(area: Area) -> None:
    with pytest.raises(ArchiveError, match="duplicate entry"):
        stage_files({"a": b"1", "./a": b"2"}, area.dest)
    with pytest.raises(ArchiveError, match="parent 'a' is a file"):
        stage_files({"a": b"1", "a/b": b"2"}, area.dest)
    with pytest.raises(ArchiveError, match="exceeds 10 bytes"):
        stage_files({"a": b"x" * 11}, area.dest, limits=ArchiveLimits(max_total_bytes=10))
    with pytest.raises(ArchiveError, match="more than 2 members"):
        stage_files({"a": b"", "b": b"", "c": b""}, area.dest, limits=ArchiveLimits(max_members=2))
    with pytest.raises(ArchiveError, match="must be bytes"):
        stage_files({"a": "text"}, area.dest)  # type: ignore[dict-item]
    assert not area.dest.exists()


def test_stage_files_writes_plain_readable_files(area: Area) -> None:
    tree = stage_files({"b/c.txt": b"hello", "a.json": b"{}", "empty": b""}, area.dest)
    assert tree.file_paths() == ("a.json", "b/c.txt", "empty")
    assert tree.directories == ("b",)
    assert (area.dest / "b" / "c.txt").read_bytes() == b"hello"
    for p in (area.dest, area.dest / "b"):
        assert stat.S_IMODE(os.lstat(p).st_mode) == 0o755
    for p in (area.dest / "a.json", area.dest / "b" / "c.txt", area.dest / "empty"):
        st = os.lstat(p)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644


# -- round trips -------------------------------------------------------------------------------


def test_pack_and_stage_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub" / "deeper").mkdir(parents=True)
    (src / "top.txt").write_bytes(b"top")
    (src / "sub" / "tool.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    (src / "sub" / "tool.sh").chmod(0o4755)  # set-id and exec bits are not carried over
    (src / "sub" / "deeper" / "blob").write_bytes(bytes(range(256)) * 100)
    (src / "empty-dir").mkdir()
    os.link(src / "top.txt", src / "sub" / "hardlinked")  # packed as an independent file

    data = pack_directory(src)
    assert data == pack_directory(src), "packing is deterministic"
    tree = stage_archive(data, tmp_path / "dest")
    assert tree.file_paths() == ("sub/deeper/blob", "sub/hardlinked", "sub/tool.sh", "top.txt")
    assert tree.directories == ("empty-dir", "sub", "sub/deeper")
    assert tree.links == ()
    for f in tree.files:
        staged = tmp_path / "dest" / f.path
        assert staged.read_bytes() == (src / f.path).read_bytes()
        assert stat.S_IMODE(os.lstat(staged).st_mode) == 0o644
        assert os.lstat(staged).st_nlink == 1


def test_extract_output_round_trip_of_a_runner_style_tar(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "reports").mkdir(parents=True)
    (out / "reports" / "r.json").write_bytes(b'{"ok": true}')
    (out / "big.bin").write_bytes(os.urandom(300_000))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(out, arcname=".")  # what a tool does: tar /tmp/out from inside
    tree = extract_output(buf.getvalue(), tmp_path / "dest")
    assert tree.file_paths() == ("big.bin", "reports/r.json")
    assert tree.directories == ("reports",)
    assert (tmp_path / "dest" / "big.bin").read_bytes() == (out / "big.bin").read_bytes()


# -- copy-out: links are recorded, never created, never followed --------------------------------


def test_extract_output_records_links_without_creating_them(area: Area) -> None:
    data = build(
        reg("real.txt", b"real"),
        sym("shadow", "/etc/shadow"),
        sym("sentinel-link", str(area.sentinel)),
        sym("up", "../../.."),
        hard("passwd", "/etc/passwd"),
        hard("again", "real.txt"),
    )
    tree = extract_output(data, area.dest)
    assert tree.file_paths() == ("real.txt",)
    assert tree.links == (
        OutputLink("again", "hardlink", "real.txt"),
        OutputLink("passwd", "hardlink", "/etc/passwd"),
        OutputLink("sentinel-link", "symlink", str(area.sentinel)),
        OutputLink("shadow", "symlink", "/etc/shadow"),
        OutputLink("up", "symlink", "../../.."),
    )
    assert sorted(os.listdir(area.dest)) == ["real.txt"]
    assert area.links_in_dest() == []
    area.assert_untouched()


@pytest.mark.parametrize(
    "members, offender",
    [
        ((sym("x", "/etc/shadow"), reg("x", b"PWNED")), "duplicate entry"),
        ((reg("x", b"fine"), sym("x", "/etc/shadow")), "duplicate entry"),
        ((sym("d", "/etc"), reg("d/passwd", b"PWNED")), "parent 'd' is a symlink"),
        ((hard("h", "/etc/passwd"), reg("h/x", b"PWNED")), "parent 'h' is a hardlink"),
        ((special("null", tarfile.CHRTYPE),), "character device"),
        ((special("p", tarfile.FIFOTYPE),), "fifo"),
        ((reg("s", b"x", mode=0o6755),), "setuid/setgid"),
        ((reg("../x", b"x"),), "'..' component"),
    ],
)
def test_extract_output_refuses(area: Area, members, offender: str) -> None:
    with pytest.raises(ArchiveError, match=offender):
        extract_output(build(*members), area.dest)
    assert not area.dest.exists()
    area.assert_untouched()


# -- races: a name swapped for a link while we write is never followed ---------------------------


def _swap_during_read(monkeypatch, action) -> None:
    """Run `action` at the moment a member's data is read, i.e. between planning and writing."""
    real = tarfile.TarFile.extractfile
    done: list[str] = []

    def extractfile(self, member):
        if not done:
            done.append(member.name)
            action(member.name)
        return real(self, member)

    monkeypatch.setattr(tarfile.TarFile, "extractfile", extractfile)


def test_file_name_swapped_for_a_link_before_create_is_not_followed(area: Area, monkeypatch) -> None:
    def plant(name: str) -> None:
        (area.dest / name).symlink_to(area.sentinel)

    _swap_during_read(monkeypatch, plant)
    with pytest.raises(ArchiveError, match="cannot create file safely"):
        extract_output(build(reg("x", b"PWNED")), area.dest)
    area.assert_untouched()
    assert not area.dest.exists()


def test_directory_swapped_for_a_link_after_create_is_not_followed(area: Area, monkeypatch) -> None:
    """We hold the directory's fd: the write lands in the directory we made, not the link."""

    def swap(name: str) -> None:
        (area.dest / "d").rename(area.dest / "d.moved")
        (area.dest / "d").symlink_to(area.outside_dir)

    _swap_during_read(monkeypatch, swap)
    tree = stage_archive(build(directory("d"), reg("d/f", b"payload")), area.dest)
    assert tree.file_paths() == ("d/f",)
    assert list(area.outside_dir.iterdir()) == []
    assert (area.dest / "d.moved" / "f").read_bytes() == b"payload"
    area.assert_untouched()


def test_red_check_plain_open_follows_the_same_swap(area: Area) -> None:
    """What the fd-relative O_NOFOLLOW|O_EXCL writer prevents: an ordinary open() follows."""
    area.dest.mkdir()
    (area.dest / "x").symlink_to(area.sentinel)
    with open(area.dest / "x", "wb") as f:
        f.write(b"PWNED")
    assert area.sentinel.read_bytes() == b"PWNED"


# -- pack_directory ----------------------------------------------------------------------------


def test_pack_directory_refuses_links_and_specials(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"xx")
    (src / "out").symlink_to("/etc/shadow")
    with pytest.raises(ArchiveError, match="'out': symlink to '/etc/shadow' leaves the tree"):
        pack_directory(src)
    (src / "out").unlink()
    (src / "in").symlink_to("f")
    with pytest.raises(ArchiveError, match="'in': symlink to 'f' is a link"):
        pack_directory(src)
    (src / "in").unlink()
    os.mkfifo(src / "pipe")
    with pytest.raises(ArchiveError, match="'pipe': not a regular file"):
        pack_directory(src)
    (src / "pipe").unlink()
    link = tmp_path / "link-to-src"
    link.symlink_to(src)
    with pytest.raises(ArchiveError, match="not a directory"):
        pack_directory(link)
    with pytest.raises(ArchiveError, match="exceeds the cap"):
        pack_directory(src, limits=ArchiveLimits(max_total_bytes=1))
    assert archive.pack_directory(src)  # the clean tree packs


def test_limits_validate_themselves() -> None:
    with pytest.raises(ValueError, match="max_members"):
        ArchiveLimits(max_members=0)
    with pytest.raises(ValueError, match="max_total_bytes"):
        ArchiveLimits(max_total_bytes=True)  # type: ignore[arg-type]
