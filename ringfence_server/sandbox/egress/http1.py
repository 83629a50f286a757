"""HTTP/1 as the egress proxy speaks it: request heads in, refusals and forwarded heads out.

    parse_head(head) -> Request          one request head (up to and including CRLF CRLF)
    split_hostport(text, default_port)   "host[:port]" / "[v6][:port]" -> (host, port)
    refusal(deny) -> bytes               the proxy's answer to a refused request
    forward_head(...) -> bytes           a plain HTTP request as sent upstream (origin form)

Strict on purpose, and small: the proxy reads one head per client connection, never a
chunked body, never a second request, so it needs no general HTTP/1 machinery (and its image
has no pip: it is stdlib only). Malformed input is a Deny (400), never a guess.

Stdlib only; runs inside the egress-proxy image as rfegress.http1.
"""

from __future__ import annotations

from dataclasses import dataclass

from .allowlist import PatternError, check_port
from .errors import Deny

MAX_HEAD = 16 * 1024
HEAD_END = b"\r\n\r\n"
CONNECT_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authorization", "proxy-authenticate", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade",
})
PHRASES = {200: "OK", 400: "Bad Request", 403: "Forbidden", 407: "Proxy Authentication Required",
           405: "Method Not Allowed", 429: "Too Many Requests", 501: "Not Implemented",
           502: "Bad Gateway", 504: "Gateway Timeout"}


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def header_values(self, name: str) -> list[str]:
        """Every value of header `name` (lower case), in order."""
        return [v for k, v in self.headers if k.lower() == name]


def parse_head(head: bytes) -> Request:
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as e:  # latin-1 decodes everything; kept for clarity
        raise Deny(400, "bad_request") from e
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Deny(400, "bad_request", "malformed request line")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        if line[0] in " \t" or ":" not in line:
            raise Deny(400, "bad_request", "malformed header line")
        name, value = line.split(":", 1)
        if not name or name != name.strip() or any(c in name for c in " \t"):
            raise Deny(400, "bad_request", "malformed header name")
        headers.append((name, value.strip()))
    return Request(parts[0], parts[1], parts[2], headers)


def split_hostport(text: str, default_port: int | None) -> tuple[str, int]:
    """`default_port` None: the port is required (a CONNECT target)."""
    port_text: str | None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise Deny(400, "bad_host")
        host, rest = text[: end + 1], text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise Deny(400, "bad_host")
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, port_text = text.split(":", 1)
    elif ":" in text:
        # An unbracketed IPv6 literal: a host that is an address either way.
        host, port_text = text, None
    else:
        host, port_text = text, None
    if port_text is None:
        if default_port is None:
            raise Deny(400, "bad_request", "CONNECT needs host:port")
        return host, default_port
    try:
        return host, check_port(port_text)
    except PatternError as e:
        raise Deny(400, "bad_port", str(e)) from e


def refusal(d: Deny) -> bytes:
    """The whole answer to a refused request: status, reason header, a one-line body."""
    body = f"ringfence egress proxy: denied ({d.reason})\n".encode()
    extra = 'Proxy-Authenticate: Basic realm="ringfence"\r\n' if d.status == 407 else ""
    head = (f"HTTP/1.1 {d.status} {PHRASES.get(d.status, 'Error')}\r\n"
            f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            f"X-Ringfence-Reason: {d.reason}\r\n{extra}Connection: close\r\n\r\n")
    return head.encode() + body


def forward_head(method: str, path: str, host_field: str, headers: list[tuple[str, str]]) -> bytes:
    """The request head sent upstream: origin form, our Host, no hop-by-hop headers, one request."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host_field}"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() not in HOP_BY_HOP and k.lower() != "host"]
    lines += ["Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")
