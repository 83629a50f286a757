"""workspace_write: a UTF-8 text file in the run's workspace, kept for the run's next calls.

arguments: {"path": "calc.py" | "pkg/mod.py" | "/workspace/pkg/mod.py", "content": "..."}
returns {"path": "pkg/mod.py", "bytes": <UTF-8 length>, "sha256": "<hex of those bytes>"}

The workspace (/workspace, the manifest's `"workspace": "write"`) is the one place a call may
leave a file for a later call of the same run; everything else in the container dies with it.
Its content is data: the workspace is mounted noexec, so a file written here is run by the
image's interpreters (`python3 calc.py`), never as `./calc.py`.

Paths are relative to /workspace (or absolute under it), normalized here ("." and empty names
dropped), without "..", NUL, control characters or backslashes, a file (no trailing "/"), at
most 1024 bytes and 255 per component. Parent directories are created. Nothing is followed: an
earlier call (or an upload) may have left a symlink anywhere in the workspace, so the path is
walked one directory at a time with O_NOFOLLOW, and the file is written to a fresh temporary
name and renamed over the target, which replaces a link or a hardlink rather than writing
through it.

This module also holds the workspace's shared path code (`check_path`, `open_dir`,
`write_file`, `read_file`): workspace_read and run_tests load it with `load_tool`.
"""

import errno
import hashlib
import os
import stat

from ringfence_tool import ToolError

ROOT = "/workspace"
MAX_CONTENT = 64 * 1024  # the control plane caps a call's arguments at 64 KiB too
MAX_PATH = 1024
MAX_NAME = 255
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def check_path(path):
    """The normalized path relative to ROOT ("a/b.py"), or ToolError("invalid")."""
    if not isinstance(path, str) or not path or len(path.encode("utf-8", "surrogatepass")) > MAX_PATH:
        raise ToolError("invalid", f"path must be a non-empty string of at most {MAX_PATH} bytes")
    if any(ord(c) < 32 or ord(c) == 127 for c in path) or "\\" in path:
        raise ToolError("invalid", "path must not contain NUL, control characters or backslashes")
    if path.startswith("/"):
        if not path.startswith(ROOT + "/"):
            raise ToolError("invalid", f"absolute paths must be under {ROOT}/")
        path = path[len(ROOT) + 1:]
    if path.endswith("/"):
        raise ToolError("invalid", "path must name a file, not a directory")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ToolError("invalid", f"path must name a file under {ROOT}, without '..'")
    if any(len(p.encode("utf-8", "surrogatepass")) > MAX_NAME for p in parts):
        raise ToolError("invalid", f"a path component is longer than {MAX_NAME} bytes")
    return "/".join(parts)


def os_error(rel, e):
    """A ToolError saying what an OSError on `rel` means for the caller."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return ToolError("fatal", f"{rel}: the workspace is full (its byte or file cap is reached)")
    if e.errno == errno.EROFS:
        return ToolError("fatal", f"{rel}: this tool has the workspace read-only")
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        return ToolError("invalid", f"{rel}: a component is not a directory (links are never followed)")
    if e.errno == errno.EISDIR:
        return ToolError("invalid", f"{rel}: is a directory")
    if e.errno == errno.ENOENT:
        return ToolError("invalid", f"{rel}: no such file in the workspace")
    return ToolError("fatal", f"{rel}: {e.strerror}")


def open_root():
    try:
        return os.open(ROOT, _DIR_FLAGS)
    except OSError as e:
        raise ToolError("fatal", f"no workspace is mounted at {ROOT} ({e.strerror}): "
                                 "the run was started without one") from None


def open_dir(rel, create):
    """A descriptor of the directory holding `rel`'s last component (the caller closes it),
    walked from ROOT one component at a time, never through a link; missing directories are
    made when `create`."""
    fd = open_root()
    try:
        for part in rel.split("/")[:-1]:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass  # a directory (opened below) or anything else (refused below)
            nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except OSError as e:
        os.close(fd)
        raise os_error(rel, e) from None
    return fd


class Replacement:
    """A new file written beside `rel` under a temporary name, renamed over `rel` on commit
    (the target's old content, or a link standing there, is replaced, never written through).
    Nothing is left behind if it is not committed."""

    def __init__(self, rel):
        self.rel = rel
        self.name = rel.rsplit("/", 1)[-1]
        self.tmp = (".rf-" + os.urandom(6).hex() + "-" + self.name)[:MAX_NAME]
        self.dir_fd = open_dir(rel, create=True)
        try:
            fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o644, dir_fd=self.dir_fd)
        except OSError as e:
            os.close(self.dir_fd)
            raise os_error(rel, e) from None
        self.file = os.fdopen(fd, "wb")
        self.done = False

    def write(self, data):
        try:
            self.file.write(data)
        except OSError as e:
            self.abort()
            raise os_error(self.rel, e) from None

    def commit(self):
        try:
            self.file.close()
            os.rename(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except OSError as e:
            self.abort()
            raise os_error(self.rel, e) from None
        self.done = True
        os.close(self.dir_fd)

    def abort(self):
        """Remove the temporary file (idempotent; nothing once committed)."""
        if self.done:
            return
        self.done = True
        try:
            self.file.close()
        except OSError:
            pass  # ENOSPC again on the final flush: the file is being removed anyway
        try:
            os.unlink(self.tmp, dir_fd=self.dir_fd)
        except OSError:
            pass  # already renamed or never made: nothing of ours is left
        os.close(self.dir_fd)


def write_file(rel, data):
    """Write `data` (bytes) to `rel` under ROOT, atomically; its sha256 hex."""
    replacement = Replacement(rel)
    replacement.write(data)
    replacement.commit()
    return hashlib.sha256(data).hexdigest()


def read_file(rel, max_bytes):
    """(the first `max_bytes` bytes of `rel`, its size): a regular file only, never a link."""
    dir_fd = open_dir(rel, create=False)
    try:
        fd = os.open(rel.rsplit("/", 1)[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=dir_fd)
    except OSError as e:
        raise os_error(rel, e) from None
    finally:
        os.close(dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ToolError("invalid", f"{rel}: not a regular file")
    with os.fdopen(fd, "rb") as f:
        return f.read(max_bytes), st.st_size


def run(arguments, context):
    rel = check_path(arguments.get("path"))
    content = arguments.get("content")
    if not isinstance(content, str):
        raise ToolError("invalid", "content must be a string (text)")
    try:
        data = content.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError("invalid", "content must be valid Unicode text") from None
    if len(data) > MAX_CONTENT:
        raise ToolError("invalid", f"content must be at most {MAX_CONTENT} bytes of UTF-8")
    return {"path": rel, "bytes": len(data), "sha256": write_file(rel, data)}
