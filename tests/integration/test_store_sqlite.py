"""The SQLite event store against real files: durability settings, append-only enforced by the
database, per-run monotonic seq under concurrency, reopening, and orchestrator recovery."""

from __future__ import annotations

import re
import sqlite3
import threading
from pathlib import Path

import pytest

from ringfence.model import ObservationStatus as S
from ringfence.model import RunOutcome, RunStatus
from ringfence_server.control.store import SCHEMA_VERSION, EventStore, SeqConflict, SqliteEventStore, StoreError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def store(tmp_path):
    s = SqliteEventStore(tmp_path / "events.sqlite3")
    yield s
    s.close()


def test_it_is_an_event_store(store):
    assert isinstance(store, EventStore)


def test_append_and_read(store):
    e1 = store.append("r1", "run_started", {"tenant": "acme", "goal": "g"})
    e2 = store.append("r1", "note", {"n": [1, 2]})
    assert (e1.seq, e2.seq) == (1, 2) and e1.schema_version == SCHEMA_VERSION
    assert store.read("r1") == [e1, e2]
    assert store.read("r1", from_seq=2) == [e2]
    assert store.read("nope") == []
    assert store.runs("acme") == ["r1"] and store.runs("globex") == []
    assert store.tenant_of("r1") == "acme"


def test_the_first_event_names_the_tenant_and_it_never_changes(store):
    with pytest.raises(StoreError):
        store.append("r1", "x", {})
    store.append("r1", "run_started", {}, tenant="acme")
    with pytest.raises(StoreError):
        store.append("r1", "x", {}, tenant="globex")


def test_expected_seq_is_optimistic_concurrency(store):
    store.append("r1", "run_started", {"tenant": "a"}, expected_seq=1)
    with pytest.raises(SeqConflict):
        store.append("r1", "x", {}, expected_seq=1)
    with pytest.raises(SeqConflict):
        store.append("r1", "x", {}, expected_seq=5)
    assert store.append("r1", "x", {}, expected_seq=2).seq == 2


def test_durability_pragmas(store):
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_the_database_refuses_updates_and_deletes(store):
    store.append("r1", "run_started", {"tenant": "a"})
    raw = sqlite3.connect(store.path)
    try:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            raw.execute("UPDATE events SET type = 'forged'")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            raw.execute("DELETE FROM events")
        with pytest.raises(sqlite3.IntegrityError):  # UNIQUE(run_id, seq)
            raw.execute("INSERT INTO events VALUES ('r1', 1, 'a', 'x', '{}', 1, 0, '', '')")
    finally:
        raw.close()
    assert [e.type for e in store.read("r1")] == ["run_started"]


def test_no_code_updates_or_deletes_events():
    offenders = []
    for path in (ROOT / "ringfence_server" / "control").rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\b(UPDATE|DELETE)\s+(FROM\s+)?events\b", line, re.IGNORECASE) or \
                    re.search(r"\bREPLACE\s+INTO\b", line, re.IGNORECASE):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    # The only mentions are the triggers that forbid them, and prune's DELETE of the runs it listed
    # in prune_allowed (the one door the DELETE trigger opens, for finished runs only).
    assert all("BEFORE" in o or "prune_allowed" in o for o in offenders), offenders
    assert any("prune_allowed" in o for o in offenders)


def test_concurrent_appends_get_contiguous_seqs(store):
    store.append("r1", "run_started", {"tenant": "a"})

    def writer(i):
        for j in range(25):
            store.append("r1", "x", {"w": i, "j": j})

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = store.read("r1")
    assert [e.seq for e in events] == list(range(1, 202))
    # Each writer's own events stay in its order.
    for i in range(8):
        assert [e.data["j"] for e in events if e.data.get("w") == i] == list(range(25))


def test_reopening_the_file_sees_everything(tmp_path):
    path = tmp_path / "events.sqlite3"
    a = SqliteEventStore(path)
    a.append("r1", "run_started", {"tenant": "acme"})
    a.append("r2", "run_started", {"tenant": "acme"})
    a.append("r1", "x", {"v": 1.5})
    a.close()
    b = SqliteEventStore(path)
    try:
        assert [(e.seq, e.type, dict(e.data)) for e in b.read("r1")] == [
            (1, "run_started", {"tenant": "acme"}), (2, "x", {"v": 1.5})]
        assert b.runs("acme") == ["r1", "r2"] and b.all_runs() == [("acme", "r1"), ("acme", "r2")]
        assert b.append("r1", "y", {}).seq == 3
    finally:
        b.close()


def test_wait_wakes_on_append(store):
    v = store.version()
    threading.Timer(0.05, lambda: store.append("r1", "run_started", {"tenant": "a"})).start()
    assert store.wait(v, timeout=10) != v


# -- crash recovery through the orchestrator -------------------------------------------------


def test_a_new_orchestrator_on_the_same_file_resumes(tmp_path):
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from control_support import AGENT, APPROVER, Harness

    h = Harness(tmp_path, rules=[{"tool": "credit", "verdict": "ask"}, {"tool": "echo", "verdict": "allow"}])
    run = h.run("crash me")
    other = h.run("finished one")
    h.submit(other, ("echo", {"text": "x"}))
    h.orch.finish_run(AGENT, other)
    [obs] = h.submit(run, ("credit", {"account": "acme-9", "amount": 50}))
    before = {v.run_id: v for v in h.orch.list_runs(AGENT)}

    h.restart()  # a new Orchestrator and a new connection on the same file

    after = {v.run_id: v for v in h.orch.list_runs(AGENT)}
    assert after == before
    assert after[run].status is RunStatus.WAITING_APPROVAL
    assert after[other].outcome is RunOutcome.COMPLETED
    [pending] = h.orch.list_approvals(APPROVER, run)
    assert pending.approval_id == obs.approval_id
    h.orch.decide_approval(APPROVER, pending.approval_id, True, "ok")
    assert [(c.call_id, c.arguments) for c in h.emulator.log if c.tool == "credit"] == [
        (obs.call_id, {"account": "acme-9", "amount": 50})]
    assert h.orch.get_run(AGENT, run).trajectory[0].status is S.EXECUTED


