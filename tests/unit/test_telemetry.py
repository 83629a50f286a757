"""ringfence_server.control.telemetry: the tracer provider `ringfence serve` configures, and the export guard."""

from __future__ import annotations

import json

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ringfence_server.control.telemetry import (
    GuardedExporter,
    configure_tracing,
    is_raw_content_name,
    otlp_insecure,
    shutdown_tracing,
    unsafe_attributes,
)

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"


def test_nothing_configured_is_none_and_changes_nothing():
    before = trace.get_tracer_provider()
    assert configure_tracing(None, False) is None
    assert configure_tracing("", False) is None
    assert trace.get_tracer_provider() is before
    shutdown_tracing(None)  # a no-op


def test_console_spans_reach_stdout_one_json_line_each(capsys):
    provider = configure_tracing(None, True, set_global=False)
    assert provider is not None and trace.get_tracer_provider() is not provider
    with provider.get_tracer("t").start_as_current_span("outer"), \
            provider.get_tracer("t").start_as_current_span("inner", attributes={"ringfence.run_id": "r1"}):
        pass
    shutdown_tracing(provider)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [s["name"] for s in lines] == ["inner", "outer"]
    assert lines[0]["attributes"] == {"ringfence.run_id": "r1"}
    assert lines[0]["parent_id"] == lines[1]["context"]["span_id"]
    assert lines[0]["resource"]["attributes"]["service.name"] == "ringfence"
    assert lines[0]["resource"]["attributes"]["service.version"]


def test_raw_content_names_are_recognised_and_measures_of_them_are_not():
    for name in ("gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "gen_ai.input.messages",
                 "ringfence.tool_output", "ringfence.content", "ringfence.stdout", "http.request.body"):
        assert is_raw_content_name(name), name
    for name in ("gen_ai.tool.name", "gen_ai.tool.call.id", "gen_ai.operation.name", "ringfence.run_id",
                 "ringfence.arguments.sha256", "ringfence.output_bytes", "ringfence.content.size",
                 "rpc.grpc.status_code", "error.type", "ringfence.calls", "enduser.id", "exception.message"):
        assert not is_raw_content_name(name), name


def test_the_guard_drops_raw_content_redacts_secrets_and_withholds_free_text_status():
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(GuardedExporter(memory)))
    raw = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(raw))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("execute_tool", attributes={
            "gen_ai.tool.name": "echo", "gen_ai.tool.call.arguments": '{"text": "hello"}',
            "ringfence.note": f"key {AWS_KEY}", "ringfence.arguments.sha256": "ab" * 32}) as span:
        span.add_event("looked", {"ringfence.output": "tool said hello", "n": 1})
        span.set_status(trace.Status(trace.StatusCode.ERROR, "the tool said: hello"))
    with tracer.start_as_current_span("rpc") as span:
        span.set_status(trace.Status(trace.StatusCode.ERROR, "NOT_FOUND"))
    with tracer.start_as_current_span("failed", attributes={"error.type": "transient"}) as span:
        span.set_status(trace.Status(trace.StatusCode.ERROR, "transient"))
    [before, _, _] = raw.get_finished_spans()
    assert sorted(unsafe_attributes(before)) == ["gen_ai.tool.call.arguments", "looked:ringfence.output",
                                                 "ringfence.note"]
    tool, rpc, failed = memory.get_finished_spans()
    assert unsafe_attributes(tool) == []
    assert dict(tool.attributes) == {"gen_ai.tool.name": "echo", "ringfence.note": "key [REDACTED:aws_access_key]",
                                     "ringfence.arguments.sha256": "ab" * 32}
    assert dict(tool.events[0].attributes) == {"n": 1}
    assert tool.status.status_code is trace.StatusCode.ERROR and not tool.status.description
    assert rpc.status.description == "NOT_FOUND" and failed.status.description == "transient"
    assert tool.context == before.context and tool.parent == before.parent
    assert "hello" not in json.dumps([json.loads(tool.to_json()), json.loads(rpc.to_json())])


def test_which_collector_addresses_go_in_plaintext():
    assert otlp_insecure("127.0.0.1:4317") and otlp_insecure("localhost:4317") and otlp_insecure("[::1]:4317")
    assert otlp_insecure("http://collector:4317")
    assert not otlp_insecure("collector.example.com:4317") and not otlp_insecure("https://127.0.0.1:4317")


def test_serve_records_even_without_an_exporter():
    # `ringfence serve` always records (record=True), so a run's trace id is real and reaches its
    # log and its JSON log lines whether or not anything is exported.
    from ringfence_server.control.telemetry import configure_tracing

    provider = configure_tracing(None, False, record=True, set_global=False)
    assert provider is not None
    span = provider.get_tracer("t").start_span("x")
    assert span.get_span_context().is_valid and span.is_recording()
    span.end()
    provider.shutdown()
