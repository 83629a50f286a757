"""fetch: GET one http(s) URL through the egress proxy the sandbox was given (HTTP(S)_PROXY).

arguments: {"url": "https://host/path"}. The sandbox has no other way out and no resolver: the
proxy decides, per call, what is reachable. Returns the status and at most 64 KiB of the body.
"""

import urllib.error
import urllib.request

from ringfence_tool import ToolError

MAX_BODY = 64 * 1024


def run(arguments, context):
    url = arguments.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ToolError("invalid", "url must be an http(s) URL")
    request = urllib.request.Request(url, headers={"User-Agent": "ringfence-fetch"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read(MAX_BODY + 1)
            status = response.status
    except urllib.error.HTTPError as e:
        # 403 from the proxy is a refusal, not a hiccup: never retried.
        raise ToolError("transient" if e.code in (502, 503, 504) else "fatal", f"HTTP {e.code}: {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise ToolError("transient", f"cannot reach {url}: {getattr(e, 'reason', e)}") from None
    return {"status": status, "body": body[:MAX_BODY].decode("utf-8", "replace"), "truncated": len(body) > MAX_BODY}
