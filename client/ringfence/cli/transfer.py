"""Local files in and out of a run's workspace, safely: the archive `files put` sends (regular
files and directories only, nothing read through a link) and the writer `files get` uses (never
outside --out, never through a link, never over an existing file)."""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import stat
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from ringfence.cli.errors import CommandFailed, UsageError
from ringfence.workspace_paths import path_problem

# O_NOFOLLOW on every open: a path swapped for a link after it was checked is refused by the
# kernel, not followed.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def pack_local(paths: Sequence[str]) -> tuple[bytes, int]:
    """An uncompressed tar of local files and directories (each under its own name, a
    directory with everything in it), and how many files it holds. Regular files and
    directories only: a link is refused here (it would be refused by the server too), and
    nothing is ever read through one."""
    buf = io.BytesIO()
    names: set[str] = set()
    count = 0

    def add(local: str, arcname: str, tar: tarfile.TarFile) -> None:
        nonlocal count
        try:
            st = os.lstat(local)
        except FileNotFoundError:
            raise UsageError(f"there is no file or directory {local}") from None
        except OSError as e:
            raise UsageError(f"cannot read {local}: {e.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise UsageError(f"{local} is a symbolic link (to {os.readlink(local)!r}): links are never sent",
                             hint="name the file it points to, or copy it in place of the link")
        info = tarfile.TarInfo(arcname)
        info.mtime = 0
        if stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
            with os.scandir(local) as entries:
                children = sorted(entries, key=lambda e: e.name)
            for child in children:
                add(child.path, f"{arcname}/{child.name}", tar)
            return
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{local} is not a regular file or a directory: only those are sent")
        try:
            fd = os.open(local, _READ_FLAGS)
        except OSError as e:
            raise UsageError(f"cannot open {local} without following links: {e.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            now = os.fstat(f.fileno())
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise UsageError(f"{local} changed while it was being read")
            data = f.read()
        info.size = len(data)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(data))
        count += 1

    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for given in paths:
            name = os.path.basename(os.path.normpath(os.path.abspath(given)))
            if not name:
                raise UsageError(f"{given} has no name to put in the workspace (name a directory inside it)")
            if name in names:
                raise UsageError(f"two LOCAL_PATHs are both named {name!r} in the workspace",
                                 hint="put them with two commands, each with its own --to DIR")
            names.add(name)
            add(given, name, tar)
    return buf.getvalue(), count


def workspace_dir(text: str) -> str:
    """--to DIR as the server takes it: relative to /workspace, normalized ("" = the workspace)."""
    dest = posixpath.normpath(text.strip()) if text.strip() else ""
    dest = "" if dest == "." else dest
    problem = path_problem(dest, allow_root=True)
    if problem is not None:
        raise UsageError(f"--to {text!r} {problem}", hint="a directory relative to /workspace, e.g. --to src/pkg")
    return dest


def write_files(root: Path, files: Mapping[str, bytes]) -> None:
    """Each file under `root` (created if missing), never outside it and never through a link:
    every directory is opened relative to its parent with O_NOFOLLOW|O_DIRECTORY, every file
    created with O_CREAT|O_EXCL|O_NOFOLLOW (nothing existing is overwritten)."""
    for path in files:
        problem = path_problem(path)
        if problem is not None:  # the SDK refused it already; checked again where it is written
            raise CommandFailed(f"refusing to write {path!r}: it {problem}")
    existing = [p for p in files if os.path.lexists(root / p)]
    if existing:
        raise CommandFailed(f"{len(existing)} file(s) already exist under {root}: {', '.join(existing[:5])}; "
                            "nothing was written", hint="choose another --out DIR (nothing is ever overwritten)")
    root.mkdir(parents=True, exist_ok=True)
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # --out itself: the user's choice
    try:
        for path, data in sorted(files.items()):
            parts = path.split("/")
            fds: list[int] = []
            try:
                fd = root_fd
                for part in parts[:-1]:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                    fd = os.open(part, _DIR_FLAGS, dir_fd=fd)  # a link or a file here: ELOOP/ENOTDIR
                    fds.append(fd)
                out_fd = os.open(parts[-1], _NEW_FILE_FLAGS, 0o644, dir_fd=fd)
                with os.fdopen(out_fd, "wb") as f:
                    f.write(data)
            except OSError as e:
                raise CommandFailed(f"cannot write {root / path} safely: {e.strerror}",
                                    hint="nothing is written through a link or over an existing file") from None
            finally:
                for opened in fds:
                    os.close(opened)
    finally:
        os.close(root_fd)
