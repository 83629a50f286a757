"""The reviewer's console in a real browser, against a real control plane.

One `ringfence serve` (two tenants, `credit` asked and reaching the ledger container, `echo`
asked so that its arguments and output can carry payloads), one console served in this process
(uvicorn on a free loopback port), and headless Debian chromium driven by Selenium. Agents act
through the `ringfence` Client with their own tokens, as an agent would; reviewers act in the
browser. What is asserted is what happened: the ledger's own count, the agent's observation, the
approval's status as the API reports it.

The security checks each have a red twin: the same attack against a console with the protection
taken away (autoescape and CSP off; the CSRF check a no-op) succeeds, so a check that passes is a
check that would have failed.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from console_support import (
    WAIT_S,
    HttpSession,
    browser,
    console,
    save_screenshot,
    sign_in,
    unlabelled_controls,
    wait,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from serve_support import Served

from ringfence import Client
from ringfence.model import Approval, ApprovalStatus, ObservationStatus, RunView
from ringfence_server.console import csrf
from ringfence_server.console.render import Pages
from ringfence_server.control.config import token_digest

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
# The README's screenshots are these tests' own: `RINGFENCE_SCREENSHOTS=docs/images make test`
# (or pytest tests/console) refreshes them; a plain run writes them under the test's tmp_path only,
# so CI never changes the checkout.
DOCS_IMAGES = ROOT / os.environ["RINGFENCE_SCREENSHOTS"] if os.environ.get("RINGFENCE_SCREENSHOTS") else None
AGENT_A, APPROVER_A, ADMIN_A = "acme-agent-token", "acme-reviewer-token", "acme-admin-token"
AGENT_B, APPROVER_B = "globex-agent-token", "globex-reviewer-token"
LEDGER_HOST = "ledger.ringfence.internal"
XSS = {
    "text": "<script>window.__xss=1</script>",
    "img": '<img src=x onerror="window.__xss=1">',
    "link": "javascript:window.__xss=1",
    "svg": '<svg onload="window.__xss=1"><script>window.__xss=1</script></svg>',
    "html": "</pre><b id=injected>bold</b><a href=javascript:window.__xss=1>click</a>",
}
XSS_GOAL = 'pay <img src=x onerror="window.__xss=1"> then <script>window.__xss=1</script>'
_accounts = itertools.count(200)


def account() -> str:
    return f"acme-{next(_accounts)}"


def write_config(path: Path, ledger: Any) -> Path:
    def tokens(*entries: tuple[str, str, str]) -> str:
        return ", ".join(f'{{ sha256 = "{token_digest(t)}", role = "{role}", subject = "{subject}" }}'
                         for t, role, subject in entries)

    services = ", ".join(f'"{name}" = [{", ".join(chr(34) + a + chr(34) for a in addrs)}]'
                         for name, addrs in ledger.services().items())
    acme = tokens((AGENT_A, "agent", "acme-agent"), (APPROVER_A, "approver", "acme-reviewer"),
                  (ADMIN_A, "admin", "acme-admin"))
    globex = tokens((AGENT_B, "agent", "globex-agent"), (APPROVER_B, "approver", "globex-reviewer"))
    path.write_text(
        "[tenants.acme]\n"
        f"tokens = [{acme}]\n"
        "[tenants.globex]\n"
        f"tokens = [{globex}]\n"
        "[policy.egress]\n"
        f'credit = ["{LEDGER_HOST}"]\n'
        "[egress]\n"
        f"services = {{ {services} }}\n"
        f'networks = ["{ledger.network}"]\n'
        "[[policy.rules]]\n"
        'tool = "credit"\nverdict = "ask"\nwhen = { amount = { lte = 100 } }\n'
        "[[policy.rules]]\n"
        'tool = "credit"\nverdict = "deny"\nwhen = { amount = { gt = 100 } }\n'
        "[[policy.rules]]\n"
        'tool = "echo"\nverdict = "ask"\n'
        "[[policy.rules]]\n"
        'tool = "run_tests"\nverdict = "allow"\n'
    )
    return path


@dataclass
class World:
    server: str
    url: str
    ledger: Any
    driver: Any


@pytest.fixture(scope="module")
def world(docker_client, pinned_images, tmp_path_factory) -> Iterator[World]:
    from ringfence_server.demo_services.ledger.container import Ledger

    tmp = tmp_path_factory.mktemp("console")
    with Ledger(docker_client, lock=pinned_images) as ledger:
        served = Served(write_config(tmp / "ringfence.toml", ledger), tmp / "state")
        try:
            with console(served.address) as url, browser() as driver:
                yield World(served.address, url, ledger, driver)
        finally:
            served.stop()


# -- helpers -------------------------------------------------------------------------------------


def propose(world: World, token: str, goal: str, tool: str, arguments: dict[str, Any], *,
            reviewer: str = APPROVER_A) -> tuple[str, Approval]:
    """An agent starts a run and proposes one call that is asked: (run id, its pending approval,
    as `reviewer` of the same tenant lists it)."""
    with Client(world.server, token) as agent:
        run = agent.start_run(goal)
        [obs] = agent.submit_batch(run.run_id, [{"call_id": "c1", "tool": tool, "arguments": arguments}])
    assert obs.status is ObservationStatus.PENDING_APPROVAL, obs
    return run.run_id, approval(world, obs.approval_id or "", reviewer)


def approval(world: World, approval_id: str, token: str = APPROVER_A) -> Approval:
    with Client(world.server, token) as reviewer:
        return reviewer.get_approval(approval_id)


def run_view(world: World, run_id: str, token: str = AGENT_A) -> RunView:
    with Client(world.server, token) as agent:
        return agent.get_run(run_id)


def eventually(check: Callable[[], Any], what: str) -> Any:
    """Poll until `check()` is truthy (a ceiling of WAIT_S, not a timing assertion)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.2)


