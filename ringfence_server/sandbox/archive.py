"""Safe file transfer into and out of a sandbox.

    stage_files(files, dest, *, limits=...) -> Tree     copy-in from a {path: bytes} mapping
    stage_archive(tar_bytes, dest, *, limits=...) -> Tree
                                                         copy-in from an uncompressed tar
    extract_output(tar_bytes, dest, *, limits=...) -> Tree
                                                         copy-out of a tool's tar of /tmp/out
    pack_directory(path, *, limits=...) -> bytes         a tar of a host tree (tests, tooling)

A staged directory is then shown read-only inside the sandbox with
`SandboxProfile(inputs=(InputMount(str(tree.root), "/input"),))`.

Everything a tool sends us is hostile, including the tar stream itself: the tool writes those
bytes, so it can put any name, type, mode or link target in a header (CVE-2024-28185 and
CVE-2024-28189 in Judge0 were a symlink in a sandbox's output followed by the host). So:

* Every member is checked before anything is written: names must be relative, normalized,
  without `..`; only regular files and directories are materialized; device nodes, fifos,
  sparse and unknown types, setuid/setgid bits, duplicate names, a member "under" a non-directory,
  and member count / total size over the caps are refused. The stdlib's `tarfile.data_filter`
  (PEP 706, `filter="data"`) is applied to every materialized member as an independent second
  opinion; both must agree.
* Links are never created on the host. Copy-in refuses every link, not only those that leave
  the tree: whether a link stays inside depends on the other links it passes through (`l -> .`
  then `x -> l/../secret` is lexically inside and physically outside), and an input tree is
  data for a tool, which has no need for links. Copy-out records links as metadata
  (`Tree.links`: name, kind, target string) and materializes nothing for them: a tool that made
  a symlink loses nothing it could legitimately want, and the host has nothing to follow.
* Writing never follows a link even if the destination is tampered with while we write: `dest`
  must not exist and is created by us; every directory is opened with O_NOFOLLOW|O_DIRECTORY and
  kept open, and every file is created relative to its parent's fd with
  O_CREAT|O_EXCL|O_NOFOLLOW. A name swapped for a link mid-way makes the call fail (EEXIST /
  ELOOP), never write through it.
* Written modes are normalized (files 0644, directories 0755): no exec or set-id bits survive.
* Copy-in names must be valid UTF-8 (they become proto strings and JSON events); copy-out keeps
  a name that is not, surrogate-escaped as tarfile reads it, for the caller to skip or report
  (`escaped_name` shows it as text, its odd bytes as `\\xNN`).
* On any refusal or error the partly written `dest` is removed, so a caller never sees half a tree.

Only uncompressed tar is accepted: a compressed stream would need a decompression-ratio cap as
well, and neither the runner nor the stagers need compression.
"""

from __future__ import annotations

import io
import os
import posixpath
import shutil
import stat
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ringfence_server.sandbox.errors import ArchiveError

__all__ = [
    "ArchiveLimits",
    "OutputLink",
    "Tree",
    "TreeFile",
    "escaped_name",
    "extract_output",
    "pack_directory",
    "stage_archive",
    "stage_files",
]

_MiB = 1024 * 1024
_FILE_MODE = 0o644
_DIR_MODE = 0o755
_CHUNK = 1024 * 1024
# O_NOFOLLOW on the last component, O_CLOEXEC so no tool-facing child inherits our fds.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_SETID = stat.S_ISUID | stat.S_ISGID


@dataclass(frozen=True)
class ArchiveLimits:
    """Caps on one transfer. Checked from the headers before any byte is written."""

    max_members: int = 10_000
    """Entries in the archive (files, directories and links alike)."""

    max_total_bytes: int = 64 * _MiB
    """Sum of the regular files' sizes."""

    max_archive_bytes: int = 80 * _MiB
    """Size of the tar stream itself (headers, padding and PAX records included)."""

    max_path_bytes: int = 1024
    """Length of one member's normalized path, in UTF-8 bytes."""

    def __post_init__(self) -> None:
        for name in ("max_members", "max_total_bytes", "max_archive_bytes", "max_path_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ArchiveLimits.{name} must be a positive int, got {value!r}")


DEFAULT_LIMITS = ArchiveLimits()


@dataclass(frozen=True)
class TreeFile:
    path: str
    """Relative POSIX path inside the tree."""
    size: int


