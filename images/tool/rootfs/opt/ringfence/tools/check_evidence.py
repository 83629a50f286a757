"""check_evidence: the verifier's check of one claim against the verifier's own evidence record.

arguments: {"ref": "...", "claim": "...", "record": {"value": "...", "revision": N} | null}
result:    {"ref": "...", "supported": bool, "value": "..." | null, "revision": N}

A claim is supported only when it is `degraded` and the verifier's record reads exactly "high".
This tool judges and reports; it never acts on what it finds (no remediation from a verifier).
"""


def run(arguments, context):
    ref = arguments.get("ref")
    record = arguments.get("record")
    value = record.get("value") if isinstance(record, dict) else None
    revision = record.get("revision", 0) if isinstance(record, dict) else 0
    supported = arguments.get("claim") == "degraded" and value == "high"
    return {"ref": ref, "supported": supported, "value": value, "revision": revision}
