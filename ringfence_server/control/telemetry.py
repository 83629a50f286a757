"""Where the control plane's spans go: an OTLP/gRPC collector, the console, or nowhere.

The orchestration and the API create their spans through the global tracer provider
(`trace.get_tracer(...)`); until one is configured those spans are no-ops. `configure_tracing`
builds the SDK provider `ringfence serve --otlp-endpoint/--trace-console` installs, and
`shutdown_tracing` flushes it before the process exits (a span still in the batch queue at exit
is otherwise lost).

Spans carry identifiers, names, verdicts, sizes and digests, never a call's arguments or a
tool's output. Every exporter is wrapped in `GuardedExporter`, the last line of defence at the
process boundary: an attribute whose name says it holds raw content is dropped, secret-looking
strings (ringfence_server.control.guardrails) are redacted, and a span status description that is free text
rather than a code (a tool's error message can quote its arguments) is withheld.
`unsafe_attributes` is the same rule as a check, for tests.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Sequence
from typing import IO, Any

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Status

from ringfence_server.control import guardrails
from ringfence_server.control.netloc import is_loopback_host

log = logging.getLogger("ringfence.telemetry")

EXPORT_TIMEOUT_S = 5.0  # per OTLP export (retries included): bounds how long shutdown can wait

# Name components that announce raw content (the GenAI conventions' opt-in content attributes
# are gen_ai.tool.call.arguments, gen_ai.tool.call.result, gen_ai.input.messages, ...) ...
_RAW = frozenset({"argument", "arguments", "args", "content", "contents", "output", "outputs", "input",
                  "inputs", "result", "results", "stdout", "stderr", "prompt", "completion", "body",
                  "payload", "text", "goal"})
# ... unless the name ends in one that says it is a size or a digest of it.
_MEASURE = frozenset({"sha256", "digest", "hash", "bytes", "size", "length", "len", "count", "truncated"})
# A status description that is a code (a gRPC code name such as NOT_FOUND, or the span's own
# error.type) is kept; free text is not.
_CODE_LIKE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")


def is_raw_content_name(name: str) -> bool:
    """Whether an attribute name says it holds content (`gen_ai.tool.call.arguments`,
    `ringfence.tool_output`) rather than an identifier or a measure of it
    (`ringfence.arguments.sha256`, `ringfence.output_bytes`)."""
    parts = [p for p in re.split(r"[._\-]", name.lower()) if p]
    return bool(parts) and parts[-1] not in _MEASURE and any(p in _RAW for p in parts)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, str)]
    return []


def unsafe_attributes(span: ReadableSpan) -> list[str]:
    """What the guard would remove from `span`: raw-content attribute names, and attributes
    (of the span or its events) whose string value holds a secret the scanner recognises."""
    found = []
    for where, attrs in [("", span.attributes or {})] + [(f"{e.name}:", e.attributes or {}) for e in span.events]:
        for name, value in attrs.items():
            if is_raw_content_name(name) or any(guardrails.scan(s) for s in _strings(value)):
                found.append(where + name)
    return found


def _clean_attributes(attrs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in (attrs or {}).items():
        if is_raw_content_name(name):
            continue
        if isinstance(value, str):
            value = guardrails.redact(value)
        elif isinstance(value, (list, tuple)):
            value = tuple(guardrails.redact(v) if isinstance(v, str) else v for v in value)
        out[name] = value
    return out


def guard_span(span: ReadableSpan) -> ReadableSpan:
    """A copy of `span` fit to leave the process (see the module docstring)."""
    status = span.status
    if status.description and not (_CODE_LIKE.fullmatch(status.description)
                                   or status.description == (span.attributes or {}).get("error.type")):
        status = Status(status.status_code)
    return ReadableSpan(
        name=span.name, context=span.context, parent=span.parent, resource=span.resource,
        attributes=_clean_attributes(span.attributes),
        events=[SpanEvent(e.name, _clean_attributes(e.attributes), e.timestamp) for e in span.events],
        links=span.links, kind=span.kind, status=status, start_time=span.start_time, end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope)


class GuardedExporter(SpanExporter):
    """Exports through `inner` the guarded copies of the spans (`guard_span`)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([guard_span(s) for s in spans])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ringfence")
    except PackageNotFoundError:
        return "dev"


def otlp_insecure(endpoint: str) -> bool:
    """Plaintext for http:// and for a loopback HOST:PORT; TLS for https:// and any other host."""
    scheme, sep, _rest = endpoint.partition("://")
    if sep:
        return scheme.lower() == "http"
    return is_loopback_host(endpoint.rpartition(":")[0] if ":" in endpoint else endpoint)


def configure_tracing(otlp_endpoint: str | None, console: bool, *, service_name: str = "ringfence",
                      insecure: bool | None = None, console_out: IO[str] | None = None,
                      set_global: bool = True, record: bool = False) -> TracerProvider | None:
    """An SDK tracer provider exporting to `otlp_endpoint` (OTLP/gRPC: HOST:PORT, http://... or
    https://...) and/or, with `console`, one JSON line per span on `console_out` (stdout); made
    the global provider unless `set_global` is False. Neither: None, and nothing is changed,
    unless `record`: then a provider that exports nowhere, so that spans still have real ids
    (the run's trace id in its log, its events and its JSON log lines: `ringfence serve` always
    records). `insecure` (plaintext to the collector) defaults to `otlp_insecure(otlp_endpoint)`."""
    if not otlp_endpoint and not console and not record:
        return None
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name, SERVICE_VERSION: _version()}))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        otlp = OTLPSpanExporter(endpoint=otlp_endpoint,
                                insecure=otlp_insecure(otlp_endpoint) if insecure is None else insecure,
                                timeout=EXPORT_TIMEOUT_S)
        provider.add_span_processor(BatchSpanProcessor(GuardedExporter(otlp),
                                                       export_timeout_millis=EXPORT_TIMEOUT_S * 1000))
    if console:
        out = console_out if console_out is not None else sys.stdout
        console_exporter = ConsoleSpanExporter(service_name=service_name, out=out,
                                               formatter=lambda span: span.to_json(indent=None) + "\n")
        provider.add_span_processor(SimpleSpanProcessor(GuardedExporter(console_exporter)))
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


def shutdown_tracing(provider: TracerProvider | None, timeout_s: float = EXPORT_TIMEOUT_S) -> None:
    """Export what is still queued, then stop the exporters (serve's last step)."""
    if provider is None:
        return
    try:
        if not provider.force_flush(int(timeout_s * 1000)):
            log.warning("some spans were not exported within %gs", timeout_s)
    finally:
        provider.shutdown()
