"""The worker's durable record of logical calls: who claimed each, whether it started, its result,
and claims released because the call never started. SQLite: the worker's own file, on its host.

One row per logical call (tenant, run, call, attempt: `LogicalKey`; "call" below is one attempt
of one call), held for one call digest forever (`Envelope.call_digest`): the same ids with other
content are a CallConflict, whatever the state. The states, and the only changes between them:

    (none) ──claim──▶ claimed ──mark_started──▶ started ──record──▶ recorded
                      claimed ──release──▶ released ──claim──▶ claimed (a later delivery)
                                           started ──release_not_started──▶ released
                                                     (the sandbox answered: no container started)
                      claimed ──recover──▶ released        (the worker died before the start)
                                           started ──recover──▶ uncertain (died while it ran)

    claimed    a delivery (its envelope id) won the call; no container has been asked for yet.
    started    written BEFORE the worker asks its engine for the container: from here the call
               may have had effects, so it is never released on the worker's own judgement. It
               ends recorded; if the worker dies first, its restart's `recover` makes it
               uncertain. Until then a later delivery is answered "in progress", never run. One
               way back: the sandbox itself answered that the container never started (a
               START_FAILED result, or EngineError/ImageError raised by the backend, which the
               sandbox raises only before any container existed): `release_not_started`, so the
               control plane's retry runs it. The start mark was a precaution against dying while
               the engine was asked; the engine's answer settles that nothing ran.
    recorded   final: the result every later delivery of the call is answered with (`get`).
    uncertain  final: it started and its result was never recorded, so it may or may not have
               taken effect. `get` answers every later delivery with an UncertainResult (admission:
               ReturnRecorded), which the worker reports instead of a result; it never runs again.
               The control plane reconciles it, as after a crash of its own.
    released   the claimant could not start it (the engine refused: nothing ran) and said why;
               the next claim (the control plane's retry, any delivery of the same content)
               wins it again, as if it had never been claimed.

Refused, each with a ResultsError (ringfence_server.worker.errors) and nothing written:

    any change by a delivery that does not hold the live claim          NotClaimant
    a claim for another call digest under the same key (any state)      CallConflict
    release after mark_started (or after record)                        InvalidTransition
    release_not_started before mark_started (use release) or after record InvalidTransition
    record before mark_started (nothing started, so nothing ran)        InvalidTransition
    mark_started after record                                           InvalidTransition
    a second record of OTHER bytes                                      InvalidTransition
    any change of an uncertain call (it is final)                       InvalidTransition
    prune with a horizon under the store's minimum age                  PruneHorizonTooShort

Recovery (`recover`), once when the worker starts, BEFORE it takes any work and while it is the
file's only user: no call of this file is running then (the worker's containers died with it, or
its reaper removes them first), so every call still claimed or started is a leftover of the last
run. Claimed ones never started, so nothing ran: released, and the control plane's retry runs
them. Started ones may have had effects: uncertain. It returns what it changed (`Recovery`) for
the worker to report. Called while calls run, it would release their live claims: hence "once,
before taking work".

Pruning (`prune`): finished calls (recorded, uncertain, released) whose last change is older than
a horizon are deleted; claimed and started ones are live and never are. Safe once the horizon is
past every envelope's deadline: a delivery after its deadline is refused as expired by
`open_sealed`, before the store is asked, so no delivery can still ask for a pruned record (a
released one held nothing anyway). The store cannot see deadlines, so it is given the longest an
envelope may live (`min_prune_age`, from the worker's configuration) and refuses any shorter
horizon. A re-issue (a new envelope of the same logical call) has a deadline of its own, so the
bound is the control plane's to keep for those too: it re-issues a call to a worker only within
`min_prune_age` of the call's first delivery. Every change stamps `changed_at` from the store's
clock (injected, for tests).

Idempotent, because each is the same fact again and a worker that cannot tell whether its
write landed (an error after the commit) must be able to retry it: mark_started of a started
call, record of the same bytes, release (or release_not_started) of a claim the same delivery
already released, each by
the delivery that did it. A claim, by contrast, is never "again": any claim of a held call
returns False, the claimant's own included (a redelivery of a running envelope is in progress).

Durable: WAL with synchronous=FULL, and every change one IMMEDIATE transaction committed before
its method returns, so a claim, a start mark or a result that was returned survives the worker
being killed (kill -9), and (synchronous=FULL, on a file system that honours fsync) its host
losing power. Thread-safe: one connection behind a lock (a worker runs several calls at once);
several processes sharing the file are serialized by SQLite itself (BEGIN IMMEDIATE, waiting up
to BUSY_TIMEOUT_MS for another's write).
"""

