"""The console's parts without a browser or a server: the templates' escaping (and its red twin),
a reconciliation task's wording, the CSRF checks, the sessions' lifetime, the waterfall's layout,
and the `ringfence console` command (its help, the listen rule, serving and stopping)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from console_support import HttpSession, console
from starlette.requests import Request

from ringfence.model import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Identity,
    Role,
    RunStatus,
    RunView,
    ToolRisk,
    Usage,
)
from ringfence_server.console import csrf
from ringfence_server.console.headers import CSP
from ringfence_server.console.render import Pages, approval_summary, arguments_view, risk_rows
from ringfence_server.console.sessions import SessionStore
from ringfence_server.console.waterfall import LABEL_CHARS, layout
from ringfence_server.control.tracing import TraceNode

ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = '<script>window.__xss=1</script><img src=x onerror="window.__xss=1">'


def an_approval(kind: ApprovalKind = ApprovalKind.CALL, **arguments: Any) -> Approval:
    return Approval(approval_id="apr-1", tenant="acme", run_id="run-1", call_id="c1", tool="credit",
                    arguments=arguments or {"account": "acme-1", "amount": 5}, digest="d" * 64,
                    status=ApprovalStatus.PENDING, created_at=time.time(), expires_at=time.time() + 600, kind=kind,
                    proposer="acme-agent", policy_rule="policy:rule[0]:ask",
                    tool_risk=ToolRisk(mutates=True, irreversible=True, egress_hosts=("ledger.ringfence.internal",)))


def approval_page(pages: Pages, approval: Approval, goal: str = "a goal", *, own: bool = False) -> str:
    run = RunView(run_id="run-1", tenant="acme", goal=goal, status=RunStatus.WAITING_APPROVAL, outcome=None,
                  turns=1, trajectory=(), usage=Usage())
    response = pages.render("approval.html", session=None, flash=[], csrf_token="t", path="/approvals/apr-1",
                            approval=approval, summary=approval_summary(approval), run=run, turns=[],
                            events_complete=True, pending=True, reconcile=approval.kind is ApprovalKind.RECONCILE,
                            problem="", stale=False, own=own)
    return bytes(response.body).decode()


def test_arguments_and_goal_are_escaped_and_the_red_twin_is_not():
    page = approval_page(Pages(), an_approval(text=PAYLOAD), goal=PAYLOAD)
    assert "<script>window" not in page and "<img" not in page
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in page
    weak = approval_page(Pages(autoescape=False), an_approval(text=PAYLOAD), goal=PAYLOAD)
    assert "<script>window.__xss=1</script>" in weak  # what the check above would miss without autoescape


def test_a_long_argument_is_folded_and_every_risk_field_shows():
    [arg] = arguments_view({"note": "x" * 500})
    assert arg.folded and len(arg.head) < len(arg.text)
    rows = dict(risk_rows(ToolRisk(mutates=True, egress_hosts=("a.example", "b.example"))))
    assert rows["mutates"] == "yes" and rows["egress hosts"] == "a.example, b.example"
    assert {"image digest", "memory bytes", "timeout s", "paths"} <= rows.keys()


def test_a_reconciliation_task_says_what_approve_and_decline_mean():
    page = approval_page(Pages(), an_approval(ApprovalKind.RECONCILE))
    assert "Did this call happen?" in page
    assert "Approve</strong> if it did <em>not</em> happen: the call is run once now" in page
    assert "Decline</strong> if it <em>did</em> happen" in page
    assert 'id="remember"' not in page  # a reconciliation is never remembered


def test_the_proposers_own_approval_offers_no_decision():
    other = approval_page(Pages(), an_approval())
    assert 'id="approve"' in other and 'id="decline"' in other and 'id="four-eyes"' not in other
    own = approval_page(Pages(), an_approval(), own=True)
    assert "You proposed this call: another person must decide it (four-eyes)." in own
    assert "<form" not in own.split("</header>", 1)[1]  # nothing to post but sign-out (in the header)
    assert 'id="approve"' not in own and 'id="decline"' not in own and 'id="remember"' not in own


def request(headers: dict[str, str]) -> Request:
    return Request({"type": "http", "method": "POST", "scheme": "http", "server": ("127.0.0.1", 8080),
                    "path": "/x", "query_string": b"", "root_path": "",
                    "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]})


@pytest.mark.parametrize(("headers", "token", "refused"), [
    ({"Origin": "http://127.0.0.1:8080", "Host": "127.0.0.1:8080"}, "secret", None),
    ({"Referer": "http://127.0.0.1:8080/approvals/a", "Host": "127.0.0.1:8080"}, "secret", None),
    ({"Origin": "http://evil.example", "Host": "127.0.0.1:8080"}, "secret", "another origin"),
    ({"Origin": "http://127.0.0.1:8081", "Host": "127.0.0.1:8080"}, "secret", "another origin"),
    ({"Origin": "null", "Host": "127.0.0.1:8080"}, "secret", "names no origin"),
    ({"Host": "127.0.0.1:8080"}, "secret", "names no origin"),
    ({"Origin": "http://127.0.0.1:8080", "Host": "127.0.0.1:8080"}, "", "no CSRF token"),
    ({"Origin": "http://127.0.0.1:8080", "Host": "127.0.0.1:8080"}, "secreT", "not this session's"),
])
def test_the_csrf_check(headers, token, refused):
    if refused is None:
        csrf.check(request(headers), "secret", token)
    else:
        with pytest.raises(csrf.CsrfRefused, match=refused):
            csrf.check(request(headers), "secret", token)


def test_sessions_end_when_idle_when_full_and_when_signed_out():
    now = [0.0]
    store = SessionStore(idle_s=60, max_anonymous=2, clock=lambda: now[0])
    a = store.new()
    assert store.get(a.session_id) is a and a.csrf and a.csrf != a.session_id
    now[0] = 61
    assert store.get(a.session_id) is None  # idle too long
    b, c = store.new(), store.new()
    d = store.new()  # full: the least recently used goes
    assert store.get(b.session_id) is None and store.get(c.session_id) is c and store.get(d.session_id) is d
    store.end(c)
    assert store.get(c.session_id) is None and len(store) == 1
    assert store.get(None) is None and store.get("") is None


def test_a_flood_of_anonymous_sessions_never_signs_a_reviewer_out():
    store = SessionStore(max_sessions=2, max_anonymous=3)
    alice = Identity("acme", "alice", Role.APPROVER)
    reviewer = store.new(client=object(), identity=alice)  # type: ignore[arg-type]  # a stand-in client
    for _ in range(50):
        store.new()
    assert store.get(reviewer.session_id) is reviewer and len(store) == 4
    assert (reviewer.identity, reviewer.role) == (alice, "approver")


def test_the_waterfall_lays_spans_out_in_order_with_labels_cut():
    root = TraceNode("invoke_agent", 100.0, 102.0, title=("run r-1",), children=(
        TraceNode("batch", 100.5, 101.5, title=("r-1.t1", "x" * 200)),
        TraceNode("credit", 100.6, None, labels=("ask",)),
    ))
    w = layout(root)
    assert [b.kind for b in w.bars] == ["invoke-agent", "batch", "other"]
    assert w.bars[0].x == 0 and w.bars[0].width == w.chart_width
    assert w.bars[1].x == pytest.approx(w.chart_width / 4) and w.bars[2].instant
    assert all(len(b.text) <= LABEL_CHARS for b in w.bars)
    assert w.height > 3 * 22


def console_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "ringfence.cli", "console", *args]


def test_the_command_explains_itself():
    out = subprocess.run(console_command("--help"), capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0
    for words in ("--listen", "--server", "--tls-cert", "--server-tls-ca", "no authority of its", "TLS only"):
        assert words in " ".join(out.stdout.split()), words


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "10.1.2.3:8443", "[::]:0", "console.example:8443"])
def test_the_command_refuses_a_non_loopback_listen_without_tls(listen):
    out = subprocess.run(console_command("--listen", listen, "--server", "127.0.0.1:1"), capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2
    assert "refusing to serve the console" in out.stderr and "without TLS" in out.stderr


def test_the_command_serves_on_loopback_and_stops_on_sigterm():
    proc = subprocess.Popen(console_command("--listen", "127.0.0.1:0", "--server", "127.0.0.1:1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the command prints its address first (then only "stopped")
        assert first.startswith("ringfence: console on http://127.0.0.1:"), first
        url = first.split(" on ", 1)[1].split()[0]
        with urllib.request.urlopen(url + "/signin", timeout=30) as r:
            assert r.status == 200 and r.headers["content-security-policy"] == CSP
            assert "HttpOnly" in r.headers["set-cookie"] and "SameSite=strict" in r.headers["set-cookie"]
            # Plain HTTP on loopback: a Secure cookie would never come back.
            assert "Secure" not in r.headers["set-cookie"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert proc.stdout.read().strip() == "ringfence: console stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_with_tls_the_command_serves_off_loopback_and_the_cookie_is_secure(tmp_path):
    import ssl

    cert, key = tmp_path / "console.pem", tmp_path / "console-key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    proc = subprocess.Popen(console_command("--listen", "0.0.0.0:0", "--tls-cert", str(cert), "--tls-key", str(key),
                                            "--server", "127.0.0.1:1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("ringfence: console on https://0.0.0.0:"), first + (proc.stderr.read() if
                                                                                   proc.poll() is not None else "")
        port = first.split(" on ", 1)[1].split()[0].rsplit(":", 1)[1]
        context = ssl.create_default_context(cafile=str(cert))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/signin", timeout=30, context=context) as r:
            cookie = r.headers["set-cookie"]
        assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_without_a_control_plane_sign_in_says_so_and_keeps_no_session():
    with console("127.0.0.1:1", timeout=2.0) as url:
        session = HttpSession(url)
        session.request("/signin")
        answer = session.request("/signin", {"csrf_token": session.csrf, "token": "any", "next": "/approvals"},
                                 {"Origin": url})
        assert answer.status == 401 and "could not be asked" in answer.body
        assert session.request("/approvals").status == 303  # still signed out


def test_an_egress_rows_other_facts_leave_out_empty_ones_and_show_the_proxys_clock_as_utc():
    from ringfence_server.console.runview import EgressRow

    row = EgressRow(call_id="c1", attempt=1, decision={
        "decision": "allowed", "host": "ledger.ringfence.internal", "cut": None, "note": "",
        "ts": 1796664478.182, "service": True, "call_id": "c1"})
    assert row.rest == [("service", "True"), ("ts", "17:27:58.182 UTC")]
