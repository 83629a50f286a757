"""issue_credit: credits an amount to an account at the ledger, with a reason, once per key.

arguments: {"account": "acme-<digits>", "amount": number > 0, "reason"?: "..."}. `credit`'s
code (tools/credit.py `apply`, loaded by the runner's loader), so the request, the idempotency
key it carries, the ledger's answers and their classes are exactly credit's:

  no answer, 5xx (the ledger's, or the proxy's 502/504)        transient
  409 key already used with other arguments, 400 refused        invalid
  429 the proxy's connection ceiling                            rate_limited
  403/407 refused by the proxy, anything else                   fatal
  no idempotency key, or no route (no egress granted)           invalid / fatal, nothing sent

The reason travels to the ledger, which keeps it with the credit (and counts the same key with
another reason as a reused key). Its effects are looked up with credit_lookup
(ringfence_server/control/tools/issue_credit.json `reconcile`).
"""

from ringfence_tool import ToolError, load_tool

MAX_REASON = 280
credit = load_tool("credit")


def run(arguments, context):
    reason = arguments.get("reason")
    if reason is not None and (
        not isinstance(reason, str) or not 0 < len(reason) <= MAX_REASON
        or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in reason)
    ):
        raise ToolError("invalid", f"reason must be 1-{MAX_REASON} characters without control characters")
    return credit.apply(arguments.get("account"), arguments.get("amount"), context.get("idempotency_key"),
                        reason=reason, tool="issue_credit")
