"""Sandbox workers' leases and late results (schema version 6), against each real store: a SQLite
file and a PostgreSQL database of a throwaway cluster (tests/pg_support.py).

"Another control plane" is a second store object on the same database: its own connection(s),
as a second control-plane process would have. Expiry is never timed: a test that needs a lease
to lapse polls the store until the store says it has (HANG_GUARD_S only turns a hang into a
failure).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from store_targets import HANG_GUARD_S

from ringfence_server.control.store import SCHEMA_VERSION, StoreError, verify
from ringfence_server.control.store.base import LATE_REASONS, LateResult, WorkerLease

TTL = 3600.0  # long enough never to lapse during a test that does not wait for it


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not so after {HANG_GUARD_S} s")
        time.sleep(0.02)


def _late(envelope_id: str, worker_id: str = "w1", reason: str = "fenced", result: bytes = b"out",
          recorded_at: float | None = None, epoch: int = 1) -> LateResult:
    return LateResult(worker_id=worker_id, epoch=epoch, envelope_id=envelope_id, tenant="acme", run_id="r1",
                      call_id="c1", attempt=1, reason=reason, result_sha256=hashlib.sha256(result).hexdigest(),
                      recorded_at=recorded_at)


# -- epochs: each acquisition fences every earlier one -----------------------------------------


def test_a_worker_attaching_again_gets_the_next_epoch_and_the_old_one_is_fenced(target):
    """The worker's stream drops and it dials the same control plane again: only the epoch tells
    the two attachments apart. (The red check below removes that comparison from renew.)"""
    s = target.open()
    first = s.acquire_worker_lease("w1", "cp-a", TTL)
    assert (first.worker_id, first.epoch, first.holder) == ("w1", 1, "cp-a")
    assert first.expires_at > s.store_now()
    assert s.worker_lease_current("w1", 1)

    second = s.acquire_worker_lease("w1", "cp-a", TTL)
    assert second.epoch == 2
    assert s.renew_worker_lease(first, TTL) is None
    assert not s.worker_lease_current("w1", 1)
    assert s.worker_lease_current("w1", 2)
    assert s.worker_leases() == [second]  # the refused renewal changed nothing
    # Epochs are per worker; an epoch that was never given is not current either.
    assert s.acquire_worker_lease("w2", "cp-a", TTL).epoch == 1
    assert not s.worker_lease_current("w1", 3) and not s.worker_lease_current("nobody", 1)


def test_renewing_the_current_lease_extends_it(target):
    s = target.open()
    lease = s.acquire_worker_lease("w1", "cp-a", 30)
    renewed = s.renew_worker_lease(lease, TTL)
    assert renewed is not None
    assert (renewed.worker_id, renewed.epoch, renewed.holder) == ("w1", 1, "cp-a")
    assert renewed.expires_at > lease.expires_at
    assert s.worker_leases() == [renewed]
    assert s.worker_lease_current("w1", 1)
    # A renewal of the renewed handle works the same (it is the same epoch).
    again = s.renew_worker_lease(renewed, TTL)
    assert again is not None and again.epoch == 1 and again.expires_at >= renewed.expires_at


def test_a_lapsed_lease_is_not_current_and_is_never_revived(target):
    s = target.open()
    lease = s.acquire_worker_lease("w1", "cp-a", 0.2)
    _until(lambda: not s.worker_lease_current("w1", 1), "the lease lapsed")
    assert s.store_now() >= lease.expires_at  # the store's own clock says so too
    assert s.renew_worker_lease(lease, TTL) is None
    assert not s.worker_lease_current("w1", 1)
    assert s.worker_leases() == [lease]  # still listed, expiry untouched
    s.end_worker_lease(lease)  # ending a lapsed epoch changes nothing
    assert s.worker_leases() == [lease]
    # The worker attaches again: a new epoch, never the lapsed one back.
    back = s.acquire_worker_lease("w1", "cp-b", TTL)
    assert back.epoch == 2 and s.worker_lease_current("w1", 2) and not s.worker_lease_current("w1", 1)


def test_ending_an_old_epoch_leaves_the_new_one_current(target):
    s = target.open()
    old = s.acquire_worker_lease("w1", "cp-a", TTL)
    new = s.acquire_worker_lease("w1", "cp-b", TTL)
    s.end_worker_lease(old)  # the old stream's end arrives after the worker attached again
    assert s.worker_lease_current("w1", 2)
    assert s.worker_leases() == [new]
    s.end_worker_lease(new)
    assert not s.worker_lease_current("w1", 2)
    assert s.renew_worker_lease(new, TTL) is None  # an ended epoch is not revived
    ended = s.worker_leases()
    assert [(w.epoch, w.holder) for w in ended] == [(2, "cp-b")] and ended[0].expires_at <= s.store_now()
    assert s.acquire_worker_lease("w1", "cp-a", TTL).epoch == 3


def test_expiry_is_the_stores_clock_not_the_callers(target):
    """A store whose own clock (the one that stamps events) is far in the past still judges
    leases by the database's clock."""
    s = target.open(clock=lambda: 0.0)
    lease = s.acquire_worker_lease("w1", "cp-a", TTL)
    assert lease.expires_at > 1_000_000_000  # seconds since 1970 by the database, not 0 + TTL
    assert s.worker_lease_current("w1", 1)
    assert lease.expires_at - TTL <= s.store_now()


