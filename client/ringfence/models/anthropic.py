"""AnthropicMessagesModel: the Messages API with `tool_use` / `tool_result` blocks. Needs
`pip install 'ringfence[anthropic]'`.

The request (non-streaming): the model, `max_tokens`, the system prompt, the conversation
(ringfence.models._common: the goal as the first user message, then per earlier turn the
assistant's `tool_use` blocks and one user message of `tool_result` blocks, one per call, each the
result as JSON data, `is_error` when the call did not run as asked), the tools (name, description,
input_schema from ListTools: clean schemas, no risk metadata), tool_choice and temperature when
set. The client's own OpenTelemetry spans are off: the adapter's `chat` span is the one.

The response, by stop_reason (the raw value kept as ModelTurn.finish_reason):

    max_tokens, model_context_window_exceeded
                    ModelTurn.cut: truncated, even mid tool_use; never an answer
    refusal         a final answer of its text (often "") with stop_reason CONTENT_FILTER
    tool_use blocks one ModelTurn with every call, in order, ids kept; an `input` that is not an
                    object becomes ToolCall.malformed (an `invalid` observation to repair)
    "tool_use" and no block   a malformed call
    end_turn, stop_sequence   the final answer (the text blocks, joined)
    pause_turn, other         the text as an answer, stop_reason OTHER (pause_turn comes only
                    with server tools, which ringfence never sends)

Usage: Anthropic's input_tokens EXCLUDES cache reads and cache writes, so input_tokens =
input_tokens + cache_read_input_tokens + cache_creation_input_tokens and cached_input_tokens =
cache_read_input_tokens (each token counted once); output = output_tokens.

It cannot reach a real Anthropic server in ringfence's tests: they run it against a local HTTP
server replaying request/response pairs in the documented format (tests/model_fakes.py).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import anthropic
from anthropic.types import MessageParam, ToolChoiceParam, ToolParam, ToolResultBlockParam, ToolUseBlockParam

from ringfence.models._common import (
    ChatSpan,
    Failure,
    ModelRetry,
    Secrets,
    Transport,
    arguments_of,
    call_with_retries,
    chat_span,
    error_detail,
    first_user_text,
    is_error_result,
    model_name,
    result_json,
    retry_after_s,
    system_text,
    tool_specs,
    turn_call_ids,
    usage_of,
)
from ringfence.models.errors import ModelError
from ringfence.turns import AgentContext, ModelTurn, StopReason, TokenUsage, ToolCall, canonical_json

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["AnthropicMessagesModel"]

PROVIDER = "anthropic"
_CUT = frozenset({"max_tokens", "model_context_window_exceeded"})


class AnthropicMessagesModel:
    """A ModelClient on the Messages API (module docstring)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str = "ANTHROPIC_API_KEY",
        max_output_tokens: int = 1024,
        temperature: float | None = None,
        tool_choice: str | None = None,
        retry: ModelRetry = ModelRetry(),  # noqa: B008 - a frozen value, shared safely
        tracer_provider: TracerProvider | None = None,
        transport: Transport = Transport(),  # noqa: B008 - a frozen value, shared safely
    ) -> None:
        """`api_key_env`: the environment variable holding the key (unset or empty: ValueError).
        `tool_choice`: "auto", "any" (or "required": some tool), "none", or a tool's name.
        `tracer_provider`: where the `chat` spans go (None: the global one). `transport`: sleep
        and clocks (tests)."""
        if not model:
            raise ValueError("AnthropicMessagesModel needs a model name")
        if max_output_tokens < 1:
            raise ValueError("max_output_tokens must be at least 1")
        key = os.environ.get(api_key_env, "")
        if not key:
            raise ValueError(f"AnthropicMessagesModel: the environment variable {api_key_env} (the API key) is not set")
        self.model = model
        self.max_output_tokens = max_output_tokens
        self.temperature = temperature
        self.tool_choice = tool_choice
        self.retry = retry
        self.tracer_provider = tracer_provider
        self.transport = transport
        self._secrets = Secrets((key,))
        # max_retries=0: the library's retries are off, ours (ModelRetry) decide; its spans are off,
        # ours (`chat`) are the ones.
        self._client = anthropic.Anthropic(api_key=key, base_url=base_url, max_retries=0, open_telemetry=False)

    def __repr__(self) -> str:
        return f"AnthropicMessagesModel({self.model!r}, base_url={str(self._client.base_url)!r})"

    def close(self) -> None:
        self._client.close()

    # ModelClient

    def next_turn(self, context: AgentContext) -> ModelTurn:
        with chat_span(PROVIDER, self.model, self.tracer_provider) as span:
            data = call_with_retries(PROVIDER, lambda timeout: self._send(context, timeout), self._classify,
                                     self.retry, context.deadline, self.transport, span)
            return self._turn(data, span)

    # the request

    def messages(self, context: AgentContext) -> list[MessageParam]:
        """The conversation for the context (module docstring)."""
        out: list[MessageParam] = [{"role": "user", "content": first_user_text(context)}]
        for record in context.history:
            ids = turn_call_ids(record)
            if not record.calls:
                continue
            uses: list[ToolUseBlockParam] = [
                {"type": "tool_use", "id": call_id, "name": model_name(call.name), "input": dict(call.arguments)}
                for call_id, call in zip(ids, record.calls, strict=True)
            ]
            results: list[ToolResultBlockParam] = []
            for i, (call_id, call) in enumerate(zip(ids, record.calls, strict=True)):
                observation = record.observations[i] if i < len(record.observations) else None
                results.append({"type": "tool_result", "tool_use_id": call_id,
                                "content": result_json(call, observation),
                                "is_error": is_error_result(observation)})
            out.append({"role": "assistant", "content": uses})
            out.append({"role": "user", "content": results})
        return out

    def _tools(self, context: AgentContext) -> list[ToolParam]:
        return [{"name": s.name, "description": s.description, "input_schema": dict(s.parameters)}
                for s in tool_specs(context.tools)]

    def _tool_choice(self) -> ToolChoiceParam:
        choice = self.tool_choice or "auto"
        if choice == "auto":
            return {"type": "auto"}
        if choice in ("any", "required"):
            return {"type": "any"}
        if choice == "none":
            return {"type": "none"}
        return {"type": "tool", "name": choice}

    def _send(self, context: AgentContext, timeout: float) -> Any:
        tools = self._tools(context)
        # The SDK has no `temperature` argument any more (the newest models take none): it goes in
        # the body when asked for, and a model that refuses it answers 400, never retried.
        extra = {"temperature": self.temperature} if self.temperature is not None else None
        raw = self._client.messages.with_raw_response.create(
            model=self.model, max_tokens=self.max_output_tokens, system=system_text(),
            messages=self.messages(context),
            tools=tools or anthropic.omit,
            tool_choice=self._tool_choice() if tools and self.tool_choice is not None else anthropic.omit,
            extra_body=extra, timeout=timeout)
        try:
            return raw.http_response.json()
        except ValueError:
            # Not a provider failure to retry: a server (or a proxy) that answers this way will again.
            raise ModelError(PROVIDER, "the response is not JSON", status=raw.http_response.status_code) from None

    def _classify(self, error: Exception) -> Failure | None:
        if isinstance(error, anthropic.APIStatusError):
            detail = error_detail(error.body, f"HTTP {error.status_code}", self._secrets)
            return Failure(error.status_code, detail, retry_after_s(error.response.headers, self.transport.wall()))
        if isinstance(error, anthropic.APITimeoutError):
            return Failure(None, "the request timed out")
        if isinstance(error, anthropic.APIConnectionError):
            cause = error.__cause__ or error
            return Failure(None, self._secrets.scrub(f"no answer: {type(cause).__name__}: {cause}"))
        return None

    # the response

    def _turn(self, data: Any, span: ChatSpan) -> ModelTurn:
        blocks = data.get("content") if isinstance(data, dict) else None
        if not isinstance(blocks, list):
            raise ModelError(PROVIDER, "the response has no content")
        raw_reason = str(data.get("stop_reason") or "")
        usage = _usage(data.get("usage"))
        span.response(str(data.get("model") or ""), [raw_reason], usage)
        text = "".join(b["text"] for b in blocks if isinstance(b, dict) and b.get("type") == "text"
                       and isinstance(b.get("text"), str))
        uses = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
        if raw_reason in _CUT:
            return ModelTurn.cut(raw_reason, usage)
        if raw_reason == "refusal":
            return ModelTurn(final_answer=text, usage=usage, stop_reason=StopReason.CONTENT_FILTER,
                             finish_reason=raw_reason)
        if uses:
            calls = tuple(_call(b) for b in uses)
            stop = StopReason.TOOL_CALLS if raw_reason == "tool_use" else StopReason.OTHER
            return ModelTurn(calls, usage=usage, stop_reason=stop, finish_reason=raw_reason)
        if raw_reason == "tool_use":
            bad = ToolCall.malformed("?", text, "the response says tool_use but carries no tool_use block")
            return ModelTurn((bad,), usage=usage, stop_reason=StopReason.TOOL_CALLS, finish_reason=raw_reason)
        stop = StopReason.END_TURN if raw_reason in ("end_turn", "stop_sequence") else StopReason.OTHER
        return ModelTurn(final_answer=text, usage=usage, stop_reason=stop, finish_reason=raw_reason)


def _call(block: dict[str, Any]) -> ToolCall:
    name = str(block.get("name") or "")
    call_id = str(block.get("id") or "")
    raw = block.get("input")
    if not isinstance(raw, dict):
        # `input` is an object by the API's contract; anything else is shown to the model to repair.
        return ToolCall.malformed(name, canonical_json(raw), f"input is a JSON {type(raw).__name__}", call_id)
    return arguments_of(name, raw, call_id)


def _usage(raw: Any) -> TokenUsage | None:
    if not isinstance(raw, dict):
        return None
    fresh, read, written = (_int(raw.get(k)) for k in
                            ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
    return usage_of(fresh + read + written, _int(raw.get("output_tokens")), read)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
