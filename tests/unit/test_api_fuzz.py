"""Fuzzed requests never produce INTERNAL or UNKNOWN, nor reach the catch-all.

Hypothesis builds requests for every RPC (random ids, texts with NUL and odd Unicode, JSON
that is valid, invalid, duplicated or not an object, out-of-range enums and limits) and also
throws raw bytes at every method. The server is the real one over the real Orchestrator with
a FakeBackend. A status code outside the expected set fails the test, and so does any
exception that fell through to the server's catch-all (`edge.unexpected_errors`), which
answers INTERNAL with an incident id; the fuzz asserts it is never reached.
"""

from __future__ import annotations

import json

import grpc
import pytest
from api_support import TOKENS, RealCore, fake_backend, make_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringfence.model import Role
from ringfence.v1 import approvals_pb2, identity_pb2, runs_pb2, tools_pb2, types_pb2
from ringfence_server.control.api.background import BackgroundServer

EXPECTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
LIVE_RUN = "fuzz-live"
TOOLS = ["echo", "credit", "read_file", "write_note", "sleep", "fail"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    config = make_config(tmp_path_factory.mktemp("fuzz"), limits={"max_message_bytes": 256 * 1024})
    with RealCore(config, fake_backend()) as core, BackgroundServer(core.orchestrator, config) as server, \
            grpc.insecure_channel(server.address) as channel:
        agent = (("authorization", f"Bearer {TOKENS[('acme', Role.AGENT)]}"),)
        approver = (("authorization", f"Bearer {TOKENS[('acme', Role.APPROVER)]}"),)
        start = channel.unary_unary(
            "/ringfence.v1.RunService/StartRun",
            request_serializer=runs_pb2.StartRunRequest.SerializeToString,
            response_deserializer=types_pb2.Run.FromString,
        )
        start(runs_pb2.StartRunRequest(goal="fuzz target", run_id=LIVE_RUN), metadata=agent, timeout=10)
        yield server, channel, agent, approver
        assert server.server.edge.unexpected_errors == 0


# --- strategies -------------------------------------------------------------------------------

# Protobuf strings are UTF-8: lone surrogates cannot even be put into a message.
text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)
ids = st.one_of(
    st.just(""),
    st.just(LIVE_RUN),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,20}", fullmatch=True),
    st.text(st.characters(blacklist_categories=["Cs"]), min_size=95, max_size=130),
    text,
)
# JSON text may escape lone surrogates ("\ud800"); json.dumps writes them that way.
json_strings = text | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | json_strings,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
arguments_json = st.one_of(
    st.dictionaries(st.sampled_from(["text", "account", "amount", "path", "seconds", "name", "class"]), json_values)
    .map(json.dumps),
    st.dictionaries(json_strings, json_values, max_size=5).map(json.dumps),
    json_values.map(json.dumps),
    text,
    st.sampled_from(['{"a":1,"a":2}', '{"x": NaN}', '{"x": 1e999}', "[" * 3000, "{}", "", "null",
                     '{"text": "\\ud800"}', '{"\\udfff": 1}', '{"text": "\\ud83d\\ude00"}',
                     '{"text": ' + "[" * 31 + "]" * 31 + "}", '{"text": ' + "[" * 700 + "]" * 700 + "}"]),
)
tools = st.one_of(st.sampled_from(TOOLS), text)
calls = st.builds(types_pb2.ProposedCall, call_id=ids, tool=tools, arguments_json=arguments_json)
steps = st.builds(types_pb2.PlanStep, key=ids, tool=tools, arguments_json=arguments_json)
uint32 = st.one_of(st.integers(0, 20), st.integers(0, 2**32 - 1))

UNARY = {
    "/ringfence.v1.ToolService/ListTools": (st.builds(tools_pb2.ListToolsRequest, query=text),
                                            tools_pb2.ListToolsResponse),
    "/ringfence.v1.RunService/StartRun": (st.builds(runs_pb2.StartRunRequest, goal=text, run_id=ids), types_pb2.Run),
    "/ringfence.v1.RunService/GetRun": (st.builds(runs_pb2.GetRunRequest, run_id=ids), types_pb2.Run),
    "/ringfence.v1.RunService/ListRuns": (st.just(runs_pb2.ListRunsRequest()), runs_pb2.ListRunsResponse),
    "/ringfence.v1.RunService/CancelRun": (st.builds(runs_pb2.CancelRunRequest, run_id=ids), types_pb2.Run),
    "/ringfence.v1.RunService/SubmitBatch": (
        st.builds(runs_pb2.SubmitBatchRequest, run_id=ids, calls=st.lists(calls, max_size=5)),
        runs_pb2.SubmitBatchResponse,
    ),
    "/ringfence.v1.RunService/WithdrawApproval": (
        st.builds(runs_pb2.WithdrawApprovalRequest, run_id=ids, approval_id=ids, reason=text),
        types_pb2.Observation,
    ),
    "/ringfence.v1.ApprovalService/ListApprovals": (
        st.builds(approvals_pb2.ListApprovalsRequest, run_id=ids),
        approvals_pb2.ListApprovalsResponse,
    ),
    "/ringfence.v1.ApprovalService/GetApproval": (
        st.builds(approvals_pb2.GetApprovalRequest, approval_id=ids),
        types_pb2.Approval,
    ),
    "/ringfence.v1.IdentityService/WhoAmI": (st.just(identity_pb2.WhoAmIRequest()), identity_pb2.Identity),
    "/ringfence.v1.ApprovalService/DecideApproval": (
        st.builds(
            approvals_pb2.DecideApprovalRequest,
            approval_id=ids,
            decision=st.integers(-(2**31), 2**31 - 1),
            reason=st.text(st.characters(blacklist_categories=["Cs"]), max_size=1100),
        ),
        types_pb2.Approval,
    ),
}


