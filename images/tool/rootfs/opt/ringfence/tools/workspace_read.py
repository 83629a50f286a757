"""workspace_read: a UTF-8 text file from the run's workspace, capped.

arguments: {"path": "calc.py" | "/workspace/calc.py"}
returns {"path": "calc.py", "content": "...", "size": <bytes on disk>, "truncated": bool}

The workspace is mounted read-only for this tool (the manifest's `"workspace": "read"`). Paths
follow workspace_write's rules and are walked the same way: never through a link (a link an
earlier call left is refused, not followed), a regular file only. The first MAX_BYTES bytes are
returned (`truncated` says there was more, cut on a character boundary); a file that is not
UTF-8 text is refused (download it with `ringfence files get` instead).
"""

from ringfence_tool import ToolError, load_tool

MAX_BYTES = 256 * 1024
workspace = load_tool("workspace_write")


def run(arguments, context):
    rel = workspace.check_path(arguments.get("path"))
    data, size = workspace.read_file(rel, MAX_BYTES + 1)
    truncated = len(data) > MAX_BYTES
    data = data[:MAX_BYTES]
    # A cut can split a character: drop at most its first three bytes, never anything else.
    for cut in range(4 if truncated else 1):
        try:
            content = data[:len(data) - cut].decode("utf-8")
            break
        except UnicodeDecodeError:
            continue
    else:
        raise ToolError("invalid", f"{rel}: not UTF-8 text ({size} bytes)")
    return {"path": rel, "content": content, "size": size, "truncated": truncated}
