"""The PostgreSQL store's schema: its DDL, the version check on open, and the migrations.

Version numbers are shared with the SQLite store (ringfence_server.control.store.base.SCHEMA_VERSION); the
PostgreSQL store first appeared at version 2, so there is no earlier PostgreSQL layout to
migrate from; version 3 adds the `keys` table, version 4 `records`, version 5 the index of
run_page's finished filter, version 6 sandbox workers' leases and late results. Creation and
migration run in one transaction under an advisory lock, so instances starting together on an
empty database create it once.

`data` is TEXT, not JSONB: the audit chain hashes the exact canonical JSON that was written, and
JSONB would re-encode numbers and keys on the way back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from ringfence_server.control.store.base import FINISHED, SCHEMA_VERSION, SchemaVersionError, StoreError

# An arbitrary constant: the key of the advisory lock that serializes schema creation/migration.
_SCHEMA_LOCK = 0x72696E67666E6365  # "ringfnce"

_V2 = [
    "CREATE TABLE schema_meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)",
    """CREATE TABLE events (
        id BIGINT GENERATED ALWAYS AS IDENTITY,
        run_id TEXT NOT NULL,
        seq BIGINT NOT NULL CHECK (seq >= 1),
        tenant TEXT NOT NULL,
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        schema_version INTEGER NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    )""",
    "CREATE INDEX events_first ON events (tenant, at, id) WHERE seq = 1",
    f"CREATE INDEX events_finished ON events (at) WHERE type = '{FINISHED}'",
    # Fencing tokens: a sequence never goes back, not even across released or pruned leases.
    "CREATE SEQUENCE lease_tokens",
    "CREATE TABLE leases (run_id TEXT PRIMARY KEY, owner TEXT NOT NULL, token BIGINT NOT NULL, "
    "expires_at TIMESTAMPTZ NOT NULL)",
    # Runs being pruned, filled and emptied inside prune's own transaction. Only a finished run
    # may enter it, so not even a hand-written DELETE through this door can touch a live run.
    "CREATE TABLE prune_allowed (run_id TEXT PRIMARY KEY)",
    f"""CREATE FUNCTION ringfence_prune_allowed_guard() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' THEN
            RAISE EXCEPTION 'prune_allowed rows are not changed';
        END IF;
        IF (SELECT type FROM events WHERE run_id = NEW.run_id ORDER BY seq DESC LIMIT 1)
                IS DISTINCT FROM '{FINISHED}' THEN
            RAISE EXCEPTION 'only a finished run can be pruned';
        END IF;
        RETURN NEW;
    END $$""",
    """CREATE TRIGGER prune_allowed_finished_only BEFORE INSERT OR UPDATE ON prune_allowed
    FOR EACH ROW EXECUTE FUNCTION ringfence_prune_allowed_guard()""",
    # Append-only, enforced by the database: no UPDATE or TRUNCATE ever, no DELETE outside pruning.
    """CREATE FUNCTION ringfence_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'DELETE' THEN
            IF EXISTS (SELECT 1 FROM prune_allowed WHERE run_id = OLD.run_id) THEN
                RETURN OLD;
            END IF;
        END IF;
        RAISE EXCEPTION 'events are append-only';
    END $$""",
    """CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION ringfence_events_append_only()""",
    """CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION ringfence_events_append_only()""",
]

# Version 3: names that must be unique across every run (an approval id, a tenant's client
# idempotency key), each held by the event that claimed it, in the same transaction. Like the
# events, never updated, and deleted only with a pruned run.
_V3 = [
    "CREATE TABLE keys (name TEXT PRIMARY KEY, run_id TEXT NOT NULL, seq BIGINT NOT NULL)",
    "CREATE INDEX keys_run ON keys (run_id)",
    """CREATE TRIGGER keys_append_only BEFORE UPDATE OR DELETE ON keys
    FOR EACH ROW EXECUTE FUNCTION ringfence_events_append_only()""",
    """CREATE TRIGGER keys_no_truncate BEFORE TRUNCATE ON keys
    FOR EACH STATEMENT EXECUTE FUNCTION ringfence_events_append_only()""",
]


def _v2_to_v3(conn: Any) -> None:
    for statement in _V3:
        conn.execute(statement)


# Version 4: revisioned records that belong to no run (evidence, assessments, routing decisions).
# Never updated, deleted or truncated: a correction is a new revision.
_V4 = [
    """CREATE TABLE records (
        tenant TEXT NOT NULL,
        kind TEXT NOT NULL,
        key TEXT NOT NULL,
        revision BIGINT NOT NULL CHECK (revision >= 1),
        body TEXT NOT NULL,
        written_by TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (tenant, kind, key, revision)
    )""",
    """CREATE FUNCTION ringfence_records_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'records are append-only';
    END $$""",
    """CREATE TRIGGER records_append_only BEFORE UPDATE OR DELETE ON records
    FOR EACH ROW EXECUTE FUNCTION ringfence_records_append_only()""",
    """CREATE TRIGGER records_no_truncate BEFORE TRUNCATE ON records
    FOR EACH STATEMENT EXECUTE FUNCTION ringfence_records_append_only()""",
]


def _v3_to_v4(conn: Any) -> None:
    for statement in _V4:
        conn.execute(statement)


# Version 5: "is this run finished (with this outcome)?" is one look-up by run id (run_page's
# filters; a page walks events_first, which version 2 made).
_V5 = [
    f"CREATE INDEX events_run_finished ON events (run_id) WHERE type = '{FINISHED}'",
]


def _v4_to_v5(conn: Any) -> None:
    for statement in _V5:
        conn.execute(statement)


# Version 6: sandbox workers. `worker_leases`: one row per worker, its latest epoch; the row is
# never deleted and its epoch never lowered (nor its holder changed under one epoch), so an epoch
# is never handed out twice and a result carrying an old one is always told apart. Expiry is a
# TIMESTAMPTZ compared with the database's now(), as run leases. `late_results`: results that were
# not applied, append-only like records, one per (worker, envelope); `id` orders those recorded
# at one recorded_at, and the index serves late_results' newest-first walk.
_V6 = [
    """CREATE TABLE worker_leases (
        worker_id TEXT PRIMARY KEY,
        epoch BIGINT NOT NULL CHECK (epoch >= 1),
        holder TEXT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL
    )""",
    """CREATE FUNCTION ringfence_worker_leases_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' AND NEW.worker_id = OLD.worker_id AND (NEW.epoch > OLD.epoch
                OR (NEW.epoch = OLD.epoch AND NEW.holder = OLD.holder)) THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'a worker lease epoch never goes back or changes hands';
    END $$""",
    """CREATE TRIGGER worker_leases_forward_only BEFORE UPDATE OR DELETE ON worker_leases
    FOR EACH ROW EXECUTE FUNCTION ringfence_worker_leases_forward_only()""",
    """CREATE TRIGGER worker_leases_no_truncate BEFORE TRUNCATE ON worker_leases
    FOR EACH STATEMENT EXECUTE FUNCTION ringfence_worker_leases_forward_only()""",
    """CREATE TABLE late_results (
        id BIGINT GENERATED ALWAYS AS IDENTITY,
        worker_id TEXT NOT NULL,
        envelope_id TEXT NOT NULL,
        epoch BIGINT NOT NULL CHECK (epoch >= 1),
        tenant TEXT NOT NULL,
        run_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        attempt BIGINT NOT NULL CHECK (attempt >= 0),
        reason TEXT NOT NULL,
        result_sha256 TEXT NOT NULL,
        recorded_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (worker_id, envelope_id)
    )""",
    "CREATE INDEX late_results_newest ON late_results (recorded_at, id)",
    """CREATE FUNCTION ringfence_late_results_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'late results are append-only';
    END $$""",
    """CREATE TRIGGER late_results_append_only BEFORE UPDATE OR DELETE ON late_results
    FOR EACH ROW EXECUTE FUNCTION ringfence_late_results_append_only()""",
    """CREATE TRIGGER late_results_no_truncate BEFORE TRUNCATE ON late_results
    FOR EACH STATEMENT EXECUTE FUNCTION ringfence_late_results_append_only()""",
]


def _v5_to_v6(conn: Any) -> None:
    for statement in _V6:
        conn.execute(statement)


MIGRATIONS: dict[int, Callable[[Any], None]] = {2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5, 5: _v5_to_v6}
"""version -> the step that takes a database from it to version + 1."""


def current_version(conn: Any) -> int:
    """0 for a database without our tables, else what schema_meta says."""
    meta, events = conn.execute("SELECT to_regclass('schema_meta'), to_regclass('events')").fetchone()
    if meta is None:
        if events is not None:
            raise SchemaVersionError("the database has an events table but no schema_meta: not a ringfence "
                                     "event store this version knows")
        return 0
    try:
        row = conn.execute("SELECT value FROM schema_meta WHERE key = 'version'").fetchone()
    except psycopg.errors.UndefinedColumn as e:  # somebody else's schema_meta: a shared database
        raise SchemaVersionError("schema_meta is not ringfence's: give the store a database (or a schema, "
                                 "with search_path) of its own") from e
    if row is None:
        raise SchemaVersionError("schema_meta has no version row: not a ringfence event store")
    return int(row[0])


def open_schema(conn: Any) -> int:
    """Check the schema version, create or migrate to SCHEMA_VERSION; returns the version found.

    `conn`: a psycopg connection in autocommit mode.
    """
    found = current_version(conn)
    if found == SCHEMA_VERSION:
        return found
    if found > SCHEMA_VERSION:
        raise _too_new(found)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        found = current_version(conn)  # another instance may have done it while we waited
        if found > SCHEMA_VERSION:
            raise _too_new(found)
        # A new database is version 2's layout and every step since: the one path a migrated
        # database takes too, so the two cannot drift apart.
        if found == 0:
            for statement in _V2:
                conn.execute(statement)
        for version in range(2 if found == 0 else found, SCHEMA_VERSION):
            if version not in MIGRATIONS:
                raise StoreError(f"no migration from schema version {version}")
            MIGRATIONS[version](conn)
        conn.execute("INSERT INTO schema_meta (key, value) VALUES ('version', %s) "
                     "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value", (SCHEMA_VERSION,))
    return found


def _too_new(found: int) -> SchemaVersionError:
    return SchemaVersionError(
        f"the event store has schema version {found}, newer than this ringfence knows ({SCHEMA_VERSION}); "
        "upgrade ringfence to open it")