@dataclass(frozen=True)
class OutputLink:
    """A link found in a tool's output: recorded, never created, never followed."""

    path: str
    kind: str
    """`symlink` or `hardlink`."""
    target: str
    """The link target exactly as the tool wrote it (untrusted text)."""


@dataclass(frozen=True)
class Tree:
    """What a transfer wrote under `root` (sorted by path)."""

    root: Path
    files: tuple[TreeFile, ...]
    directories: tuple[str, ...]
    links: tuple[OutputLink, ...] = ()

    def file_paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)


# ---------------------------------------------------------------------------------------------
# Names


def _normalize(name: str, limits: ArchiveLimits) -> str:
    """The member's path relative to the tree root, or ArchiveError. "" means the root itself."""
    if not isinstance(name, str) or name == "":
        raise ArchiveError(f"member {name!r}: empty name")
    if "\0" in name:
        raise ArchiveError(f"member {name!r}: NUL in name")
    if name.startswith("/"):
        raise ArchiveError(f"member {name!r}: absolute path")
    parts = []
    for part in name.split("/"):
        if part in ("", "."):
            continue  # "./a", "a//b", "dir/" are ordinary spellings
        if part == "..":
            raise ArchiveError(f"member {name!r}: '..' component")
        if len(part.encode("utf-8", "surrogateescape")) > 255:
            raise ArchiveError(f"member {name!r}: a path component is longer than 255 bytes")
        parts.append(part)
    path = "/".join(parts)
    if len(path.encode("utf-8", "surrogateescape")) > limits.max_path_bytes:
        raise ArchiveError(f"member {name!r}: path longer than {limits.max_path_bytes} bytes")
    return path


