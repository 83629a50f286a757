"""The MCP front door's pure mappings (ringfence.mcp.mapping, ringfence.mcp.resources): tools as an
MCP client sees them (no risk metadata, honest hints), every observation status as a result or a
JSON-RPC error, truncation, and ringfence's errors as JSON-RPC errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, CallToolResult, ErrorData

from ringfence import errors
from ringfence.mcp.mapping import (
    NOT_AUTHORIZED,
    OUTPUT_CAP,
    RUN_OVER,
    SESSION_OVER_LIMIT,
    STATUS_META,
    UNAVAILABLE,
    error_of,
    result_of,
    tool_of,
    truncate,
)
from ringfence.mcp.resources import artifact_uri, parse_artifact_uri, resource_contents
from ringfence.model import Observation, ObservationStatus, ToolView

S = ObservationStatus
PATH = ("registry:ok", "validation:ok", "guardrail:pass", "resource:ok", "policy:rule[5]:deny")


def view(schema: Any, *, read_only: bool = True, destructive: bool = False) -> ToolView:
    return ToolView("t", "does t", schema, read_only_hint=read_only, destructive_hint=destructive)


def obs(status: ObservationStatus, *, executed: bool = False, content: Any = None, error: str | None = None,
        error_class: str | None = None, path: tuple[str, ...] = PATH, approval_id: str | None = None) -> Observation:
    return Observation("mcp-1", "t", status, executed, content=content, error=error, error_class=error_class,
                       verdict_path=path, approval_id=approval_id)


def text(result: CallToolResult) -> str:
    [block] = result.content
    return block.text  # type: ignore[union-attr]


# --- tools/list -----------------------------------------------------------------------------------


def test_a_tools_schema_keeps_only_json_schema_keywords_and_property_names():
    schema = {
        "type": "object", "$schema": "https://json-schema.org/draft/2020-12/schema", "x-cost": 3,
        "mutates": True, "reversible": False, "paths": {"p": ["/input"]},
        "properties": {"cost": {"type": "number", "minimum": 0, "x-risk": "high"},  # an argument named cost
                       "p": {"type": "string", "egress_hosts": ["a.example"]}},
        "required": ["cost"], "additionalProperties": False,
    }
    tool = tool_of(view(schema))
    assert tool.input_schema == {
        "type": "object", "properties": {"cost": {"type": "number", "minimum": 0}, "p": {"type": "string"}},
        "required": ["cost"], "additionalProperties": False}
    assert tool.name == "t" and tool.description == "does t"


@pytest.mark.parametrize("schema", [{}, None, True])
def test_a_tool_without_an_object_schema_gets_an_empty_object_one(schema):
    assert tool_of(view(schema)).input_schema == {"type": "object", "properties": {}}


def test_a_schema_without_a_type_is_an_object_schema():
    assert tool_of(view({"properties": {"a": {"type": "string"}}})).input_schema == {
        "properties": {"a": {"type": "string"}}, "type": "object"}


@pytest.mark.parametrize("read_only, destructive, hints", [
    (True, False, {"readOnlyHint": True}),  # a read: destructiveHint is meaningless, not sent
    (False, False, {"readOnlyHint": False, "destructiveHint": False}),  # a reversible mutation
    (False, True, {"readOnlyHint": False, "destructiveHint": True}),  # an irreversible one
])
def test_annotations_are_the_hints_ringfence_can_stand_behind(read_only, destructive, hints):
    tool = tool_of(view({"type": "object"}, read_only=read_only, destructive=destructive))
    wire = tool.model_dump(by_alias=True, exclude_none=True)
    # idempotentHint and openWorldHint are never guessed.
    assert wire["annotations"] == hints


# --- tools/call: results --------------------------------------------------------------------------


def test_an_executed_json_object_is_pretty_text_and_structured_content():
    result = result_of(obs(S.EXECUTED, executed=True, content={"b": 1, "a": [1, 2]}))
    assert isinstance(result, CallToolResult) and not result.is_error
    assert text(result) == json.dumps({"b": 1, "a": [1, 2]}, indent=2)
    assert result.structured_content == {"b": 1, "a": [1, 2]}
    assert result.meta == {STATUS_META: {"call_id": "mcp-1", "status": "executed", "executed": True,
                                         "verdict_path": list(PATH)}}


@pytest.mark.parametrize("content, shown", [("plain text", "plain text"), ([1, "x"], '[\n  1,\n  "x"\n]'),
                                            (None, ""), (3.5, "3.5")])
def test_an_executed_result_that_is_not_an_object_is_text_only(content, shown):
    result = result_of(obs(S.EXECUTED, executed=True, content=content))
    assert isinstance(result, CallToolResult) and not result.is_error
    assert text(result) == shown and result.structured_content is None


def test_a_deduplicated_call_returns_the_earlier_result_and_says_so():
    result = result_of(obs(S.DEDUPLICATED, executed=True, content={"credit": 1}))
    assert isinstance(result, CallToolResult) and not result.is_error
    assert result.structured_content == {"credit": 1}
    assert result.meta is not None and result.meta[STATUS_META]["status"] == "deduplicated"


@pytest.mark.parametrize("error_class", ["error", "timeout", "oom", "killed"])
def test_a_tool_that_failed_is_an_error_result_with_its_error_and_class(error_class):
    result = result_of(obs(S.EXECUTED, executed=True, error="it broke", error_class=error_class))
    assert isinstance(result, CallToolResult) and result.is_error
    assert text(result).startswith(f"t failed ({error_class}): it broke")
    assert "verdict path: " + " > ".join(PATH) in text(result)
    assert result.meta is not None and result.meta[STATUS_META]["error_class"] == error_class


def test_output_the_server_cut_says_so():
    result = result_of(obs(S.EXECUTED, executed=True, error="stdout over 65536 bytes", error_class="output_limit"))
    assert isinstance(result, CallToolResult) and result.is_error
    assert "[ringfence: the server cut the tool's output at the tool's output limit]" in text(result)


@pytest.mark.parametrize("status, error, error_class, word", [
    (S.DENIED, "amount 500 is over 100", "policy", "denied"),
    (S.DENIED, "/etc/passwd is outside /input", "resource", "denied"),
    (S.BLOCKED, "the arguments carry a secret", "secret", "blocked"),
    (S.DECLINED, "declined by demo-approver: not today", None, "declined"),
    (S.DECLINED, "the approval expired", "expired", "declined"),
    (S.DECLINED, "withdrawn: the MCP client cancelled the request", "withdrawn", "declined"),
    (S.HALTED, "the run was halted: loop", None, "halted"),
    (S.WITHHELD, "the result carried a secret", "secret_in_result", "withheld"),
    (S.PENDING_APPROVAL, "waiting for approval", None, "not decided"),
])
def test_a_refusal_is_an_error_result_with_the_reason_and_the_verdict_path(status, error, error_class, word):
    result = result_of(obs(status, error=error, error_class=error_class, approval_id="apr-1"))
    assert isinstance(result, CallToolResult), result
    assert result.is_error
    assert text(result) == f"t {word}: {error}\nverdict path: {' > '.join(PATH)}\napproval: apr-1"
    assert result.meta is not None and result.meta[STATUS_META]["verdict_path"] == list(PATH)


def test_an_unknown_tool_is_invalid_params_naming_it():
    error = result_of(obs(S.UNKNOWN_TOOL, error="unknown tool 't'", error_class="unknown_tool",
                          path=("registry:unknown",)))
    assert isinstance(error, ErrorData)
    assert error.code == INVALID_PARAMS and "unknown tool 't'" in error.message
    assert error.data == {"tool": "t", "verdict_path": ["registry:unknown"]}


def test_invalid_arguments_are_invalid_params_with_each_schema_path():
    reason = "arguments.amount: 'lots' is not of type 'number'; arguments: 'account' is a required property"
    error = result_of(obs(S.DENIED, error=reason, error_class="invalid_arguments",
                          path=("registry:ok", "validation:invalid")))
    assert isinstance(error, ErrorData)
    assert error.code == INVALID_PARAMS and error.message == f"invalid arguments for tool 't': {reason}"
    assert error.data["violations"] == [
        {"field": "arguments.amount", "description": "'lots' is not of type 'number'"},
        {"field": "arguments", "description": "'account' is a required property"}]


def test_the_loops_invalid_status_is_invalid_params_too():
    assert isinstance(result_of(obs(S.INVALID, error="not JSON")), ErrorData)


@pytest.mark.parametrize("status", list(ObservationStatus))
def test_every_status_maps_and_only_the_callers_mistakes_are_protocol_errors(status):
    result = result_of(obs(status, executed=status in (S.EXECUTED, S.DEDUPLICATED), error="why"))
    if status in (S.UNKNOWN_TOOL, S.INVALID):
        assert isinstance(result, ErrorData)
    else:
        assert isinstance(result, CallToolResult)


# --- truncation -----------------------------------------------------------------------------------


def test_a_long_text_is_cut_and_says_so():
    assert truncate("x" * 10, 10) == "x" * 10
    assert truncate("x" * 11, 10) == "x" * 10 + "\n[ringfence: output truncated: 10 of 11 characters shown]"


def test_a_result_over_the_cap_is_truncated_with_the_note():
    result = result_of(obs(S.EXECUTED, executed=True, content="y" * (OUTPUT_CAP + 5)))
    assert isinstance(result, CallToolResult)
    assert text(result) == "y" * OUTPUT_CAP + (
        f"\n[ringfence: output truncated: {OUTPUT_CAP} of {OUTPUT_CAP + 5} characters shown]")


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("exc, code, says", [
    (errors.ResourceExhausted("128 calls in flight"), SESSION_OVER_LIMIT, "over its limit"),
    (errors.Unauthenticated("unknown token"), NOT_AUTHORIZED, "refused the token"),
    (errors.PermissionDenied("role approver"), NOT_AUTHORIZED, "does not permit"),
    (errors.FailedPrecondition("run r is finished"), RUN_OVER, "cannot take the call"),
    (errors.NotFound("no run r"), RUN_OVER, "cannot take the call"),
    (errors.Unavailable("docker is down"), UNAVAILABLE, "unavailable"),
    (errors.Internal("incident inc-1"), INTERNAL_ERROR, "incident inc-1"),
])
def test_ringfence_errors_are_json_rpc_errors(exc, code, says):
    error = error_of(exc)
    assert error.code == code and says in error.message and str(exc) in error.message


def test_invalid_argument_carries_its_violations():
    error = error_of(errors.InvalidArgument("bad", [errors.FieldViolation("calls[0].arguments", "too big")]))
    assert error.code == INVALID_PARAMS
    assert error.data == {"violations": [{"field": "calls[0].arguments", "description": "too big"}]}


@pytest.mark.parametrize("exc", [KeyError("secret detail"), RuntimeError("boom at line 3"), ValueError("x")])
def test_anything_unexpected_is_an_internal_error_that_says_nothing_of_it(exc):
    error = error_of(exc)
    assert error.code == INTERNAL_ERROR and str(exc) not in error.message and error.data is None


# --- resources ------------------------------------------------------------------------------------


def test_artifact_uris_round_trip_and_stay_within_the_sessions_run():
    uri = artifact_uri("run-1", "out/report 1.txt")
    assert uri == "ringfence://runs/run-1/artifacts/out/report%201.txt"
    assert parse_artifact_uri(uri, "run-1") == "out/report 1.txt"
    assert parse_artifact_uri(uri, "run-2") is None
    assert parse_artifact_uri("ringfence://runs/run-1/artifacts/", "run-1") is None


def test_resource_contents_are_text_when_utf8_else_base64():
    assert resource_contents("ringfence://runs/r/artifacts/a.txt", "héllo".encode()).text == "héllo"  # type: ignore[union-attr]
    blob = resource_contents("ringfence://runs/r/artifacts/a.bin", b"\xff\x00")
    assert blob.blob == "/wA="  # type: ignore[union-attr]


# --- trace context ----------------------------------------------------------------------------------


def test_meta_trace_context_becomes_the_parent_of_the_grpc_calls_made_inside():
    from opentelemetry import propagate

    from ringfence.mcp.frontdoor import _trace_parent

    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with _trace_parent({"traceparent": parent, "progress_token": 1}):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)  # what ringfence's client puts in each call's metadata
    assert carrier.get("traceparent") == parent
    outside: dict[str, str] = {}
    propagate.inject(outside)
    assert "traceparent" not in outside
    with _trace_parent({"traceparent": "not a trace context"}):
        nothing: dict[str, str] = {}
        propagate.inject(nothing)
    assert "traceparent" not in nothing


# --- the optional extra -----------------------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RINGFENCE_TOKEN": "demo-agent-token"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)


def test_importing_ringfence_never_imports_the_mcp_sdk():
    proc = _python("import sys, ringfence, ringfence.cli.main; print('mcp' in sys.modules, 'mcp_types' in sys.modules)")
    assert proc.stdout.strip() == "False False", proc.stderr


def test_without_the_extra_the_package_and_the_command_name_it():
    # sys.modules[name] = None makes `import name` raise ImportError: the SDK as if not installed.
    hide = "import sys; sys.modules['mcp'] = None; "
    proc = _python(hide + "import ringfence.mcp")
    assert "pip install 'ringfence[mcp]'" in proc.stderr and proc.returncode != 0
    proc = _python(hide + "from ringfence.cli.main import main; sys.exit(main(['mcp', '--server', '127.0.0.1:9']))")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "pip install 'ringfence[mcp]'" in proc.stderr


def test_a_server_that_cannot_be_reached_is_said_on_stderr_before_any_protocol():
    env = {**os.environ, "RINGFENCE_TOKEN": "demo-agent-token"}
    proc = subprocess.run([sys.executable, "-m", "ringfence.cli", "mcp", "--server", "127.0.0.1:9", "--timeout", "3"],
                          capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "cannot reach a ringfence server at 127.0.0.1:9" in proc.stderr
