"""Cross-site request forgery: every state-changing request must prove it came from our page.

Two checks, both required:
- the form carries the session's CSRF token (a hidden field every form on every page has),
  compared in constant time;
- the request's Origin (or, when a browser sends none, its Referer) is this console's own
  origin. A request that carries neither is refused: browsers send Origin on every POST.

The session cookie is SameSite=Strict as well, so a browser does not even attach it to a
cross-site request; these checks hold without relying on that.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from starlette.requests import Request

__all__ = ["CsrfRefused", "check", "own_origin"]


class CsrfRefused(Exception):
    """The request is refused with 403; the message says which check failed."""


def own_origin(request: Request) -> str:
    """scheme://host[:port] of this console as the browser addressed it."""
    url = request.url
    return f"{url.scheme}://{url.netloc}".lower()


def _origin_of(value: str) -> str:
    parts = urlsplit(value)
    return f"{parts.scheme}://{parts.netloc}".lower()


def check(request: Request, expected_token: str, sent_token: object) -> None:
    """Raise CsrfRefused unless the request is same-origin and carries the session's token."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        referer = request.headers.get("referer")
        if not referer:
            raise CsrfRefused("the request names no origin (no Origin or Referer header)")
        origin = _origin_of(referer)
    if origin.lower() != own_origin(request):
        raise CsrfRefused("the request comes from another origin")
    if not isinstance(sent_token, str) or not sent_token:
        raise CsrfRefused("the form carries no CSRF token")
    if not hmac.compare_digest(sent_token.encode(), expected_token.encode()):
        raise CsrfRefused("the form's CSRF token is not this session's")
