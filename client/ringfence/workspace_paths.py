"""What a path into a run's workspace may look like: one rule for the server, the SDK and the CLI.

Stdlib only (the SDK imports it). A path names something under /workspace: relative, in normal
form, no `..`, no NUL, at most MAX_PATH_BYTES of UTF-8. The rule is lexical on purpose: links are
dealt with where files are touched (the sandboxed helpers refuse a link on the way, and the
archive code never follows one), never by resolving a path on the host.
"""

from __future__ import annotations

import posixpath

__all__ = ["MAX_PATH_BYTES", "path_problem"]

MAX_PATH_BYTES = 1024


def path_problem(value: object, *, allow_root: bool = False) -> str | None:
    """Why `value` is not a usable path relative to /workspace, or None. "" (the workspace
    itself) only with `allow_root`."""
    if not isinstance(value, str):
        return "must be text"
    if value == "":
        return None if allow_root else "is required (a path relative to /workspace)"
    if "\0" in value:
        return "must not contain NUL"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "must be valid Unicode text"
    if size > MAX_PATH_BYTES:
        return f"is {size} bytes; at most {MAX_PATH_BYTES}"
    if value.startswith("/"):
        return "must be relative to /workspace, not absolute"
    if ".." in value.split("/"):
        return "must not contain a '..' component"
    normal = posixpath.normpath(value)
    if value != normal or normal == ".":
        return f"must be in normal form (no '.', '//' or trailing '/'; e.g. {normal!r})"
    return None