def text(driver: Any, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def loaded(driver: Any) -> bool:
    return bool(driver.execute_script("return document.readyState === 'complete'"))


def xss_flag(driver: Any) -> Any:
    return driver.execute_script("return window.__xss")


def open_page(driver: Any, url: str) -> None:
    driver.get(url)
    wait(driver, loaded)


def call_status(driver: Any, call_id: str) -> str:
    rows = driver.find_elements(By.CSS_SELECTOR, f'tr[data-call="{call_id}"] td.status')
    return str(rows[0].text) if rows else ""


def wait_until_executed(driver: Any, call_id: str) -> None:
    """Reload the run page until the call shows executed (the run page is drawn, not live)."""

    def executed(d: Any) -> bool:
        if call_status(d, call_id).startswith("executed"):
            return True
        d.refresh()
        return False

    wait(driver, executed)


# -- the reviewer's work ------------------------------------------------------------------------


def test_an_ask_arrives_live_is_approved_runs_once_and_the_run_page_shows_it(world, tmp_path):
    d = world.driver
    sign_in(d, world.url, APPROVER_A)
    wait(d, lambda d: text(d, "#live-state") == "live.")
    assert unlabelled_controls(d) == []
    d.execute_script("window.__same_page = true")  # gone if the page were reloaded

    acct = account()
    run_id, asked = propose(world, AGENT_A, f"credit {acct} for a late delivery", "credit",
                            {"account": acct, "amount": 7})
    row_css = f'tr[data-approval="{asked.approval_id}"]'
    row = wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, row_css))[0]
    assert d.execute_script("return window.__same_page") is True, "the row came without a reload"
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert cells[:5] == ["credit", run_id, "acme", "acme-agent", "policy:rule[0]:ask"]
    assert cells[6] != "expired"
    save_screenshot(d, tmp_path, "console-inbox.png", DOCS_IMAGES, height=420)

    row.find_element(By.CSS_SELECTOR, "a.open").click()
    wait(d, lambda d: d.current_url.endswith(f"/approvals/{asked.approval_id}"))
    assert text(d, "#digest") == asked.digest
    assert text(d, "#goal") == f"credit {acct} for a late delivery"
    risk = text(d, "#risk")
    assert LEDGER_HOST in risk and "sha256:" in risk and "irreversible yes" in risk
    assert unlabelled_controls(d) == []
    save_screenshot(d, tmp_path, "console-approval.png", DOCS_IMAGES, height=1500)

    d.find_element(By.ID, "approve").click()
    wait(d, lambda d: d.current_url.endswith(f"/runs/{run_id}"))
    assert f"{asked.approval_id} approved" in text(d, ".flash")

    wait_until_executed(d, "c1")
    assert int(world.ledger.balance(acct)["credits"]) == 1
    assert text(d, "#audit").startswith("verified:")
    assert d.find_elements(By.CSS_SELECTOR, "#trace rect")
    assert "execute_tool" in text(d, "#trace") or d.find_elements(By.CSS_SELECTOR, "#trace .kind-execute-tool")
    assert LEDGER_HOST in text(d, "#egress")
    [obs] = run_view(world, run_id).trajectory
    assert obs.status is ObservationStatus.EXECUTED and obs.executed
    save_screenshot(d, tmp_path, "console-run.png", DOCS_IMAGES, height=1500)