def test_worker_lease_arguments_are_checked(target):
    s = target.open()
    for worker, holder, ttl in (("", "cp-a", 1), ("w1", "", 1), ("w1", "cp-a", 0), ("w1", "cp-a", -1),
                                ("w1", "cp-a", float("nan")), ("w1", "cp-a", float("inf")), ("w1", "cp-a", True),
                                (None, "cp-a", 1), ("w1", None, 1)):
        with pytest.raises(ValueError):
            s.acquire_worker_lease(worker, holder, ttl)
    lease = s.acquire_worker_lease("w1", "cp-a", TTL)
    for ttl in (0, -5, float("nan"), "10"):
        with pytest.raises(ValueError):
            s.renew_worker_lease(lease, ttl)
    for worker, epoch in (("", 1), ("w1", 0), ("w1", -1), ("w1", True), ("w1", 1.0)):
        with pytest.raises(ValueError):
            s.worker_lease_current(worker, epoch)
    for kwargs in ({"worker_id": ""}, {"epoch": 0}, {"holder": ""}, {"expires_at": float("nan")}):
        with pytest.raises(ValueError):
            WorkerLease(**{"worker_id": "w1", "epoch": 1, "holder": "cp-a", "expires_at": 1.0, **kwargs})
    assert s.worker_leases() == [lease]  # no refused call wrote anything


def test_the_database_keeps_epochs_moving_forward(target):
    """The fencing rests on an epoch never being handed out twice: the database refuses to lower
    one, to give one epoch to another holder, or to forget a worker (its next epoch would be 1)."""
    s = target.open()
    s.acquire_worker_lease("w1", "cp-a", TTL)
    lease = s.acquire_worker_lease("w1", "cp-a", TTL)
    raw = target.raw()
    for statement in ("UPDATE worker_leases SET epoch = 1", "UPDATE worker_leases SET holder = 'cp-x'",
                      "UPDATE worker_leases SET worker_id = 'w9'", "DELETE FROM worker_leases"):
        with pytest.raises(target.refused, match="never goes back"):
            raw.execute(statement)
    if target.kind == "postgres":
        with pytest.raises(target.refused, match="never goes back"):
            raw.execute("TRUNCATE worker_leases")
    assert s.worker_leases() == [lease]


# -- two control planes on one database ------------------------------------------------------


def test_a_second_control_plane_fences_the_first(target):
    a, b = target.open(), target.open()
    on_a = a.acquire_worker_lease("w1", "cp-a", TTL)
    on_b = b.acquire_worker_lease("w1", "cp-b", TTL)  # the worker dialled the other control plane
    assert (on_a.epoch, on_b.epoch) == (1, 2)
    assert a.renew_worker_lease(on_a, TTL) is None
    assert not a.worker_lease_current("w1", on_a.epoch)
    assert a.worker_lease_current("w1", on_b.epoch) and b.worker_lease_current("w1", on_b.epoch)
    a.end_worker_lease(on_a)  # A notices its stream is gone; B's attachment is untouched
    assert a.worker_leases() == b.worker_leases() == [on_b]
    assert b.renew_worker_lease(on_b, TTL) is not None


