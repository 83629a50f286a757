"""A sandbox result's wire form (ringfence_server.worker.wire): round trips over every outcome
(and, with Hypothesis, over arbitrary output bytes), the one spelling, and every refusal of the
control plane's strict reader, in its documented order."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringfence_server.sandbox.egress.config import ProxyConfig
from ringfence_server.sandbox.result import Outcome, SandboxResult, ToolErrorClass
from ringfence_server.worker import wire as wire_mod
from ringfence_server.worker.envelope import SandboxSpec
from ringfence_server.worker.errors import WireError, WireFault, WorkerError
from ringfence_server.worker.wire import (
    CONTROL_PLANE_FIELDS,
    FORMAT,
    FORMAT_VERSION,
    MAX_EGRESS_EVENTS,
    MAX_METADATA_BYTES,
    decode_result,
    encode_result,
    max_wire_bytes,
)

LIMITS = SandboxSpec(stdout_limit=4096, stderr_limit=1024)

EVENT = {"ts": 1.5, "event": "request", "call_id": "call-1.a1", "method": "CONNECT", "host": "api.example.com",
         "port": 443, "address": "203.0.113.7", "decision": "allowed", "reason": None, "bytes_up": 10,
         "bytes_down": 20, "cut": None, "sni": ["api.example.com"], "service": False}
APPLIED = {"user": "10001:10001", "read_only": True, "cap_drop": ["ALL"], "cap_add": None, "nano_cpus": 500000000,
           "ulimits": [{"name": "core", "soft": 0, "hard": 0}], "mounts": [], "env": ["PATH=/usr/bin"]}


def result(**changes) -> SandboxResult:
    fields: dict[str, Any] = dict(
        outcome=Outcome.OK, exit_code=0, stdout=b'{"ok":true,"content":{"x":1}}\n', stderr=b"\xff\x00warn",
        stdout_truncated=False, stderr_truncated=False, duration_ms=42, image_id="sha256:" + "a" * 64,
        runtime="runc", error_class=None, message="", retry_after_s=None, container_name="rf-call-1",
        applied=APPLIED, egress_events=(EVENT,), setup_ms=7, warm=True)
    fields.update(changes)
    return SandboxResult(**fields)


def refused(data: bytes, limits: SandboxSpec = LIMITS) -> WireFault:
    with pytest.raises(WireError) as e:
        decode_result(data, limits=limits)
    return e.value.reason


def doc(**changes) -> dict:
    d = json.loads(encode_result(result()))
    d.update(changes)
    return d


def canonical(d: dict) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


# -- round trips -------------------------------------------------------------------------------

_BY_OUTCOME = {
    Outcome.OK: {},
    Outcome.TOOL_ERROR: {"exit_code": 3, "error_class": ToolErrorClass.RATE_LIMITED, "retry_after_s": 2.5,
                         "message": "slow down"},
    Outcome.OOM: {"exit_code": 137, "message": "memory limit"},
    Outcome.TIMEOUT: {"exit_code": None, "message": "timed out after 5s"},
    Outcome.OUTPUT_LIMIT: {"stdout": b"x" * 4096, "stdout_truncated": True, "exit_code": None},
    Outcome.START_FAILED: {"exit_code": None, "stdout": b"", "stderr": b"", "duration_ms": 0, "setup_ms": 0,
                           "applied": {}, "egress_events": (), "warm": False, "message": "sandbox engine: down"},
    Outcome.UNCERTAIN: {"exit_code": None, "message": "the engine failed after the start"},
    Outcome.KILLED: {"exit_code": 143, "message": "killed: the run was cancelled"},
}


def test_every_outcome_is_covered():
    assert set(_BY_OUTCOME) == set(Outcome)


@pytest.mark.parametrize("outcome", list(Outcome))
def test_every_outcome_round_trips(outcome):
    original = result(outcome=outcome, **_BY_OUTCOME[outcome])
    data = encode_result(original)
    assert decode_result(data, limits=LIMITS) == original
    assert encode_result(decode_result(data, limits=LIMITS)) == data


def test_every_field_of_a_result_is_on_the_wire_by_name():
    # A field added to SandboxResult and not to the wire form fails here, not silently in transit.
    d = json.loads(encode_result(result()))
    on_the_wire = {f.name for f in dataclasses.fields(SandboxResult)} - CONTROL_PLANE_FIELDS
    assert set(d) == on_the_wire | {"format", "version"}
    assert (d["format"], d["version"]) == (FORMAT, FORMAT_VERSION)
    assert base64.b64decode(d["stdout"]) == result().stdout and base64.b64decode(d["stderr"]) == b"\xff\x00warn"


def test_the_encoding_is_canonical_ascii_and_deterministic():
    data = encode_result(result(message="é ü \u2028 \ud800"))  # a lone surrogate survives, escaped
    assert data.isascii() and b"\n" not in data and b'": ' not in data and b'", "' not in data
    assert data == encode_result(result(message="é ü \u2028 \ud800"))
    assert decode_result(data, limits=LIMITS).message == "é ü \u2028 \ud800"


def test_a_whole_number_retry_after_is_one_spelling():
    # 5 and 5.0 are one value: written 5.0 whichever the result held, and only 5.0 is read.
    data = encode_result(result(outcome=Outcome.TOOL_ERROR, retry_after_s=5))
    assert b'"retry_after_s":5.0' in data
    assert decode_result(data, limits=LIMITS).retry_after_s == 5.0
    assert refused(data.replace(b'"retry_after_s":5.0', b'"retry_after_s":5')) is WireFault.NOT_CANONICAL


@settings(max_examples=200, deadline=None)
@given(stdout=st.binary(max_size=4096), stderr=st.binary(max_size=1024), exit_code=st.none() | st.integers(-255, 255),
       outcome=st.sampled_from(list(Outcome)), message=st.text(max_size=50), duration=st.integers(0, 10**9),
       retry=st.none() | st.floats(0, 1e9, allow_nan=False, allow_infinity=False))
def test_any_bytes_survive_the_round_trip(stdout, stderr, exit_code, outcome, message, duration, retry):
    original = result(stdout=stdout, stderr=stderr, exit_code=exit_code, outcome=outcome, message=message,
                      duration_ms=duration, retry_after_s=retry)
    back = decode_result(encode_result(original), limits=LIMITS)
    assert back == original
    assert back.stdout == stdout and back.stderr == stderr


# -- the writer refuses what the reader would ----------------------------------------------------


def _circular() -> dict:
    d: dict = {"a": 1}
    d["me"] = d
    return d


@pytest.mark.parametrize(("changes", "fault"), [
    ({"retry_after_s": float("nan")}, WireFault.NON_FINITE),
    ({"retry_after_s": float("inf")}, WireFault.NON_FINITE),
    ({"applied": {"x": float("inf")}}, WireFault.NON_FINITE),
    ({"applied": {"x": object()}}, WireFault.NOT_JSON),
    ({"applied": _circular()}, WireFault.NOT_JSON),
    ({"egress_events": ({"nested": {"a": 1}},)}, WireFault.NOT_FLAT),
    ({"duration_ms": -1}, WireFault.OUT_OF_RANGE),
    ({"outcome": "exploded"}, WireFault.UNKNOWN_OUTCOME),
    ({"error_class": "catastrophic"}, WireFault.UNKNOWN_ERROR_CLASS),
])
def test_a_result_its_reader_would_refuse_is_never_written(changes, fault):
    with pytest.raises(WireError) as e:
        encode_result(result(**changes))
    assert e.value.reason is fault


# -- every refusal of the reader -------------------------------------------------------------------


def test_the_layer_has_one_exception_hierarchy():
    assert issubclass(WireError, WorkerError)


def test_too_large_before_anything_is_parsed():
    cap = max_wire_bytes(LIMITS)
    assert cap == 4 * ((4096 + 2) // 3) + 4 * ((1024 + 2) // 3) + MAX_METADATA_BYTES
    assert refused(b"{" + b" " * cap) is WireFault.TOO_LARGE
    assert refused(b"x" * (cap + 1)) is WireFault.TOO_LARGE  # not JSON either: size is judged first


@pytest.mark.parametrize("data", [
    b"", b"not json", b"\xff\xfe{}", "{\"message\":\"é\"}".encode(), b"[" * 100_000 + b"]" * 100_000,
    encode_result(result()) + b" trailing", encode_result(result())[:-1],
])
def test_not_json(data):
    assert refused(data) is WireFault.NOT_JSON


def test_a_key_twice_is_not_json():
    data = encode_result(result())
    assert refused(data[:-1] + b',"warm":false}') is WireFault.NOT_JSON


@pytest.mark.parametrize("token", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e999"])
def test_a_non_finite_number(token):
    data = encode_result(result(outcome=Outcome.TOOL_ERROR, retry_after_s=1.5))
    assert refused(data.replace(b'"retry_after_s":1.5', b'"retry_after_s":' + token)) is WireFault.NON_FINITE


@pytest.mark.parametrize("data", [
    b"[]", b"1", b'"ok"', b"null",
    canonical(doc(format="ringfence/work-envelope")), canonical(doc(version=2)), canonical(doc(version=True)),
    canonical({k: v for k, v in doc().items() if k != "format"}),
])
def test_wrong_format(data):
    assert refused(data) is WireFault.WRONG_FORMAT


@pytest.mark.parametrize("data", [
    canonical(doc(admin=True)), canonical({k: v for k, v in doc().items() if k != "stdout"}),
    canonical({k: v for k, v in doc().items() if k != "egress_events"}),
    # A worker does not say which worker it is in its result: the control plane knows.
    canonical(doc(worker="worker-other")),
])
def test_unknown_or_missing_keys(data):
    assert refused(data) is WireFault.FIELDS


@pytest.mark.parametrize("changes", [
    {"exit_code": "0"}, {"exit_code": 0.0}, {"exit_code": True}, {"stdout": None}, {"stdout_truncated": 0},
    {"duration_ms": 1.5}, {"duration_ms": None}, {"image_id": 1}, {"error_class": 3}, {"retry_after_s": "1"},
    {"retry_after_s": False}, {"applied": []}, {"egress_events": {}}, {"warm": "yes"}, {"outcome": None},
    {"message": ["a"]}, {"setup_ms": True},
])
def test_a_field_of_another_type(changes):
    assert refused(canonical(doc(**changes))) is WireFault.WRONG_TYPE


@pytest.mark.parametrize("changes", [
    {"duration_ms": -1}, {"setup_ms": -5}, {"retry_after_s": -0.5}, {"exit_code": 2**63}, {"exit_code": -(2**63) - 1},
])
def test_out_of_range(changes):
    assert refused(canonical(doc(**changes))) is WireFault.OUT_OF_RANGE


@pytest.mark.parametrize("outcome", ["OK", "success", "", "ok "])
def test_an_unknown_outcome(outcome):
    assert refused(canonical(doc(outcome=outcome))) is WireFault.UNKNOWN_OUTCOME


@pytest.mark.parametrize("error_class", ["INVALID", "retryable", ""])
def test_an_unknown_error_class(error_class):
    assert refused(canonical(doc(outcome="tool_error", error_class=error_class))) is WireFault.UNKNOWN_ERROR_CLASS


@pytest.mark.parametrize("text", [
    "not base64!", "YWJj\n", "YWJ", "YW=j", base64.urlsafe_b64encode(b"\xfb\xff").decode(),
    "YR==",  # "a" is "YQ==": padding bits set, another spelling of the same byte
])
def test_bad_base64(text):
    assert refused(canonical(doc(stdout=text))) is WireFault.BAD_BASE64
    assert refused(canonical(doc(stderr=text))) is WireFault.BAD_BASE64


def test_output_over_the_calls_limit():
    at_limit = result(stdout=b"o" * 4096, stderr=b"e" * 1024)
    assert decode_result(encode_result(at_limit), limits=LIMITS) == at_limit
    assert refused(encode_result(result(stdout=b"o" * 4097))) is WireFault.OUTPUT_OVER_LIMIT
    assert refused(encode_result(result(stderr=b"e" * 1025))) is WireFault.OUTPUT_OVER_LIMIT
    # Judged against the call's own profile: what one call may write, another may not.
    assert decode_result(encode_result(result(stdout=b"o" * 4097)), limits=SandboxSpec()).stdout == b"o" * 4097


def test_too_many_egress_events():
    # The proxy keeps at most this many per call: more can only be made up.
    assert ProxyConfig.__dataclass_fields__["max_events_per_call"].default == MAX_EGRESS_EVENTS
    most = result(egress_events=(EVENT,) * MAX_EGRESS_EVENTS)
    assert len(decode_result(encode_result(most), limits=LIMITS).egress_events) == MAX_EGRESS_EVENTS
    assert refused(canonical(doc(egress_events=[EVENT] * (MAX_EGRESS_EVENTS + 1)))) is WireFault.TOO_MANY_EVENTS


@pytest.mark.parametrize("event", [{"a": {"b": 1}}, {"a": [{"b": 1}]}, {"a": [[1]]}, "not an object", [1], None])
def test_an_egress_event_that_is_not_flat(event):
    assert refused(canonical(doc(egress_events=[EVENT, event]))) is WireFault.NOT_FLAT


@pytest.mark.parametrize("variant", ["whitespace", "key order", "escaped ascii", "non-ascii escaped differently"])
def test_not_canonical(variant):
    data = encode_result(result(message="A"))
    d = json.loads(data)
    if variant == "whitespace":
        bad = json.dumps(d, sort_keys=True).encode()
    elif variant == "key order":
        bad = json.dumps(dict(reversed(d.items())), separators=(",", ":")).encode()
    elif variant == "escaped ascii":
        bad = data.replace(b'"message":"A"', b'"message":"\\u0041"')
    else:
        bad = encode_result(result(message="é")).replace(b"\\u00e9", b"\\u00E9")
    assert bad != data
    assert refused(bad) is WireFault.NOT_CANONICAL


def test_the_refusal_order_is_the_documented_one():
    # The docstring's steps are WireFault's members, in order.
    doc_steps = [m.group(1) for m in re.finditer(r"^\d+\. (\w+)", wire_mod.__doc__ or "", re.MULTILINE)]
    assert doc_steps == [f.value for f in WireFault]
    # A document wrong in several ways is refused for its first fault.
    cap = max_wire_bytes(LIMITS)
    assert refused(b"NaN" + b" " * cap) is WireFault.TOO_LARGE
    assert refused(canonical({**doc(admin=True), "version": 9})) is WireFault.WRONG_FORMAT
    assert refused(canonical({**doc(admin=True), "warm": "x"})) is WireFault.FIELDS
    assert refused(canonical(doc(warm="x", duration_ms=-1))) is WireFault.WRONG_TYPE
    assert refused(canonical(doc(duration_ms=-1, outcome="exploded"))) is WireFault.OUT_OF_RANGE
    assert refused(canonical(doc(outcome="exploded", error_class="nope"))) is WireFault.UNKNOWN_OUTCOME
    assert refused(canonical(doc(error_class="nope", stdout="!!"))) is WireFault.UNKNOWN_ERROR_CLASS
    over = base64.b64encode(b"o" * 5000).decode()
    assert refused(canonical(doc(stdout="!!", stderr=over))) is WireFault.BAD_BASE64
    assert refused(canonical(doc(stdout=over, egress_events=[EVENT] * 1001))) is WireFault.OUTPUT_OVER_LIMIT
    assert refused(canonical(doc(egress_events=[{"a": {}}] * 1001))) is WireFault.TOO_MANY_EVENTS
    assert refused(json.dumps(doc(egress_events=[{"a": {}}])).encode()) is WireFault.NOT_FLAT


def test_a_non_bytes_argument_is_a_programming_error():
    with pytest.raises(TypeError):
        decode_result("text", limits=LIMITS)  # type: ignore[arg-type]
