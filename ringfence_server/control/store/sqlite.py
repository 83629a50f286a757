"""SQLite event store: WAL, synchronous=FULL, append-only, per-run monotonic seq, hash-chained.

Append-only is enforced by the database itself: triggers abort any UPDATE on the events table
and any DELETE outside `prune` (see sqlite_schema), so no code path (ours or a future one) can
rewrite history. `synchronous=FULL` makes a committed append survive power loss in WAL mode; an
event acknowledged is on disk. One connection guarded by a lock: SQLite serializes writers
anyway (BEGIN IMMEDIATE, also across processes sharing the file), and reads are cheap.

Several processes may open the same file: seqs, tenants and leases stay consistent because each
check and its write are one IMMEDIATE transaction. What SQLite cannot do is tell one process
that another appended: see `wait_for`.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from ringfence.model import Event
from ringfence_server.control.store.audit import canonical_json, event_hash
from ringfence_server.control.store.base import (
    FINISHED,
    SCHEMA_VERSION,
    KeyTaken,
    LateResult,
    Lease,
    NewEvent,
    Record,
    RunRow,
    SeqConflict,
    StoreError,
    StoreFull,
    StoreUnavailable,
    Subscribers,
    WorkerLease,
    WriteOutage,
    check_epoch,
    check_late_limit,
    check_lease,
    check_lease_args,
    check_worker_id,
    check_worker_lease_args,
    next_event,
    next_revision,
    refuse_existing_run,
)
from ringfence_server.control.store.sqlite_schema import DB_NOW, open_schema

_EVENT_COLUMNS = "run_id, seq, type, data, schema_version, at, prev_hash, hash"
_SQLITE_FULL = 13
"""SQLite's primary result code for "database or disk is full" (the file system said ENOSPC)."""
_WRITE_PROBE = ("INSERT INTO schema_meta (key, value) VALUES ('write_probe', 1) "
                "ON CONFLICT (key) DO UPDATE SET value = schema_meta.value + 1")
"""The write `ping` tries while writes fail for want of space: a counter that changes, so its
commit appends a page to the write-ahead log, which needs new space as every commit does (a
row rewritten as it is would write nothing)."""
_RENEW_WORKER_LEASE = ("UPDATE worker_leases SET expires_at = ? "
                       "WHERE worker_id = ? AND epoch = ? AND expires_at > ?")
"""Only the worker's current epoch, and only before it lapsed: the epoch is the fencing token (a
renewal for an attachment the worker has since replaced must fail, whoever holds either)."""
_LATE_COLUMNS = ("worker_id, epoch, envelope_id, tenant, run_id, call_id, attempt, reason, result_sha256, "
                 "recorded_at")


