"""The audit hash chain of a run's log, and its verification.

Every event carries the hash of its predecessor, so changing, dropping or reordering any stored
event breaks the chain at that point:

    canonical(e) = JSON of {"at", "data", "run_id", "schema_version", "seq", "type"}
                   (sorted keys, no whitespace, UTF-8, no NaN)
    hash(e)      = sha256_hex(prev_hash(e) + canonical(e))      prev_hash of seq 1 = ""

`data` is hashed as the store keeps it (the canonical JSON text the store wrote), so hashing is
stable across stores and across a read-write round trip. What a per-run chain cannot show by
itself: a cut-off tail (the last events dropped) or a whole run removed, unless the caller
compares with a head hash it recorded elsewhere (`verify(..., expected_head=)`); and a rewrite
of the whole chain from some event to the end by someone who can also recompute every hash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ringfence.model import Event

__all__ = ["AuditReport", "canonical_json", "event_hash", "verify"]


def _json_default(value: Any) -> Any:
    # Mappings from frozen values (MappingProxyType) are stored as plain JSON objects.
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


def canonical_json(value: Any) -> str:
    """The one JSON form the stores write and hash: re-encoding its own output gives it back."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                      default=_json_default)


def event_hash(prev_hash: str, run_id: str, seq: int, type: str, data: Any, schema_version: int,
               at: float) -> str:
    content = canonical_json({"at": at, "data": data, "run_id": run_id, "schema_version": schema_version,
                              "seq": seq, "type": type})
    return hashlib.sha256((prev_hash + content).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class AuditReport:
    ok: bool
    """True when every event links to its predecessor and its hash matches its content."""
    first_bad_seq: int | None = None
    """The seq of the first event that fails a check (None when ok)."""
    problem: str = ""
    """Why that event fails, for a person: "" when ok."""
    events: int = 0
    """How many events were checked."""


def verify(events: Iterable[Event], *, expected_head: str | None = None) -> AuditReport:
    """Check a run's events (as read, in the order given) against the hash chain.

    Detects an edited event (its hash no longer matches its content), a dropped event (a seq gap,
    or a prev_hash that is not the predecessor's hash), reordered events (seq out of order) and a
    forged hash (one that does not match the content, or that its successor does not link to).
    `expected_head`: the hash the last event must have, recorded elsewhere; it catches a cut-off
    tail, which the chain alone cannot.
    """
    checked = 0
    prev: Event | None = None
    for e in events:
        checked += 1
        expected_seq = 1 if prev is None else prev.seq + 1
        if e.seq != expected_seq:
            if prev is not None and e.seq <= prev.seq:
                why = f"seq {e.seq} comes after seq {prev.seq}: events are out of order or repeated"
            else:
                why = f"seq {expected_seq} is missing (next present is {e.seq}): an event was dropped"
            return AuditReport(False, e.seq, why, checked)
        if prev is not None and e.run_id != prev.run_id:
            return AuditReport(False, e.seq, f"run id {e.run_id!r} differs from {prev.run_id!r}", checked)
        linked = "" if prev is None else prev.hash
        if e.prev_hash != linked:
            why = ("prev_hash is not the previous event's hash: an event before it was dropped or "
                   "replaced, or the previous event's hash was forged") if prev is not None else \
                "the first event must have an empty prev_hash"
            return AuditReport(False, e.seq, why, checked)
        if not e.hash:
            return AuditReport(False, e.seq, "the event has no hash (written outside the chain)", checked)
        actual = event_hash(e.prev_hash, e.run_id, e.seq, e.type, e.data, e.schema_version, e.at)
        if actual != e.hash:
            return AuditReport(False, e.seq, "the stored hash does not match the event's content: the event "
                                             "was edited or its hash forged", checked)
        prev = e
    if expected_head is not None and (prev.hash if prev else "") != expected_head:
        last = prev.seq if prev else 0
        return AuditReport(False, last + 1, f"the chain ends at seq {last} with a different head than expected: "
                                            "events after it were dropped, or the log was rewritten", checked)
    return AuditReport(True, None, "", checked)
