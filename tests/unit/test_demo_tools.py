"""The demo tools of the tool image (fetch_url, issue_credit, write_file), run in-process by the
image's own runner, and their manifests at admission. No Docker: HTTP goes to a scripted proxy
on 127.0.0.1 (HTTP_PROXY), like tests/unit/test_ledger_tools.py, so what each answer of a
receiver, or of the egress proxy before it, is classified as can be shown case by case.

The real path (sandbox, relay, egress proxy, runbooks service, ledger) is
tests/integration/test_demo_services.py.
"""

from __future__ import annotations

import json

import pytest
from scripted_proxy import PROXY_VARIABLES, load_runner, scripted_proxy

from ringfence.model import ProposedCall
from ringfence_server.control.config import load_config
from ringfence_server.control.orchestration.admission import AdmissionContext, AdmissionVerdict, admit_batch
from ringfence_server.control.policy import PolicyEngine
from ringfence_server.control.resource_policy import check_resources
from ringfence_server.control.tools import load_builtin

KEY = "k" * 64
RUNBOOK_URL = "http://runbooks.internal.corp/runbooks/credit-policy"
RECORD = {"id": 1, "idempotency_key": KEY, "account": "acme-9", "amount": 50,
          "applied_at": "2026-01-01T00:00:00+00:00"}


@pytest.fixture(scope="module")
def runner():
    yield from load_runner("ringfence_runner_demo_tools")


@pytest.fixture
def proxy(monkeypatch):
    yield from scripted_proxy(monkeypatch)


def no_route(monkeypatch):
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def run(runner, tool: str, arguments: dict, key: str | None = KEY) -> dict:
    doc, code = runner.handle(json.dumps({"tool": tool, "arguments": arguments, "call_id": "c1",
                                          "idempotency_key": key}).encode())
    assert (code == 0) == doc["ok"]
    return doc


# -- fetch_url -----------------------------------------------------------------------------------


def fetch(runner, url: str = RUNBOOK_URL, **more) -> dict:
    return run(runner, "fetch_url", {"url": url, **more}, key=None)


def test_fetch_url_gets_the_document_through_the_proxy(runner, proxy):
    doc = {"name": "credit-policy", "title": "Credit policy", "text": "..."}
    proxy.answer = (200, doc, {})
    content = fetch(runner)["content"]
    assert content == {"url": RUNBOOK_URL, "status": 200, "content_type": "application/json",
                       "body": json.dumps(doc), "bytes": len(json.dumps(doc)), "truncated": False}
    [seen] = proxy.seen
    assert seen["method"] == "GET" and seen["target"] == RUNBOOK_URL
    assert seen["auth"].startswith("Basic ")  # the call's proxy credentials


def test_fetch_url_returns_text_decoded_by_its_charset_and_capped(runner, proxy):
    proxy.answer = (200, "caf\u00e9 ".encode("latin-1") * 100, {"Content-Type": "text/plain; charset=latin-1"})
    content = fetch(runner, max_bytes=10)["content"]
    assert content["body"] == "caf\u00e9 caf\u00e9 " and content["bytes"] == 10 and content["truncated"] is True
    assert content["content_type"] == "text/plain; charset=latin-1"


def test_fetch_url_never_follows_a_redirect(runner, proxy):
    # The target of a redirect has not been through admission: it is reported, not fetched.
    proxy.answer = (302, b"", {"Location": "http://elsewhere.example/"})
    content = fetch(runner)["content"]
    assert content["status"] == 302 and content["location"] == "http://elsewhere.example/"
    assert len(proxy.seen) == 1


@pytest.mark.parametrize("answer, cls", [
    ((404, {"error": "not_found", "message": "no runbook at /runbooks/x"}, {}), "invalid"),
    ((400, None, {}), "invalid"),
    ((410, b"gone", {"Content-Type": "text/plain"}), "invalid"),
    ((500, None, {}), "transient"),
    ((503, None, {}), "transient"),
    ((502, None, {"X-Ringfence-Reason": "connect_failed"}), "transient"),   # the proxy could not reach it
    ((504, None, {"X-Ringfence-Reason": "upstream_timeout"}), "transient"),
    ("reset", "transient"),                                                  # no answer
    ((429, None, {"X-Ringfence-Reason": "connection_limit"}), "rate_limited"),
    ((429, None, {"Retry-After": "3"}), "rate_limited"),
    ((403, None, {"X-Ringfence-Reason": "not_allowlisted"}), "fatal"),     # a refusal is never retried
    ((403, None, {"X-Ringfence-Reason": "address_refused"}), "fatal"),
    ((403, None, {"X-Ringfence-Reason": "byte_limit"}), "fatal"),
    ((407, None, {"X-Ringfence-Reason": "credentials_invalid"}), "fatal"),
    ((407, None, {}), "fatal"),
])
def test_fetch_url_errors_are_classified(runner, proxy, answer, cls):
    proxy.answer = answer
    doc = fetch(runner)
    assert doc["ok"] is False and doc["error"]["class"] == cls, doc
    if isinstance(answer, tuple) and "X-Ringfence-Reason" in answer[2]:
        assert answer[2]["X-Ringfence-Reason"] in doc["error"]["message"]
    if isinstance(answer, tuple) and answer[2].get("Retry-After"):
        assert doc["error"]["retry_after_s"] == 3


