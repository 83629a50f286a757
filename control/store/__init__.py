"""Event stores: the Protocol (base) and the SQLite implementation (sqlite)."""

from control.store.base import SCHEMA_VERSION, EventStore, SeqConflict, StoreError
from control.store.sqlite import SqliteEventStore

__all__ = ["SCHEMA_VERSION", "EventStore", "SeqConflict", "SqliteEventStore", "StoreError"]
