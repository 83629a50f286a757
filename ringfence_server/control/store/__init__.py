"""Event stores: the Protocol (base), SQLite (sqlite), PostgreSQL (postgres), the audit chain
(audit), and `open_store`, which picks one from a path or a URL."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ringfence_server.control.store.audit import AuditReport, verify
from ringfence_server.control.store.base import (
    SCHEMA_VERSION,
    EventStore,
    KeyTaken,
    Lease,
    LeaseLost,
    NewEvent,
    Record,
    RevisionConflict,
    RunExists,
    RunRow,
    SchemaVersionError,
    SeqConflict,
    StoreError,
    StoreUnavailable,
)
from ringfence_server.control.store.sqlite import SqliteEventStore

__all__ = [
    "SCHEMA_VERSION",
    "AuditReport",
    "EventStore",
    "KeyTaken",
    "Lease",
    "LeaseLost",
    "NewEvent",
    "Record",
    "RevisionConflict",
    "RunExists",
    "RunRow",
    "SchemaVersionError",
    "SeqConflict",
    "SqliteEventStore",
    "StoreError",
    "StoreUnavailable",
    "is_database_url",
    "open_store",
    "verify",
]

SQLITE_FILENAME = "events.sqlite3"
"""The event log's file name inside a state directory (as ringfence_server.control.config.Config.db_path)."""


def is_database_url(target: str | Path) -> bool:
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def open_store(url_or_path: str | Path, *, clock: Callable[[], float] | None = None, **options: Any) -> EventStore:
    """PostgreSQL for a `postgresql://` (or `postgres://`) URL, SQLite for anything else: a file
    path, or an existing directory (its events.sqlite3). `options` go to the store's constructor."""
    if clock is not None:
        options["clock"] = clock
    if is_database_url(url_or_path):
        # Imported here: psycopg is needed only by deployments that use PostgreSQL.
        from ringfence_server.control.store.postgres import PostgresEventStore

        return PostgresEventStore(str(url_or_path), **options)
    path = Path(url_or_path)
    if path.is_dir():
        path = path / SQLITE_FILENAME
    return SqliteEventStore(path, **options)