def test_a_404_says_what_the_server_said(runner, proxy):
    proxy.answer = (404, {"error": "not_found", "message": "no runbook at /runbooks/x"}, {})
    assert "no runbook at /runbooks/x" in fetch(runner)["error"]["message"]


@pytest.mark.parametrize("url", ["ftp://runbooks.internal.corp/x", "http:///nohost", "http://u:p@runbooks.internal.corp/",
                                 "http://runbooks.internal.corp:99999/", "runbooks.internal.corp/x",
                                 "http://runbooks.internal.corp/a b", "", 7])
def test_fetch_url_refuses_a_bad_url_and_sends_nothing(runner, proxy, url):
    doc = run(runner, "fetch_url", {"url": url}, key=None)
    assert doc["error"]["class"] == "invalid" and proxy.seen == []


def test_fetch_url_without_a_route_is_fatal(runner, monkeypatch):
    no_route(monkeypatch)
    doc = fetch(runner)
    assert doc["error"]["class"] == "fatal" and "no route to runbooks.internal.corp" in doc["error"]["message"]


# -- issue_credit --------------------------------------------------------------------------------


def issue(runner, key: str | None = KEY, **arguments) -> dict:
    return run(runner, "issue_credit", {"account": "acme-9", "amount": 50, **arguments}, key=key)


def test_issue_credit_posts_credits_request_with_the_reason(runner, proxy):
    proxy.answer = (201, {**RECORD, "reason": "INC-7", "replayed": False}, {})
    doc = issue(runner, reason="INC-7")
    assert doc == {"ok": True, "content": {"applied": True, **RECORD, "reason": "INC-7", "replayed": False}}
    [seen] = proxy.seen
    assert seen["method"] == "POST" and seen["target"] == "http://ledger.ringfence.internal/credits"
    assert seen["body"] == {"account": "acme-9", "amount": 50, "idempotency_key": KEY, "reason": "INC-7"}


def test_issue_credit_without_a_reason_sends_exactly_what_credit_sends(runner, proxy):
    proxy.answer = (201, {**RECORD, "replayed": False}, {})
    issue(runner)
    run(runner, "credit", {"account": "acme-9", "amount": 50})
    assert proxy.seen[0]["body"] == proxy.seen[1]["body"] == {"account": "acme-9", "amount": 50, "idempotency_key": KEY}


@pytest.mark.parametrize("answer, cls", [
    ((409, {"error": "idempotency_key_reused", "message": "key reused"}, {}), "invalid"),
    ((400, {"error": "bad_request", "message": "bad amount"}, {}), "invalid"),
    ((500, {"error": "internal"}, {}), "transient"),
    ((502, None, {"X-Ringfence-Reason": "connect_failed"}), "transient"),
    ("reset", "transient"),
    ((429, None, {"X-Ringfence-Reason": "connection_limit"}), "rate_limited"),
    ((403, None, {"X-Ringfence-Reason": "not_allowlisted"}), "fatal"),
    ((201, {"something": "else"}, {}), "fatal"),
])
def test_issue_credit_classifies_like_credit(runner, proxy, answer, cls):
    proxy.answer = answer
    assert issue(runner, reason="r")["error"]["class"] == cls
    assert run(runner, "credit", {"account": "acme-9", "amount": 50})["error"]["class"] == cls


def test_issue_credit_without_a_key_is_invalid_and_sends_nothing(runner, proxy):
    doc = issue(runner, key=None, reason="r")
    assert doc["error"]["class"] == "invalid" and "idempotency key" in doc["error"]["message"]
    assert proxy.seen == []


@pytest.mark.parametrize("reason", ["", "x" * 281, "two\nlines", 5])
def test_issue_credit_refuses_a_bad_reason_and_sends_nothing(runner, proxy, reason):
    assert issue(runner, reason=reason)["error"]["class"] == "invalid" and proxy.seen == []