def test_a_decline_carries_its_reason_to_the_agent_and_nothing_runs(world):
    d = world.driver
    sign_in(d, world.url, APPROVER_A)
    acct = account()
    run_id, asked = propose(world, AGENT_A, "credit twice by mistake", "credit", {"account": acct, "amount": 9})
    open_page(d, f"{world.url}/approvals/{asked.approval_id}")
    reason = "duplicate of ticket #41 <b>not</b> a new credit"
    d.find_element(By.ID, "reason").send_keys(reason)
    d.find_element(By.ID, "decline").send_keys(Keys.ENTER)  # from the keyboard
    wait(d, lambda d: d.current_url.endswith(f"/runs/{run_id}"))
    [obs] = run_view(world, run_id).trajectory
    assert obs.status is ObservationStatus.DECLINED and not obs.executed
    assert reason in (obs.error or "")
    assert approval(world, asked.approval_id).status is ApprovalStatus.DECLINED
    assert int(world.ledger.balance(acct)["credits"]) == 0


def test_an_ask_decided_elsewhere_leaves_the_inbox_without_a_reload(world):
    d = world.driver
    sign_in(d, world.url, APPROVER_A)
    _, asked = propose(world, AGENT_A, "credit decided from the command line", "credit",
                       {"account": account(), "amount": 6})
    row_css = f'tr[data-approval="{asked.approval_id}"]'
    wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, row_css))
    d.execute_script("window.__same_page = true")
    with Client(world.server, APPROVER_A) as reviewer:
        reviewer.decide_approval(asked.approval_id, False, "decided elsewhere", digest=asked.digest)
    wait(d, lambda d: not d.find_elements(By.CSS_SELECTOR, row_css))
    assert d.execute_script("return window.__same_page") is True


def test_approve_and_remember_lets_the_same_call_run_again_without_asking(world):
    d = world.driver
    sign_in(d, world.url, APPROVER_A)
    run_id, asked = propose(world, AGENT_A, "echo twice", "echo", {"text": "the same words"})
    open_page(d, f"{world.url}/approvals/{asked.approval_id}")
    d.find_element(By.ID, "remember").click()
    wait(d, lambda d: d.current_url.endswith(f"/runs/{run_id}"))
    assert "approved and remembered" in text(d, ".flash")
    with Client(world.server, AGENT_A) as agent:
        eventually(lambda: agent.get_run(run_id).trajectory[0].executed, "the approved echo ran")
        [again] = agent.submit_batch(run_id, [{"call_id": "c2", "tool": "echo",
                                               "arguments": {"text": "the same words"}}])
        [other] = agent.submit_batch(run_id, [{"call_id": "c3", "tool": "echo",
                                               "arguments": {"text": "other words"}}])
    assert again.status is ObservationStatus.EXECUTED and "approval:approved" not in again.verdict_path
    assert other.status is ObservationStatus.PENDING_APPROVAL  # remembered: that exact call only


def test_a_stale_page_is_told_to_look_again(world):
    d = world.driver
    sign_in(d, world.url, APPROVER_A)
    _, asked = propose(world, AGENT_A, "credit, judged on an old page", "credit", {"account": account(), "amount": 3})
    open_page(d, f"{world.url}/approvals/{asked.approval_id}")
    # The page a reviewer judged showed another call than the one pending now.
    d.execute_script("document.querySelectorAll('input[name=digest]').forEach(e => e.value = '0'.repeat(64))")
    d.find_element(By.ID, "approve").click()
    wait(d, lambda d: d.find_elements(By.ID, "problem"))
    assert "This request changed — look again" in text(d, "#problem")
    assert text(d, "#digest") == asked.digest  # the page as it is now
    assert approval(world, asked.approval_id).status is ApprovalStatus.PENDING


FOUR_EYES = "You proposed this call: another person must decide it (four-eyes)."
DECISION_CONTROLS = "#approve, #remember, #decline, #reason, form[action$='/decide']"


