"""credit_lookup: looks a credit up at the ledger by its idempotency key. Read-only.

arguments: {"idempotency_key": "..."}. Returns {"found": true, "record": {...}} or
{"found": false}. It is how `credit` declares its effects can be looked up (the `reconcile`
field of ringfence_server/control/tools/credit.json): after a crash between a credit and its record, recovery
asks the receiver whether the effect happened before deciding anything.

"found": false is the ledger's own 404 and nothing else. Every other outcome is an error,
never a guess: "not found" is what would make recovery apply the credit again.
"""

import re

from ringfence_tool import ToolError, has_egress, http_json

LEDGER = "http://ledger.ringfence.internal"
KEY = re.compile(r"[A-Za-z0-9._:-]{1,200}")


def run(arguments, context):
    key = arguments.get("idempotency_key")
    if not isinstance(key, str) or not KEY.fullmatch(key):
        raise ToolError("invalid", "idempotency_key must be 1-200 characters of [A-Za-z0-9._:-]")
    if not has_egress():
        raise ToolError("fatal", "no route to the ledger: policy granted this call no egress, so nothing "
                                 "can be said about the key")
    status, doc, proxy_reason = http_json("GET", f"{LEDGER}/credits/{key}")
    if status == 200:
        if isinstance(doc, dict) and doc.get("idempotency_key") == key:
            return {"found": True, "record": doc}
        raise ToolError("fatal", f"the ledger answered 200 without the record of key {key}")
    if status == 404 and proxy_reason is None and isinstance(doc, dict) and doc.get("error") == "not_found":
        return {"found": False}
    if status >= 500:
        raise ToolError("transient", f"the ledger (or the proxy before it) answered {status}"
                                     + (f" ({proxy_reason})" if proxy_reason else ""))
    if status == 429:
        raise ToolError("rate_limited", f"the egress proxy refused another connection ({proxy_reason})")
    raise ToolError("fatal", f"the look-up failed: HTTP {status}"
                             + (f", refused by the egress proxy ({proxy_reason})" if proxy_reason else ""))