def escaped_name(name: str) -> str:
    """`name` as valid UTF-8 text: the bytes of a name that is not UTF-8 (tarfile and os hand
    them over surrogate-escaped) shown as `\\xNN`, the rest unchanged."""
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that no byte decodes to
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def _require_text(name: str) -> None:
    """Copy-in: a name must be valid UTF-8. The names of an input tree end up in proto strings
    and JSON events, which hold text only; refusing here means such an archive never reaches a
    workspace at all, instead of arriving and then failing to be recorded."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ArchiveError(f"member '{escaped_name(name)}': the name is not valid UTF-8 (shown escaped); "
                           "names must be UTF-8 text") from None


# ---------------------------------------------------------------------------------------------
# Planning: every member is checked before anything is written.


@dataclass(frozen=True)
class _Entry:
    path: str
    kind: str  # "file" | "dir" | "symlink" | "hardlink"
    size: int = 0
    member: tarfile.TarInfo | None = None
    target: str = ""


def _kind_name(member: tarfile.TarInfo) -> str:
    if member.ischr():
        return "character device"
    if member.isblk():
        return "block device"
    if member.isfifo():
        return "fifo"
    if member.issparse():
        return "sparse file"
    return f"type {member.type!r}"


def _iter_members(tar: tarfile.TarFile, limits: ArchiveLimits) -> Iterator[tarfile.TarInfo]:
    """Headers one at a time, stopping at the member cap instead of reading a million headers."""
    count = 0
    while True:
        try:
            member = tar.next()
        except tarfile.TarError as e:
            raise ArchiveError(f"not a valid tar archive: {e}") from e
        if member is None:
            return
        count += 1
        if count > limits.max_members:
            raise ArchiveError(f"member {member.name!r}: more than {limits.max_members} members")
        yield member


def _plan(tar: tarfile.TarFile, dest: Path, limits: ArchiveLimits, *, links: str) -> list[_Entry]:
    """Validate the whole archive; `links` is "refuse" (copy-in) or "record" (copy-out)."""
    entries: list[_Entry] = []
    kinds: dict[str, str] = {"": "dir"}
    total = 0
    for member in _iter_members(tar, limits):
        if links == "refuse":
            _require_text(member.name)
        path = _normalize(member.name, limits)
        label = f"member {member.name!r}"
        if member.mode & _SETID:
            raise ArchiveError(f"{label}: setuid/setgid bit set (mode {member.mode:o})")
        if member.issym() or member.islnk():
            kind = "symlink" if member.issym() else "hardlink"
            if links == "refuse":
                raise ArchiveError(
                    f"{label}: is a {kind} to {member.linkname!r}; links are refused in inputs"
                )
            entry = _Entry(path, kind, target=member.linkname)
        elif member.isdir():
            entry = _Entry(path, "dir", member=member)
        elif member.isreg() and not member.issparse() and member.type != tarfile.CONTTYPE:
            if member.size < 0:
                raise ArchiveError(f"{label}: negative size")
            total += member.size
            if total > limits.max_total_bytes:
                raise ArchiveError(
                    f"{label}: total size of files exceeds {limits.max_total_bytes} bytes"
                )
            entry = _Entry(path, "file", size=member.size, member=member)
        else:
            raise ArchiveError(f"{label}: {_kind_name(member)} is refused")

        if path == "":
            if entry.kind != "dir":
                raise ArchiveError(f"{label}: the archive root must be a directory")
            continue
        if path in kinds:
            # A second entry with the same name is how "symlink, then a file through it" and
            # "file, then replace it with a link" attacks are spelled; only a directory
            # created implicitly for an earlier child may be named again, as a directory.
            if not (entry.kind == "dir" and kinds[path] == "implicit-dir"):
                raise ArchiveError(f"{label}: duplicate entry for {path!r}")
            kinds[path] = "dir"
        parent = posixpath.dirname(path)
        # Every ancestor must be a directory of this archive (explicit or implicit), never a
        # file or a recorded link: "l" (symlink) then "l/x" would write through the link.
        ancestors = []
        while parent:
            ancestors.append(parent)
            parent = posixpath.dirname(parent)
        for ancestor in ancestors:
            seen = kinds.get(ancestor)
            if seen is None:
                kinds[ancestor] = "implicit-dir"
            elif seen not in ("dir", "implicit-dir"):
                raise ArchiveError(f"{label}: parent {ancestor!r} is a {seen}, not a directory")
        if path not in kinds:
            kinds[path] = entry.kind
        if entry.member is not None:
            _second_opinion(entry.member, dest, label)
        entries.append(entry)
    return entries


def _second_opinion(member: tarfile.TarInfo, dest: Path, label: str) -> None:
    """The stdlib's PEP 706 `data` filter must accept the member too (we never extract with it:
    our writer below is stricter about links on disk, but it must agree on names and types)."""
    try:
        tarfile.data_filter(member, str(dest))
    except tarfile.FilterError as e:
        raise ArchiveError(f"{label}: refused by tarfile's data filter: {e}") from e


# ---------------------------------------------------------------------------------------------
# Writing: fd-relative, O_NOFOLLOW|O_EXCL, into a directory we create.


class _Writer:
    """Creates directories and files under a fresh root without ever following a link."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        parent = dest.parent
        if not parent.is_dir():
            raise ArchiveError(f"destination parent {str(parent)!r} is not a directory")
        try:
            os.mkdir(dest, 0o700)
        except FileExistsError as e:
            raise ArchiveError(f"destination {str(dest)!r} already exists; it must be fresh") from e
        except OSError as e:
            raise ArchiveError(f"cannot create destination {str(dest)!r}: {e}") from e
        self._fds: dict[str, int] = {}
        try:
            self._fds[""] = os.open(dest, _DIR_FLAGS)
        except OSError as e:
            os.rmdir(dest)
            raise ArchiveError(f"cannot open destination {str(dest)!r}: {e}") from e

    def _dir_fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            return fd
        parent_fd = self._dir_fd(posixpath.dirname(path))
        name = posixpath.basename(path)
        try:
            os.mkdir(name, _DIR_MODE, dir_fd=parent_fd)  # mkdirat: never follows `name`
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError as e:
            # EEXIST / ELOOP / ENOTDIR: something appeared under our feet. Stop, never follow.
            raise ArchiveError(f"member {path!r}: cannot create directory safely: {e}") from e
        os.fchmod(fd, _DIR_MODE)
        self._fds[path] = fd
        return fd

    def mkdir(self, path: str) -> None:
        self._dir_fd(path)

    def write(self, path: str, source: IO[bytes] | None, size: int) -> None:
        parent_fd = self._dir_fd(posixpath.dirname(path))
        name = posixpath.basename(path)
        try:
            fd = os.open(name, _NEW_FILE_FLAGS, _FILE_MODE, dir_fd=parent_fd)
        except OSError as e:
            raise ArchiveError(f"member {path!r}: cannot create file safely: {e}") from e
        try:
            os.fchmod(fd, _FILE_MODE)
            left = size
            while left > 0:
                chunk = source.read(min(left, _CHUNK)) if source is not None else b""
                if not chunk:
                    raise ArchiveError(f"member {path!r}: archive ends {left} bytes early")
                _write_all(fd, chunk)
                left -= len(chunk)
        finally:
            os.close(fd)

    def directories(self) -> tuple[str, ...]:
        return tuple(sorted(p for p in self._fds if p))

    def finish(self) -> None:
        os.fchmod(self._fds[""], _DIR_MODE)
        self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def discard(self) -> None:
        self.close()
        # rmtree is fd-based and does not follow symlinks (it refuses a symlinked root).
        shutil.rmtree(self.dest, ignore_errors=True)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _check_dest(dest: Path | str) -> Path:
    dest = Path(dest)
    if not dest.is_absolute():
        dest = Path.cwd() / dest
    return dest


