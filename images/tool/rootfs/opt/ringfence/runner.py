"""ringfence tool runner: one JSON request on stdin, one JSON line on stdout. Stdlib only.

Request:  {"tool": "name", "arguments": {...}, "call_id": "...", "idempotency_key": "..."|null}
Success:  {"ok": true, "content": ...}                                     exit 0
Failure:  {"ok": false, "error": {"class": "invalid|transient|rate_limited|fatal",
                                  "message": "...", "retry_after_s": null|number}}   exit 3

Run as `python3 -I -S -B runner.py`: -I ignores PYTHON* variables and keeps the working
directory off sys.path, -S skips site (no site-packages), -B writes no bytecode (the root is
read-only). Tools are loaded by file path from tools/ next to this file, never by sys.path.

Third-party modules: the wheels a child image pins are unpacked into /opt/ringfence/site
(sandbox.images.wheels). -S means nothing adds a site folder, so this file appends that one to
sys.path when it exists: after the standard library (a wheel cannot shadow a stdlib module),
and without reading .pth files (which run code at start-up).
"""

import importlib.util
import json
import os
import re
import sys

MAX_REQUEST = 4 * 1024 * 1024
EXIT_OK, EXIT_TOOL_ERROR = 0, 3
HERE = os.path.dirname(os.path.abspath(__file__))
TOOL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
SITE = "/opt/ringfence/site"

if os.path.isdir(SITE):
    sys.path.append(SITE)


def _load_module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# Tools `import ringfence_tool`; isolated mode keeps HERE off sys.path, so register it by hand.
ringfence_tool = _load_module("ringfence_tool", os.path.join(HERE, "ringfence_tool.py"))
ToolError = ringfence_tool.ToolError


def _parse(raw):
    if len(raw) > MAX_REQUEST:
        raise ToolError("invalid", f"request is over {MAX_REQUEST} bytes")
    try:
        req = json.loads(raw)
    except ValueError as e:  # also UnicodeDecodeError
        raise ToolError("invalid", f"request is not JSON: {e}") from None
    if not isinstance(req, dict):
        raise ToolError("invalid", "request must be a JSON object")
    tool = req.get("tool")
    if not isinstance(tool, str) or not TOOL_NAME.fullmatch(tool):
        raise ToolError("invalid", "tool must be a name matching [a-z][a-z0-9_]*")
    args = req.get("arguments", {})
    if not isinstance(args, dict):
        raise ToolError("invalid", "arguments must be a JSON object")
    call_id = req.get("call_id")
    key = req.get("idempotency_key")
    if not isinstance(call_id, str) or not (key is None or isinstance(key, str)):
        raise ToolError("invalid", "call_id must be a string and idempotency_key a string or null")
    return tool, args, {"call_id": call_id, "idempotency_key": key}


def _tool_module(name):
    # tools/<name>.py, a regular file only (a symlink could point anywhere): one loader for the
    # runner and for tools that reuse another's code.
    return ringfence_tool.load_tool(name)


def handle(raw):
    """Run one request; return (result document, exit code). Never raises."""
    try:
        tool, args, context = _parse(raw)
        module = _tool_module(tool)
        content = module.run(args, context)
        json.dumps(content)  # refuse content the caller could not read, as the tool's fault
        return {"ok": True, "content": content}, EXIT_OK
    except ToolError as e:
        err = {"class": e.cls, "message": e.message, "retry_after_s": e.retry_after_s}
    except BaseException as e:  # noqa: BLE001 - SystemExit from a tool is a failure too
        if isinstance(e, KeyboardInterrupt):
            raise
        err = {"class": "fatal", "message": f"{type(e).__name__}: {e}"[:2000], "retry_after_s": None}
    return {"ok": False, "error": err}, EXIT_TOOL_ERROR


def main():
    # The result channel is fd 1 alone: keep a private copy, then point fd 1 at stderr so a
    # tool's print() (or a child process it starts) cannot corrupt the one result line.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    raw = sys.stdin.buffer.read(MAX_REQUEST + 1)
    doc, code = handle(raw)
    out.write(json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n")
    out.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