def test_concurrent_acquisitions_get_distinct_epochs_and_the_last_is_current(target):
    stores = [target.open(), target.open()]
    start = threading.Barrier(8)
    got: list[WorkerLease] = []
    errors: list[BaseException] = []

    def attach(i: int) -> None:
        try:
            start.wait(HANG_GUARD_S)
            got.append(stores[i % 2].acquire_worker_lease("w1", f"cp-{i}", TTL))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=attach, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD_S * 2)
    assert errors == []
    assert sorted(lease.epoch for lease in got) == list(range(1, 9))
    last = max(got, key=lambda lease: lease.epoch)
    assert [e for e in range(1, 9) if stores[0].worker_lease_current("w1", e)] == [8]
    assert [(w.epoch, w.holder) for w in stores[1].worker_leases()] == [(8, last.holder)]
    assert [lease.epoch for lease in got if stores[1].renew_worker_lease(lease, TTL) is not None] == [8]


# -- late results --------------------------------------------------------------------------------


def test_late_results_are_durable_deduplicated_and_newest_first(target):
    now = [1_000.0]
    s = target.open(clock=lambda: now[0])
    assert s.late_results() == []
    assert s.record_late_result(_late("env-1", reason="fenced")) is True
    now[0] = 1_001.0
    assert s.record_late_result(_late("env-2", reason="lease_lapsed")) is True
    assert s.record_late_result(_late("env-1", worker_id="w2", reason="run_ended")) is True  # another worker
    # The same (worker, envelope) again, whatever it says now: the first is kept.
    assert s.record_late_result(_late("env-1", reason="unknown_envelope", result=b"other", epoch=7)) is False
    assert s.record_late_result(_late("env-3", recorded_at=5.0)) is True  # a given time is kept

    expected = [("w2", "env-1", "run_ended", 1_001.0), ("w1", "env-2", "lease_lapsed", 1_001.0),
                ("w1", "env-1", "fenced", 1_000.0), ("w1", "env-3", "fenced", 5.0)]
    listed = s.late_results()
    assert [(r.worker_id, r.envelope_id, r.reason, r.recorded_at) for r in listed] == expected
    first = listed[2]
    assert first == _late("env-1", reason="fenced", recorded_at=1_000.0)  # every field as recorded
    assert s.late_results(limit=2) == listed[:2]
    with pytest.raises(ValueError):
        s.late_results(limit=0)

    # Durable: a store opened after every object on the database was closed reads the same.
    target.close()
    again = target.open()
    assert again.late_results() == listed
    assert again.record_late_result(_late("env-2")) is False


def test_the_database_refuses_to_change_or_delete_a_late_result(target):
    s = target.open()
    s.record_late_result(_late("env-1"))
    raw = target.raw()
    with pytest.raises(target.refused, match="append-only"):
        raw.execute("UPDATE late_results SET reason = 'run_ended'")
    with pytest.raises(target.refused, match="append-only"):
        raw.execute("DELETE FROM late_results")
    if target.kind == "postgres":
        with pytest.raises(target.refused, match="append-only"):
            raw.execute("TRUNCATE late_results")
    assert [r.reason for r in s.late_results()] == ["fenced"]


def test_late_result_values_are_checked():
    assert {"fenced", "run_ended", "unknown_envelope", "lease_lapsed"} == LATE_REASONS
    good = _late("env-1")
    bad: list[dict[str, Any]] = [
        {"worker_id": ""}, {"envelope_id": ""}, {"epoch": 0}, {"epoch": True}, {"reason": "late"},
        {"tenant": None}, {"run_id": 1}, {"call_id": b"c1"}, {"attempt": -1}, {"attempt": 1.5},
        {"result_sha256": "abc"}, {"result_sha256": "A" * 64}, {"result_sha256": "g" * 64},
        {"recorded_at": float("nan")}, {"recorded_at": "now"},
    ]
    for change in bad:
        with pytest.raises(ValueError):
            LateResult(**{**good.__dict__, **change})
    # What the worker reported is kept as it came, also when it named nothing.
    LateResult(**{**good.__dict__, "reason": "unknown_envelope", "tenant": "", "run_id": "", "call_id": "",
                  "attempt": 0})
    LateResult(**{**good.__dict__, "reason": "fenced", "tenant": "", "run_id": "", "call_id": ""})