from __future__ import annotations

import enum
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ringfence_server.worker.admission import RecordedResult, UncertainResult
from ringfence_server.worker.envelope import LogicalKey
from ringfence_server.worker.errors import (
    CallConflict,
    InvalidTransition,
    NotClaimant,
    PruneHorizonTooShort,
    ResultsError,
)

__all__ = [
    "BUSY_TIMEOUT_MS",
    "DEFAULT_MIN_PRUNE_AGE_S",
    "RECOVERY_RELEASE_REASON",
    "SCHEMA_VERSION",
    "CallEntry",
    "CallState",
    "Recovery",
    "SqliteResults",
]

SCHEMA_VERSION = 3
"""PRAGMA user_version of a results file this code wrote; a file of another version is refused
(ResultsError) rather than read as this one. Version 2 added the uncertain state and `changed_at`,
version 3 the `attempt` column (a result is keyed by one attempt of one call); no worker ran
version 1 or 2 (the worker command is not built), so there is no migration."""
DEFAULT_MIN_PRUNE_AGE_S = 24 * 3600.0
"""The shortest prune horizon a store accepts unless configured otherwise: the longest an
envelope may live (deadline minus issue) must stay under it."""
RECOVERY_RELEASE_REASON = "the worker restarted before the container was started"
"""The release reason `recover` writes for a call left claimed."""
BUSY_TIMEOUT_MS = 5000
"""How long a write waits for another process's write to the same file before it fails."""

_DIGEST = re.compile(r"[0-9a-f]{64}")

_SCHEMA = f"""
CREATE TABLE calls (
    tenant         TEXT NOT NULL,
    run_id         TEXT NOT NULL,
    call_id        TEXT NOT NULL,
    attempt        INTEGER NOT NULL CHECK (attempt >= 1),
    call_digest    TEXT NOT NULL,
    envelope_id    TEXT NOT NULL,
    state          TEXT NOT NULL
                   CHECK (state IN ('claimed', 'started', 'recorded', 'released', 'uncertain')),
    result         BLOB,
    release_reason TEXT,
    changed_at     REAL NOT NULL,
    PRIMARY KEY (tenant, run_id, call_id, attempt),
    -- The states' invariants, held by the file itself: a result exactly when recorded, a reason
    -- exactly when released.
    CHECK ((state = 'recorded') = (result IS NOT NULL)),
    CHECK ((state = 'released') = (release_reason IS NOT NULL))
) WITHOUT ROWID;
PRAGMA user_version = {SCHEMA_VERSION};
"""


class CallState(enum.StrEnum):
    """A logical call's state in the store (the module's docstring has the changes)."""

    CLAIMED = "claimed"
    STARTED = "started"
    RECORDED = "recorded"
    RELEASED = "released"
    UNCERTAIN = "uncertain"


_LIVE = (CallState.CLAIMED, CallState.STARTED)
_FINISHED = (CallState.RECORDED, CallState.UNCERTAIN, CallState.RELEASED)


@dataclass(frozen=True)
class CallEntry:
    """What the store holds of one logical call (`SqliteResults.entry`)."""

    key: LogicalKey
    """The logical call."""
    state: CallState
    """Where it is."""
    envelope_id: str
    """The delivery that holds the claim (claimed, started), ran it (recorded) or released it."""
    call_digest: str
    """The content the call is held for, for good: another digest under this key is a conflict."""
    result: bytes | None
    """The recorded result; None unless recorded."""
    release_reason: str | None
    """Why the claimant released it; None unless released."""
    changed_at: float
    """When it last changed (the store's clock): what `prune` judges its age by."""


@dataclass(frozen=True)
class Recovery:
    """What `SqliteResults.recover` changed, for the worker to report to the control plane."""

    released: tuple[LogicalKey, ...]
    """Calls left claimed (never started: nothing ran), now released for the retry to run."""
    uncertain: tuple[LogicalKey, ...]
    """Calls left started without a result (they may have had effects), now uncertain."""

    @property
    def released_count(self) -> int:
        return len(self.released)

    @property
    def uncertain_count(self) -> int:
        return len(self.uncertain)


