"""A model provider on 127.0.0.1 for the adapters' tests (ringfence.models): a real HTTP server in a
thread that RECORDS every request and answers scripted replies, in OpenAI's Chat Completions or
Anthropic's Messages format (the helpers below build the documented shapes).

    with ReplayServer([reply(200, openai_completion(...)), reply(503, error_body(...))]) as server:
        model = OpenAIChatModel("m", base_url=server.url + "/v1", ...)
        ...
        server.seen        every request: method, path, headers (lower-case names), body (parsed JSON)

A reply is (status, JSON body, headers), or RESET: the connection is closed unanswered. A request
past the script is answered 500 "unscripted" (the test sees it as one more request).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RESET = "reset"


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    """Wait this long before answering (a slow server; the client may give up first)."""


def reply(status: int, body: Any, headers: Mapping[str, str] | None = None, delay_s: float = 0.0) -> Reply:
    return Reply(status, body, dict(headers or {}), delay_s)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


class ReplayServer:
    def __init__(self, replies: Sequence[Reply | str]) -> None:
        self.replies = list(replies)
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with outer._lock:
                    outer.seen.append(Seen("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    index = len(outer.seen) - 1
                    item = outer.replies[index] if index < len(outer.replies) else reply(
                        500, {"error": {"type": "unscripted", "message": f"no reply scripted for request {index + 1}"}})
                if item == RESET:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                assert isinstance(item, Reply)
                if item.delay_s:
                    time.sleep(item.delay_s)
                data = json.dumps(item.body).encode() if not isinstance(item.body, bytes) else item.body
                try:
                    self.send_response(item.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for name, value in item.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    self.close_connection = True  # the client gave up first (a timeout test)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="model-replay",
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> ReplayServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@contextmanager
def closed_port() -> Iterator[str]:
    """A loopback URL nothing listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield f"http://127.0.0.1:{port}"


class Sleeps:
    """An injectable sleep that records the waits it was asked for and returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


# --- OpenAI Chat Completions ----------------------------------------------------------------------


def openai_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def openai_completion(
    *,
    content: str | None = None,
    tool_calls: Sequence[dict[str, Any]] = (),
    finish_reason: str = "stop",
    prompt_tokens: int = 10,
    completion_tokens: int = 5,
    cached_tokens: int | None = None,
    model: str = "served-model",
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = list(tool_calls)
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                             "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens, "audio_tokens": 0}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
            "usage": usage}


def openai_error(message: str, type_: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": None}}


# --- Anthropic Messages ---------------------------------------------------------------------------


def anthropic_message(
    content: Sequence[dict[str, Any]],
    *,
    stop_reason: str = "end_turn",
    input_tokens: int = 10,
    output_tokens: int = 5,
    cache_read: int = 0,
    cache_creation: int = 0,
    model: str = "served-model",
) -> dict[str, Any]:
    return {"id": "msg_01", "type": "message", "role": "assistant", "model": model, "content": list(content),
            "stop_reason": stop_reason, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                      "cache_read_input_tokens": cache_read, "cache_creation_input_tokens": cache_creation}}


def anthropic_text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def anthropic_tool_use(block_id: str, name: str, input_: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": block_id, "name": name, "input": input_}


def anthropic_error(type_: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": message}}


# --- a context with everything an adapter renders -------------------------------------------------

GOAL = "Find the incident's cause."
INVALID_ERROR = "the arguments are not a JSON object (invalid JSON): '{\"path\": '"


def risky_tools() -> tuple[Any, ...]:
    """Two tools whose schemas carry what a model must never see: risk words beside the schema's
    own (mutates, reversible, cost, approval), vendor keywords (x-ringfence-*), at the top and
    nested; and an ARGUMENT named `cost`, which is the tool's own and must stay."""
    from ringfence.model import ToolView

    read_file = ToolView("read_file", "Read a text file under /input.", {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1, "description": "a path under /input",
                     "x-ringfence-roots": ["/input"]},
            "mode": {"type": "string", "enum": ["text", "base64"]},
            "cost": {"type": "number", "description": "an argument named cost"},
        },
        "required": ["path"],
        "additionalProperties": False,
        "mutates": False, "reversible": True, "cost": 0.01, "approval": "never",
        "x-ringfence-approval": "ask",
    })
    issue_credit = ToolView("issue_credit", "Issue a credit.", {
        "type": "object",
        "properties": {"amount": {"type": "number", "exclusiveMinimum": 0, "x-risk": "irreversible"}},
        "required": ["amount"],
        "x-ringfence-mutates": True,
    })
    return read_file, issue_credit


def rich_context(deadline: float | None = None) -> Any:
    """Turn 3 of a run: two earlier turns (an executed and a denied call in one batch; then a call
    whose arguments were not JSON, answered `invalid`), recalled memory and a summary."""
    from ringfence.context import RecalledFact
    from ringfence.model import Observation, ObservationStatus
    from ringfence.turns import AgentContext, ToolCall, TurnRecord

    turn1 = TurnRecord(1, (ToolCall("read_file", {"path": "/input/a.md"}, "call_a"),
                           ToolCall("issue_credit", {"amount": 5}, "call_b")),
                       (Observation("r-1-1", "read_file", ObservationStatus.EXECUTED, True, content={"text": "hello"}),
                        Observation("r-1-2", "issue_credit", ObservationStatus.DENIED, False,
                                    error="policy denies issue_credit", error_class="policy")))
    turn2 = TurnRecord(2, (ToolCall.malformed("read_file", '{"path": ', "invalid JSON", "call_c"),),
                       (Observation("r-2-1", "read_file", ObservationStatus.INVALID, False, error=INVALID_ERROR),))
    return AgentContext(GOAL, "run-1", 3, risky_tools(), (turn1, turn2), summary="turn 0: nothing yet",
                        memory=(RecalledFact("fact", "the incident began at 09:00", True),), deadline=deadline)


def bare_context(deadline: float | None = None) -> Any:
    """Turn 1 with the two tools and nothing else."""
    from ringfence.turns import AgentContext

    return AgentContext(GOAL, "run-1", 1, risky_tools(), deadline=deadline)
