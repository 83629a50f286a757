"""assess_evidence: the executor's reading of one evidence record, turned into a claim.

arguments: {"ref": "...", "record": {"value": "...", "revision": N} | null}
result:    {"ref": "...", "claim": "degraded" | "unknown", "revision": N}

Only a reading of exactly "high" supports `degraded`; anything else (another value, no record,
a malformed record) is `unknown`. There is no `normal`: absence of evidence is not health.
"""


def run(arguments, context):
    ref = arguments.get("ref")
    record = arguments.get("record")
    value = record.get("value") if isinstance(record, dict) else None
    revision = record.get("revision", 0) if isinstance(record, dict) else 0
    return {"ref": ref, "claim": "degraded" if value == "high" else "unknown", "revision": revision}
