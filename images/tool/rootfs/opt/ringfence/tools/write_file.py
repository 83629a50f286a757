"""write_file: a text file under /output, delivered in the call's result.

arguments: {"path": "report.md" | "/output/incident/report.md", "content": "..."}
returns {"path": "/output/...", "bytes": <UTF-8 length>, "content": "..."}

Where the file goes: into the result, not onto a disk. The sandbox has no writable host mount
(DESIGN, "The sandbox": no host mounts but declared read-only inputs) and its only writable
filesystems are its own /tmp and /dev/shm, which die with the container; so the tool checks
the path and the text and returns them, and the control plane records that result, like every
observation, durably in the run's event log, from which a client takes the file (the `content`
of the call's observation). /output is a name space, not a directory of this sandbox.

Paths follow read_file's rules, checked here and, before the call runs, by resource policy
against the manifest's root (ringfence_server/control/tools/write_file.json `paths`): relative to /output or
absolute under it, no "..", no empty name, no NUL or control characters, a file (no trailing
"/"), at most 1024 bytes and 255 per component.
"""

from ringfence_tool import ToolError

ROOT = "/output"
MAX_CONTENT = 64 * 1024  # the control plane caps a call's arguments at 64 KiB too
MAX_PATH = 1024


def check_path(path):
    """The normalized absolute path under ROOT, or ToolError("invalid")."""
    if not isinstance(path, str) or not path or len(path.encode("utf-8", "surrogatepass")) > MAX_PATH:
        raise ToolError("invalid", f"path must be a non-empty string of at most {MAX_PATH} bytes")
    if any(ord(c) < 32 or ord(c) == 127 for c in path) or "\\" in path:
        raise ToolError("invalid", "path must not contain control characters or backslashes")
    if path.startswith("/"):
        if not path.startswith(ROOT + "/"):
            raise ToolError("invalid", f"absolute paths must be under {ROOT}/")
        rel = path[len(ROOT) + 1:]
    else:
        rel = path
    if rel.endswith("/"):
        raise ToolError("invalid", "path must name a file, not a directory")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ToolError("invalid", f"path must name a file under {ROOT}, without '..'")
    if any(len(p.encode("utf-8", "surrogatepass")) > 255 for p in parts):
        raise ToolError("invalid", "a path component is longer than 255 bytes")
    return ROOT + "/" + "/".join(parts)


def run(arguments, context):
    path = check_path(arguments.get("path"))
    content = arguments.get("content")
    if not isinstance(content, str):
        raise ToolError("invalid", "content must be a string (text)")
    try:
        size = len(content.encode("utf-8"))
    except UnicodeEncodeError:
        raise ToolError("invalid", "content must be valid Unicode text") from None
    if size > MAX_CONTENT:
        raise ToolError("invalid", f"content must be at most {MAX_CONTENT} bytes of UTF-8")
    return {"path": path, "bytes": size, "content": content}
