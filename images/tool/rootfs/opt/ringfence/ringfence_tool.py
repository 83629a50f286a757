"""What a tool module may import from the runner: the classified error it can raise, and a
JSON-over-HTTP helper for tools that talk to a receiver through the call's egress proxy.

A tool's `run(arguments, context)` returns JSON-able content, or raises ToolError with one of
CLASSES. Any other exception is reported as "fatal" (never retried).
"""

import os

CLASSES = ("invalid", "transient", "rate_limited", "fatal")
MAX_REPLY = 1024 * 1024


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


def http_json(method, url, body=None, timeout=10.0):
    """One HTTP request with a JSON body, through the call's egress proxy (urllib takes it from
    HTTP_PROXY); returns (status, the reply's JSON or None, the proxy's refusal reason or None).

    An HTTP status is returned, never raised: the tool knows what each means for it. When no
    answer came at all (refused, reset, timed out, cut mid-reply) it raises ToolError
    "transient": the request may or may not have taken effect, which only a receiver that
    deduplicates by idempotency key makes safe to retry.
    """
    # Imported here: most tools never talk to a network, and every call pays for module imports.
    import http.client
    import json
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
    headers = {"Accept": "application/json", "User-Agent": "ringfence-tool"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    # The proxy as the environment names it now (urlopen's shared opener keeps the first one).
    opener = urllib.request.build_opener(urllib.request.ProxyHandler())
    try:
        with opener.open(request, timeout=timeout) as response:
            status, raw, reason = response.status, response.read(MAX_REPLY + 1), None
    except urllib.error.HTTPError as e:
        status, reason = e.code, e.headers.get("X-Ringfence-Reason")
        try:
            raw = e.read(MAX_REPLY + 1)
        except (OSError, http.client.HTTPException):
            raw = b""
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise ToolError("transient", f"no answer from {url}: {getattr(e, 'reason', None) or e!r}") from None
    if len(raw) > MAX_REPLY:
        raise ToolError("fatal", f"the reply of {url} is over {MAX_REPLY} bytes")
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        doc = None
    return status, doc, reason
