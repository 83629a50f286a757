"""Idempotency keys for mutating calls (step 8).

key = sha256(run id, canonical signature). The orchestrator looks the key up among the run's
recorded completions (a completion found → the stored result, no dispatch) and passes it to
the tool in the runner request, so a receiver can deduplicate too: that is the only defence
for a crash between the effect and its record (the run then ends `uncertain`, never re-run).
"""

from __future__ import annotations

from typing import Any, Mapping

from control.validation import sha256_hex, signature


def idempotency_key(run_id: str, tool: str, arguments: Mapping[str, Any]) -> str:
    return sha256_hex("idempotency/v1", run_id, signature(tool, arguments))
