"""The real stores a store test runs against, one per parameter: a SQLite file and a PostgreSQL
database of a throwaway cluster (tests/pg_support.py). `target` opens store objects (each a
control plane, as far as the database can tell) and raw connections on the same database, and
closes all of them after the test, whatever it left open."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from ringfence_server.control.store import open_store

HANG_GUARD_S = 60.0  # only so that a broken store fails instead of hanging; never a time assertion


@dataclass
class Target:
    """One database and the means to open store objects and raw connections on it."""

    kind: str
    where: str
    opened: list[Any] = field(default_factory=list)

    def open(self, clock: Callable[[], float] | None = None) -> Any:
        store = open_store(self.where, clock=clock)
        self.opened.append(store)
        return store

    def raw(self):
        """A plain connection that bypasses the store: what an operator or an attacker would use."""
        if self.kind == "sqlite":
            conn: Any = sqlite3.connect(self.where, isolation_level=None)
        else:
            import psycopg

            conn = psycopg.connect(self.where, autocommit=True)
        self.opened.append(conn)
        return conn

    @property
    def refused(self) -> type[Exception]:
        if self.kind == "sqlite":
            return sqlite3.DatabaseError
        import psycopg

        return psycopg.Error

    def tables(self) -> set[str]:
        raw = self.raw()
        if self.kind == "sqlite":
            rows = raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        else:
            rows = raw.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()").fetchall()
        return {r[0] for r in rows}

    def close(self) -> None:
        for thing in reversed(self.opened):
            with contextlib.suppress(Exception):  # closing what a failed test left behind
                thing.close()
        self.opened.clear()


@pytest.fixture(params=["sqlite", "postgres"])
def target(request, tmp_path):
    if request.param == "sqlite":
        t = Target("sqlite", str(tmp_path / "events.sqlite3"))
    else:
        t = Target("postgres", request.getfixturevalue("pg_url"))
    try:
        yield t
    finally:
        t.close()