def _extract(tar_bytes: bytes, dest: Path | str, limits: ArchiveLimits, *, links: str) -> Tree:
    if not isinstance(tar_bytes, (bytes, bytearray, memoryview)):
        raise ArchiveError("the archive must be bytes")
    if len(tar_bytes) > limits.max_archive_bytes:
        raise ArchiveError(f"archive of {len(tar_bytes)} bytes is over the {limits.max_archive_bytes} cap")
    dest = _check_dest(dest)
    try:
        # "r:" = uncompressed only (see the module docstring).
        tar = tarfile.open(fileobj=io.BytesIO(bytes(tar_bytes)), mode="r:")  # noqa: SIM115 - entered by the `with tar` below, once a TarError here is mapped
    except tarfile.TarError as e:
        raise ArchiveError(f"not an uncompressed tar archive: {e}") from e
    with tar:
        entries = _plan(tar, dest, limits, links=links)
        writer = _Writer(dest)
        try:
            files, recorded = [], []
            for entry in entries:
                if entry.kind == "dir":
                    writer.mkdir(entry.path)
                elif entry.kind == "file":
                    assert entry.member is not None  # _plan gives every file its member
                    source = tar.extractfile(entry.member) if entry.size else None
                    writer.write(entry.path, source, entry.size)
                    files.append(TreeFile(entry.path, entry.size))
                else:
                    recorded.append(OutputLink(entry.path, entry.kind, entry.target))
            dirs = writer.directories()
            writer.finish()
        except (tarfile.TarError, EOFError) as e:
            writer.discard()
            raise ArchiveError(f"archive is corrupt or truncated: {e}") from e
        except BaseException:
            writer.discard()
            raise
    return Tree(
        root=dest,
        files=tuple(sorted(files, key=lambda f: f.path)),
        directories=dirs,
        links=tuple(sorted(recorded, key=lambda link: link.path)),
    )


# ---------------------------------------------------------------------------------------------
# Public API


def stage_archive(tar_bytes: bytes, dest: Path | str, *, limits: ArchiveLimits = DEFAULT_LIMITS) -> Tree:
    """Copy-in: write an input archive's files under `dest` (which must not exist yet).

    Refuses, before writing anything: absolute names, `..`, any link, device nodes, fifos,
    sparse/unknown members, setuid/setgid bits, duplicates, and archives over `limits`."""
    return _extract(tar_bytes, dest, limits, links="refuse")