def test_four_eyes_the_proposer_is_told_and_offered_no_decision_another_reviewer_is(world):
    d = world.driver
    acct = account()
    run_id, asked = propose(world, ADMIN_A, "an admin's own credit", "credit", {"account": acct, "amount": 4})
    assert asked.proposer == "acme-admin"
    sign_in(d, world.url, ADMIN_A)
    open_page(d, f"{world.url}/approvals/{asked.approval_id}")
    assert text(d, "#four-eyes") == FOUR_EYES
    assert d.find_elements(By.CSS_SELECTOR, DECISION_CONTROLS) == []
    assert text(d, "#digest") == asked.digest  # everything else is shown as to anyone
    assert unlabelled_controls(d) == []

    sign_in(d, world.url, APPROVER_A)  # another person of the same tenant
    open_page(d, f"{world.url}/approvals/{asked.approval_id}")
    assert d.find_elements(By.ID, "four-eyes") == [] and FOUR_EYES not in d.page_source
    assert all(d.find_elements(By.ID, name) for name in ("approve", "remember", "decline", "reason"))
    d.find_element(By.ID, "approve").click()
    wait(d, lambda d: d.current_url.endswith(f"/runs/{run_id}"))
    decided = approval(world, asked.approval_id)
    assert decided.decided_by == "acme-reviewer"
    assert decided.status in (ApprovalStatus.APPROVED, ApprovalStatus.USED)
    eventually(lambda: int(world.ledger.balance(acct)["credits"]) == 1, "the reviewer's approval ran the credit")


def test_four_eyes_a_decision_the_proposer_posts_anyway_is_refused_by_the_server(world):
    """No button is no protection: the proposer posts the decision form by hand, and the control
    plane refuses it; the console shows the server's reason."""
    _, asked = propose(world, ADMIN_A, "an admin's own credit, posted by hand", "credit",
                       {"account": account(), "amount": 4})
    session = HttpSession(world.url)
    session.sign_in(ADMIN_A)
    page = session.request(f"/approvals/{asked.approval_id}")
    assert page.status == 200 and FOUR_EYES in page.body and 'id="approve"' not in page.body
    answer = session.request(f"/approvals/{asked.approval_id}/decide",
                             decide_form(session, asked, decision="approve", reason=""), {"Origin": world.url})
    assert answer.status == 403
    assert "acme-admin proposed this call and cannot decide its approval" in answer.body
    assert FOUR_EYES in answer.body and 'id="approve"' not in answer.body
    assert approval(world, asked.approval_id).status is ApprovalStatus.PENDING


def test_an_approval_of_a_finished_run_still_opens(world):
    """GetApproval: the page reads the one approval, so one of a finished run (declined by the
    system when the run ended) shows, with nothing left to decide."""
    run_id, asked = propose(world, AGENT_A, "credit, then the run ends", "credit", {"account": account(), "amount": 5})
    with Client(world.server, AGENT_A) as agent:
        agent.finish_run(run_id)
    d = world.driver
    sign_in(d, world.url, APPROVER_A)
    open_page(d, f"{world.url}/approvals/{asked.approval_id}")
    assert text(d, "#not-pending") == "This approval is declined: there is nothing to decide."
    assert "system" in text(d, "main dl.facts") and text(d, "#digest") == asked.digest
    assert d.find_elements(By.CSS_SELECTOR, DECISION_CONTROLS) == []
    open_page(d, f"{world.url}/approvals/no-such-approval")
    assert text(d, "h1") == "Not found"


# -- XSS: data is text ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def xss_run(world) -> tuple[str, Approval]:
    """A run whose goal, arguments (names and values) and, once approved, output hold payloads."""
    arguments = {**XSS, XSS["img"]: "a payload as an argument's name"}
    return propose(world, AGENT_A, XSS_GOAL, "echo", arguments)


def assert_shown_as_text(d: Any) -> None:
    wait(d, loaded)
    assert xss_flag(d) is None
    body = d.execute_script("return document.querySelector('main').textContent")
    assert XSS_GOAL in body
    for payload in XSS.values():  # as the JSON the arguments are shown in: the characters, not markup
        assert json.dumps(payload, ensure_ascii=False) in body, payload
    assert d.find_elements(By.CSS_SELECTOR, "main img, main script, main #injected, main pre svg") == []
    assert d.find_elements(By.CSS_SELECTOR, 'a[href^="javascript"]') == []


