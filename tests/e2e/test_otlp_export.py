"""`ringfence serve --otlp-endpoint` to a real OTLP/gRPC receiver: the spans of a run arrive
with the right parents, the caller's trace context is continued, and no secret travels.

The receiver is the OTLP TraceService (opentelemetry-proto's servicer) on a port of the test;
the server is the real process with the official exporter, running real containers; its spans
are flushed when it stops on SIGTERM. The run sends a secret no scanner recognises through a
call that executes (so it is in the arguments and in the tool's output), an AWS key the
guardrail blocks, a tool's error message, and a read of /etc/passwd the resource policy denies;
none of them may appear in any exported byte or any line of the server's JSON log.
"""

from __future__ import annotations

import json
import threading
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace import TracerProvider
from serve_support import Served

from ringfence import Client
from ringfence.model import ObservationStatus

pytestmark = pytest.mark.docker

ARG_SECRET = "correct-horse-battery-staple"  # executes: in the arguments and the echoed output
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"  # blocked by the guardrail
ERROR_SECRET = "leaky-message-quux"  # the tool's own error message
SECRETS = (ARG_SECRET, AWS_KEY, ERROR_SECRET, "/etc/passwd")


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace collector that keeps what it is sent."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def Export(self, request, context):
        with self._lock:
            self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[tuple[dict, trace_pb2.Span]]:
        """(resource attributes, span) for every span received."""
        out: list[tuple[dict, trace_pb2.Span]] = []
        for request in self.requests:
            for rs in request.resource_spans:
                resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                out.extend((resource, span) for ss in rs.scope_spans for span in ss.spans)
        return out


def attrs(span: trace_pb2.Span) -> dict:
    return {a.key: _value(a.value) for a in span.attributes}


def _value(value: common_pb2.AnyValue) -> object:
    """What an attribute's value holds (whichever field of its oneof is set), or None."""
    which = value.WhichOneof("value")
    return getattr(value, which) if which else None


def test_a_runs_spans_reach_a_real_collector_with_the_right_parents(pinned_images, tmp_path):
    receiver = Receiver()
    receiver.server.start()
    served = None
    stderr: list[str] = []
    try:
        endpoint = f"127.0.0.1:{receiver.port}"
        served = Served(None, tmp_path / "state", "--otlp-endpoint", endpoint, "--log-format", "json")
        drain = threading.Thread(target=lambda: stderr.extend(served.proc.stderr), daemon=True)
        drain.start()
        assert f"ringfence: exporting traces to {endpoint} (OTLP/gRPC)" in served.lines

        agent_tracer = TracerProvider().get_tracer("the-agent")  # the caller's own tracing
        with Client(served.address, "demo-agent-token", timeout=120) as client:
            run = client.start_run("traced", "otlp-run").run_id
            with agent_tracer.start_as_current_span("agent-turn") as turn:
                caller = turn.get_span_context()
                observed = client.submit_batch(run, [
                    {"call_id": "c1", "tool": "echo", "arguments": {"text": ARG_SECRET}},
                    {"call_id": "c2", "tool": "echo", "arguments": {"text": "hello"}},
                    {"call_id": "c3", "tool": "read_file", "arguments": {"path": "/etc/passwd"}},
                    {"call_id": "c4", "tool": "echo", "arguments": {"text": f"key {AWS_KEY}"}},
                    {"call_id": "c5", "tool": "fail", "arguments": {"class": "fatal", "message": ERROR_SECRET}},
                ])
                client.finish_run(run)
        assert [o.status for o in observed] == [ObservationStatus.EXECUTED, ObservationStatus.EXECUTED,
                                                ObservationStatus.DENIED, ObservationStatus.BLOCKED,
                                                ObservationStatus.EXECUTED]
        assert observed[0].content == {"text": ARG_SECRET}  # the secret did go through the tool
        assert observed[4].error_class == "fatal" and ERROR_SECRET in observed[4].error  # and came back
        assert served.stop() == 0
        drain.join(30)
    finally:
        if served is not None:
            served.stop()
        receiver.server.stop(None)

    received = receiver.spans()
    assert received, "the collector received nothing"
    assert {resource.get("service.name") for resource, _ in received} == {"ringfence"}
    spans = [span for _, span in received]

    # One root per run; batches hang from it, tools from a span of the same trace.
    roots = [s for s in spans if s.name == "invoke_agent" and attrs(s).get("ringfence.run_id") == run]
    assert len(roots) == 1, [s.name for s in spans]
    [root] = roots
    assert root.parent_span_id == b""
    in_trace = [s for s in spans if s.trace_id == root.trace_id]
    ids = {s.span_id for s in in_trace}
    batches = [s for s in in_trace if s.name == "batch"]
    assert batches and all(b.parent_span_id == root.span_id for b in batches)
    assert not [s for s in spans if s.name == "batch" and s.trace_id != root.trace_id
                and attrs(s).get("ringfence.run_id") == run]
    tools = [s for s in spans if s.name == "execute_tool" and attrs(s).get("ringfence.run_id") == run]
    assert sorted((attrs(t)["gen_ai.tool.call.id"], attrs(t)["gen_ai.tool.name"]) for t in tools) == [
        ("c1", "echo"), ("c2", "echo"), ("c5", "fail")]
    for t in tools:
        assert t.trace_id == root.trace_id and t.parent_span_id in ids and t.parent_span_id != b""
    [failed] = [t for t in tools if attrs(t)["gen_ai.tool.call.id"] == "c5"]
    assert failed.status.code == trace_pb2.Status.STATUS_CODE_ERROR

    # The RPCs: SERVER spans; those sent inside the caller's span continue its trace.
    rpcs = {s.name.rsplit("/", 1)[-1]: s for s in spans if s.kind == trace_pb2.Span.SPAN_KIND_SERVER}
    for name in ("SubmitBatch", "FinishRun"):
        assert rpcs[name].trace_id == caller.trace_id.to_bytes(16, "big"), name
        assert rpcs[name].parent_span_id == caller.span_id.to_bytes(8, "big"), name
    assert rpcs["StartRun"].trace_id != caller.trace_id.to_bytes(16, "big")

    # Nothing secret left the process: not in any exported byte, not in any log line.
    for request in receiver.requests:
        wire = request.SerializeToString()
        for secret in SECRETS:
            assert secret.encode() not in wire, secret
    log = "".join(stderr)
    for secret in SECRETS:
        assert secret not in log, secret
    lines = [json.loads(line) for line in log.splitlines()]
    events = [d for d in lines if "event" in d and d.get("run_id") == run]
    assert [d["seq"] for d in events] == list(range(1, len(events) + 1)) and events[-1]["event"] == "run_finished"
    assert {d["trace_id"] for d in events} == {root.trace_id.hex()}
    assert {d["call_id"] for d in events if d["event"] == "observation"} == {"c1", "c2", "c3", "c4", "c5"}