def metadata_for(path, env):
    _, _, agent, approver = env
    return approver if "ApprovalService" in path else agent


def code_of_unary(channel, path, request, response_class, metadata):
    call = channel.unary_unary(
        path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=response_class.FromString
    )
    try:
        call(request, metadata=metadata, timeout=20)
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def code_of_raw(channel, path, metadata, data=b""):
    try:
        channel.unary_unary(path)(data, metadata=metadata, timeout=20)
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def code_of_stream(channel, path, request_bytes, metadata):
    call = channel.unary_stream(path)(request_bytes, metadata=metadata, timeout=20)
    try:
        for _ in call:
            pass
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize("path", sorted(UNARY))
def test_fuzzed_unary_requests_get_a_defined_answer(env, path):
    server, channel, *_ = env
    strategy, response_class = UNARY[path]

    @SETTINGS
    @given(request=strategy)
    def check(request):
        code, details = code_of_unary(channel, path, request, response_class, metadata_for(path, env))
        assert code in EXPECTED, (code, details, request)
        assert server.server.edge.unexpected_errors == 0

    check()


def test_fuzzed_plans_get_a_defined_answer(env):
    server, channel, agent, _ = env

    @SETTINGS
    @given(run_id=ids, plan=st.lists(steps, max_size=12), max_steps=uint32)
    def check(run_id, plan, max_steps):
        request = runs_pb2.ExecutePlanRequest(run_id=run_id, steps=plan, max_steps=max_steps)
        code, details = code_of_stream(channel, "/ringfence.v1.RunService/ExecutePlan", request.SerializeToString(),
                                       agent)
        assert code in EXPECTED, (code, details, request)

    check()
    assert server.server.edge.unexpected_errors == 0


def test_fuzzed_watches_get_a_defined_answer(env):
    server, channel, agent, _ = env
    finish = channel.unary_unary(
        "/ringfence.v1.RunService/FinishRun",
        request_serializer=runs_pb2.FinishRunRequest.SerializeToString,
        response_deserializer=types_pb2.Run.FromString,
    )

    @SETTINGS
    @given(run_id=ids, from_seq=st.integers(0, 2**64 - 1))
    def check(run_id, from_seq):
        # A watch of a live run follows it until it finishes; finish it (if it exists) so the
        # watch replays the log and ends.
        try:
            finish(runs_pb2.FinishRunRequest(run_id=run_id), metadata=agent, timeout=20)
        except grpc.RpcError as e:
            assert e.code() in EXPECTED, (e.code(), e.details())
        request = runs_pb2.WatchRunRequest(run_id=run_id, from_seq=from_seq)
        code, details = code_of_stream(channel, "/ringfence.v1.RunService/WatchRun", request.SerializeToString(), agent)
        assert code in EXPECTED, (code, details, request)

    check()
    assert server.server.edge.unexpected_errors == 0


@SETTINGS
@given(path=st.sampled_from([*sorted(UNARY), "/ringfence.v1.RunService/ExecutePlan",
                             "/ringfence.v1.RunService/WatchRun"]),
       data=st.binary(max_size=300))
def test_raw_bytes_never_produce_internal_or_unknown(env, path, data):
    server, channel, *_ = env
    metadata = metadata_for(path, env)
    if path.endswith(("ExecutePlan", "WatchRun")):
        code, details = code_of_stream(channel, path, data, metadata)
        allowed = EXPECTED | ({grpc.StatusCode.DEADLINE_EXCEEDED} if path.endswith("WatchRun") else set())
    else:
        code, details = code_of_raw(channel, path, metadata, data)
        allowed = EXPECTED
    assert code in allowed, (code, details, data)
    assert server.server.edge.unexpected_errors == 0


@SETTINGS
@given(
    path=st.sampled_from(sorted(UNARY)),
    value=st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=200),
)
def test_fuzzed_authorization_headers_are_unauthenticated(env, path, value):
    _server, channel, *_ = env
    code, details = code_of_raw(channel, path, (("authorization", value),))
    assert code == grpc.StatusCode.UNAUTHENTICATED, (code, details, value)
