"""credit: credits an amount to an account at the ledger, once per idempotency key.

arguments: {"account": "acme-<digits>", "amount": number > 0}. It POSTs {account, amount,
idempotency_key} to the ledger (LEDGER, reached through the call's egress proxy) and returns
the ledger's record, `"replayed": true` when the ledger had already applied this key: the
receiver, not this reply, is where the effect is counted, and the key is what makes retrying
an effect whose reply was lost harmless.

Errors, for the runner's retry layer:
  no answer (refused, reset, cut mid-reply), 5xx (the ledger's, or the proxy's 502/504)  transient
  409  the key was already used with another account or amount (nothing applied)        invalid
  400  the ledger refused the request (no key, an amount it does not take)              invalid
  429  the proxy's connection ceiling for the call                                       rate_limited
  403/407 and anything else: the proxy refused it, or the ledger said something unknown  fatal

Without a route to the ledger (policy granted this call no egress, so its sandbox names no
proxy) nothing can be applied: a fatal error that says why, never a reply that looks applied. A deployment that runs the ledger grants `ledger.ringfence.internal`
to this tool and declares the ledger as a proxy service.

`apply` is the whole of it, reused by issue_credit (which adds a reason): one request, one
classification, for both.
"""

import re

from ringfence_tool import ToolError, has_egress, http_json

LEDGER = "http://ledger.ringfence.internal"
ACCOUNT = re.compile(r"[a-z]+-[0-9]{1,12}")


def run(arguments, context):
    return apply(arguments.get("account"), arguments.get("amount"), context.get("idempotency_key"))


def apply(account, amount, key, reason=None, tool="credit"):
    """Credit `amount` to `account` at the ledger under `key` (with `reason` when given): the
    ledger's record, `"applied": true`, or a classified ToolError. `tool` names the caller in
    the error that says which egress grant is missing."""
    if not isinstance(account, str) or not ACCOUNT.fullmatch(account):
        raise ToolError("invalid", "account must look like acme-9")
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not 0 < amount <= 1_000_000:
        raise ToolError("invalid", "amount must be a number in (0, 1000000]")
    if not key:
        raise ToolError("invalid", "a credit needs an idempotency key: without one a retry could apply it twice")
    if not has_egress():
        # Never a reply that looks like success: nothing was applied, and nothing can be.
        raise ToolError("fatal", "no route to the ledger: policy granted this call no egress "
                                 f"(grant ledger.ringfence.internal to {tool} in [policy.egress])")
    body = {"account": account, "amount": amount, "idempotency_key": key}
    if reason is not None:
        body["reason"] = reason
    status, doc, proxy_reason = http_json("POST", LEDGER + "/credits", body)
    if status in (200, 201):
        if isinstance(doc, dict) and doc.get("idempotency_key") == key:
            return {"applied": True, **doc}
        raise ToolError("fatal", f"the ledger answered {status} without the record of key {key}")
    message = (doc or {}).get("message") if isinstance(doc, dict) else None
    if status == 409:
        raise ToolError("invalid", message or f"idempotency key {key} was already used with other arguments")
    if status == 400:
        raise ToolError("invalid", f"the ledger refused the credit: {message or 'bad request'}")
    if status >= 500:
        raise ToolError("transient", f"the ledger (or the proxy before it) answered {status}"
                                     + (f" ({proxy_reason})" if proxy_reason else ""))
    if status == 429:
        raise ToolError("rate_limited", f"the egress proxy refused another connection ({proxy_reason})")
    raise ToolError("fatal", f"the credit was not applied: HTTP {status}"
                             + (f", refused by the egress proxy ({proxy_reason})" if proxy_reason else ""))
