"""The worker's durable record of logical calls: who claimed each, whether it started, its result,
and claims released because the call never started. SQLite: the worker's own file, on its host.

One row per logical call (tenant, run, call: `LogicalKey`), held for one call digest forever
(`Envelope.call_digest`): the same ids with other content are a CallConflict, whatever the state.
The states, and the only changes between them:

    (none) ──claim──▶ claimed ──mark_started──▶ started ──record──▶ recorded
                      claimed ──release──▶ released ──claim──▶ claimed (a later delivery)

    claimed    a delivery (its envelope id) won the call; no container has been asked for yet.
    started    written BEFORE the worker asks its engine for the container: from here the call
               may have had effects, so it is never released. It ends recorded; if the worker
               dies first it stays started (uncertain: the control plane reconciles it as after
               a crash of its own), and a later delivery is answered "in progress", never run.
    recorded   final: the result every later delivery of the call is answered with (`get`).
    released   the claimant could not start it (the engine refused: nothing ran) and said why;
               the next claim (the control plane's retry, any delivery of the same content)
               wins it again, as if it had never been claimed.

Refused, each with a ResultsError (ringfence_server.worker.errors) and nothing written:

    any change by a delivery that does not hold the live claim          NotClaimant
    a claim for another call digest under the same key (any state)      CallConflict
    release after mark_started (or after record)                        InvalidTransition
    record before mark_started (nothing started, so nothing ran)        InvalidTransition
    mark_started after record                                           InvalidTransition
    a second record of OTHER bytes                                      InvalidTransition

Idempotent, because each is the same fact again and a worker that cannot tell whether its
write landed (an error after the commit) must be able to retry it: mark_started of a started
call, record of the same bytes, release of a claim the same delivery already released, each by
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ringfence_server.worker.admission import RecordedResult
from ringfence_server.worker.envelope import LogicalKey
from ringfence_server.worker.errors import CallConflict, InvalidTransition, NotClaimant, ResultsError

__all__ = ["BUSY_TIMEOUT_MS", "SCHEMA_VERSION", "CallEntry", "CallState", "SqliteResults"]

SCHEMA_VERSION = 1
"""PRAGMA user_version of a results file this code wrote; a file of another version is refused
(ResultsError) rather than read as this one."""
BUSY_TIMEOUT_MS = 5000
"""How long a write waits for another process's write to the same file before it fails."""

_DIGEST = re.compile(r"[0-9a-f]{64}")

_SCHEMA = f"""
CREATE TABLE calls (
    tenant         TEXT NOT NULL,
    run_id         TEXT NOT NULL,
    call_id        TEXT NOT NULL,
    call_digest    TEXT NOT NULL,
    envelope_id    TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('claimed', 'started', 'recorded', 'released')),
    result         BLOB,
    release_reason TEXT,
    PRIMARY KEY (tenant, run_id, call_id),
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
    at `path` (created 0600 if missing). Use as a context manager, or `close()`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
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
        row = db.execute("SELECT state, envelope_id, call_digest, result, release_reason FROM calls "
                         "WHERE tenant = ? AND run_id = ? AND call_id = ?",
                         (key.tenant, key.run_id, key.call_id)).fetchone()
        if row is None:
            return None
        return CallEntry(key, CallState(row[0]), row[1], row[2], row[3], row[4])

    def entry(self, key: LogicalKey) -> CallEntry | None:
        """Everything the store holds of the logical call, or None if it was never claimed."""
        with self._lock:
            return self._row(self._db, key)

    def get(self, key: LogicalKey) -> RecordedResult | None:
        """The result recorded for the logical call, or None (not recorded yet, or never claimed)."""
        entry = self.entry(key)
        if entry is None or entry.result is None:
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
                db.execute("INSERT INTO calls (tenant, run_id, call_id, call_digest, envelope_id, state) "
                           "VALUES (?, ?, ?, ?, ?, 'claimed')",
                           (key.tenant, key.run_id, key.call_id, call_digest, envelope_id))
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
            entry = self._claimant(db, key, envelope_id)
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
            entry = self._claimant(db, key, envelope_id)
            if entry.state is CallState.STARTED:
                raise InvalidTransition(key, envelope_id, entry.state, "release",
                                        "a call that started may have had effects and is never released; "
                                        "it ends recorded, or uncertain for the control plane to reconcile")
            if entry.state is CallState.RECORDED:
                raise InvalidTransition(key, envelope_id, entry.state, "release", "it ran; its result is recorded")
            self._set(db, key, "state = 'released', release_reason = ?", reason)

    def record(self, key: LogicalKey, envelope_id: str, result: bytes) -> RecordedResult:
        """Record the result of the call the claimant started: from now on every delivery of the
        call is answered with it. Again with the same bytes: nothing changes (a retry); with other
        bytes: refused (a recorded result never changes, so two deliveries never get two answers)."""
        _check_args(envelope_id)
        if not isinstance(result, bytes):
            raise ValueError("result: bytes")
        with self._write() as db:
            entry = self._claimant(db, key, envelope_id)
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

    def _claimant(self, db: sqlite3.Connection, key: LogicalKey, envelope_id: str) -> CallEntry:
        """The call's entry if `envelope_id` holds its live claim (or recorded it); NotClaimant
        otherwise. A released claim is held by nobody: its releaser must claim again."""
        entry = self._row(db, key)
        if entry is None or entry.state is CallState.RELEASED:
            raise NotClaimant(key, envelope_id, None)
        if entry.envelope_id != envelope_id:
            raise NotClaimant(key, envelope_id, entry.envelope_id)
        return entry

    @staticmethod
    def _set(db: sqlite3.Connection, key: LogicalKey, assignments: str, *values: object) -> None:
        # `assignments` is one of this module's literals, never input: only values are bound.
        db.execute(f"UPDATE calls SET {assignments} WHERE tenant = ? AND run_id = ? AND call_id = ?",
                   (*values, key.tenant, key.run_id, key.call_id))