def test_payloads_in_arguments_goal_and_output_show_as_text_and_never_run(world, xss_run):
    d = world.driver
    run_id, asked = xss_run
    sign_in(d, world.url, APPROVER_A)
    open_page(d, f"{world.url}/approvals/{asked.approval_id}")
    assert_shown_as_text(d)
    d.find_element(By.ID, "approve").click()
    wait(d, lambda d: d.current_url.endswith(f"/runs/{run_id}"))

    wait_until_executed(d, "c1")
    [obs] = run_view(world, run_id).trajectory
    assert obs.content is not None and XSS["svg"] in str(obs.content)  # the output holds them too
    assert_shown_as_text(d)
    assert d.find_elements(By.CSS_SELECTOR, "#trace text")  # the waterfall drew its labels as text


def test_every_response_carries_a_csp_without_inline_script(world):
    for path in ("/signin", "/static/console.js"):
        with urllib.request.urlopen(world.url + path, timeout=30) as r:
            policy = r.headers["content-security-policy"]
            assert r.headers["x-content-type-options"] == "nosniff" and r.headers["x-frame-options"] == "DENY"
        assert "script-src 'self'" in policy and "default-src 'none'" in policy
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy


def test_red_without_autoescape_and_csp_the_payload_runs(world, xss_run):
    """The check above is worth something: take both protections away and the same page runs the payload."""
    run_id, _ = xss_run
    with console(world.server, pages=Pages(autoescape=False), headers={}) as weak, browser() as d:
        sign_in(d, weak, APPROVER_A)
        open_page(d, f"{weak}/runs/{run_id}")
        wait(d, lambda d: xss_flag(d) == 1)


def test_csp_alone_still_stops_the_payload_when_escaping_fails(world, xss_run):
    """Defence in depth: autoescape off, CSP on: the markup is there, and nothing of it runs."""
    run_id, _ = xss_run
    with console(world.server, pages=Pages(autoescape=False)) as weak, browser() as d:
        sign_in(d, weak, APPROVER_A)
        open_page(d, f"{weak}/runs/{run_id}")
        # The injected images exist and have failed to load: an allowed onerror would have run by now.
        wait(d, lambda d: d.execute_script(
            "const i = document.querySelectorAll('main img'); return i.length > 0 && [...i].every(e => e.complete)"))
        assert d.find_elements(By.CSS_SELECTOR, "main #injected")  # the markup did get in
        assert xss_flag(d) is None


# -- CSRF and signed-out requests ----------------------------------------------------------------


def decide_form(session: HttpSession, asked: Approval, **override: str) -> dict[str, str]:
    form = {"csrf_token": session.csrf, "digest": asked.digest, "decision": "decline", "reason": "forged"}
    form.update(override)
    return {k: v for k, v in form.items() if v != "-"}


def test_a_forged_decision_is_refused_and_the_approval_stays_pending(world):
    session = HttpSession(world.url)
    session.sign_in(APPROVER_A)
    _, asked = propose(world, AGENT_A, "credit a forger wants declined", "credit", {"account": account(), "amount": 2})
    path = f"/approvals/{asked.approval_id}/decide"
    attempts = {
        "another origin": (decide_form(session, asked), {"Origin": "http://evil.example"}),
        "another origin by Referer": (decide_form(session, asked), {"Referer": "http://evil.example/page"}),
        "no origin at all": (decide_form(session, asked), {}),
        "no token": (decide_form(session, asked, csrf_token="-"), {"Origin": world.url}),
        "a wrong token": (decide_form(session, asked, csrf_token="x" * 43), {"Origin": world.url}),
    }
    for what, (form, headers) in attempts.items():
        answer = session.request(path, form, headers)
        assert answer.status == 403, what
        assert "refused" in answer.body
    assert approval(world, asked.approval_id).status is ApprovalStatus.PENDING


def test_red_without_the_csrf_check_the_forged_decision_lands(world, monkeypatch):
    session = HttpSession(world.url)
    session.sign_in(APPROVER_A)
    _, asked = propose(world, AGENT_A, "credit a forger declines", "credit", {"account": account(), "amount": 2})
    monkeypatch.setattr(csrf, "check", lambda *args: None)
    answer = session.request(f"/approvals/{asked.approval_id}/decide", decide_form(session, asked, csrf_token="-"),
                             {"Origin": "http://evil.example"})
    assert answer.status == 303
    assert approval(world, asked.approval_id).status is ApprovalStatus.DECLINED


