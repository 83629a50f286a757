"""The SQLite store's schema: its DDL, the version check on open, and the migrations.

Version 1 (the first release) had only the `events` table and no meta table: a database with
`events` and no `schema_meta` is version 1. Version 2 adds `schema_meta`, the audit chain
columns, leases and sanctioned pruning; version 3 the `keys` table (unique names held by
events); version 4 `records`; version 5 the indexes of run_page; version 6 sandbox workers'
leases and late results. A migration runs in one write transaction (SQLite DDL is
transactional), so a failure leaves the file exactly as it was.

The statements are run one by one, never with `executescript`: that COMMITs a pending
transaction first, which would split a migration.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

from ringfence_server.control.store.audit import canonical_json, event_hash
from ringfence_server.control.store.base import FINISHED, SCHEMA_VERSION, SchemaVersionError, StoreError

DB_NOW = "((julianday('now') - 2440587.5) * 86400.0)"
"""The database's clock as epoch seconds (SQLite's own `now`, millisecond precision)."""

_EVENTS = """
CREATE TABLE events (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL CHECK (seq >= 1),
    tenant TEXT NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    at REAL NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL,
    UNIQUE (run_id, seq)
)"""

# Everything of version 2 but the events table itself (the migration builds that one by copy).
_V2_REST = [
    "CREATE INDEX events_tenant_first ON events (tenant, seq, run_id)",
    "CREATE TABLE schema_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "INSERT INTO schema_meta (key, value) VALUES ('lease_token', 0)",
    "CREATE TABLE leases (run_id TEXT PRIMARY KEY, owner TEXT NOT NULL, token INTEGER NOT NULL, "
    "expires_at REAL NOT NULL)",
    # Runs being pruned, filled and emptied inside prune's own transaction. Only a finished run
    # may enter it, so not even a hand-written DELETE through this door can touch a live run.
    "CREATE TABLE prune_allowed (run_id TEXT PRIMARY KEY)",
    f"""CREATE TRIGGER prune_allowed_finished_only BEFORE INSERT ON prune_allowed
    WHEN (SELECT type FROM events WHERE run_id = NEW.run_id ORDER BY seq DESC LIMIT 1) IS NOT '{FINISHED}'
    BEGIN SELECT RAISE(ABORT, 'only a finished run can be pruned'); END""",
    """CREATE TRIGGER prune_allowed_no_update BEFORE UPDATE ON prune_allowed
    BEGIN SELECT RAISE(ABORT, 'prune_allowed rows are not changed'); END""",
    # Append-only, enforced by the database: no UPDATE ever, no DELETE outside pruning.
    """CREATE TRIGGER events_append_only_u BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only'); END""",
    """CREATE TRIGGER events_append_only_d BEFORE DELETE ON events
    WHEN NOT EXISTS (SELECT 1 FROM prune_allowed WHERE run_id = OLD.run_id)
    BEGIN SELECT RAISE(ABORT, 'events are append-only'); END""",
]


