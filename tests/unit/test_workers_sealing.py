"""From dispatch's sandbox request to a worker's envelope (ringfence_server.control.workers.sealing):
what a worker receives is the same call, signed, and what workers cannot run yet is refused
before anything is placed."""

from __future__ import annotations

import json

import pytest

from ringfence_server.control.workers.sealing import NotForWorkers, Sealer, worker_call
from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.egress.grant import EgressGrant
from ringfence_server.sandbox.errors import ImageError
from ringfence_server.sandbox.pinned_images import load_lock
from ringfence_server.sandbox.profile import InputMount, SandboxProfile, WorkspaceMount
from ringfence_server.worker.envelope import open_sealed
from ringfence_server.worker.keys import TrustedKeys, generate_private_key

LOCK = load_lock()
NOW = 1_800_000_000.0


def request(**changes: object) -> SandboxRequest:
    body = json.dumps({"tool": "echo", "arguments": {"text": "hi", "n": [1, 2]}, "call_id": "c-7",
                       "idempotency_key": None}, separators=(",", ":")).encode()
    fields: dict[str, object] = {"profile": SandboxProfile(image="tool", memory_bytes=64 * 1024 * 1024, cpus=0.5,
                                                           pids=32, timeout_s=5.0),
                                 "stdin": body, "run_id": "acme:run-1", "call_id": "c-7.a2", "warm": True}
    fields.update(changes)
    return SandboxRequest(**fields)  # type: ignore[arg-type]


def test_the_envelope_carries_the_call_as_dispatch_made_it():
    call = worker_call(request(), LOCK)
    assert (call.tenant, call.run_id, call.call_id, call.attempt) == ("acme", "run-1", "c-7", 2)
    assert (call.tool, call.arguments, call.idempotency_key) == ("echo", {"text": "hi", "n": [1, 2]}, None)
    assert call.image_digest == LOCK.image_id("tool")
    spec = call.spec
    assert (spec.memory_bytes, spec.cpus, spec.pids, spec.timeout_s) == (64 * 1024 * 1024, 0.5, 32, 5.0)
    assert call.spec.warm and call.egress is None


def test_the_egress_grant_goes_as_granted():
    grant = EgressGrant(allow=("api.example.com:443",), max_bytes=4096, max_connections=3)
    call = worker_call(request(profile=SandboxProfile(image="tool", egress=grant)), LOCK)
    assert call.egress is not None and call.egress.to_grant() == grant


def test_a_sealed_envelope_opens_on_the_worker_it_names_with_every_field():
    key = generate_private_key()
    sealer = Sealer(key, clock=lambda: NOW)
    placed = sealer.seal(worker_call(request(), LOCK), worker_id="w1", start_allowance_s=30,
                         traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    opened = open_sealed(placed.sealed, TrustedKeys.of([key.public_key()]), NOW + 1)
    assert opened == placed.envelope
    assert (opened.worker_id, opened.attempt, opened.deadline) == ("w1", 2, NOW + 5.0 + 30)
    assert opened.traceparent.startswith("00-aaaa")


@pytest.mark.parametrize(("changes", "why"), [
    ({"argv": ("python3", "-c", "1")}, "a command"),
    ({"profile": SandboxProfile(image="tool", workspace=WorkspaceMount("ws-1"))}, "workspace"),
    ({"profile": SandboxProfile(image="tool", inputs=(InputMount("/srv/data", "/data"),))}, "input folders"),
    ({"run_id": "adhoc"}, "not a tenant's run"),
    ({"call_id": "c-7"}, "not an attempt"),
    ({"stdin": b"not json"}, "not a tool runner call"),
    ({"call_id": "other.a1"}, "does not match its call"),
])
def test_what_workers_cannot_run_yet_is_refused_with_the_reason(changes, why):
    with pytest.raises(NotForWorkers, match=why):
        worker_call(request(**changes), LOCK)


def test_an_image_the_lock_does_not_pin_is_refused_as_the_local_sandbox_refuses_it():
    with pytest.raises(ImageError, match="nosuchimage"):
        worker_call(request(profile=SandboxProfile(image="nosuchimage")), LOCK)