def test_subscribers_see_every_durable_append(store):
    seen = []
    unsubscribe = store.subscribe(seen.append)
    e1 = store.append("r1", "run_started", {"tenant": "a"})
    unsubscribe()
    store.append("r1", "x", {})
    assert seen == [e1]


# -- schema version 1 (the first release: events only, no meta table) -------------------------

# Verbatim the DDL of version 1, as files written by the first release have it.
V1_SCHEMA = """
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


def _v1_file(path: Path, rows) -> None:
    import json

    db = sqlite3.connect(path)
    try:
        db.executescript(V1_SCHEMA)
        for run_id, seq, tenant, type_, data, at in rows:
            # As version 1's append wrote it.
            text = data if isinstance(data, str) else json.dumps(
                data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            db.execute("INSERT INTO events (run_id, seq, tenant, type, data, schema_version, at) "
                       "VALUES (?,?,?,?,?,?,?)", (run_id, seq, tenant, type_, text, 1, at))
        db.commit()
    finally:
        db.close()


V1_ROWS = [
    ("r2", 1, "globex", "run_started", {"tenant": "globex", "goal": "ü"}, 100.5),
    ("r1", 1, "acme", "run_started", {"tenant": "acme", "goal": "g"}, 101.25),
    ("r1", 2, "acme", "observation", {"call_id": "c1", "content": {"b": [1, 2.5, None], "a": True}}, 102.0),
    ("r1", 3, "acme", "run_finished", {"outcome": "completed", "reason": ""}, 103.0),
]


def _tables(path: Path) -> dict[str, str]:
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT name, type FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
        return {name: kind for name, kind in rows}
    finally:
        db.close()


def test_a_version_1_file_is_migrated_and_its_chain_computed(tmp_path):
    from ringfence_server.control.store import verify

    path = tmp_path / "events.sqlite3"
    _v1_file(path, V1_ROWS)
    assert "schema_meta" not in _tables(path)

    s = SqliteEventStore(path)
    try:
        assert s.schema_version() == SCHEMA_VERSION == 6
        old = s.read("r1")
        assert [(e.seq, e.type, e.schema_version, e.at) for e in old] == [
            (1, "run_started", 1, 101.25), (2, "observation", 1, 102.0), (3, "run_finished", 1, 103.0)]
        assert old[1].data == {"call_id": "c1", "content": {"a": True, "b": [1, 2.5, None]}}
        assert old[0].prev_hash == "" and old[1].prev_hash == old[0].hash and len(old[2].hash) == 64
        assert verify(old).ok and verify(s.read("r2")).ok
        # Order and tenants survive the rebuild.
        assert s.all_runs() == [("globex", "r2"), ("acme", "r1")]
        assert s.runs("acme") == ["r1"] and s.tenant_of("r2") == "globex"
        # New appends continue the chain, under the new schema version.
        e4 = s.append("r1", "note", {})
        assert (e4.seq, e4.prev_hash, e4.schema_version) == (4, old[2].hash, SCHEMA_VERSION)
        assert verify(s.read("r1")).ok
        # Version 4's records table came with the migration.
        assert s.append_record("acme", "verdict", "p", {"ok": True}, "v").revision == 1
    finally:
        s.close()
    tables = _tables(path)
    assert {"events", "schema_meta", "leases", "prune_allowed", "events_append_only_u",
            "events_append_only_d", "events_tenant_first", "records", "records_append_only_u",
            "records_append_only_d"} <= set(tables)
    assert "events_v1" not in tables
    raw = sqlite3.connect(path)
    try:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            raw.execute("UPDATE events SET type = 'forged'")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            raw.execute("DELETE FROM events WHERE run_id = 'r1'")
    finally:
        raw.close()
    # Opening again migrates nothing.
    s = SqliteEventStore(path)
    try:
        assert [e.hash for e in s.read("r1")][:3] == [e.hash for e in old]
    finally:
        s.close()


def test_a_failed_migration_changes_nothing(tmp_path):
    path = tmp_path / "events.sqlite3"
    _v1_file(path, [*V1_ROWS, ("r3", 1, "acme", "run_started", "{not json", 104.0)])
    with pytest.raises(StoreError, match="nothing was changed"):
        SqliteEventStore(path)
    assert "schema_meta" not in _tables(path) and "events_v1" not in _tables(path)
    raw = sqlite3.connect(path)
    try:
        assert [r[1] for r in raw.execute("PRAGMA table_info(events)")] == [
            "run_id", "seq", "tenant", "type", "data", "schema_version", "at"]
        assert raw.execute("SELECT count(*) FROM events").fetchone()[0] == 5
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            raw.execute("DELETE FROM events")
    finally:
        raw.close()


def test_an_unknown_meta_table_is_refused(tmp_path):
    from ringfence_server.control.store import SchemaVersionError

    path = tmp_path / "events.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE schema_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
    db.commit()
    db.close()
    with pytest.raises(SchemaVersionError):
        SqliteEventStore(path)
