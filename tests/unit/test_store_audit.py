"""The audit hash chain: each kind of tampering is found, on a real SQLite file.

The tamperer has the file: it drops the append-only triggers in its own connection, edits, and
the store reads the result back as any later reader would.
"""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest

from ringfence.model import Event
from ringfence_server.control.store import SqliteEventStore, verify
from ringfence_server.control.store.audit import AuditReport, canonical_json, event_hash


@pytest.fixture()
def path(tmp_path):
    p = tmp_path / "events.sqlite3"
    s = SqliteEventStore(p, clock=iter(range(1000, 2000)).__next__)
    try:
        s.append("r1", "run_started", {"tenant": "acme", "goal": "g"})
        for i in range(2, 6):
            s.append("r1", "note", {"i": i, "text": f"event {i}"})
    finally:
        s.close()
    return p


def tamper(path, *statements: str) -> None:
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        raw.execute("DROP TRIGGER IF EXISTS events_append_only_u")
        raw.execute("DROP TRIGGER IF EXISTS events_append_only_d")
        for statement in statements:
            raw.execute(statement)
    finally:
        raw.close()


def reread(path) -> list[Event]:
    s = SqliteEventStore(path)
    try:
        return s.read("r1")
    finally:
        s.close()


def test_an_untouched_log_verifies(path):
    assert verify(reread(path)) == AuditReport(True, None, "", 5)
    assert verify([]) == AuditReport(True, None, "", 0)


def test_an_edited_event(path):
    tamper(path, """UPDATE events SET data = '{"i":3,"text":"something else"}' WHERE seq = 3""")
    report = verify(reread(path))
    assert (report.ok, report.first_bad_seq) == (False, 3) and "edited" in report.problem


def test_an_edited_type_or_time(path):
    tamper(path, "UPDATE events SET at = at + 1 WHERE seq = 2")
    assert verify(reread(path)).first_bad_seq == 2


def test_a_dropped_event(path):
    tamper(path, "DELETE FROM events WHERE seq = 3")
    report = verify(reread(path))
    assert (report.ok, report.first_bad_seq) == (False, 4) and "seq 3 is missing" in report.problem


def test_a_dropped_event_with_the_rest_renumbered(path):
    tamper(path, "DELETE FROM events WHERE seq = 3", "UPDATE events SET seq = seq - 1 WHERE seq > 3")
    report = verify(reread(path))
    assert (report.ok, report.first_bad_seq) == (False, 3) and "prev_hash" in report.problem


def test_reordered_events_in_the_store(path):
    # Swap the places of seq 2 and 3.
    tamper(path, "UPDATE events SET seq = 100 WHERE seq = 2", "UPDATE events SET seq = 2 WHERE seq = 3",
           "UPDATE events SET seq = 3 WHERE seq = 100")
    report = verify(reread(path))
    assert (report.ok, report.first_bad_seq) == (False, 2)


def test_reordered_events_in_an_export(path):
    events = reread(path)
    report = verify([events[0], events[2], events[1], *events[3:]])
    assert (report.ok, report.first_bad_seq) == (False, 3) and "missing" in report.problem
    report = verify([*events[:3], events[1], *events[3:]])
    assert (report.ok, report.first_bad_seq) == (False, 2) and "out of order" in report.problem


def test_a_forged_hash(path):
    tamper(path, f"UPDATE events SET hash = '{'0' * 64}' WHERE seq = 4")
    report = verify(reread(path))
    assert (report.ok, report.first_bad_seq) == (False, 4) and "forged" in report.problem


def test_an_edit_with_its_own_hash_recomputed_breaks_the_next_link(path):
    events = reread(path)
    e3 = events[2]
    data = {"i": 3, "text": "rewritten"}
    forged = event_hash(e3.prev_hash, e3.run_id, e3.seq, e3.type, data, e3.schema_version, e3.at)
    tamper(path, f"UPDATE events SET data = '{canonical_json(data)}', hash = '{forged}' WHERE seq = 3")
    report = verify(reread(path))
    assert (report.ok, report.first_bad_seq) == (False, 4) and "prev_hash" in report.problem


def test_what_the_chain_alone_cannot_see_a_recorded_head_does(path):
    events = reread(path)
    head = events[-1].hash
    tamper(path, "DELETE FROM events WHERE seq = 5")  # a cut-off tail links up fine
    cut = reread(path)
    assert verify(cut).ok
    report = verify(cut, expected_head=head)
    assert (report.ok, report.first_bad_seq) == (False, 5)
    assert verify(events, expected_head=head).ok


def test_an_event_without_a_hash_is_not_trusted(path):
    events = reread(path)
    report = verify([*events[:2], dataclasses.replace(events[2], hash="")])
    assert (report.ok, report.first_bad_seq) == (False, 3)


def test_the_hash_is_pinned():
    # The definition is part of the on-disk format: changing it breaks every stored chain.
    assert event_hash("", "r1", 1, "run_started", {"tenant": "acme"}, 2, 1700000000.125) == \
        __import__("hashlib").sha256(
            b'{"at":1700000000.125,"data":{"tenant":"acme"},"run_id":"r1","schema_version":2,'
            b'"seq":1,"type":"run_started"}').hexdigest()