class SqliteEventStore:
    FALLBACK_RECHECK_S = 0.25
    """How often `wait_for` looks at the file again when no local append woke it: the bound on
    how late it notices another process's append."""

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._lock = threading.RLock()
        self._changed = threading.Condition(threading.Lock())
        self._version = 0
        self._closed = False
        self._subscribers = Subscribers()
        self._writes = WriteOutage()
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves so every check and its write
        # are one write transaction.
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=5000")
            open_schema(self._db)
        except BaseException:
            self._db.close()
            raise

    # ------------------------------------------------------------------ writing

    def append(self, run_id: str, type: str, data: Mapping[str, Any], expected_seq: int | None = None,
               tenant: str | None = None, lease: Lease | None = None, keys: Sequence[str] = ()) -> Event:
        return self.append_all(run_id, [NewEvent(type, data, keys)], expected_seq, tenant, lease)[0]

    def append_all(self, run_id: str, events: Sequence[NewEvent], expected_seq: int | None = None,
                   tenant: str | None = None, lease: Lease | None = None) -> list[Event]:
        if not events:
            raise ValueError("append_all of no events")
        payloads = [canonical_json(e.data) for e in events]
        at = float(self._clock())  # as stored (REAL / DOUBLE PRECISION): what is hashed must read back equal
        written: list[Event] = []
        with self._lock, self._write() as cur:
            row = cur.execute("SELECT seq, tenant, hash FROM events WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
                              (run_id,)).fetchone()
            refuse_existing_run(run_id, row[1] if row else None, expected_seq)
            check_lease(run_id, lease, self._lease_row(cur, run_id))
            head = (row[0], row[1]) if row else None
            prev_hash = row[2] if row else ""
            for new, payload in zip(events, payloads, strict=True):
                seq, tenant = next_event(run_id, head, new.data, expected_seq, tenant)
                content = json.loads(payload)
                digest = event_hash(prev_hash, run_id, seq, new.type, content, SCHEMA_VERSION, at)
                try:
                    cur.execute(
                        "INSERT INTO events (run_id, seq, tenant, type, data, schema_version, at, prev_hash, hash) "
                        "VALUES (?,?,?,?,?,?,?,?,?)",
                        (run_id, seq, tenant, new.type, payload, SCHEMA_VERSION, at, prev_hash, digest))
                except sqlite3.IntegrityError as e:  # UNIQUE(run_id, seq): cannot happen under IMMEDIATE
                    raise SeqConflict(f"run {run_id}: seq {seq} was taken") from e
                for name in new.keys:
                    holder = cur.execute("SELECT run_id, seq FROM keys WHERE name = ?", (name,)).fetchone()
                    if holder is not None:
                        raise KeyTaken(name, (holder[0], holder[1]))  # the write rolls back, events and all
                    cur.execute("INSERT INTO keys (name, run_id, seq) VALUES (?, ?, ?)", (name, run_id, seq))
                written.append(Event(run_id, seq, new.type, content, SCHEMA_VERSION, at, prev_hash, digest))
                head, prev_hash, expected_seq = (seq, tenant), digest, seq + 1
        self._bump()
        for event in written:
            self._subscribers.notify(event)
        return written

    def acquire_lease(self, run_id: str, owner: str, ttl_s: float) -> Lease | None:
        check_lease_args(owner, ttl_s)
        with self._lock, self._write() as cur:
            now = cur.execute(f"SELECT {DB_NOW}").fetchone()[0]
            row = cur.execute("SELECT owner, expires_at FROM leases WHERE run_id = ?", (run_id,)).fetchone()
            if row is not None and row[0] != owner and row[1] > now:
                return None
            # The same owner acquiring again gets a new token: its older handle is fenced off.
            cur.execute("UPDATE schema_meta SET value = value + 1 WHERE key = 'lease_token'")
            token = cur.execute("SELECT value FROM schema_meta WHERE key = 'lease_token'").fetchone()[0]
            expires_at = now + ttl_s
            cur.execute("INSERT INTO leases (run_id, owner, token, expires_at) VALUES (?,?,?,?) "
                        "ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, token = excluded.token, "
                        "expires_at = excluded.expires_at", (run_id, owner, token, expires_at))
        return Lease(run_id, owner, token, ttl_s, expires_at)

    def renew_lease(self, lease: Lease) -> Lease | None:
        with self._lock, self._write() as cur:
            now = cur.execute(f"SELECT {DB_NOW}").fetchone()[0]
            changed = cur.execute(
                "UPDATE leases SET expires_at = ? WHERE run_id = ? AND owner = ? AND token = ? AND expires_at > ?",
                (now + lease.ttl_s, lease.run_id, lease.owner, lease.token, now)).rowcount
        if not changed:
            return None
        return Lease(lease.run_id, lease.owner, lease.token, lease.ttl_s, now + lease.ttl_s)

    def release_lease(self, lease: Lease) -> None:
        with self._lock, self._write() as cur:
            cur.execute("DELETE FROM leases WHERE run_id = ? AND owner = ? AND token = ?",
                        (lease.run_id, lease.owner, lease.token))

    def lease_holder(self, run_id: str) -> str | None:
        """The owner of the run's unexpired lease, or None."""
        with self._lock:
            row = self._db.execute(f"SELECT owner FROM leases WHERE run_id = ? AND expires_at > {DB_NOW}",
                                   (run_id,)).fetchone()
        return row[0] if row else None

    def break_lease(self, run_id: str, owner: str) -> bool:
        """Drop `owner`'s lease on the run, whatever its expiry: ONLY for an owner known to be
        dead (a process of this host that no longer exists). True when one was dropped."""
        with self._lock, self._write() as cur:
            cur.execute("DELETE FROM leases WHERE run_id = ? AND owner = ?", (run_id, owner))
            return cur.rowcount > 0

    def prune(self, older_than_s: float) -> list[str]:
        """Remove whole runs whose last event is run_finished, appended more than `older_than_s`
        ago by this store's clock (the clock that stamped `at`), with their leases."""
        if not math.isfinite(older_than_s) or older_than_s < 0:
            raise ValueError(f"older_than_s must be a non-negative number, not {older_than_s!r}")
        cutoff = self._clock() - older_than_s
        with self._lock, self._write() as cur:
            doomed = [r[0] for r in cur.execute(
                "SELECT e.run_id FROM events e WHERE e.type = ? AND e.at < ? "
                "AND e.seq = (SELECT MAX(seq) FROM events WHERE run_id = e.run_id) ORDER BY e.rowid",
                (FINISHED, cutoff))]
            # The sanctioned path: the DELETE trigger lets through only runs listed here, and the
            # list refuses a run that is not finished.
            cur.executemany("INSERT INTO prune_allowed (run_id) VALUES (?)", [(r,) for r in doomed])
            cur.execute("DELETE FROM events WHERE run_id IN (SELECT run_id FROM prune_allowed)")
            cur.execute("DELETE FROM keys WHERE run_id IN (SELECT run_id FROM prune_allowed)")
            cur.execute("DELETE FROM leases WHERE run_id IN (SELECT run_id FROM prune_allowed)")
            cur.execute("DELETE FROM prune_allowed")
        return doomed

    # ------------------------------------------------------------------ sandbox workers

    def store_now(self) -> float:
        """SQLite's own clock (this host's), which every lease's expiry is judged by, as epoch
        seconds (millisecond precision)."""
        with self._lock:
            return float(self._db.execute(f"SELECT {DB_NOW}").fetchone()[0])

    def acquire_worker_lease(self, worker_id: str, holder: str, ttl_s: float) -> WorkerLease:
        """The worker's next epoch (1 for a new worker) for `holder`, expiring `ttl_s` seconds
        from now; every earlier epoch is fenced in the same IMMEDIATE transaction, so of
        concurrent acquisitions (threads, processes sharing the file) each gets its own epoch
        and the last one is current."""
        check_worker_lease_args(worker_id, holder, ttl_s)
        with self._lock, self._write() as cur:
            expires_at = float(cur.execute(f"SELECT {DB_NOW}").fetchone()[0]) + ttl_s
            cur.execute("INSERT INTO worker_leases (worker_id, epoch, holder, expires_at) VALUES (?, 1, ?, ?) "
                        "ON CONFLICT (worker_id) DO UPDATE SET epoch = epoch + 1, holder = excluded.holder, "
                        "expires_at = excluded.expires_at", (worker_id, holder, expires_at))
            epoch = cur.execute("SELECT epoch FROM worker_leases WHERE worker_id = ?", (worker_id,)).fetchone()[0]
        return WorkerLease(worker_id, int(epoch), holder, expires_at)

    def renew_worker_lease(self, lease: WorkerLease, ttl_s: float) -> WorkerLease | None:
        """The lease expiring `ttl_s` seconds from now, if its epoch is still the worker's
        current one and unexpired by SQLite's clock; None (and nothing changed) otherwise."""
        check_worker_lease_args(lease.worker_id, lease.holder, ttl_s)
        with self._lock, self._write() as cur:
            now = float(cur.execute(f"SELECT {DB_NOW}").fetchone()[0])
            changed = cur.execute(_RENEW_WORKER_LEASE, (now + ttl_s, lease.worker_id, lease.epoch, now)).rowcount
        if not changed:
            return None
        return WorkerLease(lease.worker_id, lease.epoch, lease.holder, now + ttl_s)

    def worker_lease_current(self, worker_id: str, epoch: int) -> bool:
        """Whether `epoch` is the worker's current epoch and unexpired by SQLite's clock now."""
        check_worker_id(worker_id)
        check_epoch(epoch)
        with self._lock:
            row = self._db.execute(f"SELECT epoch = ? AND expires_at > {DB_NOW} FROM worker_leases "
                                   "WHERE worker_id = ?", (epoch, worker_id)).fetchone()
        return bool(row and row[0])

    def end_worker_lease(self, lease: WorkerLease) -> None:
        """The lease's epoch expires now, if it is still current and unexpired; a newer epoch,
        or one that already lapsed, is left exactly as it is."""
        with self._lock, self._write() as cur:
            now = float(cur.execute(f"SELECT {DB_NOW}").fetchone()[0])
            cur.execute("UPDATE worker_leases SET expires_at = ? WHERE worker_id = ? AND epoch = ? AND expires_at > ?",
                        (now, lease.worker_id, lease.epoch, now))

    def worker_leases(self) -> list[WorkerLease]:
        """Every worker's latest lease, expired ones included, by worker id."""
        with self._lock:
            rows = self._db.execute("SELECT worker_id, epoch, holder, expires_at FROM worker_leases "
                                    "ORDER BY worker_id").fetchall()
        return [WorkerLease(w, int(e), h, float(x)) for w, e, h, x in rows]

    def record_late_result(self, late: LateResult) -> bool:
        """Record `late`, committed (synchronous=FULL) before it returns, stamped with this
        store's clock unless it carries recorded_at. False, and nothing written, when its
        (worker_id, envelope_id) was recorded before."""
        at = float(self._clock()) if late.recorded_at is None else float(late.recorded_at)
        with self._lock, self._write() as cur:
            # ON CONFLICT of the key alone: INSERT OR IGNORE would also swallow a CHECK failure.
            cur.execute(f"INSERT INTO late_results ({_LATE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?) "
                        "ON CONFLICT (worker_id, envelope_id) DO NOTHING",
                        (late.worker_id, late.epoch, late.envelope_id, late.tenant, late.run_id, late.call_id,
                         late.attempt, late.reason, late.result_sha256, at))
            return cur.rowcount == 1

    def late_results(self, limit: int = 100) -> list[LateResult]:
        """At most `limit` late results, newest first (recorded_at, then the order recorded)."""
        check_late_limit(limit)
        with self._lock:
            rows = self._db.execute(f"SELECT {_LATE_COLUMNS} FROM late_results "
                                    "ORDER BY recorded_at DESC, rowid DESC LIMIT ?", (limit,)).fetchall()
        return [LateResult(r[0], int(r[1]), r[2], r[3], r[4], r[5], int(r[6]), r[7], r[8], float(r[9]))
                for r in rows]

    # ------------------------------------------------------------------ reading

    def read(self, run_id: str, from_seq: int = 0, limit: int | None = None) -> list[Event]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE run_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
                (run_id, from_seq, -1 if limit is None else limit)).fetchall()
        return [Event(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6], r[7]) for r in rows]

    def run_page(self, tenant: str, *, finished: bool | None = None, outcome: str | None = None,
                 before: RunRow | None = None, limit: int = 50) -> list[RunRow]:
        """Walks events_tenant_started (tenant, at, rowid; first events only) backwards from the
        cursor; a finished filter is one look-up per run in events_run_finished."""
        if finished is False and outcome is not None:
            return []  # an unfinished run has no outcome
        query = "SELECT e.run_id, e.at, e.rowid FROM events e WHERE e.tenant = ? AND e.seq = 1"
        args: list[Any] = [tenant]
        if before is not None:
            query += " AND (e.at, e.rowid) < (?, ?)"
            args += [before.at, before.id]
        if finished is not None or outcome is not None:
            done = f"SELECT 1 FROM events f WHERE f.run_id = e.run_id AND f.type = '{FINISHED}'"
            if outcome is not None:
                done += " AND json_extract(f.data, '$.outcome') = ?"
                args.append(outcome)
            query += f" AND {'NOT ' if finished is False else ''}EXISTS ({done})"
        query += " ORDER BY e.at DESC, e.rowid DESC LIMIT ?"
        args.append(limit)
        with self._lock:
            rows = self._db.execute(query, args).fetchall()
        return [RunRow(r[0], float(r[1]), int(r[2])) for r in rows]

    def runs(self, tenant: str) -> list[str]:
        with self._lock:
            rows = self._db.execute(
                "SELECT run_id FROM events WHERE tenant = ? AND seq = 1 ORDER BY at, rowid", (tenant,)).fetchall()
        return [r[0] for r in rows]

    def all_runs(self) -> list[tuple[str, str]]:
        with self._lock:
            rows = self._db.execute("SELECT tenant, run_id FROM events WHERE seq = 1 ORDER BY rowid").fetchall()
        return [(r[0], r[1]) for r in rows]

    def unfinished(self, tenant: str | None = None) -> list[tuple[str, str]]:
        """(tenant, run_id) of every run without run_finished, oldest first: what a starting
        server folds, without reading the finished history."""
        query = ("SELECT tenant, run_id FROM events e WHERE seq = 1 AND NOT EXISTS (SELECT 1 FROM events f "
                 f"WHERE f.run_id = e.run_id AND f.type = '{FINISHED}')")
        args: tuple[str, ...] = ()
        if tenant is not None:
            query += " AND tenant = ?"
            args = (tenant,)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY rowid", args).fetchall()
        return [(r[0], r[1]) for r in rows]

    def tenant_of(self, run_id: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT tenant FROM events WHERE run_id = ? AND seq = 1", (run_id,)).fetchone()
        return row[0] if row else None

    # ------------------------------------------------------------------ records

    def append_record(self, tenant: str, kind: str, key: str, body: Mapping[str, Any], written_by: str,
                      expected_revision: int | None = None) -> Record:
        payload = canonical_json(body)
        at = float(self._clock())
        with self._lock, self._write() as cur:
            latest = cur.execute("SELECT MAX(revision) FROM records WHERE tenant = ? AND kind = ? AND key = ?",
                                 (tenant, kind, key)).fetchone()[0] or 0
            revision = next_revision(tenant, kind, key, latest, expected_revision)
            cur.execute("INSERT INTO records (tenant, kind, key, revision, body, written_by, at) "
                        "VALUES (?,?,?,?,?,?,?)", (tenant, kind, key, revision, payload, written_by, at))
        return Record(tenant, kind, key, revision, json.loads(payload), written_by, at)

    def read_records(self, tenant: str, kind: str, key: str) -> list[Record]:
        with self._lock:
            rows = self._db.execute("SELECT revision, body, written_by, at FROM records WHERE tenant = ? AND "
                                    "kind = ? AND key = ? ORDER BY revision", (tenant, kind, key)).fetchall()
        return [Record(tenant, kind, key, int(r), json.loads(b), w, float(a)) for r, b, w, a in rows]

    def lookup_key(self, name: str) -> tuple[str, int] | None:
        """(run id, seq) of the event that holds `name`, or None."""
        with self._lock:
            row = self._db.execute("SELECT run_id, seq FROM keys WHERE name = ?", (name,)).fetchone()
        return (row[0], int(row[1])) if row else None

    def ping(self) -> None:
        """Raise StoreUnavailable unless the database file answers a query now, and StoreFull
        while writes fail for want of space (health checks)."""
        try:
            with self._lock:
                self._db.execute("SELECT 1 FROM schema_meta LIMIT 1").fetchone()
        except sqlite3.Error as e:
            raise StoreUnavailable(f"the event log at {self.path} does not answer: {e}") from e
        if self._writes.reason is not None:
            # Only a write tells whether writes succeed again, and a server that says
            # NOT_SERVING is sent none: write something small and let its outcome decide.
            with self._lock, self._write() as cur:
                cur.execute(_WRITE_PROBE)

    def schema_version(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT value FROM schema_meta WHERE key = 'version'").fetchone()[0])

    # ------------------------------------------------------------------ watching

    def version(self) -> int:
        with self._changed:
            return self._version

    def wait(self, version: int, timeout: float) -> int:
        with self._changed:
            self._changed.wait_for(lambda: self._version != version, timeout=timeout)
            return self._version

    def wait_for(self, run_id: str, after_seq: int, timeout: float) -> bool:
        """True as soon as `run_id` has an event with seq > after_seq; False after `timeout`.

        An append through this object wakes the waiter at once. SQLite has no way to notify
        another process (or another connection) of a commit, so an append made elsewhere is
        seen by re-reading the file every FALLBACK_RECHECK_S: at most that late, never missed.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._changed:
                if self._closed:
                    return False
                seen = self._version  # read before the check: an append in between still wakes us
            try:
                if self._head_seq(run_id) > after_seq:
                    return True
            except sqlite3.ProgrammingError:  # closed meanwhile
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            def moved(seen: int = seen) -> bool:  # `seen` of this iteration, bound explicitly
                return self._version != seen or self._closed

            with self._changed:
                self._changed.wait_for(moved,
                                       timeout=min(remaining, self.FALLBACK_RECHECK_S))

    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        return self._subscribers.add(callback)

    def close(self) -> None:
        with self._lock:
            self._db.close()
        with self._changed:
            self._closed = True
            self._version += 1
            self._changed.notify_all()

    # ------------------------------------------------------------------ plumbing

    def _write(self) -> _WriteTransaction:
        return _WriteTransaction(self._db, self._writes)

    def _bump(self) -> None:
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def _head_seq(self, run_id: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT MAX(seq) FROM events WHERE run_id = ?", (run_id,)).fetchone()
        return row[0] or 0

    @staticmethod
    def _lease_row(cur: sqlite3.Cursor, run_id: str) -> tuple[str, int, bool] | None:
        row = cur.execute(f"SELECT owner, token, expires_at > {DB_NOW} FROM leases WHERE run_id = ?",
                          (run_id,)).fetchone()
        return (row[0], row[1], bool(row[2])) if row else None


def _is_full(e: sqlite3.Error) -> bool:
    # Extended result codes carry the primary one in their low byte.
    return (getattr(e, "sqlite_errorcode", 0) or 0) & 0xFF == _SQLITE_FULL


class _WriteTransaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any exception (the caller holds the lock).
    A full disk, wherever the transaction meets it, is StoreFull and recorded in `writes`; a
    commit clears it."""

    def __init__(self, db: sqlite3.Connection, writes: WriteOutage) -> None:
        self._db = db
        self._writes = writes
        self._cur: sqlite3.Cursor | None = None

    def __enter__(self) -> sqlite3.Cursor:
        self._cur = self._db.cursor()
        try:
            self._cur.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:  # busy past busy_timeout, read-only file, ...
            raise self._refusal("cannot write the event log", e) from e
        return self._cur

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._cur is not None
        if exc_type is None:
            try:
                self._cur.execute("COMMIT")
            except sqlite3.Error as e:  # disk full, I/O error: nothing was committed
                self._rollback()
                raise self._refusal("cannot commit to the event log", e) from e
            self._writes.succeeded()
            return
        self._rollback()
        if isinstance(exc, sqlite3.Error) and _is_full(exc):
            # A statement that needed a new page (the cache spilled to a full disk); other
            # sqlite3 errors of a statement are bugs and pass through as they are.
            raise self._refusal("cannot write the event log", exc) from exc

    def _refusal(self, doing: str, e: sqlite3.Error) -> StoreError:
        if _is_full(e):
            self._writes.failed(str(e))
            return StoreFull(f"{doing}: its disk is full ({e}); nothing was written, retry once space is freed")
        return StoreError(f"{doing}: {e}")

    def _rollback(self) -> None:
        assert self._cur is not None
        if self._db.in_transaction:
            self._cur.execute("ROLLBACK")
