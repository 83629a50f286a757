"""From a sandbox request, as dispatch makes it, to a signed work envelope for one worker.

A worker runs exactly what an envelope says (ringfence_server.worker.envelope), so this is
where a call leaves the control plane's hands: the request's tool runner body becomes the
envelope's tool, arguments, call id and idempotency key; its attempt number comes from the
sandbox call id dispatch gives each attempt ("CALL.aN"); its profile becomes the plain
`SandboxSpec` and its image name the pinned image ID of this control plane's lock, so the
worker runs content, never a name.

What workers cannot run yet is refused here, before anything is placed (`NotForWorkers`, a
SandboxError: dispatch reports it as the call's fatal failure): a command instead of the tool
runner (file transfers, tool checks), an MCP server's session, a workspace, input folders. The
reason is in the message; docs/workers.md says what is missing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ringfence_server.sandbox.backend import SandboxRequest
from ringfence_server.sandbox.errors import SandboxError
from ringfence_server.sandbox.pinned_images import Lock
from ringfence_server.worker.envelope import Envelope, GrantedEgress, SandboxSpec, SealedEnvelope, seal
from ringfence_server.worker.keys import key_id, load_private_key

__all__ = ["NotForWorkers", "Placed", "Sealer", "WorkerCall", "worker_call"]

# dispatch names each attempt's sandbox call CALL.aN (ringfence_server.control.orchestration.dispatch).
_ATTEMPT = re.compile(r"^(?P<call>.+)\.a(?P<n>[1-9][0-9]{0,5})$")


class NotForWorkers(SandboxError):
    """A call workers cannot run (yet): refused before it is placed, with the reason."""


@dataclass(frozen=True)
class WorkerCall:
    """What of a sandbox request an envelope carries, checked; placement reads `spec`,
    `image_digest` and `egress`."""

    tenant: str
    run_id: str
    call_id: str
    attempt: int
    tool: str
    arguments: dict[str, object]
    idempotency_key: str | None
    image_digest: str
    spec: SandboxSpec
    egress: GrantedEgress | None


def worker_call(request: SandboxRequest, lock: Lock) -> WorkerCall:
    """The envelope's content for `request`, or NotForWorkers saying why a worker cannot run it."""
    if request.mcp is not None:
        raise NotForWorkers("an MCP server's session does not run on sandbox workers yet")
    if request.argv:
        raise NotForWorkers("a command (a file transfer, a tool check) does not run on sandbox workers yet")
    profile = request.profile
    if profile.workspace is not None:
        raise NotForWorkers("a run's workspace is not on sandbox workers yet")
    if profile.inputs:
        raise NotForWorkers("input folders are not mounted on sandbox workers yet")
    tenant, sep, run_id = request.run_id.partition(":")
    if not sep:
        raise NotForWorkers(f"sandbox run {request.run_id!r} is not a tenant's run")
    match = _ATTEMPT.match(request.call_id)
    if match is None:
        raise NotForWorkers(f"sandbox call {request.call_id!r} is not an attempt of a call")
    try:
        body = json.loads(request.stdin)
        tool, arguments = body["tool"], body["arguments"]
        call_id, key = body["call_id"], body["idempotency_key"]
    except (ValueError, KeyError, TypeError) as e:
        raise NotForWorkers(f"the request is not a tool runner call: {e}") from None
    if call_id != match["call"] or not isinstance(arguments, dict):
        raise NotForWorkers("the request's body does not match its call")
    spec = SandboxSpec(runtime=profile.runtime, memory_bytes=profile.memory_bytes, cpus=float(profile.cpus),
                       pids=profile.pids, timeout_s=float(profile.timeout_s), stdout_limit=profile.stdout_limit,
                       stderr_limit=profile.stderr_limit, warm=request.warm)
    egress = None
    if profile.egress is not None:
        grant = profile.egress
        egress = GrantedEgress(allow=grant.allow, max_bytes=grant.max_bytes, max_connections=grant.max_connections)
    digest = lock.image_id(profile.image)  # ImageError for an image the lock does not pin, as locally
    return WorkerCall(tenant=tenant, run_id=run_id, call_id=call_id, attempt=int(match["n"]), tool=tool,
                      arguments=arguments, idempotency_key=key, image_digest=digest, spec=spec, egress=egress)


@dataclass(frozen=True)
class Placed:
    """An envelope sealed for one worker: what is sent, and what its result is checked against."""

    envelope: Envelope
    sealed: SealedEnvelope


class Sealer:
    """This control plane's signing key: seals a call's envelope for the worker it was placed on."""

    def __init__(self, private_key: Ed25519PrivateKey, *, clock: Callable[[], float]) -> None:
        self._key = private_key
        self.key_id = key_id(private_key.public_key())
        self._clock = clock

    @classmethod
    def from_file(cls, path: Path, *, clock: Callable[[], float]) -> Sealer:
        """The key `ringfence worker keygen` wrote (refused if others may read it)."""
        return cls(load_private_key(path), clock=clock)

    def seal(self, call: WorkerCall, *, worker_id: str, start_allowance_s: float, traceparent: str = "") -> Placed:
        now = self._clock()
        envelope = Envelope.for_call(worker_id=worker_id, run_id=call.run_id, call_id=call.call_id,
                                     attempt=call.attempt, tenant=call.tenant, tool=call.tool,
                                     arguments=call.arguments, image_digest=call.image_digest, profile=call.spec,
                                     deadline=now + call.spec.timeout_s + start_allowance_s, now=now,
                                     idempotency_key=call.idempotency_key, traceparent=traceparent,
                                     egress=call.egress)
        sealed = seal(envelope, self._key, self.key_id)
        return Placed(envelope=replace(envelope, key_id=self.key_id), sealed=sealed)