# -- schema version 5 -> 6 -----------------------------------------------------------------------


def _schema_5_store(target, monkeypatch):
    """A store made by the code path of schema version 5: creation and migrations up to 5 (the
    steps are unchanged; only the target version is held back), events stamped 5."""
    from ringfence_server.control.store import postgres, postgres_schema, sqlite, sqlite_schema

    schema, store = (sqlite_schema, sqlite) if target.kind == "sqlite" else (postgres_schema, postgres)
    with monkeypatch.context() as m:
        m.setattr(schema, "SCHEMA_VERSION", 5)
        m.setattr(store, "SCHEMA_VERSION", 5)
        s = target.open()
        s.append("r1", "run_started", {"tenant": "acme", "goal": "g"})
        s.append("r1", "observation", {"call_id": "c1", "content": {"b": [1, 2.5]}})
        s.append("r2", "run_started", {"tenant": "globex"})
        s.append_record("acme", "verdict", "p", {"ok": True}, "v")
        events = s.read("r1") + s.read("r2")
        assert s.schema_version() == 5
        target.close()
    return events


def test_a_schema_5_database_opens_as_6_with_its_events_and_empty_worker_tables(target, monkeypatch):
    events = _schema_5_store(target, monkeypatch)
    assert not {"worker_leases", "late_results"} & target.tables()  # it was version 5's layout
    target.close()

    s = target.open()
    assert s.schema_version() == SCHEMA_VERSION == 6
    assert s.read("r1") + s.read("r2") == events and {e.schema_version for e in events} == {5}
    assert verify(s.read("r1")).ok and verify(s.read("r2")).ok
    assert s.all_runs() == [("acme", "r1"), ("globex", "r2")]
    assert [dict(r.body) for r in s.read_records("acme", "verdict", "p")] == [{"ok": True}]
    assert s.worker_leases() == [] and s.late_results() == []
    # The new tables work, and new events continue the chain under the new version.
    assert s.acquire_worker_lease("w1", "cp-a", TTL).epoch == 1
    assert s.record_late_result(_late("env-1")) is True
    e3 = s.append("r1", "note", {})
    assert (e3.seq, e3.prev_hash, e3.schema_version) == (3, events[1].hash, 6)
    # Opening again migrates nothing and loses nothing.
    target.close()
    s = target.open()
    assert s.schema_version() == 6 and [w.epoch for w in s.worker_leases()] == [1] and len(s.late_results()) == 1


def test_a_failed_migration_to_6_changes_nothing(target, monkeypatch):
    _schema_5_store(target, monkeypatch)
    raw = target.raw()
    raw.execute("CREATE TABLE late_results (x INTEGER)")  # in the way of version 6's table
    if target.kind == "sqlite":
        with pytest.raises(StoreError, match="nothing was changed"):
            target.open()
    else:
        import psycopg

        with pytest.raises(psycopg.errors.DuplicateTable):
            target.open()
    assert "worker_leases" not in target.tables()
    assert raw.execute("SELECT value FROM schema_meta WHERE key = 'version'").fetchone()[0] == 5


# -- red check -----------------------------------------------------------------------------------


def test_red_check_without_the_epoch_comparison_a_stale_lease_renews(target, monkeypatch):
    """The protection test_a_worker_attaching_again_gets_the_next_epoch_and_the_old_one_is_fenced
    relies on is renew's `epoch = ?`: with it replaced by an always-true condition (same
    parameters), the fenced epoch-1 handle renews. So that test turns red without it."""
    from ringfence_server.control.store import postgres, sqlite

    module, check, always = ((sqlite, "epoch = ?", "? > 0") if target.kind == "sqlite"
                             else (postgres, "epoch = %s", "%s > 0"))
    assert module._RENEW_WORKER_LEASE.count(check) == 1
    monkeypatch.setattr(module, "_RENEW_WORKER_LEASE", module._RENEW_WORKER_LEASE.replace(check, always))
    s = target.open()
    stale = s.acquire_worker_lease("w1", "cp-a", TTL)
    s.acquire_worker_lease("w1", "cp-a", TTL)
    assert s.renew_worker_lease(stale, TTL) is not None  # the stale attachment is told it still holds