def _check_args(envelope_id: str, call_digest: str | None = None) -> None:
    # A programming error, not a refusal: the envelope's own validation makes both well-formed.
    if not isinstance(envelope_id, str) or not envelope_id:
        raise ValueError("envelope_id: a non-empty str")
    if call_digest is not None and not (isinstance(call_digest, str) and _DIGEST.fullmatch(call_digest)):
        raise ValueError("call_digest: 64 lower-case hex digits (Envelope.call_digest)")


def _create_private(path: Path) -> None:
    """Create the file 0600 before SQLite opens it: results are tool output (tenant data), and
    SQLite gives its -wal and -shm files the database file's permissions."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return
    os.close(fd)


class SqliteResults:
    """The durable `Results` (ringfence_server.worker.admission) of one worker, in the SQLite file
    at `path` (created 0600 if missing). Use as a context manager, or `close()`.

    `clock` stamps every change (seconds, as time.time); `min_prune_age` is the shortest horizon
    `prune` accepts, and must be at least the longest an envelope may live (the module's docstring)."""

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time,
                 min_prune_age: float = DEFAULT_MIN_PRUNE_AGE_S) -> None:
        if not min_prune_age > 0:
            raise ValueError("min_prune_age: a positive number of seconds")
        self.path = Path(path)
        self._clock = clock
        self.min_prune_age = float(min_prune_age)
        _create_private(self.path)
        self._lock = threading.Lock()
        # isolation_level=None: this code issues BEGIN IMMEDIATE itself, so each check and its
        # write are one write transaction (no other writer between the look and the change).
        self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        try:
            self._db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise ResultsError(f"{self.path}: cannot use write-ahead logging (journal mode {mode})")
            self._db.execute("PRAGMA synchronous=FULL")
            self._open_schema()
        except BaseException:
            self._db.close()
            raise

    def _open_schema(self) -> None:
        with self._write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
            elif version != SCHEMA_VERSION:
                raise ResultsError(f"{self.path}: results schema version {version}, this worker reads "
                                   f"{SCHEMA_VERSION}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> SqliteResults:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction under the lock: committed when the block ends, rolled back
        when it raises (a refusal writes nothing)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    # -- reading -------------------------------------------------------------------------------

    @staticmethod
    def _row(db: sqlite3.Connection, key: LogicalKey) -> CallEntry | None:
        row = db.execute("SELECT state, envelope_id, call_digest, result, release_reason, changed_at FROM calls "
                         "WHERE tenant = ? AND run_id = ? AND call_id = ? AND attempt = ?",
                         (key.tenant, key.run_id, key.call_id, key.attempt)).fetchone()
        if row is None:
            return None
        return CallEntry(key, CallState(row[0]), row[1], row[2], row[3], row[4], row[5])

    def entry(self, key: LogicalKey) -> CallEntry | None:
        """Everything the store holds of the logical call, or None if it was never claimed."""
        with self._lock:
            return self._row(self._db, key)

    def get(self, key: LogicalKey) -> RecordedResult | UncertainResult | None:
        """The result recorded for the logical call, its uncertain record (recovery found it
        started without a result), or None (not finished yet, or never claimed)."""
        entry = self.entry(key)
        if entry is None:
            return None
        if entry.state is CallState.UNCERTAIN:
            return UncertainResult(entry.envelope_id, entry.call_digest)
        if entry.result is None:
            return None
        return RecordedResult(entry.envelope_id, entry.call_digest, entry.result)

    # -- changing ------------------------------------------------------------------------------

    def claim(self, key: LogicalKey, envelope_id: str, call_digest: str) -> bool:
        """Take the logical call for the delivery `envelope_id`: True when it was unclaimed or
        released; False when a delivery (this one included) holds it, started it or recorded it.
        CallConflict when the call is held for another digest."""
        _check_args(envelope_id, call_digest)
        with self._write() as db:
            entry = self._row(db, key)
            if entry is None:
                db.execute("INSERT INTO calls (tenant, run_id, call_id, attempt, call_digest, envelope_id, state, "
                           "changed_at) VALUES (?, ?, ?, ?, ?, ?, 'claimed', ?)",
                           (key.tenant, key.run_id, key.call_id, key.attempt, call_digest, envelope_id,
                            self._clock()))
                return True
            if entry.call_digest != call_digest:
                raise CallConflict(key, entry.call_digest, call_digest)
            if entry.state is CallState.RELEASED:
                self._set(db, key, "state = 'claimed', envelope_id = ?, release_reason = NULL", envelope_id)
                return True
            return False

    def mark_started(self, key: LogicalKey, envelope_id: str) -> None:
        """Record that the claimant is about to start the call's container: call it before the
        engine is asked, so that a crash at any later moment leaves the call started (never
        released, never run again)."""
        _check_args(envelope_id)
        with self._write() as db:
            entry = self._claimant(db, key, envelope_id, "mark_started")
            if entry.state is CallState.RECORDED:
                raise InvalidTransition(key, envelope_id, entry.state, "mark_started", "its result is recorded")
            if entry.state is CallState.CLAIMED:
                self._set(db, key, "state = 'started'")

    def release(self, key: LogicalKey, envelope_id: str, reason: str) -> None:
        """Give the claim up because the call never started (the engine refused the container:
        nothing ran), so the next delivery runs it. Refused once the call started: it may have had
        effects, and running it again could repeat them."""
        _check_args(envelope_id)
        if not isinstance(reason, str) or not reason:
            raise ValueError("reason: a non-empty str (why the call could not start)")
        with self._write() as db:
            entry = self._row(db, key)
            if entry is not None and entry.state is CallState.RELEASED and entry.envelope_id == envelope_id:
                return  # released by this delivery already: the same fact again
            entry = self._claimant(db, key, envelope_id, "release")
            if entry.state is CallState.STARTED:
                raise InvalidTransition(key, envelope_id, entry.state, "release",
                                        "a call that started may have had effects and is never released "
                                        "(release_not_started, only on the sandbox's answer that no container "
                                        "started); it ends recorded, or uncertain for the control plane to "
                                        "reconcile")
            if entry.state is CallState.RECORDED:
                raise InvalidTransition(key, envelope_id, entry.state, "release", "it ran; its result is recorded")
            self._set(db, key, "state = 'released', release_reason = ?", reason)

    def release_not_started(self, key: LogicalKey, envelope_id: str, reason: str) -> None:
        """Give back the claim of a call marked started whose container the sandbox answered never
        started (a START_FAILED result; EngineError or ImageError raised by the backend), so the
        next delivery runs it. Only from started: a claimed call is `release`d (no start mark to
        take back), a recorded one ran. The worker's word alone never releases a started call:
        only the sandbox's answer that nothing ran does (the module's docstring)."""
        _check_args(envelope_id)
        if not isinstance(reason, str) or not reason:
            raise ValueError("reason: a non-empty str (why the container never started)")
        with self._write() as db:
            entry = self._row(db, key)
            if entry is not None and entry.state is CallState.RELEASED and entry.envelope_id == envelope_id:
                return  # released by this delivery already: the same fact again
            entry = self._claimant(db, key, envelope_id, "release_not_started")
            if entry.state is CallState.CLAIMED:
                raise InvalidTransition(key, envelope_id, entry.state, "release_not_started",
                                        "it was never marked started (a claimed call is released with release)")
            if entry.state is CallState.RECORDED:
                raise InvalidTransition(key, envelope_id, entry.state, "release_not_started",
                                        "it ran; its result is recorded")
            self._set(db, key, "state = 'released', release_reason = ?", reason)

    def record(self, key: LogicalKey, envelope_id: str, result: bytes) -> RecordedResult:
        """Record the result of the call the claimant started: from now on every delivery of the
        call is answered with it. Again with the same bytes: nothing changes (a retry); with other
        bytes: refused (a recorded result never changes, so two deliveries never get two answers)."""
        _check_args(envelope_id)
        if not isinstance(result, bytes):
            raise ValueError("result: bytes")
        with self._write() as db:
            entry = self._claimant(db, key, envelope_id, "record")
            if entry.state is CallState.RECORDED:
                if entry.result != result:
                    raise InvalidTransition(key, envelope_id, entry.state, "record",
                                            "another result is recorded, and a recorded result never changes")
            elif entry.state is CallState.CLAIMED:
                raise InvalidTransition(key, envelope_id, entry.state, "record",
                                        "it was never marked started (mark_started comes before the container)")
            else:
                self._set(db, key, "state = 'recorded', result = ?", result)
            return RecordedResult(envelope_id, entry.call_digest, result)

    def _claimant(self, db: sqlite3.Connection, key: LogicalKey, envelope_id: str, action: str) -> CallEntry:
        """The call's entry if `envelope_id` holds its live claim (or recorded it); NotClaimant
        otherwise. A released claim is held by nobody: its releaser must claim again. An uncertain
        call is final: no change of it, even by the delivery that started it (a result arriving
        after recovery would contradict what the worker already reported)."""
        entry = self._row(db, key)
        if entry is None or entry.state is CallState.RELEASED:
            raise NotClaimant(key, envelope_id, None)
        if entry.envelope_id != envelope_id:
            raise NotClaimant(key, envelope_id, entry.envelope_id)
        if entry.state is CallState.UNCERTAIN:
            raise InvalidTransition(key, envelope_id, entry.state, action,
                                    "it is uncertain (reported to the control plane, which reconciles it)")
        return entry

    def _set(self, db: sqlite3.Connection, key: LogicalKey, assignments: str, *values: object) -> None:
        # `assignments` is one of this module's literals, never input: only values are bound.
        db.execute(f"UPDATE calls SET {assignments}, changed_at = ? "
                   "WHERE tenant = ? AND run_id = ? AND call_id = ? AND attempt = ?",
                   (*values, self._clock(), key.tenant, key.run_id, key.call_id, key.attempt))

    # -- restart recovery and pruning (the module's docstring says when and why) ----------------

    def recover(self) -> Recovery:
        """Finish what the worker's last run left live, in one transaction: started → uncertain,
        then claimed → released. Call once at the worker's start, before it takes any work.
        Again, it changes nothing (nothing is live any more)."""
        with self._write() as db:
            uncertain = _make_uncertain(db, self._clock())
            released = _release_live(db, self._clock())
        return Recovery(released=released, uncertain=uncertain)

    def prune(self, older_than: float) -> int:
        """Delete the finished calls (recorded, uncertain, released) last changed more than
        `older_than` seconds ago; how many went. PruneHorizonTooShort, nothing deleted, under
        `min_prune_age`: a delivery of a younger call may still be within its deadline."""
        if not older_than >= self.min_prune_age:  # `not >=`: a NaN horizon is refused too
            raise PruneHorizonTooShort(older_than, self.min_prune_age)
        with self._write() as db:
            marks = ", ".join("?" for _ in _FINISHED)
            cursor = db.execute(f"DELETE FROM calls WHERE state IN ({marks}) AND changed_at < ?",
                                (*_FINISHED, self._clock() - older_than))
            return cursor.rowcount


def _live_keys(db: sqlite3.Connection, states: tuple[CallState, ...]) -> tuple[LogicalKey, ...]:
    marks = ", ".join("?" for _ in states)
    rows = db.execute(f"SELECT tenant, run_id, call_id, attempt FROM calls WHERE state IN ({marks}) "
                      "ORDER BY tenant, run_id, call_id, attempt", states).fetchall()
    return tuple(LogicalKey(*row) for row in rows)


def _make_uncertain(db: sqlite3.Connection, now: float) -> tuple[LogicalKey, ...]:
    """Recovery's first step, its own function: the step a red check (tests/unit/
    test_worker_results.py) switches off. A started call may have had effects: never released."""
    keys = _live_keys(db, (CallState.STARTED,))
    db.execute("UPDATE calls SET state = 'uncertain', changed_at = ? WHERE state = 'started'", (now,))
    return keys


def _release_live(db: sqlite3.Connection, now: float) -> tuple[LogicalKey, ...]:
    """Recovery's second step: every call still live. After `_make_uncertain` only claimed ones
    are left, which never started; it takes every live state so that recovery leaves nothing live
    (no call answered "in progress" forever), which is why the first step must come first."""
    keys = _live_keys(db, _LIVE)
    marks = ", ".join("?" for _ in _LIVE)
    db.execute(f"UPDATE calls SET state = 'released', release_reason = ?, changed_at = ? WHERE state IN ({marks})",
               (RECOVERY_RELEASE_REASON, now, *_LIVE))
    return keys
