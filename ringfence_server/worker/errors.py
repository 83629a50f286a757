"""The worker layer's one exception hierarchy: everything ringfence_server.worker raises on purpose
is a WorkerError, so the worker's loop can tell its own refusals from bugs with one `except`.

Pure (the standard library only): admission, which must load no database driver, catches
CallConflict from whatever `Results` it is given without importing the SQLite store that raises it.
"""

from __future__ import annotations

import enum

__all__ = [
    "CallConflict",
    "ExecutorError",
    "InvalidTransition",
    "NotClaimant",
    "PruneHorizonTooShort",
    "ResultsError",
    "WireError",
    "WireFault",
    "WorkerError",
]


class WorkerError(Exception):
    """Base of this layer's errors (envelope refusals, key files, the results store, the result's
    wire form, the executor)."""


class ResultsError(WorkerError):
    """The results store refused a change (ringfence_server.worker.results): nothing was written."""


class CallConflict(ResultsError):
    """The logical call (tenant, run, call) is held or recorded for another call digest: the same
    ids with other content. Never run, never answered with the other call's result."""

    def __init__(self, key: object, held_digest: str, offered_digest: str) -> None:
        super().__init__(f"call {key} is held for call digest {held_digest[:16]}…, "
                         f"this delivery is {offered_digest[:16]}…")
        self.held_digest = held_digest
        """The digest the store holds the logical call for."""
        self.offered_digest = offered_digest
        """The digest of the delivery that was refused."""


class NotClaimant(ResultsError):
    """A delivery asked to change a logical call whose claim it does not hold (there is no claim,
    another delivery holds it, or its own claim was released)."""

    def __init__(self, key: object, envelope_id: str, holder: str | None) -> None:
        held = f"held by {holder}" if holder is not None else "not claimed"
        super().__init__(f"call {key}: delivery {envelope_id} does not hold its claim ({held})")
        self.envelope_id = envelope_id
        """The delivery that asked."""
        self.holder = holder
        """The delivery the store names for the call, or None when there is no row."""


class InvalidTransition(ResultsError):
    """The claimant asked for a change its call's state does not allow (results.py's docstring has
    the states): a release after the call started, a record before it started, a second record
    of other bytes, a start after the call was recorded."""

    def __init__(self, key: object, envelope_id: str, state: str, action: str, why: str) -> None:
        super().__init__(f"call {key} is {state} (delivery {envelope_id}): cannot {action}: {why}")
        self.state = state
        """The call's state when it was refused ("started", "recorded", ...)."""
        self.action = action
        """What was refused ("release", "record", "mark_started")."""


class PruneHorizonTooShort(ResultsError):
    """A prune asked to drop finished calls younger than the store's minimum age (its configured
    bound on an envelope's lifetime): a delivery of such a call may still be live, and would find
    no record and run it again."""

    def __init__(self, older_than: float, minimum: float) -> None:
        super().__init__(f"prune horizon {older_than}s is shorter than the minimum {minimum}s "
                         "(the longest an envelope may live): a pruned call could be run again")
        self.older_than = older_than
        """The horizon asked for, in seconds."""
        self.minimum = minimum
        """The store's minimum, in seconds."""


class WireFault(enum.StrEnum):
    """Why a result's wire form was refused (WireError.reason; ringfence_server.worker.wire)."""

    TOO_LARGE = "too_large"
    NOT_JSON = "not_json"
    NON_FINITE = "non_finite"
    WRONG_FORMAT = "wrong_format"
    FIELDS = "fields"
    WRONG_TYPE = "wrong_type"
    OUT_OF_RANGE = "out_of_range"
    UNKNOWN_OUTCOME = "unknown_outcome"
    UNKNOWN_ERROR_CLASS = "unknown_error_class"
    BAD_BASE64 = "bad_base64"
    OUTPUT_OVER_LIMIT = "output_over_limit"
    TOO_MANY_EVENTS = "too_many_events"
    NOT_FLAT = "not_flat"
    NOT_CANONICAL = "not_canonical"


class WireError(WorkerError):
    """A sandbox result's wire form that will not be read (or cannot be written): the one
    exception of ringfence_server.worker.wire. `reason` is machine-readable (the control plane
    counts a worker's malformed results by it); the message is for people."""

    def __init__(self, reason: WireFault, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason
        self.detail = detail


class ExecutorError(WorkerError):
    """The executor cannot turn an admitted envelope into a sandbox request on this worker (an
    image it cannot name, a mount it does not make): raised before the call is marked started, so
    the executor gives the claim back (nothing ran)."""