def test_issue_credit_without_a_route_names_its_grant(runner, monkeypatch):
    no_route(monkeypatch)
    doc = issue(runner)
    assert doc["error"]["class"] == "fatal" and "to issue_credit in [policy.egress]" in doc["error"]["message"]


# -- write_file ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path, resolved", [
    ("report.md", "/output/report.md"),
    ("/output/incident/INC-7.md", "/output/incident/INC-7.md"),
    ("./a//b.txt", "/output/a/b.txt"),
])
def test_write_file_returns_the_file(runner, path, resolved):
    text = "# INC-7\n\ncredited acme-9 with $50 \u2713\n"
    doc = run(runner, "write_file", {"path": path, "content": text})
    assert doc == {"ok": True, "content": {"path": resolved, "bytes": len(text.encode()), "content": text}}


@pytest.mark.parametrize("path", ["/etc/passwd", "/output", "/output/", "/outputs/x", "../x", "a/../../x",
                                  "/output/../etc/x", "a/", "", "a\\b", "a\x00b", "x" * 256, 7])
def test_write_file_refuses_a_bad_path(runner, path):
    assert run(runner, "write_file", {"path": path, "content": "x"})["error"]["class"] == "invalid"


def test_write_file_refuses_too_much_content(runner):
    doc = run(runner, "write_file", {"path": "a.txt", "content": "x" * (64 * 1024 + 1)})
    assert doc["error"]["class"] == "invalid"


# -- the manifests at admission ------------------------------------------------------------------


@pytest.mark.parametrize("path, allowed", [
    ("report.md", True), ("/output/incident/report.md", True),
    ("/etc/passwd", False), ("../etc/passwd", False), ("/output/../etc/passwd", False), ("/outputs/x", False),
    ("/input/greeting.txt", False), ("/tmp/x", False),
])
def test_write_file_paths_are_held_to_output_by_resource_policy(path, allowed):
    decision = check_resources(load_builtin().get("write_file"), {"path": path, "content": "x"})
    assert decision.allowed is allowed, decision.reason
    if not allowed:
        assert "outside /output" in decision.reason


def admit(calls: list[ProposedCall], **policy) -> list:
    config = load_config(overrides={"policy": policy})
    ctx = AdmissionContext(registry=load_builtin(), config=config, policy=PolicyEngine(config.policy),
                           grants=frozenset())
    return admit_batch(calls, ctx)


def test_a_write_outside_output_is_denied_at_admission_before_any_rule():
    # A rule that would allow every write_file: resource policy refuses first, and for good.
    good, bad = admit([ProposedCall("good", "write_file", {"path": "report.md", "content": "x"}),
                       ProposedCall("bad", "write_file", {"path": "/etc/cron.d/x", "content": "x"})],
                      autonomy="autonomous", rules=[{"tool": "write_file", "verdict": "allow"}])
    assert good.verdict is AdmissionVerdict.ALLOW and good.path[-1] == "admitted"
    assert bad.verdict is AdmissionVerdict.DENY and bad.path[-1] == "resource:deny"
    assert "outside /output" in bad.reason


def test_fetch_url_may_only_ever_reach_the_runbooks_service():
    egress = {"fetch_url": ["runbooks.internal.corp", "example.com"]}  # policy grants more than it declares
    ok, other, ledger, ip = admit([
        ProposedCall("ok", "fetch_url", {"url": RUNBOOK_URL}),
        ProposedCall("other", "fetch_url", {"url": "http://example.com/"}),
        ProposedCall("ledger", "fetch_url", {"url": "http://ledger.ringfence.internal/stats"}),
        ProposedCall("ip", "fetch_url", {"url": "http://169.254.169.254/latest/meta-data"}),
    ], autonomy="autonomous", rules=[{"tool": "fetch_url", "verdict": "allow"}], egress=egress)
    assert ok.verdict is AdmissionVerdict.ALLOW
    for refused in (other, ledger, ip):
        assert refused.verdict is AdmissionVerdict.DENY and refused.path[-1] == "resource:deny", refused


def test_issue_credit_is_an_irreversible_mutation_and_asks():
    [d] = admit([ProposedCall("pay", "issue_credit", {"account": "acme-9", "amount": 50, "reason": "INC-7"})],
                autonomy="autonomous", rules=[{"tool": "issue_credit", "verdict": "allow"}])
    assert d.verdict is AdmissionVerdict.ASK  # irreversible: an ALLOW becomes ASK at every autonomy
    [bad] = admit([ProposedCall("pay", "issue_credit", {"account": "acme-9", "amount": 50, "reason": "a\nb"})],
                  autonomy="autonomous", rules=[{"tool": "issue_credit", "verdict": "allow"}])
    assert bad.verdict is AdmissionVerdict.INVALID
