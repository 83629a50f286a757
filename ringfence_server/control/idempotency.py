"""Idempotency keys for mutating calls (step 8).

key = sha256(tenant, run id, canonical signature), or, for a call that carries a key of the
client's choosing, sha256(tenant, that key). The tenant is always part of it: two tenants may
use the same run id (or the same client key), and a receiver that deduplicates by key must
never drop one tenant's real effect as a repeat of another's. Derived only from what the log
holds, so the key is the same after a restart.

The orchestrator looks a derived key up among the run's recorded completions (a completion
found → the stored result, no dispatch) and passes the key to the tool in the runner request,
so a receiver can deduplicate too: that is the only defence for a crash between the effect and
its record. A client's key says nothing about the arguments, so it is judged against the call
that claimed it in the store, the same way in its own run and in a later one: the same call →
its stored result; other arguments → refused, never run; a call that may have run without a
result → in doubt, never run again. A claim whose call provably never started (every attempt
failed before a container existed) releases the key (ringfence_server.control.orchestration.dispatch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ringfence_server.control.validation import sha256_hex, signature


def idempotency_key(tenant: str, run_id: str, tool: str, arguments: Mapping[str, Any]) -> str:
    return sha256_hex("idempotency/v2", tenant, run_id, signature(tool, arguments))


def client_idempotency_key(tenant: str, client_key: str) -> str:
    return sha256_hex("idempotency/client/v1", tenant, client_key)
