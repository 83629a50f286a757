"""The edge's own guarantees through a real server: error mapping, size and concurrency bounds,
malformed bytes, trace context. A stub core makes calls block or raise on demand."""

from __future__ import annotations

import threading

import grpc
import pytest
from api_support import TOKENS, StubOrchestrator, make_config
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ringfence import Client
from ringfence.errors import FieldViolation, Internal, InvalidArgument, NotFound, ResourceExhausted, Unavailable
from ringfence.model import Role
from ringfence.v1 import runs_pb2, types_pb2
from ringfence_server.control.api.background import BackgroundServer

AGENT = TOKENS[("acme", Role.AGENT)]
OTHER = TOKENS[("globex", Role.AGENT)]
CALL = {"call_id": "c1", "tool": "echo", "arguments": {"text": "hi"}}


@pytest.fixture
def stub():
    return StubOrchestrator()


def serve(stub, tmp_path, limits=None, **kwargs):
    return BackgroundServer(stub, make_config(tmp_path, limits), **kwargs)


def wait_until(predicate, what: str, attempts: int = 400) -> None:
    """Wait for a condition (not a timing assertion: it only bounds a hang)."""
    done = threading.Event()
    for _ in range(attempts):
        if predicate():
            return
        done.wait(0.025)
    raise AssertionError(f"never happened: {what}")


def field_violations(error: grpc.RpcError):
    """The google.rpc.BadRequest field violations a client finds in a failed call."""
    assert isinstance(error, grpc.Call), error  # a failed call raises the call itself: its trailers
    status = rpc_status.from_call(error)
    assert status is not None, "no google.rpc.Status in the trailers"
    found = []
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            found.extend(bad.field_violations)
    return found


def test_an_unexpected_core_exception_is_internal_with_an_incident_never_retryable(stub, tmp_path):
    """A bug looks like a bug: INTERNAL (a client must not retry a deterministic failure, which
    UNAVAILABLE would invite), with an incident id in the message, counted."""
    stub.raise_in["get_run"] = RuntimeError("a bug with a secret in it: hunter2")
    stub.raise_in["watch_run"] = ZeroDivisionError()
    with serve(stub, tmp_path) as s, Client(s.address, AGENT) as c:
        with pytest.raises(Internal) as e:
            c.get_run("r1")
        assert "hunter2" not in str(e.value) and "incident" in str(e.value)
        assert not isinstance(e.value, Unavailable)
        with pytest.raises(Internal):
            list(c.watch_run("r1"))
        assert s.server.edge.unexpected_errors == 2


def test_core_errors_keep_their_meaning(stub, tmp_path):
    stub.raise_in["submit_batch"] = InvalidArgument(
        "bad", [FieldViolation("calls[0].arguments.amount", "must be > 0")]
    )
    with serve(stub, tmp_path) as s, Client(s.address, AGENT) as c:
        with pytest.raises(NotFound):
            c.get_run("nope")
        with pytest.raises(InvalidArgument) as e:
            c.submit_batch("r1", [CALL])
        assert e.value.violations == (FieldViolation("calls[0].arguments.amount", "must be > 0"),)
        assert s.server.edge.unexpected_errors == 0