def stage_files(
    files: Mapping[str, bytes], dest: Path | str, *, limits: ArchiveLimits = DEFAULT_LIMITS
) -> Tree:
    """Copy-in from a mapping of relative path -> content, with the same checks as an archive."""
    if not isinstance(files, Mapping):
        raise ArchiveError("files must be a mapping of relative path to bytes")
    if len(files) > limits.max_members:
        raise ArchiveError(f"{len(files)} files is more than {limits.max_members} members")
    dest = _check_dest(dest)
    planned: dict[str, bytes] = {}
    total = 0
    for name, data in files.items():
        if not isinstance(data, (bytes, bytearray)):
            raise ArchiveError(f"member {name!r}: content must be bytes")
        if isinstance(name, str):
            _require_text(name)
        path = _normalize(name, limits)
        if path == "":
            raise ArchiveError(f"member {name!r}: names the root, not a file")
        if path in planned:
            raise ArchiveError(f"member {name!r}: duplicate entry for {path!r}")
        total += len(data)
        if total > limits.max_total_bytes:
            raise ArchiveError(f"member {name!r}: total size of files exceeds {limits.max_total_bytes} bytes")
        planned[path] = bytes(data)
    paths = set(planned)
    for path in planned:
        parent = posixpath.dirname(path)
        while parent:
            if parent in paths:
                raise ArchiveError(f"member {path!r}: parent {parent!r} is a file, not a directory")
            parent = posixpath.dirname(parent)
    writer = _Writer(dest)
    try:
        for path in sorted(planned):
            writer.write(path, io.BytesIO(planned[path]), len(planned[path]))
        dirs = writer.directories()
        writer.finish()
    except BaseException:
        writer.discard()
        raise
    return Tree(
        root=dest,
        files=tuple(TreeFile(p, len(planned[p])) for p in sorted(planned)),
        directories=dirs,
    )


def extract_output(tar_bytes: bytes, dest: Path | str, *, limits: ArchiveLimits = DEFAULT_LIMITS) -> Tree:
    """Copy-out: write the regular files and directories of a tool's output tar under `dest`.

    Symlinks and hardlinks are returned in `Tree.links` and never created. Absolute names,
    `..`, device nodes, fifos, set-id bits, duplicates and oversize archives are refused."""
    return _extract(tar_bytes, dest, limits, links="record")


def pack_directory(path: Path | str, *, limits: ArchiveLimits = DEFAULT_LIMITS) -> bytes:
    """A deterministic tar (sorted, mtime 0, uid/gid 0, modes 0644/0755) of the tree at `path`.

    lstat only: a symlink anywhere in the tree is refused (stricter than "links leaving the
    tree": staging refuses every link, see the module docstring), and so are devices, fifos
    and sockets. Hardlinked files are stored as independent regular files. Each file is opened
    with O_NOFOLLOW and must still be the inode that lstat saw."""
    root = Path(path)
    try:
        root_st = os.lstat(root)
    except OSError as e:
        raise ArchiveError(f"cannot read {str(root)!r}: {e}") from e
    if not stat.S_ISDIR(root_st.st_mode):
        raise ArchiveError(f"{str(root)!r} is not a directory (or is a link to one)")
    buf = io.BytesIO()
    total = 0
    count = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        pending = [""]
        while pending:
            rel = pending.pop()
            with os.scandir(root / rel if rel else root) as it:
                children = sorted(it, key=lambda e: e.name, reverse=True)
            for child in children:
                child_rel = f"{rel}/{child.name}" if rel else child.name
                st = child.stat(follow_symlinks=False)
                count += 1
                if count > limits.max_members:
                    raise ArchiveError(f"{child_rel!r}: more than {limits.max_members} entries")
                info = tarfile.TarInfo(child_rel)
                info.mtime = 0
                if stat.S_ISLNK(st.st_mode):
                    target = os.readlink(child.path)
                    where = "leaves the tree" if _leaves(child_rel, target) else "is a link"
                    raise ArchiveError(f"{child_rel!r}: symlink to {target!r} {where}; links are refused")
                if stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    info.mode = _DIR_MODE
                    tar.addfile(info)
                    pending.append(child_rel)
                elif stat.S_ISREG(st.st_mode):
                    data = _read_nofollow(child.path, st, child_rel, limits.max_total_bytes - total)
                    total += len(data)
                    info.size = len(data)
                    info.mode = _FILE_MODE
                    tar.addfile(info, io.BytesIO(data))
                else:
                    raise ArchiveError(f"{child_rel!r}: not a regular file or directory (mode {st.st_mode:o})")
    return buf.getvalue()


def _leaves(rel: str, target: str) -> bool:
    if target.startswith("/"):
        return True
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    return joined == ".." or joined.startswith("../")


def _read_nofollow(path: str, expected: os.stat_result, rel: str, room: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ArchiveError(f"{rel!r}: cannot open without following links: {e}") from e
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (expected.st_dev, expected.st_ino) or not stat.S_ISREG(st.st_mode):
            raise ArchiveError(f"{rel!r}: changed between lstat and open")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > room:
                raise ArchiveError(f"{rel!r}: total size of files exceeds the cap")
            chunks.append(chunk)
    finally:
        os.close(fd)
