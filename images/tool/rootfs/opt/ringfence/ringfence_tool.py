"""What a tool module may import from the runner: the classified error it can raise, HTTP
helpers for tools that talk to a receiver through the call's egress proxy, and `load_tool` for
a tool that reuses another's code.

A tool's `run(arguments, context)` returns JSON-able content, or raises ToolError with one of
CLASSES. Any other exception is reported as "fatal" (never retried).
"""

import os
import re
import stat
import sys

CLASSES = ("invalid", "transient", "rate_limited", "fatal")
MAX_REPLY = 1024 * 1024
TOOLS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools")
TOOL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


class ToolError(Exception):
    def __init__(self, cls, message, retry_after_s=None):
        if cls not in CLASSES:
            raise ValueError(f"error class must be one of {CLASSES}, not {cls!r}")
        if retry_after_s is not None and (
            isinstance(retry_after_s, bool) or not isinstance(retry_after_s, (int, float)) or retry_after_s < 0
        ):
            raise ValueError("retry_after_s must be a non-negative number or None")
        super().__init__(message)
        self.cls = cls
        self.message = str(message)
        self.retry_after_s = retry_after_s


def has_egress():
    """Did policy grant this call a way out? Only then does the sandbox name a proxy."""
    return bool(os.environ.get("HTTP_PROXY") or os.environ.get("http_proxy"))


def load_tool(name):
    """The module of tool `name` (tools/<name>.py), loaded by file path, never through sys.path.
    Only a regular file: a symlink could point anywhere. The runner loads every tool through
    here; a tool may too, to reuse another's code (issue_credit reuses credit's)."""
    import importlib.util

    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise ToolError("invalid", "tool must be a name matching [a-z][a-z0-9_]*")
    module_name = "ringfence_tools_" + name
    path = os.path.join(TOOLS_DIR, name + ".py")
    try:
        st = os.lstat(path)
    except OSError:
        raise ToolError("invalid", f"unknown tool {name!r}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ToolError("invalid", f"unknown tool {name!r}")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


class Reply:
    """One HTTP answer: status, its Content-Type, Retry-After and Location headers (or None),
    at most `max_reply` bytes of its body (`truncated` when there was more), and the egress
    proxy's reason (X-Ringfence-Reason) when the proxy, not the receiver, answered."""

    __slots__ = ("status", "content_type", "retry_after", "location", "body", "truncated", "proxy_reason")

    def __init__(self, status, headers, raw, max_reply):
        self.status = status
        self.content_type = headers.get("Content-Type") if headers is not None else None
        self.retry_after = headers.get("Retry-After") if headers is not None else None
        self.location = headers.get("Location") if headers is not None else None
        self.proxy_reason = headers.get("X-Ringfence-Reason") if headers is not None else None
        self.body = raw[:max_reply]
        self.truncated = len(raw) > max_reply


def http_request(method, url, body=None, headers=None, timeout=10.0, max_reply=MAX_REPLY, follow_redirects=True):
    """One HTTP request through the call's egress proxy (urllib takes it from HTTP(S)_PROXY);
    returns a Reply.

    An HTTP status is returned, never raised: the tool knows what each means for it. When no
    answer came at all (refused, reset, timed out, cut mid-reply) it raises ToolError
    "transient": the request may or may not have taken effect, which only a receiver that
    deduplicates by idempotency key makes safe to retry. With follow_redirects=False a 3xx is
    returned as it is (its target never fetched: it has not been through admission).
    """
    # Imported here: most tools never talk to a network, and every call pays for module imports.
    import http.client
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    handlers = [urllib.request.ProxyHandler()]  # the proxy as the environment names it now
    if not follow_redirects:
        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args, **kwargs):
                return None  # urllib then raises the 3xx as an HTTPError, answered below

        handlers.append(NoRedirect())
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(request, timeout=timeout) as response:
            status, response_headers, raw = response.status, response.headers, response.read(max_reply + 1)
    except urllib.error.HTTPError as e:
        status, response_headers = e.code, e.headers
        try:
            raw = e.read(max_reply + 1)
        except (OSError, http.client.HTTPException):
            raw = b""
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise ToolError("transient", f"no answer from {url}: {getattr(e, 'reason', None) or e!r}") from None
    return Reply(status, response_headers, raw, max_reply)


def http_json(method, url, body=None, timeout=10.0):
    """One HTTP request with a JSON body, through the call's egress proxy; returns (status, the
    reply's JSON or None, the proxy's refusal reason or None). No answer at all: ToolError
    "transient" (see http_request); a reply over MAX_REPLY bytes: "fatal"."""
    import json

    data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
    headers = {"Accept": "application/json", "User-Agent": "ringfence-tool"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    reply = http_request(method, url, data, headers, timeout=timeout)
    if reply.truncated:
        raise ToolError("fatal", f"the reply of {url} is over {MAX_REPLY} bytes")
    try:
        doc = json.loads(reply.body) if reply.body else None
    except ValueError:
        doc = None
    return reply.status, doc, reply.proxy_reason
