"""Shared by the worker's tests (test_worker_envelope.py, test_worker_admission.py,
test_worker_results.py): a control plane's key, a worker's trust set and id, and envelopes for one
call."""

from __future__ import annotations

from typing import Any

from ringfence_server.worker.envelope import Envelope, GrantedEgress, SandboxSpec
from ringfence_server.worker.keys import TrustedKeys, generate_private_key

NOW = 1_800_000_000.0
DIGEST = "sha256:" + "a" * 64
OTHER_DIGEST = "sha256:" + "b" * 64
TRACEPARENT = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
WORKER = "worker-1"
"""The worker the tests' envelopes are placed on (and the id of the tests' worker)."""

# One control plane's signing key (generating one is fast: Ed25519) and the trust set a worker
# would load from its public half.
CONTROL_KEY = generate_private_key()
TRUSTED = TrustedKeys.of([CONTROL_KEY.public_key()])


def envelope(**changes: Any) -> Envelope:
    """A call with every field set to something other than its default: an egress grant, a
    workspace, input roots, an idempotency key and a traceparent."""
    fields: dict[str, Any] = {
        "worker_id": WORKER, "run_id": "run-1", "call_id": "call-1", "attempt": 1, "tenant": "acme",
        "tool": "post_invoice",
        "arguments": {"amount": 50.0, "account": "ACME-1", "lines": [{"sku": "x", "n": 2}]},
        "image_digest": DIGEST, "deadline": NOW + 60, "now": NOW, "idempotency_key": "k" * 64,
        "traceparent": TRACEPARENT,
        "profile": SandboxSpec(runtime="runc", memory_bytes=64 * 1024 * 1024, cpus=0.5, pids=32, timeout_s=5.0,
                               workspace="read", input_roots=("/data",), warm=False),
        "egress": GrantedEgress(allow=("api.example.com",), max_bytes=1024, max_connections=4),
    }
    fields.update(changes)
    return Envelope.for_call(**fields)
