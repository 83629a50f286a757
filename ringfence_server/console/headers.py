"""The security headers on every response, as a plain ASGI middleware.

The Content-Security-Policy allows scripts and styles from this console's own files only: no
inline script, no inline style, no eval, no plug-ins, no framing, no form posting elsewhere. A
payload that slipped past the templates' escaping still could not run.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CSP", "SECURITY_HEADERS", "SecurityHeaders"]

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")

SECURITY_HEADERS: dict[str, str] = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
    "cache-control": "no-store",  # pages show live approvals and carry CSRF tokens
}


class SecurityHeaders:
    """Adds SECURITY_HEADERS (replacing any the app set) to every HTTP response."""

    def __init__(self, app: ASGIApp, headers: dict[str, str] | None = None) -> None:
        self.app = app
        self.headers = dict(SECURITY_HEADERS if headers is None else headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ours = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]
        names = {k for k, _ in ours}

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": [*kept, *ours]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