def test_malformed_request_bytes_are_invalid_argument(stub, tmp_path):
    with serve(stub, tmp_path) as s, grpc.insecure_channel(s.address) as ch:
        raw = ch.unary_unary("/ringfence.v1.RunService/SubmitBatch")  # bytes in, bytes out
        for garbage in (b"\xff\xff\xff", b"\x0a\x05ab", b"\x12\x02\xff\xfe"):
            with pytest.raises(grpc.RpcError) as e:
                raw(garbage, metadata=(("authorization", f"Bearer {AGENT}"),), timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, garbage
        assert stub.calls == []
        assert s.server.edge.unexpected_errors == 0


def test_a_request_over_the_message_limit_is_resource_exhausted(stub, tmp_path):
    limits = {"max_message_bytes": 64 * 1024, "max_argument_bytes": 16 * 1024}
    with serve(stub, tmp_path, limits) as s, Client(s.address, AGENT) as c:
        huge = {"call_id": "c1", "tool": "echo", "arguments": {"text": "x" * 100_000}}
        with pytest.raises(ResourceExhausted):
            c.submit_batch("r1", [huge])
        big = {"call_id": "c1", "tool": "echo", "arguments": {"text": "x" * 20_000}}
        with pytest.raises(InvalidArgument) as e:
            c.submit_batch("r1", [big])
        assert [v.field for v in e.value.violations] == ["calls[0].arguments_json"]
        assert "16384-byte limit" in e.value.violations[0].description
        assert stub.calls == [], "an oversize request reached the core"
        assert c.submit_batch("r1", [CALL])[0].executed


def test_per_tenant_concurrency_is_resource_exhausted(stub, tmp_path):
    stub.gate = threading.Event()
    with serve(stub, tmp_path, {"max_concurrent_batches": 2}) as s, Client(
        s.address, AGENT
    ) as acme, Client(s.address, OTHER) as globex:
        request = runs_pb2.SubmitBatchRequest(
            run_id="r1", calls=[types_pb2.ProposedCall(call_id="c1", tool="echo", arguments_json="{}")]
        )
        md = acme.metadata()
        held = [acme.stubs.runs.SubmitBatch.future(request, metadata=md, timeout=60) for _ in range(2)]
        for _ in held:
            assert stub.entered.acquire(timeout=30)
        with pytest.raises(ResourceExhausted) as e:
            acme.submit_batch("r1", [CALL])
        assert "limit 2" in str(e.value)
        assert len([c for c in stub.calls if c[0] == "submit_batch"]) == 2  # the third never ran
        # Another tenant is not affected by acme's load.
        other = globex.stubs.runs.SubmitBatch.future(request, metadata=globex.metadata(), timeout=60)
        assert stub.entered.acquire(timeout=30)
        stub.gate.set()
        for f in (*held, other):
            assert f.result().observations[0].executed
        assert acme.submit_batch("r1", [CALL])[0].executed


def test_a_cancelled_call_keeps_its_slot_until_the_work_ends(stub, tmp_path):
    stub.gate = threading.Event()
    with serve(stub, tmp_path, {"max_concurrent_batches": 1}) as s, Client(s.address, AGENT) as c:
        request = runs_pb2.SubmitBatchRequest(
            run_id="r1", calls=[types_pb2.ProposedCall(call_id="c1", tool="echo", arguments_json="{}")]
        )
        first = c.stubs.runs.SubmitBatch.future(request, metadata=c.metadata(), timeout=60)
        assert stub.entered.acquire(timeout=30)
        first.cancel()
        # The batch is still running in the core: cancelling must not free its slot.
        with pytest.raises(ResourceExhausted):
            c.submit_batch("r1", [CALL])
        stub.gate.set()
        wait_until(lambda: s.server.edge.batches.in_flight("acme") == 0, "the slot is released")
        assert c.submit_batch("r1", [CALL])[0].executed


def test_watch_streams_are_bounded_per_tenant(stub, tmp_path):
    from ringfence_server.control.api.servicer import EdgeOptions

    config = make_config(tmp_path)
    options = EdgeOptions.from_config(config, max_watch_streams=2)
    with BackgroundServer(stub, config, options=options) as s, Client(s.address, AGENT) as c:
        streams = [c.watch_run("r1") for _ in range(2)]
        iterators = [iter(st) for st in streams]
        for it in iterators:
            assert next(it).type == "run_started"  # both are open and being served
        with pytest.raises(ResourceExhausted):
            next(iter(c.watch_run("r1")))
        with Client(s.address, OTHER) as globex:  # another tenant has its own budget
            other = globex.watch_run("r1")
            assert next(iter(other)).type == "run_started"
            other.cancel()
        streams[0].cancel()
        wait_until(lambda: s.server.edge.watches.in_flight("acme") == 1, "the cancelled watch is released")
        third = c.watch_run("r1")
        assert next(iter(third)).type == "run_started"
        for st in (streams[1], third):
            st.cancel()


def test_the_callers_trace_context_continues_on_the_server(stub, tmp_path):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen_in_core = []
    original = stub.get_run

    def get_run(p, run_id):
        seen_in_core.append(trace.get_current_span().get_span_context())
        return original(p, run_id)

    stub.get_run = get_run
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    traceparent = f"00-{trace_id}-{parent_id}-01"
    with serve(stub, tmp_path, tracer_provider=provider) as s:
        with Client(s.address, AGENT, metadata=(("traceparent", traceparent),)) as c:
            c.start_run("g", "r1")
            c.get_run("r1")
        with Client(s.address, AGENT) as c:
            c.get_run("r1")
    spans = [sp for sp in exporter.get_finished_spans() if sp.name == "ringfence.v1.RunService/GetRun"]
    assert len(spans) == 2
    continued, fresh = spans
    assert continued.kind == trace.SpanKind.SERVER
    assert continued.context.trace_id == int(trace_id, 16)
    assert continued.parent is not None and continued.parent.span_id == int(parent_id, 16)
    assert continued.parent.is_remote
    assert fresh.parent is None and fresh.context.trace_id != int(trace_id, 16)
    assert continued.attributes["ringfence.tenant"] == "acme"
    # The core's work, on a worker thread, runs inside the server span.
    assert seen_in_core[0].span_id == continued.context.span_id


def test_bad_request_details_are_google_rpc_field_violations(stub, tmp_path):
    with serve(stub, tmp_path) as s, Client(s.address, AGENT) as c:
        request = runs_pb2.SubmitBatchRequest(
            run_id="",
            calls=[
                types_pb2.ProposedCall(call_id="c1", tool="", arguments_json='{"a": 1, "a": 2}'),
                types_pb2.ProposedCall(call_id="c1", tool="echo", arguments_json="not json"),
            ],
        )
        with pytest.raises(grpc.RpcError) as e:
            c.stubs.runs.SubmitBatch(request, metadata=c.metadata(), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        fields = {(v.field, v.description.split(":")[0]) for v in field_violations(e.value)}
        assert fields == {
            ("run_id", "is required"),
            ("calls[0].tool", "is required"),
            ("calls[0].arguments_json", "invalid JSON"),
            ("calls[1].call_id", "duplicate call id 'c1' in the batch"),
            ("calls[1].arguments_json", "invalid JSON"),
        }
        assert stub.calls == []


def test_unknown_enum_values_are_invalid_argument(stub, tmp_path):
    from ringfence.v1 import approvals_pb2

    approver = TOKENS[("acme", Role.APPROVER)]
    with serve(stub, tmp_path) as s, Client(s.address, approver) as c:
        for decision in (0, 3, 99):
            request = approvals_pb2.DecideApprovalRequest(approval_id="ap-1", decision=decision)
            with pytest.raises(grpc.RpcError) as e:
                c.stubs.approvals.DecideApproval(request, metadata=c.metadata(), timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert [v.field for v in field_violations(e.value)] == ["decision"]
        assert [name for name, _ in stub.calls] == []
