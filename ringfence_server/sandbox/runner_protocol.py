"""The tool runner's protocol: what the runner in a tool image prints, and how it is read.

The runner (images/tool/rootfs/opt/ringfence/runner.py, run as the image's command) reads one
JSON request on stdin and writes exactly one JSON line on stdout, then exits:

    success  {"ok": true, "content": <any JSON>}                                   exit 0
    failure  {"ok": false, "error": {"class": "invalid|transient|rate_limited|fatal",
                                     "message": "...", "retry_after_s": null|number}}  exit 3

The result line is the last line of stdout (the runner points fd 1 at stderr before a tool
runs, so a tool's own prints cannot come after it). Both sides of the sandbox read it here:
the control plane a success's content (ringfence_server.control.orchestration.dispatch), the backend a
failure's class (ringfence_server.sandbox.docker_backend). Any other exit status, or a document that does not
have this shape, is not the runner speaking: the call is `fatal`.

Strict JSON: NaN, Infinity and numbers too big for a float are refused. Python's json writes
and reads them, but they are not JSON, and the event store (rightly) refuses them: a result
that holds one must fail its call, never reach the log and end the run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ringfence_server.sandbox.result import ToolErrorClass

EXIT_OK = 0
"""The runner's status after writing a success document."""
EXIT_TOOL_ERROR = 3
"""The runner's status after writing a structured tool error."""

_NOT_FINITE = "(the runner's document must hold finite numbers only)"


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number {_NOT_FINITE}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf
        raise ValueError(f"{text} is not a finite number {_NOT_FINITE}")
    return value


def parse_runner_line(line: str | bytes) -> object:
    """One line of the runner's protocol, as strict JSON (ValueError on NaN, Infinity or a
    number too big for a float)."""
    result: object = json.loads(line, parse_constant=_refuse_constant, parse_float=_finite_float)
    return result


def is_result_line(line: bytes) -> bool:
    """Whether `line` is a result document ({"ok": true|false, ...}), for telling the result
    apart from a tool's own prints while the call runs (ringfence_server.control.orchestration.live_output).
    Lenient on purpose: a result that strict parsing refuses is still the result, never
    output; it fails the call when it is read (read_success, read_failure)."""
    try:
        doc = json.loads(line)
    except ValueError:  # also UnicodeDecodeError
        return False
    return isinstance(doc, dict) and isinstance(doc.get("ok"), bool)


def read_success(stdout: bytes) -> object:
    """The content of a success document on `stdout`. ValueError (UnicodeDecodeError among
    them) or IndexError when stdout does not end with one."""
    # Decoded before it is split, as the control plane always read it: str.splitlines also
    # splits at U+2028 and the other Unicode line breaks, which the runner's
    # ensure_ascii=False may leave in a string (such a result then fails `fatal`).
    doc = parse_runner_line(stdout.decode("utf-8").strip().splitlines()[-1])
    if not isinstance(doc, dict) or doc.get("ok") is not True or "content" not in doc:
        raise ValueError("not a runner success document")
    return doc["content"]


@dataclass(frozen=True)
class ToolFailure:
    """How a call's tool failed, as the sandbox reports it (SandboxResult's error fields)."""

    error_class: ToolErrorClass
    message: str
    retry_after_s: float | None = None
    """The tool's retry-after hint in seconds (a rate_limited error), finite when set."""


def read_failure(stdout: bytes, exit_code: int | None, *, runner: bool) -> ToolFailure:
    """The tool's own classified error when the runner reported one (`runner`: the image's
    runner was the command, and it exited EXIT_TOOL_ERROR); otherwise `fatal`, saying why."""
    if not runner or exit_code != EXIT_TOOL_ERROR:
        return ToolFailure(ToolErrorClass.FATAL, f"exited with status {exit_code}")
    try:
        # Strict: a NaN here would reach the log as the retry hint.
        body = parse_runner_line(stdout.strip().splitlines()[-1])
        if not isinstance(body, dict) or not isinstance(error := body["error"], dict):
            raise TypeError("not a runner error document")
        cls = ToolErrorClass(error["class"])
        retry_after = error.get("retry_after_s")
        hint = float(retry_after) if retry_after is not None else None
        if hint is not None and not math.isfinite(hint):  # float("nan") takes the string too
            raise ValueError(f"retry_after_s {retry_after!r} is not a finite number")
        return ToolFailure(cls, str(error.get("message", "")), hint)
    except (ValueError, KeyError, IndexError, TypeError):
        return ToolFailure(ToolErrorClass.FATAL, "runner reported an error it could not describe")
