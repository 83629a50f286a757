"""The reviewer's console as people start it: `ringfence serve --console` (beside the control
plane, in its process) and `ringfence demo --console` (the reference demo with a person as its
approver). The console's own behaviour (pages, sessions, CSRF, CSP, XSS) is tested with a real
browser in tests/console/; here, that the commands serve it, refuse what they must, and that a
decision made through it is the one the agent gets and the ledger applies.
"""

from __future__ import annotations

import hashlib
import html
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from console_support import HttpSession
from serve_support import Served

from ringfence import Client
from ringfence.model import ApprovalStatus

pytestmark = pytest.mark.docker

RINGFENCE = str(Path(sys.executable).with_name("ringfence"))
APPROVER = "demo-approver-token"


def test_serve_console_signs_in_an_approver_and_shows_tools_risk(docker_client, pinned_images, tmp_path):
    served = Served(None, tmp_path / "state", "--console", "127.0.0.1:0")
    try:
        url = served.line_starting("ringfence: console on ").split(" on ", 1)[1].rstrip("/")
        assert url.startswith("http://127.0.0.1:")
        person = HttpSession(url)
        assert person.request("/approvals").status == 303  # signed out: to the sign-in page
        person.sign_in(APPROVER)
        tools = person.request("/tools")
        assert tools.status == 200 and "issue_credit" in tools.body
        # The risk an approver is given (ListTools for approvers), drawn by the console.
        assert "irreversible" in tools.body and "image digest" in tools.body and "sha256:" in tools.body
        assert "script-src 'self'" in tools.headers["content-security-policy"]
        # An agent's token is no reviewer's: refused at sign-in.
        agent = HttpSession(url)
        agent.request("/signin")
        refused = agent.request("/signin", {"csrf_token": agent.csrf, "token": "demo-agent-token",
                                            "next": "/approvals"}, {"Origin": url})
        assert refused.status != 303 and agent.request("/approvals").status == 303
    finally:
        assert served.stop() == 0


@pytest.mark.parametrize(("extra", "own_tokens", "says"), [
    # Off loopback: the embedded config's public demo tokens are refused first ...
    (("--console", "0.0.0.0:0"), False, "refusing to serve the public demo tokens"),
    # ... and with tokens of one's own, clear text is.
    (("--console", "0.0.0.0:0"), True, "refusing --console 0.0.0.0:0 without TLS"),
    (("--console", "localhost"), False, "--console"),  # not HOST:PORT
])
def test_serve_refuses_a_console_it_cannot_serve_safely(tmp_path, extra, own_tokens, says):
    config = []
    if own_tokens:
        digest = hashlib.sha256(b"a-private-reviewer-token").hexdigest()
        (tmp_path / "ringfence.toml").write_text(
            f'[tenants.acme]\ntokens = [{{ sha256 = "{digest}", role = "approver" }}]\n')
        config = ["--config", str(tmp_path / "ringfence.toml")]
    proc = subprocess.run([RINGFENCE, "serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"),
                           *config, *extra], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr and "serving" not in proc.stdout, proc.stderr


def test_demo_console_a_person_decides_and_the_ledger_applies_that(docker_client, pinned_images, tmp_path):
    proc = subprocess.Popen([RINGFENCE, "demo", "--console", "127.0.0.1:0", "--workdir", str(tmp_path / "demo")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    more = threading.Condition()

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            with more:
                lines.append(raw.rstrip("\n"))
                more.notify_all()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def line(prefix: str) -> str:
        with more:
            assert more.wait_for(lambda: any(x.startswith(prefix) for x in lines) or proc.poll() is not None, 240)
            found = [x for x in lines if x.startswith(prefix)]
        assert found, lines[-20:]
        return found[0]

    try:
        address = line("control plane").split()[2]
        url = line("console ").split()[1].rstrip("/")
        person = HttpSession(url)
        person.sign_in(APPROVER)
        decided: dict[float, str] = {}
        with Client(address, APPROVER) as api:
            for _ in range(2):  # $500, then $50: the scripted agent asks one after the other
                pending = _next_pending(api, set(decided.values()))
                amount = float(pending.arguments["amount"])
                page = person.request(f"/approvals/{pending.approval_id}")
                assert page.status == 200 and pending.digest in page.body
                digest = re.search(r'name="digest" value="([^"]+)"', page.body)
                assert digest is not None and html.unescape(digest.group(1)) == pending.digest
                form = {"csrf_token": person.csrf, "digest": pending.digest}
                if amount > 100:
                    form |= {"decision": "decline", "reason": "over the limit for a double charge"}
                else:
                    form |= {"decision": "remember"}
                answer = person.request(f"/approvals/{pending.approval_id}/decide", form, {"Origin": url})
                assert answer.status == 303, answer.body[-2000:]
                decided[amount] = pending.approval_id
        assert proc.wait(300) == 0, "\n".join(lines[-30:]) + (proc.stderr.read() if proc.stderr else "")
        reader.join(10)
        out = "\n".join(lines)
        assert "approvals       asked 2: $500 declined, $50 approved (decided in the console)" in out
        assert "credits     ['acme-9:50.0']" in out  # read from the ledger itself
        assert re.search(r"ledger +1 credit\(s\) applied", out)
        assert sorted(decided) == [50.0, 500.0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def _next_pending(api: Client, seen: set[str]):
    """The next approval asked that was not decided yet (the agent proposes it after the last)."""
    for approval in api.watch_approvals(timeout=240):
        if approval.status is ApprovalStatus.PENDING and approval.approval_id not in seen:
            return approval
    raise AssertionError("the approvals stream ended before the next request")