class _EvilPage(BaseHTTPRequestHandler):
    """Another site's page: a form that posts a decision to the console as soon as it loads."""

    target = ""
    fields: dict[str, str] = {}  # noqa: RUF012 - set once per test before serving

    def do_GET(self) -> None:
        inputs = "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in self.fields.items())
        body = (f'<html><body><form id="f" method="post" action="{self.target}">{inputs}</form>'
                '<script>document.getElementById("f").submit()</script></body></html>').encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_cross_site_form_in_the_browser_changes_nothing(world):
    d = world.driver
    sign_in(d, world.url, APPROVER_A)
    _, asked = propose(world, AGENT_A, "credit a cross-site page declines", "credit",
                       {"account": account(), "amount": 2})
    _EvilPage.target = f"{world.url}/approvals/{asked.approval_id}/decide"
    _EvilPage.fields = {"digest": asked.digest, "decision": "decline", "reason": "forged", "csrf_token": "guess"}
    evil = ThreadingHTTPServer(("127.0.0.1", 0), _EvilPage)
    thread = threading.Thread(target=evil.serve_forever, daemon=True)
    thread.start()
    try:
        d.get(f"http://localhost:{evil.server_address[1]}/")  # another site than 127.0.0.1
        wait(d, lambda d: d.current_url.startswith(world.url))
        wait(d, loaded)
    finally:
        evil.shutdown()
        evil.server_close()
        thread.join(10)
    assert approval(world, asked.approval_id).status is ApprovalStatus.PENDING


def test_signed_out_requests_are_sent_to_sign_in(world):
    anonymous = HttpSession(world.url)
    for path in ("/approvals", "/runs", "/tools", "/runs/whatever"):
        answer = anonymous.request(path)
        assert answer.status == 303 and answer.headers["location"].startswith("/signin?next="), path
    assert anonymous.request("/approvals/live").status == 401
    d = world.driver
    d.delete_all_cookies()
    open_page(d, world.url + "/runs")
    assert "/signin" in d.current_url and d.find_elements(By.ID, "token")
    assert unlabelled_controls(d) == []


def test_the_session_cookie_holds_no_token_and_is_httponly_and_strict(world):
    d = world.driver
    sign_in(d, world.url, APPROVER_A)
    [cookie] = d.get_cookies()
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert APPROVER_A not in cookie["value"]
    assert APPROVER_A not in d.page_source
    assert d.execute_script("return document.cookie") == ""
    d.find_element(By.CSS_SELECTOR, "form.signout button").click()
    wait(d, lambda d: "/signin" in d.current_url)
    d.add_cookie({"name": cookie["name"], "value": cookie["value"], "path": "/"})  # the old id, replayed
    open_page(d, world.url + "/approvals")
    assert "/signin" in d.current_url


def test_sign_in_goes_back_only_to_a_page_of_the_console(world):
    for target, lands in (("/runs?status=running", "/runs?status=running"), ("//evil.example/x", "/approvals"),
                          ("https://evil.example/", "/approvals"), ("/\\evil.example", "/approvals")):
        session = HttpSession(world.url)
        session.request("/signin")
        answer = session.request("/signin", {"csrf_token": session.csrf, "token": APPROVER_A, "next": target},
                                 {"Origin": world.url})
        assert answer.status == 303 and answer.headers["location"] == lands, target


def test_a_token_that_cannot_review_does_not_sign_in(world):
    session = HttpSession(world.url)
    session.request("/signin")
    for token, says in ((AGENT_A, "This token (acme-agent, agent, tenant acme) cannot review approvals"),
                        ("no-such-token", "does not know this token")):
        answer = session.request("/signin", {"csrf_token": session.csrf, "token": token, "next": "/approvals"},
                                 {"Origin": world.url})
        assert answer.status == 401 and says in answer.body


# -- tenants, runs, tools ------------------------------------------------------------------------


