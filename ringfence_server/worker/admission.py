"""Worker admission: every decision a sandbox worker makes about a delivered envelope before
anything runs, and nothing else.

Pure: no Docker, no network, no database, no clock. What it reads of the worker is behind three
Protocols (the images it has verified, what its sandbox can run and mount, the results it has
recorded and the calls it has claimed: ringfence_server.worker.results is the durable one), and
the worker's own id and `now` are arguments. The worker does the I/O around it
(ringfence_server.worker.executor): it runs the tool only on a `Run` decision, and records the
result under the envelope's logical key.

`admit` checks in this order, the first failure deciding:

1. envelope       `open_sealed`: version, signature present, trusted key, signature verifies,
                  canonical payload, deadline not passed (ringfence_server.worker.envelope;
                  Refuse with that layer's reason). Nothing below reads an unverified envelope.
2. worker         the envelope names this worker ("wrong_worker"): an envelope placed on another
                  worker is never run here, so a captured one runs at most on the worker it was
                  placed on. After the signature (an unverified worker id means nothing, and a
                  forger learns nothing of which worker this is), before anything is looked up
3. image          the image digest is one this worker has verified ("image_unverified"): a
                  worker runs only images it checked by content itself, whatever the envelope says
4. runtime        the profile's runtime is available here ("runtime_unavailable"), and a call
                  with egress has an egress proxy here ("egress_unavailable")
5. mounts         a profile with a workspace can have one here ("workspace_unavailable"), and one
                  with input roots can have its input folders here ("inputs_unavailable"): the
                  executor (ringfence_server.worker.executor) mounts neither yet, so an envelope
                  that needs them is refused before it claims anything, not run without them
6. delivery       a result recorded for the logical call: ReturnRecorded (or "call_conflict" when
                  it was recorded for other content under the same ids); the same for a call the
                  worker's restart recovery made uncertain (ReturnRecorded carrying an
                  UncertainResult: it may have run, so it is never run again); otherwise the claim:
                  won → Run; held by another delivery of the same content → InProgress (its
                  result is recorded later), held for other content → "call_conflict" (the
                  store's CallConflict), or ReturnRecorded if the result landed between the
                  look-up and the claim

The logical call is one attempt of one call (`LogicalKey`): a retry (a new attempt) is a delivery
of another key and runs; a redelivery of one attempt is answered by step 6.

Why this order: the checks that need no state come first, and the claim comes last, so a claim is
made only for a call this worker will run. A forged or unrunnable envelope never claims the
logical call (it cannot block the real call's delivery), never reads a recorded result (it
cannot fetch another call's output), and never starts a container.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Protocol

from ringfence_server.worker.envelope import Envelope, EnvelopeRefused, LogicalKey, Refusal, SealedEnvelope, open_sealed
from ringfence_server.worker.errors import CallConflict
from ringfence_server.worker.keys import TrustedKeys

__all__ = [
    "Capabilities",
    "Decision",
    "InProgress",
    "RecordedResult",
    "Refuse",
    "Results",
    "ReturnRecorded",
    "Run",
    "UncertainResult",
    "VerifiedImages",
    "WorkRefusal",
    "admit",
]


class WorkRefusal(enum.StrEnum):
    """Why a worker refuses an envelope that opened (the envelope's own reasons are Refusal's)."""

    WRONG_WORKER = "wrong_worker"
    IMAGE_UNVERIFIED = "image_unverified"
    RUNTIME_UNAVAILABLE = "runtime_unavailable"
    EGRESS_UNAVAILABLE = "egress_unavailable"
    WORKSPACE_UNAVAILABLE = "workspace_unavailable"
    INPUTS_UNAVAILABLE = "inputs_unavailable"
    CALL_CONFLICT = "call_conflict"


class VerifiedImages(Protocol):
    """The images this worker has verified by content (pulled or loaded, then checked by digest)."""

    def has(self, digest: str) -> bool: ...


class Capabilities(Protocol):
    """What this worker's sandbox can run."""

    def has_runtime(self, runtime: str) -> bool:
        """The runtime ("runc", "gvisor") is registered in this worker's engine."""
        ...

    def has_egress(self) -> bool:
        """This worker runs an egress proxy (a call with an egress grant needs one)."""
        ...

    def has_workspace(self) -> bool:
        """This worker can mount a run's workspace (a profile with `workspace` needs it)."""
        ...

    def has_inputs(self) -> bool:
        """This worker can mount input folders (a profile with `input_roots` needs them)."""
        ...


@dataclass(frozen=True)
class RecordedResult:
    """A logical call's result as the worker recorded it."""

    envelope_id: str
    """The delivery that ran it."""
    call_digest: str
    """`Envelope.call_digest` of that delivery: what the result is the result of."""
    result: bytes
    """The result as the worker reports it (opaque here)."""


@dataclass(frozen=True)
class UncertainResult:
    """A logical call that started but whose result was never recorded (the worker died while the
    tool ran: it may or may not have taken effect). Final, like a RecordedResult: the worker
    reports it instead of a result and never runs the call again; the control plane reconciles
    it, as after a crash of its own."""

    envelope_id: str
    """The delivery that started it."""
    call_digest: str
    """`Envelope.call_digest` of that delivery."""