def current_version(db: sqlite3.Connection) -> int:
    """0 for an empty database, 1 for the meta-less first release, else what schema_meta says."""
    tables = {r[0] for r in db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('events', 'schema_meta')")}
    if "schema_meta" in tables:
        row = db.execute("SELECT value FROM schema_meta WHERE key = 'version'").fetchone()
        if row is None:
            raise SchemaVersionError("schema_meta has no version row: not a ringfence event store")
        return int(row[0])
    return 1 if "events" in tables else 0


def _create(db: sqlite3.Connection) -> None:
    db.execute(_EVENTS)
    for statement in _V2_REST:
        db.execute(statement)


def _v1_to_v2(db: sqlite3.Connection) -> None:
    # Rebuild rather than ALTER + UPDATE: the chain must be computed for every existing row, and
    # version 1's triggers (rightly) refuse any UPDATE. The old table keeps its rowids, so the
    # order of all_runs() (rowid) survives.
    db.execute("DROP TRIGGER IF EXISTS events_append_only_u")
    db.execute("DROP TRIGGER IF EXISTS events_append_only_d")
    db.execute("DROP INDEX IF EXISTS events_tenant_first")
    db.execute("ALTER TABLE events RENAME TO events_v1")
    _create(db)
    heads: dict[str, str] = {}
    rows = db.execute("SELECT rowid, run_id, seq, tenant, type, data, schema_version, at FROM events_v1 "
                      "ORDER BY run_id, seq").fetchall()
    out = []
    for rowid, run_id, seq, tenant, type_, data, schema_version, at in rows:
        # The stored text is re-encoded canonically: version 1 wrote the same canonical form,
        # and what is hashed must be exactly what is stored.
        payload = canonical_json(json.loads(data))
        prev = heads.get(run_id, "")
        digest = event_hash(prev, run_id, seq, type_, json.loads(payload), schema_version, at)
        heads[run_id] = digest
        out.append((rowid, run_id, seq, tenant, type_, payload, schema_version, at, prev, digest))
    db.executemany("INSERT INTO events (rowid, run_id, seq, tenant, type, data, schema_version, at, prev_hash, "
                   "hash) VALUES (?,?,?,?,?,?,?,?,?,?)", out)
    db.execute("DROP TABLE events_v1")


# Version 3: names that must be unique across every run (an approval id, a tenant's client
# idempotency key), each held by the event that claimed it, in the same transaction. Like the
# events, never updated, and deleted only with a pruned run.
_V3 = [
    "CREATE TABLE keys (name TEXT PRIMARY KEY, run_id TEXT NOT NULL, seq INTEGER NOT NULL)",
    "CREATE INDEX keys_run ON keys (run_id)",
    """CREATE TRIGGER keys_append_only_u BEFORE UPDATE ON keys
    BEGIN SELECT RAISE(ABORT, 'keys are append-only'); END""",
    """CREATE TRIGGER keys_append_only_d BEFORE DELETE ON keys
    WHEN NOT EXISTS (SELECT 1 FROM prune_allowed WHERE run_id = OLD.run_id)
    BEGIN SELECT RAISE(ABORT, 'keys are append-only'); END""",
]


def _v2_to_v3(db: sqlite3.Connection) -> None:
    for statement in _V3:
        db.execute(statement)


# Version 4: revisioned records that belong to no run (evidence, assessments, routing decisions).
# Never updated, never deleted: a correction is a new revision.
_V4 = [
    """CREATE TABLE records (
    tenant TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    revision INTEGER NOT NULL CHECK (revision >= 1),
    body TEXT NOT NULL,
    written_by TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (tenant, kind, key, revision)
)""",
    """CREATE TRIGGER records_append_only_u BEFORE UPDATE ON records
    BEGIN SELECT RAISE(ABORT, 'records are append-only'); END""",
    """CREATE TRIGGER records_append_only_d BEFORE DELETE ON records
    BEGIN SELECT RAISE(ABORT, 'records are append-only'); END""",
]


def _v3_to_v4(db: sqlite3.Connection) -> None:
    for statement in _V4:
        db.execute(statement)


# Version 5: a page of a tenant's runs, newest first, is a walk of an index from a cursor (never
# a sort of the whole history), and "is this run finished (with this outcome)?" one look-up.
_V5 = [
    "CREATE INDEX events_tenant_started ON events (tenant, at) WHERE seq = 1",
    f"CREATE INDEX events_run_finished ON events (run_id) WHERE type = '{FINISHED}'",
]


def _v4_to_v5(db: sqlite3.Connection) -> None:
    for statement in _V5:
        db.execute(statement)


# Version 6: sandbox workers. `worker_leases`: one row per worker, its latest epoch; the row is
# never deleted and its epoch never lowered (nor its holder changed under one epoch), so an epoch
# is never handed out twice and a result carrying an old one is always told apart.
# `late_results`: results that were not applied, append-only like records, one per (worker,
# envelope); the index serves late_results' newest-first walk.
_V6 = [
    """CREATE TABLE worker_leases (
    worker_id TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL CHECK (epoch >= 1),
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL
)""",
    """CREATE TRIGGER worker_leases_forward_only BEFORE UPDATE ON worker_leases
    WHEN NEW.worker_id IS NOT OLD.worker_id OR NEW.epoch < OLD.epoch
        OR (NEW.epoch = OLD.epoch AND NEW.holder IS NOT OLD.holder)
    BEGIN SELECT RAISE(ABORT, 'a worker lease epoch never goes back or changes hands'); END""",
    """CREATE TRIGGER worker_leases_no_delete BEFORE DELETE ON worker_leases
    BEGIN SELECT RAISE(ABORT, 'a worker lease epoch never goes back or changes hands'); END""",
    """CREATE TABLE late_results (
    worker_id TEXT NOT NULL,
    envelope_id TEXT NOT NULL,
    epoch INTEGER NOT NULL CHECK (epoch >= 1),
    tenant TEXT NOT NULL,
    run_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    attempt INTEGER NOT NULL CHECK (attempt >= 0),
    reason TEXT NOT NULL,
    result_sha256 TEXT NOT NULL,
    recorded_at REAL NOT NULL,
    PRIMARY KEY (worker_id, envelope_id)
)""",
    "CREATE INDEX late_results_newest ON late_results (recorded_at)",
    """CREATE TRIGGER late_results_append_only_u BEFORE UPDATE ON late_results
    BEGIN SELECT RAISE(ABORT, 'late results are append-only'); END""",
    """CREATE TRIGGER late_results_append_only_d BEFORE DELETE ON late_results
    BEGIN SELECT RAISE(ABORT, 'late results are append-only'); END""",
]


def _v5_to_v6(db: sqlite3.Connection) -> None:
    for statement in _V6:
        db.execute(statement)


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4,
                                                               4: _v4_to_v5, 5: _v5_to_v6}
"""version -> the step that takes a database from it to version + 1."""


def open_schema(db: sqlite3.Connection) -> int:
    """Check the schema version and create or migrate to SCHEMA_VERSION; returns the version found."""
    found = current_version(db)
    if found == SCHEMA_VERSION:
        return found
    db.execute("BEGIN IMMEDIATE")
    try:
        found = current_version(db)  # another process may have migrated while we waited
        if found > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"the event store has schema version {found}, newer than this ringfence knows "
                f"({SCHEMA_VERSION}); upgrade ringfence to open it")
        # A new database is version 2's layout and every step since: the one path a migrated
        # database takes too, so the two cannot drift apart.
        if found == 0:
            _create(db)
        for version in range(2 if found == 0 else found, SCHEMA_VERSION):
            MIGRATIONS[version](db)
        db.execute("INSERT INTO schema_meta (key, value) VALUES ('version', ?) "
                   "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (SCHEMA_VERSION,))
        db.execute("COMMIT")
    except BaseException as e:
        db.execute("ROLLBACK")
        if isinstance(e, (SchemaVersionError, KeyboardInterrupt, SystemExit)):
            raise
        raise StoreError(f"migrating the event store from schema version {found} to {SCHEMA_VERSION} "
                         f"failed, nothing was changed: {e}") from e
    return found