def test_a_reviewer_of_another_tenant_never_sees_the_ask(world):
    run_id, asked = propose(world, AGENT_A, "acme's own business", "credit", {"account": account(), "amount": 1})
    d = world.driver
    sign_in(d, world.url, APPROVER_B)
    wait(d, lambda d: text(d, "#live-state") == "live.")
    # globex's own ask, asked after acme's: once it has arrived live, acme's would have come first.
    _, own = propose(world, AGENT_B, "globex's business", "credit", {"account": account(), "amount": 1},
                     reviewer=APPROVER_B)
    wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-approval="{own.approval_id}"]'))
    assert asked.approval_id not in d.page_source and run_id not in d.page_source
    open_page(d, f"{world.url}/approvals/{asked.approval_id}")
    assert text(d, "h1") == "Not found"
    open_page(d, f"{world.url}/runs/{run_id}")
    assert text(d, "h1") == "Not found"
    open_page(d, f"{world.url}/runs")
    assert run_id not in d.page_source


def test_runs_are_filtered_and_paged_on_the_server(world):
    with Client(world.server, AGENT_B) as agent:
        ids = [agent.start_run(f"globex run {i}").run_id for i in range(27)]
        agent.finish_run(ids[0])
    d = world.driver
    sign_in(d, world.url, APPROVER_B, then="/runs")
    open_page(d, world.url + "/runs")
    assert unlabelled_controls(d) == []
    first = [a.text for a in d.find_elements(By.CSS_SELECTOR, "#runs tbody a")]
    assert len(first) == 25 and first[0] == ids[-1]  # newest first
    d.find_element(By.ID, "next-page").click()
    wait(d, lambda d: "page_token=" in d.current_url)
    second = [a.text for a in d.find_elements(By.CSS_SELECTOR, "#runs tbody a")]
    assert set(first).isdisjoint(second) and set(first) | set(second) >= set(ids)
    # Filters, chosen from the keyboard-usable form.
    open_page(d, world.url + "/runs")
    d.find_element(By.CSS_SELECTOR, '#outcome option[value="completed"]').click()
    d.find_element(By.CSS_SELECTOR, "form.filters button").click()
    wait(d, lambda d: "outcome=completed" in d.current_url)
    assert [a.text for a in d.find_elements(By.CSS_SELECTOR, "#runs tbody a")] == [ids[0]]


def test_the_tools_page_shows_schema_risk_limits_and_image(world):
    d = world.driver
    sign_in(d, world.url, APPROVER_A, then="/tools")
    open_page(d, world.url + "/tools")
    credit = text(d, "#tool-credit")
    assert LEDGER_HOST in credit and "sha256:" in credit and "memory bytes" in credit
    d.find_element(By.CSS_SELECTOR, "#tool-credit summary").click()
    assert '"account"' in text(d, "#tool-credit pre.json")


def test_a_runs_artifacts_are_listed_and_download_as_the_api_gives_them(world):
    """run_tests leaves its report as an artifact; the run page links it and the link downloads it
    (DownloadFiles with artifacts=True, as the reviewer)."""
    with Client(world.server, AGENT_A) as agent:
        run = agent.start_run("run the tests", workspace=True)
    try:
        check_artifacts(world, run.run_id)
    finally:
        with Client(world.server, AGENT_A) as agent:
            agent.finish_run(run.run_id)  # its workspace (a container and volumes) is removed with it


def check_artifacts(world: World, run_id: str) -> None:
    with Client(world.server, AGENT_A) as agent:
        agent.upload_files(run_id, {"test_ok.py": b"import unittest\n\nclass T(unittest.TestCase):\n"
                                                     b"    def test_ok(self):\n        pass\n"})
        [obs] = agent.submit_batch(run_id, [{"call_id": "tests", "tool": "run_tests", "arguments": {}}])
        assert obs.status is ObservationStatus.EXECUTED, obs
        expected = agent.download_files(run_id, artifacts=True)["reports/tests.txt"]
    d = world.driver
    sign_in(d, world.url, APPROVER_A, then=f"/runs/{run_id}")
    wait(d, lambda d: d.current_url.endswith(f"/runs/{run_id}"))
    [link] = d.find_elements(By.CSS_SELECTOR, "#artifacts a")
    assert link.text == "reports/tests.txt"
    session = HttpSession(world.url)
    session.sign_in(APPROVER_A)
    answer = session.request(urllib.parse.urlsplit(link.get_attribute("href")).path)
    assert answer.status == 200 and answer.headers["content-disposition"] == 'attachment; filename="tests.txt"'
    assert answer.body.encode() == expected
    assert session.request(f"/runs/{run_id}/artifacts/reports/nothing.txt").status == 404
