"""What both model adapters share (ringfence.models._common): the classification table, Retry-After,
the deadline, the schemas the model receives, the `chat` span, and that the API key is written
nowhere but its request header. Real HTTP on loopback (tests/model_fakes.py)."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest
from model_fakes import (
    ReplayServer,
    Sleeps,
    anthropic_error,
    bare_context,
    openai_completion,
    openai_error,
    reply,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ringfence.model import ToolView
from ringfence.models import ModelError, ModelRequestRefused, ModelUnavailable
from ringfence.models._common import (
    ModelRetry,
    Transport,
    arguments_of,
    clean_schema,
    is_transient,
    retry_after_s,
    tool_specs,
)
from ringfence.models.anthropic import AnthropicMessagesModel
from ringfence.models.openai import OpenAIChatModel

SECRET = "sk-RINGFENCE-SECRET-7f3a9c1e5b"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


# --- the table ----------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [None, 408, 409, 429, 500, 502, 503, 504, 529])
def test_transient(status):
    assert is_transient(status)


@pytest.mark.parametrize("status", [400, 401, 402, 403, 404, 405, 413, 422, 501])
def test_permanent(status):
    assert not is_transient(status)


def test_retry_after_in_its_three_forms():
    now = 1_700_000_000.0
    assert retry_after_s({"Retry-After": "7"}, now) == 7.0
    assert retry_after_s({"retry-after": "2.5"}, now) == 2.5
    assert retry_after_s({"retry-after-ms": "1500", "retry-after": "9"}, now) == 1.5  # the finer one wins
    date = format_datetime(datetime.fromtimestamp(now + 20, UTC), usegmt=True)
    assert retry_after_s({"Retry-After": date}, now) == 20.0
    past = format_datetime(datetime.fromtimestamp(now - 20, UTC), usegmt=True)
    assert retry_after_s({"Retry-After": past}, now) == 0.0
    for junk in ("soon", "-3", "nan", "inf", ""):
        assert retry_after_s({"Retry-After": junk}, now) is None, junk
    assert retry_after_s({}, now) is None


# --- the deadline -------------------------------------------------------------------------------


def test_no_request_starts_past_the_deadline(monkeypatch):
    monkeypatch.setenv("RINGFENCE_TEST_KEY", SECRET)
    clock = FakeClock()
    with ReplayServer([reply(200, openai_completion(content="x"))]) as server:
        model = OpenAIChatModel("m", base_url=server.url + "/v1", api_key_env="RINGFENCE_TEST_KEY",
                                transport=Transport(sleep=clock.sleep, clock=clock))
        with pytest.raises(ModelUnavailable, match="deadline passed"):
            model.next_turn(bare_context(deadline=clock.now - 1))
        model.close()
    assert server.seen == []


def test_a_wait_that_would_end_past_the_deadline_is_not_begun(monkeypatch):
    monkeypatch.setenv("RINGFENCE_TEST_KEY", SECRET)
    clock = FakeClock()
    sleeps = Sleeps()
    with ReplayServer([reply(503, openai_error("busy", "server_error"), {"Retry-After": "10"}),
                       reply(200, openai_completion(content="x"))]) as server:
        model = OpenAIChatModel("m", base_url=server.url + "/v1", api_key_env="RINGFENCE_TEST_KEY",
                                transport=Transport(sleep=sleeps, clock=clock))
        with pytest.raises(ModelUnavailable) as raised:
            model.next_turn(bare_context(deadline=clock.now + 5))
        model.close()
    assert len(server.seen) == 1 and sleeps.waits == []
    assert raised.value.status == 503 and "deadline leaves no time to retry after 1 attempt" in str(raised.value)


def test_an_attempts_timeout_is_cut_to_the_runs_deadline(monkeypatch):
    # request_timeout_s is a minute; the run has half a second left, and the server takes three:
    # the request gives up at the deadline (the outcome is asserted, not the time it took).
    monkeypatch.setenv("RINGFENCE_TEST_KEY", SECRET)
    with ReplayServer([reply(200, openai_completion(content="late"), delay_s=3.0)]) as server:
        model = OpenAIChatModel("m", base_url=server.url + "/v1", api_key_env="RINGFENCE_TEST_KEY",
                                retry=ModelRetry(request_timeout_s=60.0, initial_wait_s=0.0),
                                transport=Transport(sleep=Sleeps()))
        with pytest.raises(ModelUnavailable) as raised:
            model.next_turn(bare_context(deadline=time.monotonic() + 0.5))
        model.close()
    assert "timed out" in str(raised.value) and raised.value.status is None
    assert len(server.seen) == 1


# --- the tools the model receives ---------------------------------------------------------------


def test_clean_schema_keeps_the_schema_and_drops_everything_else_at_every_depth():
    schema = {
        "type": "object", "title": "args", "x-ringfence-approval": "ask", "mutates": True, "cost": 0.5,
        "$id": "urn:x", "$comment": "reviewed by ops",
        "properties": {
            "mutates": {"type": "boolean", "description": "an argument that happens to be called mutates"},
            "target": {"anyOf": [{"type": "string", "format": "uri", "x-egress": "*.internal"},
                                 {"$ref": "#/$defs/host"}]},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"], "reversible": False},
                     "maxItems": 3},
        },
        "$defs": {"host": {"type": "string", "pattern": "^[a-z.]+$", "x-roots": ["/"]}},
        "required": ["target"],
        "additionalProperties": {"type": "string", "approval": "always"},
    }
    assert clean_schema(schema) == {
        "type": "object", "title": "args",
        "properties": {
            "mutates": {"type": "boolean", "description": "an argument that happens to be called mutates"},
            "target": {"anyOf": [{"type": "string", "format": "uri"}, {"$ref": "#/$defs/host"}]},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3},
        },
        "$defs": {"host": {"type": "string", "pattern": "^[a-z.]+$"}},
        "required": ["target"],
        "additionalProperties": {"type": "string"},
    }


def test_a_declared_mcp_servers_tool_reaches_the_model_under_a_name_providers_take():
    """SERVER.TOOL has a dot, which neither provider takes in a tool's name: it is sent as
    SERVER--TOOL, and a call of that name is a call of SERVER.TOOL."""
    import re

    (spec,) = tool_specs([ToolView("time.get_current_time", "Now.", {"type": "object"})])
    assert spec.name == "time--get_current_time" and re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", spec.name)
    call = arguments_of("time--get_current_time", '{"timezone": "UTC"}', "c1")
    assert call.name == "time.get_current_time" and dict(call.arguments) == {"timezone": "UTC"}
    assert arguments_of("echo", "{}", "c2").name == "echo"


def test_a_tool_without_a_schema_gets_an_empty_object_schema():
    (spec,) = tool_specs([ToolView("now", "The time.", {})])
    assert spec.parameters == {"type": "object", "properties": {}}


# --- the chat span ------------------------------------------------------------------------------


def spans_of(provider: TracerProvider, exporter: InMemorySpanExporter):
    provider.force_flush()
    return {s.name: s for s in exporter.get_finished_spans()}


def test_one_chat_span_per_request_a_child_of_the_agents_span(monkeypatch):
    monkeypatch.setenv("RINGFENCE_TEST_KEY", SECRET)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with ReplayServer([reply(503, openai_error("busy", "server_error")),
                       reply(200, openai_completion(content="x", prompt_tokens=300, completion_tokens=20,
                                                    cached_tokens=256, model="gpt-test-2026"))]) as server:
        model = OpenAIChatModel("gpt-test", base_url=server.url + "/v1", api_key_env="RINGFENCE_TEST_KEY",
                                retry=ModelRetry(initial_wait_s=0.0), tracer_provider=provider,
                                transport=Transport(sleep=Sleeps()))
        with provider.get_tracer("agent").start_as_current_span("invoke_agent") as agent:
            model.next_turn(bare_context())
        model.close()
    spans = spans_of(provider, exporter)
    chat = spans["chat gpt-test"]
    assert chat.kind is SpanKind.CLIENT
    assert chat.parent is not None and chat.parent.span_id == agent.get_span_context().span_id
    assert chat.context.trace_id == agent.get_span_context().trace_id
    assert dict(chat.attributes or {}) == {
        "gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "gpt-test",
        "gen_ai.response.model": "gpt-test-2026", "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 300, "gen_ai.usage.output_tokens": 20,
        "ringfence.model.cached_input_tokens": 256, "ringfence.model.retries": 1,
    }
    assert [s.name for s in exporter.get_finished_spans()] == ["chat gpt-test", "invoke_agent"]  # one per request


def test_a_failed_request_is_an_error_span_with_its_retries(monkeypatch):
    monkeypatch.setenv("RINGFENCE_TEST_KEY", SECRET)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with ReplayServer([reply(529, anthropic_error("overloaded_error", "Overloaded"))] * 3) as server:
        model = AnthropicMessagesModel("claude-test", base_url=server.url, api_key_env="RINGFENCE_TEST_KEY",
                                       retry=ModelRetry(attempts=3, initial_wait_s=0.0), tracer_provider=provider,
                                       transport=Transport(sleep=Sleeps()))
        with provider.get_tracer("agent").start_as_current_span("invoke_agent") as agent, \
                pytest.raises(ModelUnavailable):
            model.next_turn(bare_context())
        model.close()
    chat = spans_of(provider, exporter)["chat claude-test"]
    assert chat.parent is not None and chat.parent.span_id == agent.get_span_context().span_id
    assert chat.status.status_code is StatusCode.ERROR and "overloaded_error" in (chat.status.description or "")
    attributes = dict(chat.attributes or {})
    assert attributes["ringfence.model.retries"] == 2 and attributes["error.type"] == "529"
    assert attributes["gen_ai.system"] == "anthropic"


# --- the key ------------------------------------------------------------------------------------


def echoing_replies(error):
    """A server that quotes the key back in every error (as a careless proxy, or OpenAI's own 401,
    does): 401, 400, then 500s."""
    return [reply(401, error(f"Incorrect API key provided: {SECRET}")),
            reply(400, error(f"bad request from key {SECRET}")),
            *[reply(500, error(f"internal error for {SECRET}"))] * 3]


@pytest.mark.parametrize("provider_name", ["openai", "anthropic"])
def test_the_key_is_in_no_exception_log_or_span(provider_name, monkeypatch, caplog):
    monkeypatch.setenv("RINGFENCE_TEST_KEY", SECRET)
    caplog.set_level(logging.DEBUG)  # every logger, the provider libraries' and httpx's included
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    common = {"api_key_env": "RINGFENCE_TEST_KEY", "retry": ModelRetry(attempts=3, initial_wait_s=0.0),
              "tracer_provider": provider, "transport": Transport(sleep=Sleeps())}

    def error_body(message: str):
        return openai_error(message) if provider_name == "openai" else anthropic_error("error", message)

    raised: list[ModelError] = []
    with ReplayServer(echoing_replies(error_body)) as server:
        model: OpenAIChatModel | AnthropicMessagesModel
        if provider_name == "openai":
            model = OpenAIChatModel("m", base_url=server.url + "/v1", **common)
        else:
            model = AnthropicMessagesModel("m", base_url=server.url, **common)
        for _ in range(3):  # 401, then 400, then 500s until the attempts run out
            with provider.get_tracer("agent").start_as_current_span("invoke_agent"):
                try:
                    model.next_turn(bare_context())
                except ModelError as error:
                    raised.append(error)
        model.close()
    assert [type(failure) for failure in raised] == [ModelRequestRefused, ModelRequestRefused, ModelUnavailable]
    assert [failure.status for failure in raised] == [401, 400, 500]
    assert len(server.seen) == 5
    assert all(any(SECRET in v for v in seen.headers.values()) for seen in server.seen)  # it WAS sent

    texts = []
    for failure in raised:
        texts += [str(failure), repr(failure), "".join(traceback.format_exception(failure))]
    texts += [record.getMessage() for record in caplog.records]
    texts += [caplog.text]
    for span in exporter.get_finished_spans():
        texts += [span.name, str(span.status.description), repr(dict(span.attributes or {}))]
        texts += [repr(dict(event.attributes or {})) for event in span.events]
    leaks = [text for text in texts if SECRET in text]
    assert not leaks
    assert "[redacted]" in str(raised[0])  # the provider's message is kept, the key scrubbed from it
    assert any("retry 1 of 2" in r.getMessage() for r in caplog.records)  # the retries were logged


# --- optional extras ----------------------------------------------------------------------------


def test_importing_the_sdk_imports_no_provider_library():
    code = ("import sys, ringfence, ringfence.agent, ringfence.models, ringfence.models._common\n"
            "loaded = sorted(m for m in ('openai', 'anthropic') if m in sys.modules)\n"
            "assert not loaded, loaded\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
