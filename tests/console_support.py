"""Shared helpers of the console's tests (tests/console/): a console served in this process (so a
red check can weaken it), headless Debian chromium driven by Selenium through Debian's
chromedriver (never a driver Selenium Manager would fetch), and a plain HTTP session that signs in
as a browser would (for requests a browser would not send: another origin, no CSRF token).

Everything started here is stopped by the context manager or the method that started it.
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringfence_server.console.app import Console, ConsoleSettings, create_app
from ringfence_server.console.render import Pages
from ringfence_server.console.server import ConsoleServer
from ringfence_server.console.throttle import SignInThrottle

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 60.0
"""How long a browser wait may take before it fails (never a timing assertion: a ceiling)."""


@contextmanager
def console(server: str, *, pages: Pages | None = None, headers: dict[str, str] | None = None,
            timeout: float = 30.0) -> Iterator[str]:
    """A console for the control plane at `server`, on a free loopback port; yields its URL."""
    with console_app(server, pages=pages, headers=headers, timeout=timeout) as (url, _):
        yield url


@contextmanager
def console_app(server: str, *, pages: Pages | None = None, headers: dict[str, str] | None = None,
                timeout: float = 30.0, throttle: SignInThrottle | None = None) -> Iterator[tuple[str, Console]]:
    """As console(), yielding its URL and the app's state (to wrap its client factory, say);
    `throttle` replaces the sign-in throttle (one with a clock the test moves)."""
    app = create_app(ConsoleSettings(server=server, timeout=timeout), pages=pages, headers=headers,
                     throttle=throttle)
    served = ConsoleServer(app, "127.0.0.1", 0)
    served.start_in_thread()
    try:
        yield served.url, app.state.console
    finally:
        served.stop()


@contextmanager
def browser() -> Iterator[Any]:
    """Headless chromium (Debian's), quit at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--disable-gpu", "--window-size=1280,1000", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-default-apps"):
        options.add_argument(arg)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # chromium refuses to run as root with its sandbox
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: Any, condition: Any, timeout: float = WAIT_S) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition)


def sign_in(driver: Any, url: str, token: str, then: str = "/approvals") -> None:
    """Sign in through the form, by keyboard only (the token field has focus; Enter submits)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.delete_all_cookies()
    driver.get(url + then)
    wait(driver, lambda d: d.current_url.startswith(url + "/signin"))
    field = driver.switch_to.active_element
    assert field.get_attribute("id") == "token", "the token field has the focus"
    field.send_keys(token + Keys.ENTER)
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "form.signout"))


def unlabelled_controls(driver: Any) -> list[str]:
    """The form controls on the page a person cannot name: no <label for>, no aria-label."""
    found: list[str] = driver.execute_script("""
        return Array.from(document.querySelectorAll('input, select, textarea, button'))
          .filter(e => e.type !== 'hidden')
          .filter(e => {
            if (e.getAttribute('aria-label') || e.getAttribute('aria-labelledby')) return false;
            if (e.tagName === 'BUTTON') return !e.textContent.trim();
            return !(e.id && document.querySelector('label[for="' + CSS.escape(e.id) + '"]'));
          })
          .map(e => e.outerHTML.slice(0, 120));""")
    return found


@dataclass
class Answer:
    status: int
    url: str
    headers: dict[str, str]
    body: str


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class HttpSession:
    """A cookie jar and the requests of one person's session, without following redirects."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect())
        self.csrf = ""

    def request(self, path: str, form: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> Answer:
        data = None if form is None else urllib.parse.urlencode(form).encode()
        req = urllib.request.Request(self.url + path, data=data, headers=headers or {})
        try:
            with self.opener.open(req, timeout=60) as r:
                answer = Answer(r.status, r.url, dict(r.headers.items()), r.read().decode())
        except urllib.error.HTTPError as e:
            answer = Answer(e.code, e.url, dict(e.headers.items()), e.read().decode())
        token = re.search(r'name="csrf_token" value="([^"]+)"', answer.body)
        if token:
            self.csrf = token.group(1)
        return answer

    def sign_in(self, token: str) -> Answer:
        self.request("/signin")
        answer = self.request("/signin", {"csrf_token": self.csrf, "token": token, "next": "/approvals"},
                              {"Origin": self.url})
        assert answer.status == 303 and answer.headers["location"] == "/approvals", answer.body[-800:]
        self.request("/approvals")  # the new session's CSRF token
        return answer


def save_screenshot(driver: Any, folder: Path, name: str, docs: Path | None = None, *,
                    height: int = 1000) -> Path:
    """A PNG of the page (its top `height` pixels) under `folder` (the test's output), copied to
    `docs` when given."""
    path = folder / name
    driver.set_window_size(1280, height)
    try:
        driver.save_screenshot(str(path))
    finally:
        driver.set_window_size(1280, 1000)
    if docs is not None:
        docs.mkdir(parents=True, exist_ok=True)
        (docs / name).write_bytes(path.read_bytes())
    return path
