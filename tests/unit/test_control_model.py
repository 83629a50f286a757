"""The shared vocabulary of core and edge: exports pinned, values frozen, errors mapped once."""

from __future__ import annotations

import dataclasses

import pytest

import ringfence.errors as errors
import ringfence.model as model
from ringfence_server.control.tools import load_builtin
from ringfence_server.control.validation import canonical, canonical_json, validate_arguments


def test_model_exports_are_pinned():
    assert sorted(model.__all__) == sorted([
        "Role", "Principal", "ToolView", "ProposedCall", "ObservationStatus", "Observation", "RunStatus",
        "RunOutcome", "Usage", "ApprovalStatus", "ApprovalKind", "Approval", "RunView", "Event",
        "PlanStep", "WorkspaceRequest", "WorkspaceView", "ToolRisk", "RunPage", "EventPage", "AuditReport", "Identity"])
    assert [s.value for s in model.ObservationStatus] == [
        "executed", "denied", "blocked", "declined", "unknown_tool", "pending_approval", "deduplicated", "halted",
        "withheld", "invalid"]
    assert [o.value for o in model.RunOutcome] == [
        "completed", "loop_detected", "guardrail_stop", "budget_exhausted", "deadline_exceeded", "cancelled",
        "error", "uncertain", "model_truncated"]


def test_errors_are_one_hierarchy():
    for name in errors.__all__:
        cls = getattr(errors, name)
        if name != "FieldViolation":
            assert issubclass(cls, errors.ControlError)
    e = errors.InvalidArgument("bad", [errors.FieldViolation("a.b", "wrong")])
    assert e.violations == (errors.FieldViolation("a.b", "wrong"),) and "a.b: wrong" in str(e)


def test_values_are_frozen_and_copy_their_mappings():
    args = {"a": 1}
    call = model.ProposedCall("c", "echo", args)
    args["a"] = 2
    assert call.arguments == {"a": 1}
    with pytest.raises(TypeError):
        call.arguments["a"] = 3  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.tool = "other"  # type: ignore[misc]


def test_canonical_form():
    assert canonical_json({"b": 1.0, "a": [2.5, True, None]}) == '{"a":[2.5,true,null],"b":1}'
    with pytest.raises(ValueError):
        canonical({"x": float("nan")})
    with pytest.raises(ValueError):
        canonical({1: "x"})


def test_validation_reports_every_error_with_its_path():
    credit = load_builtin().get("credit")
    canon, errs = validate_arguments(credit, {"account": 7, "amount": "lots"}, max_bytes=1000)
    assert canon is None
    assert sorted(v.field for v in errs) == ["arguments.account", "arguments.amount"]
    canon, errs = validate_arguments(credit, {"amount": 5, "account": "acme-1"}, max_bytes=1000)
    assert errs == [] and list(canon) == ["account", "amount"]
