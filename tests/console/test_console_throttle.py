"""The sign-in throttle: its windows, its global cap, its bounded table and what a success does
(a clock moved by hand); then over HTTP, a console served in this process in front of a real
`ringfence serve`: after N wrong tokens the next attempt - the right token - is refused with 429
and Retry-After and nothing reaches the control plane; once the window has passed the right
token signs in. The red twin: with the throttle a no-op, the same attempt reaches the control
plane again.

What reaches the control plane is counted at the console's one way to it: every AsyncClient the
console's module makes is a counting subclass, and each RPC it sends (AsyncClient._send, the one
path of every call) is counted. Zero clients made and zero RPCs sent is "the control plane was
not asked".
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_support import HttpSession, console_app
from serve_support import Served

from ringfence import AsyncClient
from ringfence_server.console import app as console_module
from ringfence_server.console.throttle import Admitted, Refused, SignInThrottle, ThrottleSettings

ROOT = Path(__file__).resolve().parents[2]
RIGHT = "demo-approver-token"
"""An approver of the embedded defaults' demo tenant."""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def refused(outcome: Admitted | Refused) -> Refused:
    assert isinstance(outcome, Refused), outcome
    return outcome


# -- the throttle alone --------------------------------------------------------------------------


def test_an_address_is_refused_after_n_failures_until_the_oldest_leaves_the_window():
    clock = Clock()
    t = SignInThrottle(ThrottleSettings(failures=3, window_s=10), clock=clock)
    for step in range(3):
        clock.now = 1000.0 + step
        assert isinstance(t.admit("10.0.0.1"), Admitted)
    no = refused(t.admit("10.0.0.1"))
    assert (no.retry_after_s, no.everyone) == (8, False)  # the failure at 1000 leaves at 1010
    assert no.message == "Too many failed sign-ins from this address; try again in 8 s"
    assert isinstance(t.admit("10.0.0.2"), Admitted)  # another address is not held back
    clock.now = 1009.99
    assert refused(t.admit("10.0.0.1")).retry_after_s == 1  # never "try again in 0 s"
    clock.now = 1010.0  # the window's edge: the first failure no longer counts
    assert isinstance(t.admit("10.0.0.1"), Admitted)
    assert refused(t.admit("10.0.0.1")).retry_after_s == 1  # now 1001, 1002, 1010: 1001 leaves at 1011


def test_the_global_cap_holds_across_addresses():
    clock = Clock()
    t = SignInThrottle(ThrottleSettings(failures=100, global_failures=4, global_window_s=60), clock=clock)
    for n in range(4):
        assert isinstance(t.admit(f"10.0.0.{n}"), Admitted)
    no = refused(t.admit("10.9.9.9"))  # a fresh address: refused all the same
    assert (no.retry_after_s, no.everyone) == (60, True)
    assert "from all addresses" in no.message
    clock.now += 59.5
    assert refused(t.admit("10.9.9.9")).retry_after_s == 1
    clock.now += 0.5
    assert isinstance(t.admit("10.9.9.9"), Admitted)


def test_the_table_of_addresses_is_bounded_and_forgets_the_least_recently_failed():
    t = SignInThrottle(ThrottleSettings(failures=2, global_failures=10_000, max_addresses=3), clock=Clock())
    t.admit("a"), t.admit("a")
    refused(t.admit("a"))
    for n in range(1000):  # a flood of addresses
        t.admit(f"flood-{n}")
        assert len(t) <= 3
    assert isinstance(t.admit("a"), Admitted)  # forgotten (the global cap is what holds then)


def test_a_success_is_not_a_failure_but_does_not_wipe_earlier_failures():
    t = SignInThrottle(ThrottleSettings(failures=2), clock=Clock())
    for _ in range(10):  # a reviewer signing in again and again is never held back
        attempt = t.admit("10.0.0.1")
        assert isinstance(attempt, Admitted)
        t.succeeded(attempt)
    assert len(t) == 0
    t.admit("10.0.0.1")  # a wrong token
    ok = t.admit("10.0.0.1")
    assert isinstance(ok, Admitted)
    t.succeeded(ok)  # a right one: only it is taken back ...
    assert isinstance(t.admit("10.0.0.1"), Admitted)  # ... the wrong one still counts: 2 failures now
    refused(t.admit("10.0.0.1"))


def test_attempts_in_flight_count_so_a_concurrent_burst_cannot_pass_together():
    t = SignInThrottle(ThrottleSettings(failures=3), clock=Clock())
    outcomes = [t.admit("10.0.0.1") for _ in range(10)]  # none answered yet
    assert sum(isinstance(o, Admitted) for o in outcomes) == 3


@pytest.mark.parametrize("bad", [{"failures": 0}, {"global_failures": 0}, {"window_s": 0},
                                 {"global_window_s": -1}, {"max_addresses": 0}])
