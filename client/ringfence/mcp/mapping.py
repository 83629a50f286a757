"""Pure mappings between ringfence's values and MCP's (no I/O: unit-tested exhaustively).

    tool_of(view)              ToolView -> mcp Tool: name, description, the JSON Schema through
                               the models' keyword allow-list (no risk metadata), honest hints
    result_of(observation)     Observation -> CallToolResult, or ErrorData for the two statuses
                               that are the caller's mistake (unknown tool, invalid arguments)
    error_of(exception)        a ringfence.errors exception -> ErrorData (never a stack trace)

Observation statuses (the table; `verdict_path` is always in the text, so the model can adapt):

    executed, no error            the result as text (+ structuredContent for a JSON object)
    executed with an error        isError: the tool failed, timed out, ran out of memory, ...
    deduplicated                  the earlier call's result, as executed (it did not run again)
    withheld                      isError: it ran, the result guardrail withheld its result
    denied / blocked / declined   isError: the reason and the verdict path; expired and
    halted / pending_approval     withdrawn approvals are `declined` with their own reason
    unknown_tool                  JSON-RPC INVALID_PARAMS naming the tool
    denied, invalid_arguments     JSON-RPC INVALID_PARAMS naming the tool and each schema path
    invalid (the loop's)          JSON-RPC INVALID_PARAMS (never the server's, mapped all the same)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import mcp_types as types
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, ErrorData

from ringfence import errors
from ringfence.model import Observation, ObservationStatus, ToolView
from ringfence.models._common import clean_schema

__all__ = [
    "IDEMPOTENCY_KEY_META",
    "NOT_AUTHORIZED",
    "OUTPUT_CAP",
    "RUN_OVER",
    "SESSION_OVER_LIMIT",
    "STATUS_META",
    "UNAVAILABLE",
    "error_of",
    "internal_error",
    "result_of",
    "tool_of",
    "truncate",
]

IDEMPOTENCY_KEY_META = "io.ringfence/idempotency-key"
"""The tools/call `_meta` key whose string value becomes the call's idempotency key: a mutation
resent with the same key (in the session's run) takes effect once."""

STATUS_META = "io.ringfence/observation"
"""The CallToolResult `_meta` key holding the call's id, status, verdict path and approval id."""

OUTPUT_CAP = 100_000
"""The most characters of a result's text an MCP client receives; beyond it the text is cut and
says so (a model's context is the scarce thing, and a huge output is seldom read whole)."""

# JSON-RPC error codes of our own, in the range JSON-RPC reserves for implementation-defined
# server errors (-32000 to -32099). INVALID_PARAMS and INTERNAL_ERROR are the spec's.
SESSION_OVER_LIMIT = -32000
"""The server's flood bounds (RESOURCE_EXHAUSTED, exactly SubmitBatch's)."""
NOT_AUTHORIZED = -32001
"""The token was refused (UNAUTHENTICATED) or may not do this (PERMISSION_DENIED)."""
RUN_OVER = -32002
"""The session's run cannot take calls any more (FAILED_PRECONDITION: finished, out of budget)."""
UNAVAILABLE = -32003
"""The ringfence server (or its sandbox engine) cannot be reached now."""

_INVALID_ARGUMENTS = "invalid_arguments"  # the server's error_class for arguments its schema refuses
_OUTPUT_LIMIT = "output_limit"  # the server's error_class when the tool's output passed its cap


# --- tools/list -----------------------------------------------------------------------------------


def tool_of(view: ToolView) -> types.Tool:
    """One tool as an MCP client sees it: never anything but its name, what it does, the JSON Schema
    of its arguments (the same allow-list the model adapters use) and the hints ringfence can stand
    behind. readOnlyHint: the tool does not mutate. destructiveHint (only meaningful, per the spec,
    for a tool that is not read-only): its effect cannot be undone. idempotentHint and
    openWorldHint are left unset: ToolView does not say, and a guessed hint is a lie."""
    schema = clean_schema(view.schema)
    if not isinstance(schema, dict) or not schema:
        schema = {"type": "object", "properties": {}}
    schema.setdefault("type", "object")  # MCP requires an object schema at the top
    read_only = bool(view.read_only_hint)
    annotations = types.ToolAnnotations(
        read_only_hint=read_only,
        destructive_hint=None if read_only else bool(view.destructive_hint),
    )
    return types.Tool(name=view.name, description=view.description, input_schema=schema, annotations=annotations)


# --- tools/call -----------------------------------------------------------------------------------


def truncate(text: str, cap: int = OUTPUT_CAP) -> str:
    """`text`, or its first `cap` characters and a line that says it was cut."""
    if len(text) <= cap:
        return text
    return f"{text[:cap]}\n[ringfence: output truncated: {cap} of {len(text)} characters shown]"


def _as_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return json.dumps(content, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def _path(observation: Observation) -> str:
    return " > ".join(observation.verdict_path) or "(none)"


def _meta(observation: Observation) -> dict[str, Any]:
    meta: dict[str, Any] = {"call_id": observation.call_id, "status": observation.status.value,
                            "executed": observation.executed, "verdict_path": list(observation.verdict_path)}
    if observation.error_class:
        meta["error_class"] = observation.error_class
    if observation.approval_id:
        meta["approval_id"] = observation.approval_id
    return {STATUS_META: meta}


def _result(text: str, observation: Observation, *, is_error: bool, structured: Any = None,
            cap: int = OUTPUT_CAP) -> types.CallToolResult:
    # `meta` by its field name (populate_by_name): the pydantic plugin knows only the alias `_meta`.
    return types.CallToolResult(content=[types.TextContent(type="text", text=truncate(text, cap))],
                                structured_content=structured, is_error=is_error,
                                meta=_meta(observation))  # type: ignore[call-arg]


def _violations(reason: str) -> list[dict[str, str]]:
    """The server's invalid-arguments reason ("FIELD: WHAT; FIELD: WHAT") as its field violations."""
    out = []
    for part in reason.split("; "):
        field, sep, description = part.partition(": ")
        out.append({"field": field, "description": description} if sep else {"field": "", "description": part})
    return out


def result_of(observation: Observation, cap: int = OUTPUT_CAP) -> types.CallToolResult | ErrorData:
    """The final observation of one tools/call as MCP's answer (the table in the module docstring).
    ErrorData is for the caller's own mistakes only; whatever the policy or the tool decided is a
    result the model reads (isError), never a protocol error."""
    status, tool = observation.status, observation.tool
    if status is ObservationStatus.UNKNOWN_TOOL:
        return ErrorData(code=INVALID_PARAMS, message=f"unknown tool {tool!r}: tools/list names the tools there are",
                         data={"tool": tool, "verdict_path": list(observation.verdict_path)})
    if status is ObservationStatus.INVALID or (status is ObservationStatus.DENIED
                                               and observation.error_class == _INVALID_ARGUMENTS):
        reason = observation.error or "the arguments do not match the tool's schema"
        return ErrorData(code=INVALID_PARAMS, message=f"invalid arguments for tool {tool!r}: {reason}",
                         data={"tool": tool, "violations": _violations(reason),
                               "verdict_path": list(observation.verdict_path)})
    if status in (ObservationStatus.EXECUTED, ObservationStatus.DEDUPLICATED) and observation.error is None:
        content = observation.content
        structured = dict(content) if isinstance(content, Mapping) else None
        text = "" if content is None else _as_text(content)
        return _result(text, observation, is_error=False, structured=structured, cap=cap)
    if status is ObservationStatus.EXECUTED:
        kind = observation.error_class or "error"
        lines = [f"{tool} failed ({kind}): {observation.error}"]
        if kind == _OUTPUT_LIMIT:
            lines.append("[ringfence: the server cut the tool's output at the tool's output limit]")
        if observation.content is not None:
            lines.append(_as_text(observation.content))
        lines.append(f"verdict path: {_path(observation)}")
        return _result("\n".join(lines), observation, is_error=True, cap=cap)
    # Not run, or its result not shown: denied, blocked, declined (expired and withdrawn included),
    # halted, withheld, or still pending when the run ended.
    word = {ObservationStatus.PENDING_APPROVAL: "not decided", ObservationStatus.WITHHELD: "withheld"}.get(
        status, status.value)
    reason = observation.error or "no reason given"
    text = f"{tool} {word}: {reason}\nverdict path: {_path(observation)}"
    if observation.approval_id:
        text += f"\napproval: {observation.approval_id}"
    return _result(text, observation, is_error=True, cap=cap)


# --- errors ---------------------------------------------------------------------------------------


def internal_error(incident: str | None = None) -> ErrorData:
    """What an MCP client is told of a fault: that it is one, never a stack trace."""
    where = f" (incident {incident})" if incident else ""
    return ErrorData(code=INTERNAL_ERROR, message=f"internal error in the ringfence MCP front door{where}")


def error_of(exc: BaseException) -> ErrorData:
    """A ringfence.errors exception as a JSON-RPC error; anything else (a bug, a transport fault
    with no ringfence meaning) is an internal error, never mapped to something retryable."""
    message = str(exc)
    if isinstance(exc, errors.ResourceExhausted):
        return ErrorData(code=SESSION_OVER_LIMIT, message=f"this MCP session is over its limit: {message}")
    if isinstance(exc, errors.Unauthenticated):
        return ErrorData(code=NOT_AUTHORIZED, message=f"ringfence refused the token: {message}")
    if isinstance(exc, errors.PermissionDenied):
        return ErrorData(code=NOT_AUTHORIZED, message=f"ringfence does not permit this: {message}")
    if isinstance(exc, errors.InvalidArgument):
        violations = [{"field": v.field, "description": v.description} for v in exc.violations]
        return ErrorData(code=INVALID_PARAMS, message=f"ringfence refused the request: {message}",
                         data={"violations": violations})
    if isinstance(exc, (errors.FailedPrecondition, errors.NotFound)):
        return ErrorData(code=RUN_OVER, message=f"this MCP session's run cannot take the call: {message}")
    if isinstance(exc, errors.Unavailable):
        return ErrorData(code=UNAVAILABLE, message=f"the ringfence server is unavailable: {message}")
    if isinstance(exc, errors.Internal):
        # The server's own fault: its message carries the incident id and nothing else.
        return ErrorData(code=INTERNAL_ERROR, message=f"internal error in the ringfence server: {message}")
    return internal_error()
