"""Edge conversions: strict decoding names the field; values survive the round trip."""

from __future__ import annotations

import json

import grpc
import pytest

from ringfence.errors import FieldViolation, InvalidArgument, NotFound, ResourceExhausted
from ringfence.model import (
    Approval,
    ApprovalStatus,
    Event,
    Observation,
    ObservationStatus,
    RunOutcome,
    RunStatus,
    RunView,
    Usage,
)
from ringfence.v1 import approvals_pb2, types_pb2
from ringfence.wire import convert
from ringfence.wire import status as wire_status
from ringfence_server.control.api import status


def parse(text: str, max_bytes: int = 1000):
    v = convert.Violations()
    value = convert.parse_json_object(text, "calls[0].arguments_json", max_bytes, v)
    return value, [x.description for x in v.items]


def test_json_objects_parse_and_empty_means_no_arguments():
    assert parse('{"account": "acme-9", "amount": 50}') == ({"account": "acme-9", "amount": 50}, [])
    assert parse("") == ({}, [])


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"amount": 5, "amount": 500}', "duplicate key 'amount'"),
        ('{"amount": NaN}', "NaN is not JSON"),
        ('{"amount": -Infinity}', "-Infinity is not JSON"),
        ('{"amount": 1e999}', "out of range"),
        ("[1, 2]", "must be a JSON object, not list"),
        ('"text"', "must be a JSON object, not str"),
        ('{"a": ', "invalid JSON"),
        ("[" * 5000 + "]" * 5000, "invalid JSON"),
        ('{"t": ' + "[" * 40 + "]" * 40 + "}", "nested deeper than 32 levels"),
        ('{"text": "\\ud800"}', "lone surrogate"),
        ('{"a": [{"\\udfff": 1}]}', "lone surrogate"),
    ],
)
def test_malformed_json_is_a_violation_naming_the_field(text, why):
    value, problems = parse(text, max_bytes=100_000)
    assert value is None
    assert len(problems) == 1 and why in problems[0]


def test_escaped_surrogate_pairs_are_fine():
    assert parse('{"smile": "\\ud83d\\ude00"}') == ({"smile": "\U0001F600"}, [])


def test_oversize_arguments_are_refused_with_the_limit():
    value, problems = parse(json.dumps({"text": "x" * 2000}), max_bytes=1000)
    assert value is None and "over the 1000-byte limit" in problems[0]


def test_a_batch_reports_every_violation_at_once():
    calls = [
        types_pb2.ProposedCall(call_id="", tool="echo", arguments_json="{}"),
        types_pb2.ProposedCall(call_id="c2", tool="", arguments_json="{}"),
        types_pb2.ProposedCall(call_id="c2", tool="echo", arguments_json="[]"),
        types_pb2.ProposedCall(call_id="bad id!", tool="echo", arguments_json="{}"),
    ]
    v = convert.Violations()
    convert.calls_from_proto(calls, max_calls=32, max_argument_bytes=1000, v=v)
    fields = [x.field for x in v.items]
    assert fields == [
        "calls[0].call_id",
        "calls[1].tool",
        "calls[2].call_id",
        "calls[2].arguments_json",
        "calls[3].call_id",
    ]
    with pytest.raises(InvalidArgument) as e:
        v.raise_if_any()
    assert len(e.value.violations) == 5


def test_batch_size_bounds():
    v = convert.Violations()
    convert.calls_from_proto([], max_calls=2, max_argument_bytes=10, v=v)
    assert [x.field for x in v.items] == ["calls"]
    v = convert.Violations()
    call = types_pb2.ProposedCall(call_id="c", tool="echo")
    convert.calls_from_proto([call] * 3, max_calls=2, max_argument_bytes=10, v=v)
    assert "over the limit of 2" in v.items[0].description


@pytest.mark.parametrize("value", [approvals_pb2.DECISION_UNSPECIFIED, 7, -1])
def test_decision_must_be_approve_or_decline(value):
    v = convert.Violations()
    assert convert.decision_from_proto(value, v) is None
    assert v.items[0].field == "decision"


def test_values_round_trip_through_their_protos():
    obs = Observation(
        "c1", "credit", ObservationStatus.PENDING_APPROVAL, False, content={"n": [1, 2.5, None]},
        error="needs approval", error_class=None, verdict_path=("registry:ok", "policy:ask"),
        approval_id="ap-1", attempts=0,
    )
    appr = Approval("ap-1", "acme", "r1", "c1", "credit", {"account": "acme-9", "amount": 50}, "d" * 64,
                    ApprovalStatus.PENDING, 1700000000.25, 1700000900.5, None, None)
    run = RunView("r1", "acme", "goal", RunStatus.WAITING_APPROVAL, None, 1, (obs,), Usage(1, 1, 0.1), (appr,))
    done = RunView("r2", "acme", "g", RunStatus.FINISHED, RunOutcome.CANCELLED, 0, (), Usage())
    event = Event("r1", 3, "call_admitted", {"call_id": "c1"}, 1, 1700000000.125)
    assert convert.observation_from_proto(convert.observation_to_proto(obs)) == obs
    assert convert.approval_from_proto(convert.approval_to_proto(appr)) == appr
    assert convert.run_from_proto(convert.run_to_proto(run)) == run
    assert convert.run_from_proto(convert.run_to_proto(done)) == done
    assert convert.event_from_proto(convert.event_to_proto(event)) == event
    # Every model enum member has a wire value (a new member without one fails here).
    for s in ObservationStatus:
        assert convert.observation_to_proto(Observation("c", "t", s, False)).status != 0


def test_status_round_trip_keeps_the_exception_and_its_violations():
    class FakeCall(grpc.RpcError):
        def __init__(self, st: grpc.Status) -> None:
            self._st = st

        def code(self):
            return self._st.code

        def details(self):
            return self._st.details

        def trailing_metadata(self):
            return self._st.trailing_metadata

    err = InvalidArgument("bad plan", [FieldViolation("steps[10]", "over the limit of 10 steps")])
    back = wire_status.from_rpc_error(FakeCall(status.to_grpc_status(err)))
    assert isinstance(back, InvalidArgument) and back.violations == err.violations
    assert isinstance(wire_status.from_rpc_error(FakeCall(status.to_grpc_status(NotFound("no run")))), NotFound)
    st = status.to_grpc_status(ResourceExhausted("too many"))
    assert st.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    unexpected = status.to_grpc_status(KeyError("boom"))
    assert unexpected.code == status.UNEXPECTED_CODE and "boom" not in unexpected.details
