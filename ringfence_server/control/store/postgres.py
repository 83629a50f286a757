"""PostgreSQL event store (psycopg 3): the same contract as the SQLite store, for several
control-plane instances sharing one database.

- Append-only is enforced by triggers (postgres_schema): UPDATE and TRUNCATE are always
  refused, DELETE only for runs that `prune` listed in prune_allowed inside its transaction.
- Every write to a run (append, lease changes, prune) first takes a transaction-scoped advisory
  lock on the run id, so the seq check, the lease check and the insert see a run that nobody
  else is changing; the (run_id, seq) primary key is the backstop.
- An append returns after its COMMIT, and the pool's connections insist on
  synchronous_commit=on (a server default of off would acknowledge events not yet on disk).
- Watchers: each append NOTIFYs one channel with the run id, inside its transaction (so it is
  delivered at commit, and only then). One listener connection per store object dispatches to
  the threads in `wait_for` by run id and bumps `version()`.
- Thread-safe: a psycopg_pool connection pool; the gRPC edge calls from many threads.
- An unreachable database costs each call one `timeout_s` (the wait for a pool connection),
  then StoreUnavailable; the health probe (`ping`) has a connection of its own, so it notices
  an outage at its next round instead of after the pool's wait and reconnect backoff.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

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
    RevisionConflict,
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
from ringfence_server.control.store.postgres_schema import open_schema

log = logging.getLogger("ringfence.store.postgres")

CHANNEL = "ringfence_events"
"""The NOTIFY channel of appends; the payload is the run id."""

_EVENT_COLUMNS = "run_id, seq, type, data, schema_version, at, prev_hash, hash"
_RUN_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"

_WRITE_PROBE = ("CREATE TEMP TABLE ringfence_write_probe (x int) ON COMMIT DROP",
                "INSERT INTO ringfence_write_probe VALUES (1)")
"""The write `ping` tries while writes fail for want of disk (in one transaction, dropped at
its commit): a new relation that grows by one block, in the database's tablespace as the
events' tables (unless temp_tablespaces says otherwise). A row written into an existing table
would fit in a page with room left and succeed while the events could not grow."""

_RENEW_WORKER_LEASE = ("UPDATE worker_leases SET expires_at = now() + make_interval(secs => %s) "
                       "WHERE worker_id = %s AND epoch = %s AND expires_at > now() "
                       "RETURNING extract(epoch FROM expires_at)::float8")
"""Only the worker's current epoch, and only before it lapsed by the database's clock: the epoch
is the fencing token (a renewal for an attachment the worker has since replaced must fail,
whoever holds either). An acquisition racing it holds the row: the UPDATE waits for it and then
re-checks the new row, whose epoch no longer matches."""
_LATE_COLUMNS = ("worker_id, epoch, envelope_id, tenant, run_id, call_id, attempt, reason, result_sha256, "
                 "recorded_at")

DEFAULT_TIMEOUT_S = 5.0
"""How long a call waits for a database connection by default (control.config.Limits.store_timeout_s)."""


class PostgresEventStore:
    FALLBACK_RECHECK_S = 5.0
    """`wait_for` re-reads at least this often even without a notification: a bound on how late
    it notices an append if the listener connection was lost and is reconnecting."""

    def __init__(self, url: str, *, clock: Callable[[], float] = time.time, pool_size: int = 10,
                 connect_timeout_s: float = 10.0, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """`connect_timeout_s`: for opening the store. `timeout_s`: what a call waits at most for
        a connection later (from the pool, or the health probe's own) before StoreUnavailable."""
        self.url = url
        self._timeout_s = timeout_s
        self._writes = WriteOutage()
        self._probe: psycopg.Connection | None = None  # ping's own connection
        self._probe_lock = threading.Lock()
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._version = 0
        self._closed = False
        self._waiters: dict[str, list[int]] = {}  # run id -> [generation, waiting threads]
        self._subscribers = Subscribers()
        # The schema first, on a connection of its own: an unreachable database or a schema we
        # must not touch fails here at once, with the server's own words, before any pool retries.
        try:
            with psycopg.connect(url, autocommit=True, application_name="ringfence-open",
                                 connect_timeout=max(1, round(connect_timeout_s))) as conn:
                open_schema(conn)
        except psycopg.OperationalError as e:
            raise StoreUnavailable(f"cannot open the event store database: {e}") from e
        self._pool = ConnectionPool(url, min_size=1, max_size=pool_size, open=False, name="ringfence-store",
                                    kwargs={"autocommit": True, "application_name": "ringfence"},
                                    configure=_configure, check=ConnectionPool.check_connection,
                                    timeout=timeout_s)
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
            self._listener = _Listener(url, self._on_notify, self._wake_all)
        except PoolTimeout as e:
            self._pool.close()
            raise StoreUnavailable(f"cannot connect to the event store database: {e}") from e
        except BaseException:
            self._pool.close()
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
        seq = 0
        try:
            with self._conn() as conn, conn.transaction():
                conn.execute(_RUN_LOCK, (run_id,))
                row = conn.execute("SELECT seq, tenant, hash FROM events WHERE run_id = %s ORDER BY seq DESC LIMIT 1",
                                   (run_id,)).fetchone()
                refuse_existing_run(run_id, row[1] if row else None, expected_seq)
                check_lease(run_id, lease, _lease_row(conn, run_id))
                head = (row[0], row[1]) if row else None
                prev_hash = row[2] if row else ""
                for new, payload in zip(events, payloads, strict=True):
                    seq, tenant = next_event(run_id, head, new.data, expected_seq, tenant)
                    content = json.loads(payload)
                    digest = event_hash(prev_hash, run_id, seq, new.type, content, SCHEMA_VERSION, at)
                    conn.execute(
                        "INSERT INTO events (run_id, seq, tenant, type, data, schema_version, at, prev_hash, hash) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        (run_id, seq, tenant, new.type, payload, SCHEMA_VERSION, at, prev_hash, digest))
                    for name in new.keys:
                        holder = conn.execute("SELECT run_id, seq FROM keys WHERE name = %s", (name,)).fetchone()
                        if holder is not None:
                            raise KeyTaken(name, (holder[0], int(holder[1])))  # rolls back, events and all
                        try:
                            with conn.transaction():  # a savepoint: only this insert fails on a race
                                conn.execute("INSERT INTO keys (name, run_id, seq) VALUES (%s, %s, %s)",
                                             (name, run_id, seq))
                        except psycopg.errors.UniqueViolation:
                            raise KeyTaken(name, None) from None  # another run claimed it just now
                    written.append(Event(run_id, seq, new.type, content, SCHEMA_VERSION, at, prev_hash, digest))
                    head, prev_hash, expected_seq = (seq, tenant), digest, seq + 1
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, run_id))
        except psycopg.errors.UniqueViolation as e:  # a writer that skipped the run lock
            raise SeqConflict(f"run {run_id}: seq {seq} was taken") from e
        self._writes.succeeded()
        self._on_notify(run_id)  # our own waiters need not wait for the round trip
        for event in written:
            self._subscribers.notify(event)
        return written

    def acquire_lease(self, run_id: str, owner: str, ttl_s: float) -> Lease | None:
        check_lease_args(owner, ttl_s)
        with self._conn() as conn, conn.transaction():
            conn.execute(_RUN_LOCK, (run_id,))
            # The same owner acquiring again gets a new token: its older handle is fenced off.
            row = conn.execute(
                "INSERT INTO leases (run_id, owner, token, expires_at) "
                "VALUES (%s, %s, nextval('lease_tokens'), now() + make_interval(secs => %s)) "
                "ON CONFLICT (run_id) DO UPDATE SET owner = EXCLUDED.owner, token = EXCLUDED.token, "
                "expires_at = EXCLUDED.expires_at "
                "WHERE leases.owner = EXCLUDED.owner OR leases.expires_at <= now() "
                "RETURNING token, extract(epoch FROM expires_at)::float8",
                (run_id, owner, float(ttl_s))).fetchone()
        return Lease(run_id, owner, row[0], ttl_s, row[1]) if row else None

    def renew_lease(self, lease: Lease) -> Lease | None:
        with self._conn() as conn, conn.transaction():
            conn.execute(_RUN_LOCK, (lease.run_id,))
            row = conn.execute(
                "UPDATE leases SET expires_at = now() + make_interval(secs => %s) "
                "WHERE run_id = %s AND owner = %s AND token = %s AND expires_at > now() "
                "RETURNING extract(epoch FROM expires_at)::float8",
                (float(lease.ttl_s), lease.run_id, lease.owner, lease.token)).fetchone()
        return Lease(lease.run_id, lease.owner, lease.token, lease.ttl_s, row[0]) if row else None

    def release_lease(self, lease: Lease) -> None:
        with self._conn() as conn, conn.transaction():
            conn.execute(_RUN_LOCK, (lease.run_id,))
            conn.execute("DELETE FROM leases WHERE run_id = %s AND owner = %s AND token = %s",
                         (lease.run_id, lease.owner, lease.token))

    def lease_holder(self, run_id: str) -> str | None:
        """The owner of the run's unexpired lease, or None."""
        with self._conn() as conn:
            row = conn.execute("SELECT owner FROM leases WHERE run_id = %s AND expires_at > now()",
                               (run_id,)).fetchone()
        return row[0] if row else None

    def break_lease(self, run_id: str, owner: str) -> bool:
        """Drop `owner`'s lease on the run, whatever its expiry: ONLY for an owner known to be
        dead (a process of this host that no longer exists). True when one was dropped."""
        with self._conn() as conn, conn.transaction():
            conn.execute(_RUN_LOCK, (run_id,))
            return conn.execute("DELETE FROM leases WHERE run_id = %s AND owner = %s", (run_id, owner)).rowcount > 0

    def prune(self, older_than_s: float) -> list[str]:
        """Remove whole runs whose last event is run_finished, appended more than `older_than_s`
        ago by this store's clock (the clock that stamped `at`), with their leases."""
        if not math.isfinite(older_than_s) or older_than_s < 0:
            raise ValueError(f"older_than_s must be a non-negative number, not {older_than_s!r}")
        cutoff = self._clock() - older_than_s
        finished = ("SELECT e.run_id FROM events e WHERE e.type = %s AND e.at < %s "
                    "AND NOT EXISTS (SELECT 1 FROM events n WHERE n.run_id = e.run_id AND n.seq > e.seq)")
        with self._conn() as conn, conn.transaction():
            candidates = [r[0] for r in conn.execute(finished, (FINISHED, cutoff))]
            for run_id in sorted(candidates):  # one order for every pruner: no lock cycles
                conn.execute(_RUN_LOCK, (run_id,))
            # Again under the locks: an append may have landed, or another instance pruned first.
            doomed = [r[0] for r in conn.execute(finished + " AND e.run_id = ANY(%s) ORDER BY e.id",
                                                 (FINISHED, cutoff, candidates))]
            # The sanctioned path: the DELETE trigger lets through only runs listed here, and the
            # list refuses a run that is not finished.
            conn.execute("INSERT INTO prune_allowed (run_id) SELECT unnest(%s::text[])", (doomed,))
            conn.execute("DELETE FROM events WHERE run_id IN (SELECT run_id FROM prune_allowed)")
            conn.execute("DELETE FROM keys WHERE run_id IN (SELECT run_id FROM prune_allowed)")
            conn.execute("DELETE FROM leases WHERE run_id IN (SELECT run_id FROM prune_allowed)")
            conn.execute("DELETE FROM prune_allowed")
        return doomed

    # ------------------------------------------------------------------ sandbox workers

    def store_now(self) -> float:
        """The database's clock (its now()), which every lease's expiry is judged by, as epoch
        seconds: the same for every control plane on the database, whatever their hosts' clocks."""
        with self._conn() as conn:
            return float(_first(conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()))

    def acquire_worker_lease(self, worker_id: str, holder: str, ttl_s: float) -> WorkerLease:
        """The worker's next epoch (1 for a new worker) for `holder`, expiring `ttl_s` seconds
        from the database's now(); every earlier epoch is fenced by the same statement. Of
        concurrent acquisitions (any control planes) the row lock of the upsert lets one at a
        time in, so each gets its own epoch and the last to commit is current."""
        check_worker_lease_args(worker_id, holder, ttl_s)
        with self._conn() as conn, conn.transaction():
            row = conn.execute(
                "INSERT INTO worker_leases (worker_id, epoch, holder, expires_at) "
                "VALUES (%s, 1, %s, now() + make_interval(secs => %s)) "
                "ON CONFLICT (worker_id) DO UPDATE SET epoch = worker_leases.epoch + 1, holder = EXCLUDED.holder, "
                "expires_at = EXCLUDED.expires_at "
                "RETURNING epoch, extract(epoch FROM expires_at)::float8",
                (worker_id, holder, float(ttl_s))).fetchone()
        self._writes.succeeded()
        assert row is not None, "an upsert returns its row"
        return WorkerLease(worker_id, int(row[0]), holder, float(row[1]))

    def renew_worker_lease(self, lease: WorkerLease, ttl_s: float) -> WorkerLease | None:
        """The lease expiring `ttl_s` seconds from the database's now(), if its epoch is still
        the worker's current one and unexpired by that clock; None (and nothing changed) otherwise."""
        check_worker_lease_args(lease.worker_id, lease.holder, ttl_s)
        with self._conn() as conn, conn.transaction():
            row = conn.execute(_RENEW_WORKER_LEASE, (float(ttl_s), lease.worker_id, lease.epoch)).fetchone()
        self._writes.succeeded()
        return WorkerLease(lease.worker_id, lease.epoch, lease.holder, float(row[0])) if row else None

    def worker_lease_current(self, worker_id: str, epoch: int) -> bool:
        """Whether `epoch` is the worker's current epoch and unexpired by the database's clock now."""
        check_worker_id(worker_id)
        check_epoch(epoch)
        with self._conn() as conn:
            row = conn.execute("SELECT epoch = %s AND expires_at > now() FROM worker_leases WHERE worker_id = %s",
                               (epoch, worker_id)).fetchone()
        return bool(row and row[0])

    def end_worker_lease(self, lease: WorkerLease) -> None:
        """The lease's epoch expires at the database's now(), if it is still current and
        unexpired; a newer epoch, or one that already lapsed, is left exactly as it is."""
        with self._conn() as conn, conn.transaction():
            conn.execute("UPDATE worker_leases SET expires_at = now() "
                         "WHERE worker_id = %s AND epoch = %s AND expires_at > now()", (lease.worker_id, lease.epoch))
        self._writes.succeeded()

    def worker_leases(self) -> list[WorkerLease]:
        """Every worker's latest lease, expired ones included, by worker id."""
        with self._conn() as conn:
            rows = conn.execute("SELECT worker_id, epoch, holder, extract(epoch FROM expires_at)::float8 "
                                "FROM worker_leases ORDER BY worker_id").fetchall()
        return [WorkerLease(w, int(e), h, float(x)) for w, e, h, x in rows]

    def record_late_result(self, late: LateResult) -> bool:
        """Record `late`, committed (synchronous_commit=on) before it returns, stamped with this
        store's clock unless it carries recorded_at. False, and nothing written, when its
        (worker_id, envelope_id) was recorded before (by any control plane)."""
        at = float(self._clock()) if late.recorded_at is None else float(late.recorded_at)
        with self._conn() as conn, conn.transaction():
            row = conn.execute(
                f"INSERT INTO late_results ({_LATE_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (worker_id, envelope_id) DO NOTHING RETURNING 1",
                (late.worker_id, late.epoch, late.envelope_id, late.tenant, late.run_id, late.call_id, late.attempt,
                 late.reason, late.result_sha256, at)).fetchone()
        self._writes.succeeded()
        return row is not None

    def late_results(self, limit: int = 100) -> list[LateResult]:
        """At most `limit` late results, newest first (recorded_at, then the order recorded)."""
        check_late_limit(limit)
        with self._conn() as conn:
            rows = conn.execute(f"SELECT {_LATE_COLUMNS} FROM late_results ORDER BY recorded_at DESC, id DESC "
                                "LIMIT %s", (limit,)).fetchall()
        return [LateResult(r[0], int(r[1]), r[2], r[3], r[4], r[5], int(r[6]), r[7], r[8], float(r[9]))
                for r in rows]

    # ------------------------------------------------------------------ reading

    def read(self, run_id: str, from_seq: int = 0, limit: int | None = None) -> list[Event]:
        with self._conn() as conn:
            rows = conn.execute(f"SELECT {_EVENT_COLUMNS} FROM events WHERE run_id = %s AND seq >= %s ORDER BY seq "
                                "LIMIT %s", (run_id, from_seq, limit)).fetchall()
        return [Event(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6], r[7]) for r in rows]

    def run_page(self, tenant: str, *, finished: bool | None = None, outcome: str | None = None,
                 before: RunRow | None = None, limit: int = 50) -> list[RunRow]:
        """Walks events_first (tenant, at, id; first events only) backwards from the cursor; a
        finished filter is one look-up per run in events_run_finished."""
        if finished is False and outcome is not None:
            return []  # an unfinished run has no outcome
        query = "SELECT e.run_id, e.at, e.id FROM events e WHERE e.tenant = %s AND e.seq = 1"
        args: list[Any] = [tenant]
        if before is not None:
            query += " AND (e.at, e.id) < (%s, %s)"
            args += [before.at, before.id]
        if finished is not None or outcome is not None:
            done = "SELECT 1 FROM events f WHERE f.run_id = e.run_id AND f.type = %s"
            args.append(FINISHED)
            if outcome is not None:
                done += " AND f.data::jsonb ->> 'outcome' = %s"
                args.append(outcome)
            query += f" AND {'NOT ' if finished is False else ''}EXISTS ({done})"
        query += " ORDER BY e.at DESC, e.id DESC LIMIT %s"
        args.append(limit)
        with self._conn() as conn:
            rows = conn.execute(query, args).fetchall()
        return [RunRow(r[0], float(r[1]), int(r[2])) for r in rows]

    def runs(self, tenant: str) -> list[str]:
        with self._conn() as conn:
            rows = conn.execute("SELECT run_id FROM events WHERE tenant = %s AND seq = 1 ORDER BY at, id",
                                (tenant,)).fetchall()
        return [r[0] for r in rows]

    def all_runs(self) -> list[tuple[str, str]]:
        with self._conn() as conn:
            rows = conn.execute("SELECT tenant, run_id FROM events WHERE seq = 1 ORDER BY id").fetchall()
        return [(r[0], r[1]) for r in rows]

    def unfinished(self, tenant: str | None = None) -> list[tuple[str, str]]:
        """(tenant, run_id) of every run without run_finished, oldest first: what a starting
        server folds, without reading the finished history."""
        query = ("SELECT tenant, run_id FROM events e WHERE seq = 1 AND NOT EXISTS (SELECT 1 FROM events f "
                 "WHERE f.run_id = e.run_id AND f.type = %s)")
        args: tuple[str, ...] = (FINISHED,)
        if tenant is not None:
            query += " AND tenant = %s"
            args += (tenant,)
        with self._conn() as conn:
            rows = conn.execute(query + " ORDER BY id", args).fetchall()
        return [(r[0], r[1]) for r in rows]

    def tenant_of(self, run_id: str) -> str | None:
        with self._conn() as conn:
            row = conn.execute("SELECT tenant FROM events WHERE run_id = %s AND seq = 1", (run_id,)).fetchone()
        return row[0] if row else None

    # ------------------------------------------------------------------ records

    def append_record(self, tenant: str, kind: str, key: str, body: Mapping[str, Any], written_by: str,
                      expected_revision: int | None = None) -> Record:
        payload = canonical_json(body)
        at = float(self._clock())
        try:
            with self._conn() as conn, conn.transaction():
                # One writer per record key at a time: the revision read and its insert are atomic.
                conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 7))",
                             (json.dumps([tenant, kind, key]),))
                latest = _first(conn.execute("SELECT MAX(revision) FROM records WHERE tenant = %s AND kind = %s "
                                             "AND key = %s", (tenant, kind, key)).fetchone()) or 0
                revision = next_revision(tenant, kind, key, int(latest), expected_revision)
                conn.execute("INSERT INTO records (tenant, kind, key, revision, body, written_by, at) "
                             "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                             (tenant, kind, key, revision, payload, written_by, at))
        except psycopg.errors.UniqueViolation as e:  # cannot happen under the lock
            raise RevisionConflict(f"{kind} {key!r}: revision {revision} was taken") from e
        self._writes.succeeded()
        return Record(tenant, kind, key, revision, json.loads(payload), written_by, at)

    def read_records(self, tenant: str, kind: str, key: str) -> list[Record]:
        with self._conn() as conn:
            rows = conn.execute("SELECT revision, body, written_by, at FROM records WHERE tenant = %s AND "
                                "kind = %s AND key = %s ORDER BY revision", (tenant, kind, key)).fetchall()
        return [Record(tenant, kind, key, int(r), json.loads(b), w, float(a)) for r, b, w, a in rows]

    def lookup_key(self, name: str) -> tuple[str, int] | None:
        """(run id, seq) of the event that holds `name`, or None."""
        with self._conn() as conn:
            row = conn.execute("SELECT run_id, seq FROM keys WHERE name = %s", (name,)).fetchone()
        return (row[0], int(row[1])) if row else None

    def ping(self) -> None:
        """Raise StoreUnavailable unless the database answers a query now, and StoreFull while
        writes fail for want of disk (health checks).

        On a connection of its own, kept between rounds: the pool would hand out a connection
        only after its wait and its reconnect backoff (seconds after the database went away,
        or never, when it came back within them), and a pool busy with calls is no outage."""
        with self._probe_lock:
            try:
                try:
                    self._probe_connection().execute("SELECT 1").fetchone()
                except psycopg.OperationalError:
                    # The connection kept since the last round may have been closed meanwhile
                    # (a restart, an idle timeout) by a database that answers: ask a new one.
                    self._drop_probe()
                    self._probe_connection().execute("SELECT 1").fetchone()
                if self._writes.reason is not None:
                    # Only a write tells whether writes succeed again, and a server that says
                    # NOT_SERVING is sent none: write something small and let it decide.
                    conn = self._probe_connection()
                    with conn.transaction():
                        for statement in _WRITE_PROBE:
                            conn.execute(statement)
                    self._writes.succeeded()
            except psycopg.errors.DiskFull as e:
                self._writes.failed(str(e))
                raise StoreFull(f"the event store database's disk is full: {e}") from e
            except psycopg.OperationalError as e:
                self._drop_probe()
                raise StoreUnavailable(f"the event store database does not answer: {e}") from e

    def _probe_connection(self) -> psycopg.Connection:
        if self._probe is None or self._probe.closed:
            # libpq counts whole seconds, and no fewer than 2.
            self._probe = psycopg.connect(self.url, autocommit=True, application_name="ringfence-health",
                                          connect_timeout=max(2, math.ceil(self._timeout_s)))
            _configure(self._probe)
        return self._probe

    def _drop_probe(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.close()

    def schema_version(self) -> int:
        with self._conn() as conn:
            return int(_first(conn.execute("SELECT value FROM schema_meta WHERE key = 'version'").fetchone()))

    # ------------------------------------------------------------------ watching

    def version(self) -> int:
        with self._cond:
            return self._version

    def wait(self, version: int, timeout: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self._version != version, timeout=timeout)
            return self._version

    def wait_for(self, run_id: str, after_seq: int, timeout: float) -> bool:
        """True as soon as `run_id` has an event with seq > after_seq, appended by this object or
        by any other process on the database (its NOTIFY wakes us); False after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            entry = self._waiters.setdefault(run_id, [0, 0])
            entry[1] += 1
        try:
            while True:
                with self._cond:
                    if self._closed:
                        return False
                    seen = entry[0]  # read before the check: a notification in between still wakes us
                if self._head_seq(run_id) > after_seq:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                def moved(seen: int = seen) -> bool:  # `seen` of this iteration, bound explicitly
                    return entry[0] != seen or self._closed

                with self._cond:
                    self._cond.wait_for(moved,
                                        timeout=min(remaining, self.FALLBACK_RECHECK_S))
        finally:
            with self._cond:
                entry[1] -= 1
                if entry[1] == 0 and self._waiters.get(run_id) is entry:
                    del self._waiters[run_id]

    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        return self._subscribers.add(callback)

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._version += 1
            self._cond.notify_all()
        self._listener.stop(self._pool)
        self._pool.close()
        # Not under the probe's lock: a probe stuck on a silent network must not hold up close;
        # closing its connection ends its wait.
        self._drop_probe()

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection]:
        # Connection trouble becomes StoreUnavailable (UNAVAILABLE at the edge: retry later);
        # our own StoreErrors and the database's refusals pass through.
        # A full disk is neither: StoreFull (RESOURCE_EXHAUSTED), and health says so until a
        # write succeeds.
        try:
            with self._pool.connection() as conn:
                yield conn
        except PoolTimeout as e:
            raise StoreUnavailable(f"no database connection available: {e}") from e
        except psycopg.errors.DiskFull as e:
            self._writes.failed(str(e))
            raise StoreFull(f"the event store database's disk is full: {e}; nothing was written, "
                            "retry once space is freed") from e
        except psycopg.OperationalError as e:
            raise StoreUnavailable(f"the event store database failed: {e}") from e

    def _head_seq(self, run_id: str) -> int:
        with self._conn() as conn:
            row = conn.execute("SELECT max(seq) FROM events WHERE run_id = %s", (run_id,)).fetchone()
        return int(_first(row) or 0)

    def _on_notify(self, run_id: str) -> None:
        with self._cond:
            self._version += 1
            entry = self._waiters.get(run_id)
            if entry is not None:
                entry[0] += 1
            self._cond.notify_all()

    def _wake_all(self) -> None:
        with self._cond:
            self._version += 1
            for entry in self._waiters.values():
                entry[0] += 1
            self._cond.notify_all()


def _first(row: tuple[Any, ...] | None) -> Any:
    """The first column of a query that always returns one row (an aggregate, a seeded key)."""
    assert row is not None, "the query returns one row"
    return row[0]


def _configure(conn: psycopg.Connection) -> None:
    conn.execute("SET synchronous_commit TO on")


def _lease_row(conn: psycopg.Connection, run_id: str) -> tuple[str, int, bool] | None:
    row = conn.execute("SELECT owner, token, expires_at > now() FROM leases WHERE run_id = %s", (run_id,)).fetchone()
    return (row[0], row[1], bool(row[2])) if row else None


class _Listener:
    """One LISTEN connection and the thread that reads it, reconnecting when it is lost.

    The first LISTEN happens before the constructor returns, so no append committed after the
    store opened can be missed. After a reconnect every waiter re-checks (`on_reset`): appends
    made while nobody listened announced themselves to no one.
    """

    POLL_S = 5.0

    def __init__(self, url: str, on_notify: Callable[[str], None], on_reset: Callable[[], None]) -> None:
        self._url = url
        self._on_notify = on_notify
        self._on_reset = on_reset
        # A channel of our own, so stop() can wake exactly this listener and no other instance's.
        self._wake_channel = f"ringfence_wake_{uuid.uuid4().hex}"
        self._stopping = threading.Event()
        conn = self._connect()
        self._thread = threading.Thread(target=self._run, args=(conn,), name="ringfence-store-listen", daemon=True)
        self._thread.start()

    def _connect(self) -> psycopg.Connection:
        try:
            # The pid names whose listener it is in pg_stat_activity (an operator's question, and
            # the tests' check that a store they opened was closed).
            conn = psycopg.connect(self._url, autocommit=True, application_name=f"ringfence-listen:{os.getpid()}")
        except psycopg.OperationalError as e:
            raise StoreUnavailable(f"cannot connect to the event store database: {e}") from e
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._wake_channel)))
        except BaseException:
            conn.close()
            raise
        return conn

    def _run(self, conn: psycopg.Connection | None) -> None:
        backoff = 0.2
        while not self._stopping.is_set():
            try:
                if conn is None:
                    conn = self._connect()
                    backoff = 0.2
                    self._on_reset()
                for note in conn.notifies(timeout=self.POLL_S):
                    if self._stopping.is_set():
                        break
                    if note.channel == CHANNEL and note.payload:
                        self._on_notify(note.payload)
            except (psycopg.Error, StoreError) as e:
                log.warning("event store listener lost its connection (%s); reconnecting", e)
                if conn is not None:
                    conn.close()
                conn = None
                self._on_reset()
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, self.POLL_S)
        if conn is not None:
            conn.close()

    def stop(self, pool: ConnectionPool) -> None:
        self._stopping.set()
        try:
            with pool.connection(timeout=2.0) as conn:
                conn.execute("SELECT pg_notify(%s, '')", (self._wake_channel,))
        except (psycopg.Error, PoolTimeout):
            pass  # the thread still sees _stopping within POLL_S
        self._thread.join(timeout=self.POLL_S * 2)
