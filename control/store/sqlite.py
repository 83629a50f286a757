"""SQLite event store: WAL, synchronous=FULL, append-only, per-run monotonic seq.

Append-only is enforced by the database itself: triggers abort any UPDATE or DELETE on the
events table, so no code path (ours or a future one) can rewrite history. `synchronous=FULL`
makes a committed append survive power loss in WAL mode; an event acknowledged is on disk.
One connection guarded by a lock: SQLite serializes writers anyway, and reads are cheap.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from control.model import Event
from control.store.base import SCHEMA_VERSION, SeqConflict, StoreError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL CHECK (seq >= 1),
    tenant TEXT NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    at REAL NOT NULL,
    UNIQUE (run_id, seq)
);
CREATE INDEX IF NOT EXISTS events_tenant_first ON events (tenant, seq, run_id);
CREATE TRIGGER IF NOT EXISTS events_append_only_u BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_append_only_d BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
"""


class SqliteEventStore:
    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._lock = threading.RLock()
        self._changed = threading.Condition(threading.Lock())
        self._version = 0
        self._subscribers: list[Callable[[Event], None]] = []
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves so the seq check and the
        # insert are one write transaction.
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)

    def append(self, run_id: str, type: str, data: Mapping[str, Any], expected_seq: int | None = None,
               tenant: str | None = None) -> Event:
        payload = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                             default=_json_default)
        at = self._clock()
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                row = cur.execute(
                    "SELECT seq, tenant FROM events WHERE run_id = ? ORDER BY seq DESC LIMIT 1", (run_id,)
                ).fetchone()
                seq = (row[0] if row else 0) + 1
                if row is None:
                    tenant = tenant or (data.get("tenant") if isinstance(data, Mapping) else None)
                    if not tenant:
                        raise StoreError(f"the first event of run {run_id} must name its tenant")
                else:
                    if tenant and tenant != row[1]:
                        raise StoreError(f"run {run_id} belongs to another tenant")
                    tenant = row[1]
                if expected_seq is not None and expected_seq != seq:
                    raise SeqConflict(f"run {run_id}: expected seq {expected_seq}, next is {seq}")
                cur.execute(
                    "INSERT INTO events (run_id, seq, tenant, type, data, schema_version, at) VALUES (?,?,?,?,?,?,?)",
                    (run_id, seq, tenant, type, payload, SCHEMA_VERSION, at),
                )
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
        event = Event(run_id, seq, type, json.loads(payload), SCHEMA_VERSION, at)
        with self._changed:
            self._version += 1
            self._changed.notify_all()
        for callback in list(self._subscribers):
            callback(event)
        return event

    def read(self, run_id: str, from_seq: int = 0) -> list[Event]:
        with self._lock:
            rows = self._db.execute(
                "SELECT run_id, seq, type, data, schema_version, at FROM events WHERE run_id = ? AND seq >= ? "
                "ORDER BY seq", (run_id, from_seq)).fetchall()
        return [Event(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5]) for r in rows]

    def runs(self, tenant: str) -> list[str]:
        with self._lock:
            rows = self._db.execute(
                "SELECT run_id FROM events WHERE tenant = ? AND seq = 1 ORDER BY at, rowid", (tenant,)).fetchall()
        return [r[0] for r in rows]

    def all_runs(self) -> list[tuple[str, str]]:
        with self._lock:
            rows = self._db.execute("SELECT tenant, run_id FROM events WHERE seq = 1 ORDER BY rowid").fetchall()
        return [(r[0], r[1]) for r in rows]

    def tenant_of(self, run_id: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT tenant FROM events WHERE run_id = ? AND seq = 1", (run_id,)).fetchone()
        return row[0] if row else None

    def version(self) -> int:
        with self._changed:
            return self._version

    def wait(self, version: int, timeout: float) -> int:
        with self._changed:
            self._changed.wait_for(lambda: self._version != version, timeout=timeout)
            return self._version

    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            try:
                self._subscribers.remove(callback)
            except ValueError:
                pass

        return unsubscribe

    def close(self) -> None:
        with self._lock:
            self._db.close()
        with self._changed:
            self._version += 1
            self._changed.notify_all()


def _json_default(value: Any) -> Any:
    # Mappings from frozen values (MappingProxyType) and tuples are stored as plain JSON.
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")