def test_settings_refuse_nonsense(bad):
    with pytest.raises(ValueError):
        ThrottleSettings(**bad)


def test_the_command_takes_the_limits_and_refuses_nonsense():
    help_text = subprocess.run([sys.executable, "-m", "ringfence.cli", "console", "--help"], capture_output=True,
                               text=True, timeout=60, cwd=ROOT).stdout
    for words in ("--signin-failures", "--signin-window", "--signin-global", "the global cap is what protects"):
        assert words in " ".join(help_text.split()), words
    out = subprocess.run([sys.executable, "-m", "ringfence.cli", "console", "--listen", "127.0.0.1:0", "--server",
                          "127.0.0.1:1", "--signin-failures", "0"], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert out.returncode == 2 and "--signin-failures" in out.stderr


# -- over HTTP, in front of a real control plane -------------------------------------------------


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory) -> Iterator[str]:
    """A real `ringfence serve` on the embedded defaults (no Docker needed to sign in)."""
    served = Served(None, tmp_path_factory.mktemp("throttle") / "state")
    try:
        yield served.address
    finally:
        served.stop()


class Reached:
    """What the console sent the control plane: the clients it made, the RPCs they sent."""

    def __init__(self) -> None:
        self.clients = 0
        self.rpcs = 0


@pytest.fixture
def reached(monkeypatch) -> Reached:
    seen = Reached()

    class Counting(AsyncClient):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            seen.clients += 1
            super().__init__(*args, **kwargs)

        async def _send(self, *args: Any, **kwargs: Any) -> Any:
            seen.rpcs += 1
            return await super()._send(*args, **kwargs)  # type: ignore[misc]

    monkeypatch.setattr(console_module, "AsyncClient", Counting)
    return seen


def post_token(session: HttpSession, token: str) -> Any:
    return session.request("/signin", {"csrf_token": session.csrf, "token": token, "next": "/approvals"},
                           {"Origin": session.url})


def test_after_n_wrong_tokens_even_the_right_one_is_refused_unasked_until_the_window_passes(control_plane,
                                                                                            reached):
    clock = Clock()
    settings = ThrottleSettings()  # the defaults: 5 failures per 300 s per address
    with console_app(control_plane, throttle=SignInThrottle(settings, clock=clock)) as (url, _):
        session = HttpSession(url)
        session.request("/signin")
        for n in range(settings.failures):
            answer = post_token(session, f"wrong-token-{n}")
            assert answer.status == 401 and "does not know this token" in answer.body, answer.body[-600:]
            clock.now += 1
        assert reached.clients == settings.failures and reached.rpcs == settings.failures  # WhoAmI each

        answer = post_token(session, RIGHT)
        assert answer.status == 429, answer.body[-600:]
        assert answer.headers["retry-after"] == "295"  # the first failure (5 s ago) leaves the window in 295 s
        assert "Too many failed sign-ins from this address; try again in 295 s" in answer.body
        assert (reached.clients, reached.rpcs) == (settings.failures, settings.failures)  # nothing reached it
        assert session.request("/approvals").status == 303  # still signed out

        clock.now += 295  # the window has passed for the first failure
        answer = post_token(session, RIGHT)
        assert answer.status == 303 and answer.headers["location"] == "/approvals", answer.body[-600:]
        assert reached.rpcs == settings.failures + 2  # WhoAmI, ListApprovals
        assert session.request("/approvals").status == 200


def test_red_twin_without_the_throttle_the_next_attempt_reaches_the_control_plane(control_plane, reached,
                                                                                  monkeypatch):
    clock = Clock()
    monkeypatch.setattr(SignInThrottle, "admit", lambda self, address: Admitted(address, clock()))
    settings = ThrottleSettings()
    with console_app(control_plane, throttle=SignInThrottle(settings, clock=clock)) as (url, _):
        session = HttpSession(url)
        session.request("/signin")
        for n in range(settings.failures):
            assert post_token(session, f"wrong-token-{n}").status == 401
        asked = reached.rpcs
        answer = post_token(session, RIGHT)
        assert answer.status == 303  # no 429: the attempt went through ...
        assert reached.rpcs == asked + 2  # ... and the control plane was asked (what the check above rules out)


def test_an_attempt_the_control_plane_never_answered_is_not_a_failure():
    throttle = SignInThrottle(ThrottleSettings(failures=2), clock=Clock())
    with console_app("127.0.0.1:1", timeout=2.0, throttle=throttle) as (url, _):
        session = HttpSession(url)
        session.request("/signin")
        for _ in range(3):  # more than `failures`: a reviewer retrying while the server is down is not locked out
            answer = post_token(session, RIGHT)
            assert answer.status == 401 and "could not be asked" in answer.body, answer.body[-600:]
    assert len(throttle) == 0
