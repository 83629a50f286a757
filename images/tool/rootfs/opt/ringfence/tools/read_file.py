"""read_file: reads a file under /input. No "..", no symlinks anywhere on the path, capped.

arguments: {"path": "relative/or/absolute-under-input", "max_bytes"?: int}
returns {"path", "size", "encoding": "utf-8"|"base64", "content", "truncated"}
"""

import base64
import os
import stat

from ringfence_tool import ToolError

ROOT = "/input"
DEFAULT_MAX = 1024 * 1024
HARD_MAX = 4 * 1024 * 1024


def read_under(root, path, max_bytes=DEFAULT_MAX):
    if not isinstance(path, str) or not path or "\0" in path:
        raise ToolError("invalid", "path must be a non-empty string")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 0 < max_bytes <= HARD_MAX:
        raise ToolError("invalid", f"max_bytes must be an integer in (0, {HARD_MAX}]")
    if path.startswith("/"):
        if path != root and not path.startswith(root + "/"):
            raise ToolError("invalid", f"absolute paths must be under {root}")
        rel = path[len(root):]
    else:
        rel = path
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ToolError("invalid", "path must name a file under the input root, without '..'")
    # Walk one component at a time with O_NOFOLLOW: a symlink anywhere fails the open.
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(root, flags_dir)
    except OSError as e:
        raise ToolError("invalid", f"input root unavailable: {e.strerror}") from None
    try:
        for part in parts[:-1]:
            try:
                nfd = os.open(part, flags_dir, dir_fd=fd)
            except OSError as e:
                raise ToolError("invalid", f"{path}: {e.strerror}") from None
            os.close(fd)
            fd = nfd
        try:
            ffd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
        except OSError as e:
            raise ToolError("invalid", f"{path}: {e.strerror}") from None
    finally:
        os.close(fd)
    st = os.fstat(ffd)
    if not stat.S_ISREG(st.st_mode):
        os.close(ffd)
        raise ToolError("invalid", f"{path}: not a regular file")
    with os.fdopen(ffd, "rb") as f:
        data = f.read(max_bytes + 1)
    truncated = len(data) > max_bytes
    data = data[:max_bytes]
    try:
        content, encoding = data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        content, encoding = base64.b64encode(data).decode(), "base64"
    return {"path": "/".join(parts), "size": st.st_size, "encoding": encoding,
            "content": content, "truncated": truncated}


def run(arguments, context):
    return read_under(ROOT, arguments.get("path"), arguments.get("max_bytes", DEFAULT_MAX))
