"""credit: a mutating, irreversible demo tool (the kind that must never run twice or unasked).

arguments: {"account": "acme-<digits>", "amount": number > 0}. It only reports what it would
credit and the idempotency key it was given: a real receiver deduplicates on that key.
"""

import re

from ringfence_tool import ToolError

ACCOUNT = re.compile(r"[a-z]+-[0-9]{1,12}")


def run(arguments, context):
    account, amount = arguments.get("account"), arguments.get("amount")
    if not isinstance(account, str) or not ACCOUNT.fullmatch(account):
        raise ToolError("invalid", "account must look like acme-9")
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not 0 < amount <= 1_000_000:
        raise ToolError("invalid", "amount must be a number in (0, 1000000]")
    return {"account": account, "credited": amount, "idempotency_key": context.get("idempotency_key")}
