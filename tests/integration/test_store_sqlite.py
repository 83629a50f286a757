"""The SQLite event store against real files: durability settings, append-only enforced by the
database, per-run monotonic seq under concurrency, reopening, and orchestrator recovery."""

from __future__ import annotations

import re
import sqlite3
import threading
from pathlib import Path

import pytest

from control.model import ObservationStatus as S
from control.model import RunOutcome, RunStatus
from control.store import SCHEMA_VERSION, EventStore, SeqConflict, SqliteEventStore, StoreError

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
            raw.execute("INSERT INTO events VALUES ('r1', 1, 'a', 'x', '{}', 1, 0)")
    finally:
        raw.close()
    assert [e.type for e in store.read("r1")] == ["run_started"]


def test_no_code_updates_or_deletes_events():
    offenders = []
    for path in (ROOT / "control").rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\b(UPDATE|DELETE)\s+(FROM\s+)?events\b", line, re.IGNORECASE) or \
                    re.search(r"\bREPLACE\s+INTO\b", line, re.IGNORECASE):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    # The only mentions are the triggers that forbid them.
    assert all("BEFORE" in o for o in offenders), offenders


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
