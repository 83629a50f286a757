"""Who may call what, through a real server on a real port: tokens, roles, health, reflection.

These tests are about the edge, so a stub core records whether a call ever reached it; tenant
isolation (the core's check, seen through the API) is in test_api_server.py.
"""

from __future__ import annotations

import grpc
import pytest
from api_support import TOKENS, StubOrchestrator, make_config
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from ringfence.errors import PermissionDenied, Unauthenticated
from ringfence.model import Principal, Role
from ringfence_server.control.api.auth import METHOD_ROLES, Authenticator, TokenEntry
from ringfence_server.control.api.background import BackgroundServer
from ringfence_server.control.api.servicer import PROTO_MODULES, SERVICE_NAMES
from ringfence_server.control.config import token_digest

METHODS = [
    (f"/{service.full_name}/{m.name}", m)
    for module in PROTO_MODULES
    for service in module.DESCRIPTOR.services_by_name.values()
    for m in service.methods
]


@pytest.fixture
def stub():
    return StubOrchestrator()


@pytest.fixture
def server(stub, tmp_path):
    with BackgroundServer(stub, make_config(tmp_path)) as s:
        yield s


@pytest.fixture
def channel(server):
    with grpc.insecure_channel(server.address) as ch:
        yield ch


def invoke(channel, path, method, metadata=()):
    """Call `path` with an empty request; return the status code the client sees."""
    request = message_factory.GetMessageClass(method.input_type)()
    response = message_factory.GetMessageClass(method.output_type)
    kwargs = dict(request_serializer=type(request).SerializeToString, response_deserializer=response.FromString)
    try:
        if method.server_streaming:
            call = channel.unary_stream(path, **kwargs)(request, metadata=metadata, timeout=10)
            for _ in call:
                call.cancel()  # the stub's watches would wait; one item proves we got in
                break
        else:
            channel.unary_unary(path, **kwargs)(request, metadata=metadata, timeout=10)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def bearer(token: str):
    return (("authorization", f"Bearer {token}"),)


def test_health_reports_serving_without_a_token(channel):
    stub = health_pb2_grpc.HealthStub(channel)
    for name in ("", *SERVICE_NAMES):
        response = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
        assert response.status == health_pb2.HealthCheckResponse.SERVING, name
    with pytest.raises(grpc.RpcError) as e:
        stub.Check(health_pb2.HealthCheckRequest(service="ringfence.v1.NoSuchService"), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_ringfence_services_without_a_token(channel):
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    assert set(SERVICE_NAMES) <= services
    assert "grpc.health.v1.Health" in services
    # A generic client can learn the whole API: the file, its methods and message types.
    runs = db.FindFileContainingSymbol("ringfence.v1.RunService")
    service = next(s for s in runs.service if s.name == "RunService")
    assert {m.name for m in service.method} >= {"SubmitBatch", "ExecutePlan", "WatchRun", "StartRun"}
    assert db.FindFileContainingSymbol("ringfence.v1.Observation").name == "ringfence/v1/types.proto"


@pytest.mark.parametrize("path, method", METHODS, ids=[p for p, _ in METHODS])
def test_every_ringfence_method_needs_a_token(channel, stub, path, method):
    assert invoke(channel, path, method) == grpc.StatusCode.UNAUTHENTICATED
    assert invoke(channel, path, method, bearer("not-a-configured-token")) == grpc.StatusCode.UNAUTHENTICATED
    assert invoke(channel, path, method, (("authorization", "Basic YWNtZTpwdw=="),)) == grpc.StatusCode.UNAUTHENTICATED
    assert stub.calls == [], "an unauthenticated call reached the core"


@pytest.mark.parametrize("role", [Role.AGENT, Role.APPROVER])
def test_a_role_cannot_call_another_roles_methods(channel, stub, role):
    token = TOKENS[("acme", role)]
    denied = [(p, m) for p, m in METHODS if role not in METHOD_ROLES[p]]
    allowed = [(p, m) for p, m in METHODS if role in METHOD_ROLES[p]]
    assert denied and allowed
    for path, method in denied:
        assert invoke(channel, path, method, bearer(token)) == grpc.StatusCode.PERMISSION_DENIED, path
    assert stub.calls == [], "a call with the wrong role reached the core"
    # The same token does get through to the methods of its role (here they fail on the empty
    # request or succeed; what matters is that they are not refused for the role).
    for path, method in allowed:
        assert invoke(channel, path, method, bearer(token)) not in (
            grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.UNAUTHENTICATED,
        ), path


def test_agents_never_decide_approvals_and_approvers_never_act():
    assert Role.AGENT not in METHOD_ROLES["/ringfence.v1.ApprovalService/DecideApproval"]
    for name in ("SubmitBatch", "ExecutePlan", "StartRun"):
        assert Role.APPROVER not in METHOD_ROLES[f"/ringfence.v1.RunService/{name}"]


def test_authenticator_parses_bearer_tokens_strictly():
    a = Authenticator([TokenEntry(token_digest("s3cret"), Principal("acme", Role.AGENT, "bot"))])
    assert a.authenticate([("authorization", "Bearer s3cret")]) == Principal("acme", Role.AGENT, "bot")
    assert a.authenticate([("authorization", "bearer   s3cret ")]).tenant == "acme"
    for metadata in (
        [],
        [("authorization", "s3cret")],
        [("authorization", "Bearer ")],
        [("authorization", "Bearer S3CRET")],
        [("authorization", "Bearer s3cret"), ("authorization", "Bearer s3cret")],
        [("authorization", "Bearer " + "x" * 5000)],
    ):
        with pytest.raises(Unauthenticated):
            a.authenticate(metadata)
    with pytest.raises(PermissionDenied):
        a.authorize(Principal("acme", Role.AGENT, "bot"), "/ringfence.v1.ApprovalService/DecideApproval")
    with pytest.raises(PermissionDenied):  # a method nobody listed: closed
        a.authorize(Principal("acme", Role.ADMIN, "root"), "/ringfence.v1.RunService/DeleteEverything")


def test_tokens_are_held_as_digests_only(tmp_path):
    config = make_config(tmp_path)
    auth = Authenticator.from_tenants(config.tenants)
    held = repr(auth.__dict__)
    for token in TOKENS.values():
        assert token not in held
    assert auth.authenticate(bearer(TOKENS[("globex", Role.APPROVER)])) == Principal(
        "globex", Role.APPROVER, "globex-approver"
    )
