"""fetch_url: GET one http(s) URL through the call's egress proxy; its status, type and text.

arguments: {"url": "http://runbooks.internal.corp/runbooks/disk-full", "max_bytes"?: int}.
returns {"url", "status", "content_type", "body", "bytes", "truncated"} (+ "location" for a
3xx, which is never followed: its target has not been through admission; propose it again).
The body is text (its charset, else UTF-8, undecodable bytes replaced), at most max_bytes.

The sandbox has no other way out and no resolver: the proxy decides what is reachable, and the
manifest (ringfence_server/control/tools/fetch_url.json) declares the only host it may ever be granted. Errors,
for the runner's retry layer (like credit's):

  no answer (refused, reset, cut mid-reply), 5xx (the server's, or the proxy's 502/504)  transient
  429 (the server's, or the proxy's connection ceiling)                                  rate_limited
  403/407 or any other answer carrying the proxy's X-Ringfence-Reason: refused by it      fatal
  any other 4xx: the request is wrong (a 404 is a URL that names nothing)                invalid
  no route (policy granted this call no egress)                                           fatal
"""

from urllib.parse import urlsplit

from ringfence_tool import ToolError, has_egress, http_request

DEFAULT_MAX = 64 * 1024
HARD_MAX = 256 * 1024


def _check_url(url):
    if not isinstance(url, str) or not url or len(url) > 2048:
        raise ToolError("invalid", "url must be an http(s) URL of at most 2048 characters")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as e:
        raise ToolError("invalid", f"url is malformed: {e}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ToolError("invalid", "url must be an http(s) URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ToolError("invalid", "url must not carry credentials")
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise ToolError("invalid", "url must not contain whitespace or control characters")


def _text(body, content_type):
    charset = "utf-8"
    for param in (content_type or "").split(";")[1:]:
        name, _, value = param.strip().partition("=")
        if name.lower() == "charset" and value:
            charset = value.strip('"').lower()
    try:
        return body.decode(charset, "replace")
    except LookupError:  # a charset Python does not know
        return body.decode("utf-8", "replace")


def _retry_after(value):
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return min(seconds, 60.0) if seconds >= 0 else None


def run(arguments, context):
    url = arguments.get("url")
    _check_url(url)
    max_bytes = arguments.get("max_bytes", DEFAULT_MAX)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 0 < max_bytes <= HARD_MAX:
        raise ToolError("invalid", f"max_bytes must be an integer in (0, {HARD_MAX}]")
    if not has_egress():
        raise ToolError("fatal", f"no route to {urlsplit(url).hostname}: policy granted this call no egress "
                                 "(grant the host to fetch_url in [policy.egress])")
    reply = http_request("GET", url, headers={"User-Agent": "ringfence-fetch_url",
                                              "Accept": "application/json, text/*;q=0.9, */*;q=0.1"},
                         max_reply=max_bytes, follow_redirects=False)
    status, reason = reply.status, reply.proxy_reason
    if 200 <= status < 400 and reason is None:
        content = {"url": url, "status": status, "content_type": reply.content_type,
                   "body": _text(reply.body, reply.content_type), "bytes": len(reply.body),
                   "truncated": reply.truncated}
        if 300 <= status < 400:
            content["location"] = reply.location
        return content
    detail = f" ({reason})" if reason else ""
    if status >= 500:
        raise ToolError("transient", f"{url}: HTTP {status}{detail}")
    if status == 429:
        raise ToolError("rate_limited", f"{url}: HTTP 429{detail}", retry_after_s=_retry_after(reply.retry_after))
    if reason is not None or status == 407:  # only a proxy asks for proxy credentials
        raise ToolError("fatal", f"{url}: refused by the egress proxy: HTTP {status}{detail}")
    if 400 <= status < 500:
        snippet = _text(reply.body[:200], reply.content_type).strip()
        raise ToolError("invalid", f"{url}: HTTP {status}" + (f": {snippet}" if snippet else ""))
    raise ToolError("fatal", f"{url}: unexpected HTTP {status}")