class Results(Protocol):
    """The worker's record of logical calls: claims and results, keyed by the logical call.

    `claim` must be atomic: of any number of concurrent claims of one key exactly one returns True
    (a durable store: across the worker's restarts too), until the claim is released (a call that
    never started: ringfence_server.worker.results)."""

    def get(self, key: LogicalKey) -> RecordedResult | UncertainResult | None:
        """The result recorded for the logical call (or its uncertain record), or None."""
        ...

    def claim(self, key: LogicalKey, envelope_id: str, call_digest: str) -> bool:
        """Take the logical call for the delivery `envelope_id` of the call `call_digest`: True for
        the first claim of `key` only; False when any delivery (this one included) already holds
        it or recorded its result. Raises CallConflict when `key` is held or recorded for another
        call digest (the same ids, other content)."""
        ...


@dataclass(frozen=True)
class Run:
    """Run the call: this delivery holds the logical call's claim."""

    envelope: Envelope


@dataclass(frozen=True)
class ReturnRecorded:
    """The logical call already ran (or may have: an UncertainResult): answer with its record,
    run nothing."""

    envelope: Envelope
    recorded: RecordedResult | UncertainResult


@dataclass(frozen=True)
class InProgress:
    """Another delivery of the logical call holds the claim and has no result yet: run nothing."""

    envelope: Envelope


@dataclass(frozen=True)
class Refuse:
    """Run nothing: the envelope is not authentic, not runnable here, or conflicts."""

    reason: Refusal | WorkRefusal
    detail: str = ""
    envelope: Envelope | None = field(default=None, compare=False)
    """The envelope refused, when it opened (a WorkRefusal: the worker may say which envelope it
    refused); None when the envelope itself was refused, since nothing of an unverified envelope
    is worth repeating. Not compared: a refusal is its reason."""


Decision = Run | ReturnRecorded | InProgress | Refuse


def _check_image(envelope: Envelope, images: VerifiedImages) -> Refuse | None:
    """Its own function: the step a red check (tests/unit/test_worker_admission.py) switches off."""
    if not images.has(envelope.image_digest):
        return Refuse(WorkRefusal.IMAGE_UNVERIFIED, f"{envelope.image_digest} is not an image this worker verified")
    return None


def _check_worker(envelope: Envelope, worker_id: str) -> Refuse | None:
    """Its own function: the step a red check (tests/unit/test_worker_admission.py) switches off."""
    if envelope.worker_id != worker_id:
        return Refuse(WorkRefusal.WRONG_WORKER, f"placed on worker {envelope.worker_id!r}, this is {worker_id!r}")
    return None


def _check_runtime(envelope: Envelope, capabilities: Capabilities) -> Refuse | None:
    runtime = envelope.profile.runtime
    if not capabilities.has_runtime(runtime):
        return Refuse(WorkRefusal.RUNTIME_UNAVAILABLE, f"{runtime} is not available on this worker")
    if envelope.egress is not None and not capabilities.has_egress():
        return Refuse(WorkRefusal.EGRESS_UNAVAILABLE, "the call has an egress grant; this worker has no egress proxy")
    return None


def _recorded(envelope: Envelope, recorded: RecordedResult | UncertainResult) -> Decision:
    if recorded.call_digest != envelope.call_digest:
        # The same (tenant, run, call) with other content: never answer one call with another's
        # result, and never run it (its id is taken).
        return Refuse(WorkRefusal.CALL_CONFLICT,
                      f"call {envelope.call_id} was recorded for other content (delivery {recorded.envelope_id})")
    return ReturnRecorded(envelope, recorded)


def _check_mounts(envelope: Envelope, capabilities: Capabilities) -> Refuse | None:
    profile = envelope.profile
    if profile.workspace is not None and not capabilities.has_workspace():
        return Refuse(WorkRefusal.WORKSPACE_UNAVAILABLE,
                      f"the call needs the run's workspace ({profile.workspace}); this worker mounts none")
    if profile.input_roots and not capabilities.has_inputs():
        return Refuse(WorkRefusal.INPUTS_UNAVAILABLE,
                      f"the call reads input folders ({', '.join(profile.input_roots)}); this worker mounts none")
    return None


def _delivery(envelope: Envelope, results: Results) -> Decision:
    key = envelope.logical_key
    recorded = results.get(key)
    if recorded is not None:
        return _recorded(envelope, recorded)
    try:
        if results.claim(key, envelope.envelope_id, envelope.call_digest):
            return Run(envelope)
    except CallConflict as e:
        # Held (not yet recorded) by a delivery of other content: as for a recorded one.
        return Refuse(WorkRefusal.CALL_CONFLICT, str(e))
    # Lost the claim: either another delivery is running it, or it finished between get and claim.
    recorded = results.get(key)
    return _recorded(envelope, recorded) if recorded is not None else InProgress(envelope)


def admit(sealed: SealedEnvelope, *, worker_id: str, trusted_keys: TrustedKeys, images: VerifiedImages,
          capabilities: Capabilities, results: Results, now: float) -> Decision:
    """What the worker `worker_id` does with `sealed`, in the order of the module's docstring."""
    try:
        envelope = open_sealed(sealed, trusted_keys, now)
    except EnvelopeRefused as e:
        return Refuse(e.reason, e.detail)
    refused = (_check_worker(envelope, worker_id) or _check_image(envelope, images)
               or _check_runtime(envelope, capabilities) or _check_mounts(envelope, capabilities))
    if refused is not None:
        return replace(refused, envelope=envelope)
    decision = _delivery(envelope, results)
    return replace(decision, envelope=envelope) if isinstance(decision, Refuse) else decision
