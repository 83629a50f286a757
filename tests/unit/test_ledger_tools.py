"""The `credit` and `credit_lookup` tools of the tool image, run in-process (by the image's own
runner) against a scripted HTTP proxy on 127.0.0.1: how each answer of the ledger, or of the
egress proxy before it, is classified for the retry layer. No Docker; traffic to loopback only.

The real path (sandbox, relay, egress proxy, ledger) is tests/integration/test_ledger.py.
"""

from __future__ import annotations

import json
import socket

import pytest
from scripted_proxy import load_runner, scripted_proxy

KEY = "k" * 64
RECORD = {"id": 1, "idempotency_key": KEY, "account": "acme-9", "amount": 50, "applied_at": "2026-01-01T00:00:00+00:00"}


@pytest.fixture(scope="module")
def runner():
    yield from load_runner("ringfence_runner_under_test")


@pytest.fixture
def proxy(monkeypatch):
    yield from scripted_proxy(monkeypatch)


def run(runner, tool: str, arguments: dict, key: str | None = KEY) -> dict:
    doc, code = runner.handle(json.dumps({"tool": tool, "arguments": arguments, "call_id": "c1",
                                          "idempotency_key": key}).encode())
    assert (code == 0) == doc["ok"]
    return doc


def credit(runner, **kw) -> dict:
    return run(runner, "credit", {"account": "acme-9", "amount": 50}, **kw)


def test_credit_posts_the_key_to_the_ledger_through_the_proxy(runner, proxy):
    proxy.answer = (201, {**RECORD, "replayed": False}, None)
    doc = credit(runner)
    assert doc == {"ok": True, "content": {"applied": True, **RECORD, "replayed": False}}
    [seen] = proxy.seen
    assert seen["method"] == "POST" and seen["target"] == "http://ledger.ringfence.internal/credits"
    assert seen["body"] == {"account": "acme-9", "amount": 50, "idempotency_key": KEY}
    assert seen["auth"].startswith("Basic ")  # the call's proxy credentials


def test_a_replay_is_a_success(runner, proxy):
    proxy.answer = (200, {**RECORD, "replayed": True}, None)
    assert credit(runner)["content"]["replayed"] is True


@pytest.mark.parametrize("answer, cls", [
    ((409, {"error": "idempotency_key_reused", "message": "key reused"}, None), "invalid"),
    ((400, {"error": "bad_request", "message": "amount has more than two fractional digits"}, None), "invalid"),
    ((500, {"error": "internal"}, None), "transient"),
    ((503, None, None), "transient"),
    ((502, None, "connect_failed"), "transient"),    # the proxy could not reach the ledger
    ((504, None, None), "transient"),
    ("reset", "transient"),                          # no answer: maybe applied, the key makes a retry safe
    ((429, None, "connection_limit"), "rate_limited"),
    ((403, None, "not_allowlisted"), "fatal"),       # a refusal is never retried
    ((403, None, "address_refused"), "fatal"),
    ((407, None, "credentials_invalid"), "fatal"),
    ((404, {"error": "not_found"}, None), "fatal"),
    ((201, {"something": "else"}, None), "fatal"),   # a success without this key's record
])
def test_credit_errors_are_classified(runner, proxy, answer, cls):
    proxy.answer = answer
    doc = credit(runner)
    assert doc["ok"] is False and doc["error"]["class"] == cls, doc
    if isinstance(answer, tuple) and answer[2]:
        assert answer[2] in doc["error"]["message"]


def test_a_refused_connection_is_transient(runner, monkeypatch):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    monkeypatch.setenv("HTTP_PROXY", f"http://u:p@127.0.0.1:{port}")
    monkeypatch.setenv("NO_PROXY", "")
    assert credit(runner)["error"]["class"] == "transient"


def test_a_credit_without_a_key_is_invalid_and_sends_nothing(runner, proxy):
    doc = credit(runner, key=None)
    assert doc["error"]["class"] == "invalid" and proxy.seen == []


def test_without_a_route_credit_fails_and_never_looks_applied(runner, monkeypatch):
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    doc = credit(runner)
    assert doc["ok"] is False and doc["error"]["class"] == "fatal" and "no route" in doc["error"]["message"]


def test_lookup_found_and_not_found(runner, proxy):
    proxy.answer = (200, RECORD, None)
    assert run(runner, "credit_lookup", {"idempotency_key": KEY}, key=None)["content"] == {
        "found": True, "record": RECORD}
    assert proxy.seen[-1]["target"] == f"http://ledger.ringfence.internal/credits/{KEY}"
    proxy.answer = (404, {"error": "not_found", "idempotency_key": KEY}, None)
    assert run(runner, "credit_lookup", {"idempotency_key": KEY}, key=None)["content"] == {"found": False}


@pytest.mark.parametrize("answer, cls", [
    ((404, None, None), "fatal"),                    # a 404 that is not the ledger's: no guess
    ((403, None, "not_allowlisted"), "fatal"),
    ((502, None, "connect_failed"), "transient"),
    ("reset", "transient"),
    ((200, {"idempotency_key": "another"}, None), "fatal"),
])
def test_lookup_never_guesses_not_found(runner, proxy, answer, cls):
    # "not found" would let recovery apply the credit again: only the ledger's own 404 says it.
    proxy.answer = answer
    doc = run(runner, "credit_lookup", {"idempotency_key": KEY}, key=None)
    assert doc["ok"] is False and doc["error"]["class"] == cls


def test_lookup_without_a_route_is_an_error_not_a_not_found(runner, monkeypatch):
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    doc = run(runner, "credit_lookup", {"idempotency_key": KEY}, key=None)
    assert doc["ok"] is False and doc["error"]["class"] == "fatal"


def test_lookup_refuses_a_malformed_key(runner, proxy):
    doc = run(runner, "credit_lookup", {"idempotency_key": "../stats"}, key=None)
    assert doc["error"]["class"] == "invalid" and proxy.seen == []
