"""The contract every event store keeps, run against each real store: a SQLite file and a
PostgreSQL database of a throwaway cluster (tests/pg_support.py).

"Another instance" is a second store object on the same database: its own connection(s), as a
second control-plane process would have.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest
from store_targets import HANG_GUARD_S, Target

from ringfence_server.control.store import (
    SCHEMA_VERSION,
    EventStore,
    KeyTaken,
    LeaseLost,
    NewEvent,
    RevisionConflict,
    SchemaVersionError,
    SeqConflict,
    StoreError,
    open_store,
    verify,
)


def started(store, run_id="r1", tenant="acme"):
    return store.append(run_id, "run_started", {"tenant": tenant, "goal": "g"})


# -- append, read, order ------------------------------------------------------------------------


def test_it_is_an_event_store(target):
    assert isinstance(target.open(), EventStore)


def test_append_and_read_in_order(target):
    s = target.open()
    e1 = started(s)
    e2 = s.append("r1", "note", {"n": [1, 2], "x": 1.5, "s": "é"})
    e3 = started(s, "r2")
    assert (e1.seq, e2.seq, e3.seq) == (1, 2, 1) and e1.schema_version == SCHEMA_VERSION
    assert s.read("r1") == [e1, e2]
    assert s.read("r1", from_seq=2) == [e2]
    assert s.read("nope") == []
    assert s.runs("acme") == ["r1", "r2"] and s.runs("globex") == []
    assert s.all_runs() == [("acme", "r1"), ("acme", "r2")]
    assert s.tenant_of("r1") == "acme" and s.tenant_of("nope") is None
    # Another instance sees exactly the same.
    other = target.open()
    assert other.read("r1") == [e1, e2] and other.all_runs() == s.all_runs()


def test_expected_seq_is_optimistic_concurrency(target):
    s = target.open()
    s.append("r1", "run_started", {"tenant": "a"}, expected_seq=1)
    with pytest.raises(SeqConflict):
        s.append("r1", "x", {}, expected_seq=1)
    with pytest.raises(SeqConflict):
        s.append("r1", "x", {}, expected_seq=5)
    assert s.append("r1", "x", {}, expected_seq=2).seq == 2
    assert [e.seq for e in s.read("r1")] == [1, 2]


def test_the_first_event_names_the_tenant_and_it_never_changes(target):
    s = target.open()
    with pytest.raises(StoreError):
        s.append("r1", "x", {})
    s.append("r1", "run_started", {}, tenant="acme")
    with pytest.raises(StoreError):
        s.append("r1", "x", {}, tenant="globex")
    assert s.append("r1", "x", {}, tenant="acme").seq == 2
    assert s.tenant_of("r1") == "acme" and s.runs("globex") == []


def test_concurrent_appenders_never_leave_a_gap_or_a_duplicate(target):
    stores = [target.open(), target.open()]  # two instances, four threads each
    started(stores[0])
    errors: list[BaseException] = []

    def writer(store, w):
        try:
            for j in range(20):
                store.append("r1", "x", {"w": w, "j": j})
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(stores[i % 2], i)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD_S * 5)
    assert errors == []
    events = stores[1].read("r1")
    assert [e.seq for e in events] == list(range(1, 162))
    for w in range(8):  # each writer's own events stay in its order
        assert [e.data["j"] for e in events if e.data.get("w") == w] == list(range(20))
    assert verify(events).ok


def test_an_acknowledged_append_is_durable(target):
    s = target.open()
    if target.kind == "sqlite":
        assert s._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert s._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    else:
        # Whatever the server's default, the store's own connections commit synchronously.
        with s._conn() as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
            assert conn.execute("SHOW fsync").fetchone()[0] == "on"


# -- append-only, by the database itself -----------------------------------------------------


def test_the_database_refuses_update_delete_and_a_fake_prune(target):
    s = target.open()
    started(s)
    s.append("r1", "x", {})
    raw = target.raw()
    with pytest.raises(target.refused, match="append-only"):
        raw.execute("UPDATE events SET type = 'forged'")
    with pytest.raises(target.refused, match="append-only"):
        raw.execute("DELETE FROM events WHERE run_id = 'r1' AND seq = 2")
    with pytest.raises(target.refused, match="append-only"):
        raw.execute("DELETE FROM events")
    if target.kind == "postgres":
        with pytest.raises(target.refused, match="append-only"):
            raw.execute("TRUNCATE events")
    # The pruning door opens only for finished runs: a live one cannot be listed in it.
    with pytest.raises(target.refused, match="only a finished run"):
        raw.execute("INSERT INTO prune_allowed (run_id) VALUES ('r1')")
    assert [e.type for e in s.read("r1")] == ["run_started", "x"]
    assert verify(s.read("r1")).ok


# -- schema version ----------------------------------------------------------------------------


def test_the_schema_version_is_recorded_and_a_newer_one_is_refused(target):
    s = target.open()
    started(s)
    assert s.schema_version() == SCHEMA_VERSION
    raw = target.raw()
    raw.execute(f"UPDATE schema_meta SET value = {SCHEMA_VERSION + 1} WHERE key = 'version'")
    with pytest.raises(SchemaVersionError, match="newer"):
        target.open()
    # Refusing touched nothing.
    assert raw.execute("SELECT value FROM schema_meta WHERE key = 'version'").fetchone()[0] == SCHEMA_VERSION + 1
    raw.execute(f"UPDATE schema_meta SET value = {SCHEMA_VERSION} WHERE key = 'version'")
    assert [e.type for e in target.open().read("r1")] == ["run_started"]


# -- the audit chain ---------------------------------------------------------------------------


def test_every_event_carries_the_chain_and_it_verifies(target):
    s = target.open()
    e1 = started(s)
    e2 = s.append("r1", "x", {"k": {"b": 1, "a": [1.25, None, True]}})
    e3 = s.append("r1", "run_finished", {"outcome": "completed"})
    assert e1.prev_hash == "" and e2.prev_hash == e1.hash and e3.prev_hash == e2.hash
    assert all(len(e.hash) == 64 and int(e.hash, 16) >= 0 for e in (e1, e2, e3))
    events = target.open().read("r1")
    assert events == [e1, e2, e3]  # hashes included: what was returned is what is stored
    report = verify(events)
    assert report.ok and report.events == 3 and report.first_bad_seq is None


def test_the_same_events_hash_the_same_in_every_store(tmp_path, pg_url):
    # One definition of the chain: a log copied between stores verifies, and hashes agree.
    chains = []
    for where in (str(tmp_path / "events.sqlite3"), pg_url):
        times = iter([1700000000, 1700000000.125])  # an int from a clock is stored, and hashed, as a float
        store = open_store(where, clock=lambda times=times: next(times))
        try:
            started(store)
            store.append("r1", "x", {"v": [1, 2.5, "ü", 1e16], "n": None})
            assert verify(store.read("r1")).ok
            chains.append([e.hash for e in store.read("r1")])
        finally:
            store.close()
    assert chains[0] == chains[1]


# -- watchers ----------------------------------------------------------------------------------


def _wait_in_thread(store, run_id, after_seq):
    result: dict[str, bool] = {}
    ready = threading.Event()

    def run():
        ready.set()
        result["woke"] = store.wait_for(run_id, after_seq, HANG_GUARD_S)

    t = threading.Thread(target=run)
    t.start()
    ready.wait(HANG_GUARD_S)
    return t, result


def test_wait_for_is_woken_by_another_instance(target):
    watcher, writer = target.open(), target.open()
    if target.kind == "postgres":
        # Prove the NOTIFY wakes it: without one, this waiter would not look again for an hour
        # and would return False after HANG_GUARD_S.
        watcher.FALLBACK_RECHECK_S = 3600.0
    started(writer)
    assert watcher.wait_for("r1", 0, 0) is True  # already there: no waiting
    t, result = _wait_in_thread(watcher, "r1", 1)
    writer.append("r1", "x", {})
    t.join(HANG_GUARD_S * 2)
    assert result == {"woke": True}
    assert watcher.wait_for("r1", 2, 0.05) is False
    assert watcher.wait_for("other-run", 0, 0.05) is False


def test_wait_for_is_woken_by_a_local_append_without_polling(target):
    s = target.open()
    s.FALLBACK_RECHECK_S = 3600.0
    started(s)
    t, result = _wait_in_thread(s, "r1", 1)
    s.append("r1", "x", {})
    t.join(HANG_GUARD_S * 2)
    assert result == {"woke": True}


def test_version_and_wait_still_work(target):
    s = target.open()
    v = s.version()
    threading.Timer(0.05, lambda: started(s)).start()
    assert s.wait(v, timeout=HANG_GUARD_S) != v


# -- leases ------------------------------------------------------------------------------------


def test_a_lease_is_exclusive_between_instances(target):
    a, b = target.open(), target.open()
    la = a.acquire_lease("r1", "instance-a", 60)
    assert la is not None and (la.run_id, la.owner) == ("r1", "instance-a")
    assert b.acquire_lease("r1", "instance-b", 60) is None
    renewed = a.renew_lease(la)
    assert renewed is not None and renewed.token == la.token and renewed.expires_at >= la.expires_at
    assert a.append("r1", "run_started", {"tenant": "acme"}, lease=renewed).seq == 1
    with pytest.raises(LeaseLost):  # no lease while someone holds one
        b.append("r1", "x", {})
    with pytest.raises(LeaseLost):  # a lease of another run
        a.append("r1", "x", {}, lease=a.acquire_lease("r2", "instance-a", 60))
    a.release_lease(renewed)
    lb = b.acquire_lease("r1", "instance-b", 60)
    assert lb is not None and lb.token > la.token
    with pytest.raises(LeaseLost):
        a.append("r1", "x", {}, lease=la)
    assert a.renew_lease(la) is None
    assert b.append("r1", "x", {}, lease=lb).seq == 2
    assert [e.seq for e in a.read("r1")] == [1, 2]


def test_an_expired_lease_is_taken_over_and_its_holder_fenced_off(target):
    a, b = target.open(), target.open()
    la = a.acquire_lease("r1", "instance-a", 0.2)
    assert la is not None
    a.append("r1", "run_started", {"tenant": "acme"}, lease=la)
    deadline = time.monotonic() + HANG_GUARD_S
    lb = None
    while lb is None and time.monotonic() < deadline:  # until the database's clock says it expired
        lb = b.acquire_lease("r1", "instance-b", 60)
        if lb is None:
            time.sleep(0.05)
    assert lb is not None and lb.token > la.token
    with pytest.raises(LeaseLost):
        a.append("r1", "late write", {}, lease=la)
    assert a.renew_lease(la) is None
    assert a.acquire_lease("r1", "instance-a", 60) is None
    assert b.append("r1", "x", {}, lease=lb).seq == 2
    assert [e.type for e in a.read("r1")] == ["run_started", "x"]


def test_lease_arguments_are_checked(target):
    s = target.open()
    for owner, ttl in (("", 10), ("a", 0), ("a", -1), ("a", float("inf"))):
        with pytest.raises(ValueError):
            s.acquire_lease("r1", owner, ttl)


# -- retention ---------------------------------------------------------------------------------


def test_prune_removes_only_old_finished_runs(target):
    now = [1_000_000.0]
    s = target.open(clock=lambda: now[0])
    for run in ("old-done", "old-live", "old-done-2"):
        started(s, run)
    s.append("old-done", "run_finished", {"outcome": "completed"})
    s.append("old-done-2", "run_finished", {"outcome": "cancelled"})
    assert s.acquire_lease("old-done", "instance-a", 3600) is not None
    now[0] += 10 * 86400
    started(s, "new-done")
    s.append("new-done", "run_finished", {"outcome": "completed"})
    s.append("old-live", "x", {})

    assert s.prune(older_than_s=86400) == ["old-done", "old-done-2"]
    assert s.read("old-done") == [] and s.tenant_of("old-done") is None
    assert [e.type for e in s.read("old-live")] == ["run_started", "x"]
    assert [e.type for e in s.read("new-done")] == ["run_started", "run_finished"]
    assert s.all_runs() == [("acme", "old-live"), ("acme", "new-done")]
    # Its lease went with it: another owner gets the (now unused) id at once.
    assert s.acquire_lease("old-done", "instance-b", 60) is not None
    # A live run is never pruned, however old; nothing is left in the pruning door.
    now[0] += 100 * 86400
    assert s.prune(older_than_s=0) == ["new-done"]
    assert s.prune(older_than_s=0) == []
    assert [e.type for e in s.read("old-live")] == ["run_started", "x"]
    assert target.raw().execute("SELECT count(*) FROM prune_allowed").fetchone()[0] == 0
    # And the database still refuses a plain DELETE of the live run.
    with pytest.raises(target.refused, match="append-only"):
        target.raw().execute("DELETE FROM events WHERE run_id = 'old-live'")


def test_prune_rejects_a_negative_age(target):
    with pytest.raises(ValueError):
        target.open().prune(-1)


def test_open_store_picks_by_form(tmp_path, pg_url):
    from ringfence_server.control.store import SqliteEventStore
    from ringfence_server.control.store.postgres import PostgresEventStore

    for where, kind, path in ((tmp_path, SqliteEventStore, tmp_path / "events.sqlite3"),
                              (tmp_path / "x.sqlite3", SqliteEventStore, tmp_path / "x.sqlite3"),
                              (pg_url, PostgresEventStore, None)):
        store = open_store(where)
        try:
            assert isinstance(store, kind)
            if path is not None:
                assert Path(store.path) == path
        finally:
            store.close()


def test_postgres_survives_losing_its_connections(pg_url):
    """The server drops every connection of the store (a restart, a failover): the pool replaces
    them and the listener reconnects, and a waiter is still woken by the next append."""
    t = Target("postgres", pg_url)
    try:
        watcher, writer = t.open(), t.open()
        watcher.FALLBACK_RECHECK_S = 3600.0
        started(writer)
        raw = t.raw()
        killed = raw.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                             "WHERE application_name LIKE 'ringfence%'").fetchone()[0]
        assert killed >= 4  # both stores' pooled connections and both listeners
        thread, result = _wait_in_thread(watcher, "r1", 1)
        assert writer.append("r1", "x", {}).seq == 2
        thread.join(HANG_GUARD_S * 2)
        assert result == {"woke": True}
        assert [e.seq for e in watcher.read("r1")] == [1, 2]
    finally:
        t.close()


# -- keys: names unique across every run, claimed by an event -----------------------------------


def test_a_key_is_claimed_once_across_runs_and_a_refused_claim_appends_nothing(target):
    s = target.open()
    started(s, "r1")
    started(s, "r2", tenant="globex")
    claimed = s.append("r1", "dispatch_started", {"call_id": "c"}, keys=["idem:acme:k1"])
    assert s.lookup_key("idem:acme:k1") == ("r1", claimed.seq)
    with pytest.raises(KeyTaken) as info:
        s.append("r2", "dispatch_started", {"call_id": "c"}, keys=["idem:globex:k2", "idem:acme:k1"])
    assert info.value.holder == ("r1", claimed.seq)
    # Nothing of the refused append is durable: no event, and not its other key either.
    assert [e.type for e in s.read("r2")] == ["run_started"]
    assert s.lookup_key("idem:globex:k2") is None
    assert s.lookup_key("nobody") is None


def test_append_all_writes_consecutive_chained_events_or_none(target):
    s = target.open()
    head = started(s)
    written = s.append_all("r1", [NewEvent("batch_started", {"b": 1}), NewEvent("call_decided", {"c": 1}),
                                  NewEvent("call_decided", {"c": 2}, keys=["idem:acme:k1"])], expected_seq=2)
    assert [e.seq for e in written] == [2, 3, 4] and [e.type for e in written] == ["batch_started", "call_decided",
                                                                                   "call_decided"]
    assert written[0].prev_hash == head.hash and all(b.prev_hash == a.hash for a, b in itertools.pairwise(written))
    events = target.open().read("r1")
    assert events == [head, *written] and verify(events).ok  # what was returned is what is stored
    assert s.lookup_key("idem:acme:k1") == ("r1", 4)
    # All or none: a taken key in the last event, or a stale expected_seq, leaves nothing of any.
    with pytest.raises(KeyTaken):
        s.append_all("r1", [NewEvent("a", {}), NewEvent("b", {}, keys=["idem:acme:k2", "idem:acme:k1"])])
    with pytest.raises(SeqConflict):
        s.append_all("r1", [NewEvent("a", {}), NewEvent("b", {})], expected_seq=4)
    assert s.read("r1") == events and s.lookup_key("idem:acme:k2") is None
    # A run may begin with one: its first event names the tenant, and the rest follow it.
    opened = s.append_all("r2", [NewEvent("run_started", {"tenant": "acme"}), NewEvent("x", {})], expected_seq=1)
    assert [e.seq for e in opened] == [1, 2] and s.tenant_of("r2") == "acme"
    with pytest.raises(ValueError):
        s.append_all("r1", [])


def test_append_all_is_one_transaction_on_postgres(pg_url):
    """One durable write: every row of an append_all has the inserting transaction's id (xmin),
    and separate appends have separate ones. (SQLite's all-or-none is the test above.)"""
    target = Target("postgres", pg_url)
    try:
        s = target.open()
        started(s)
        s.append_all("r1", [NewEvent("a", {}), NewEvent("b", {}), NewEvent("c", {})])
        s.append("r1", "d", {})
        rows = target.raw().execute("SELECT type, xmin::text FROM events WHERE run_id = 'r1' ORDER BY seq").fetchall()
        by_type = dict(rows)
        assert by_type["a"] == by_type["b"] == by_type["c"]
        assert len({by_type["run_started"], by_type["a"], by_type["d"]}) == 3
    finally:
        target.close()


def test_keys_are_append_only_and_go_with_a_pruned_run(target):
    now = [1_000_000.0]
    s = target.open(clock=lambda: now[0])
    started(s, "done")
    s.append("done", "approval_requested", {"approval_id": "apr-1"}, keys=["approval:apr-1"])
    started(s, "live")
    s.append("live", "approval_requested", {"approval_id": "apr-2"}, keys=["approval:apr-2"])
    s.append("done", "run_finished", {"outcome": "completed"})
    with pytest.raises(target.refused, match="append-only"):
        target.raw().execute("DELETE FROM keys WHERE name = 'approval:apr-2'")
    with pytest.raises(target.refused, match="append-only"):
        target.raw().execute("UPDATE keys SET run_id = 'live' WHERE name = 'approval:apr-1'")
    now[0] += 10 * 86400
    assert s.prune(older_than_s=86400) == ["done"]
    assert s.lookup_key("approval:apr-1") is None
    assert s.lookup_key("approval:apr-2") == ("live", 2)


def test_unfinished_lists_runs_without_run_finished(target):
    s = target.open()
    for run, tenant in (("a", "acme"), ("b", "acme"), ("c", "globex")):
        started(s, run, tenant=tenant)
    s.append("b", "run_finished", {"outcome": "completed"})
    assert s.unfinished() == [("acme", "a"), ("globex", "c")]
    assert s.unfinished("acme") == [("acme", "a")]


def test_a_lease_of_a_dead_owner_can_be_broken_and_only_its_own(target):
    s = target.open()
    started(s, "r1")
    held = s.acquire_lease("r1", "host:123:dead", 3600)
    assert s.lease_holder("r1") == "host:123:dead"
    assert s.break_lease("r1", "someone-else") is False and s.lease_holder("r1") == "host:123:dead"
    assert s.break_lease("r1", "host:123:dead") is True and s.lease_holder("r1") is None
    with pytest.raises(LeaseLost):
        s.append("r1", "x", {}, lease=held)  # the broken lease fences its old holder off
    assert s.acquire_lease("r1", "successor", 60) is not None


# -- records (revisioned documents outside any run) -------------------------------------------


def test_records_are_revisioned_per_tenant_kind_and_key(target):
    now = [1_000.0]
    s = target.open(clock=lambda: now[0])
    r1 = s.append_record("acme", "evidence:verifier", "checkout/p99", {"value": "high"}, "vera")
    now[0] = 1_001.5
    r2 = s.append_record("acme", "evidence:verifier", "checkout/p99", {"value": "normal"}, "vera")
    other = s.append_record("globex", "evidence:verifier", "checkout/p99", {"value": "low"}, "gus")
    assert (r1.revision, r2.revision, other.revision) == (1, 2, 1)
    history = s.read_records("acme", "evidence:verifier", "checkout/p99")
    assert [(r.revision, dict(r.body), r.written_by, r.at) for r in history] == [
        (1, {"value": "high"}, "vera", 1_000.0), (2, {"value": "normal"}, "vera", 1_001.5)]
    # Another tenant's record of the same key is invisible, as is another kind.
    assert [dict(r.body) for r in s.read_records("globex", "evidence:verifier", "checkout/p99")] == [{"value": "low"}]
    assert s.read_records("acme", "evidence:executor", "checkout/p99") == []


def test_expected_revision_refuses_a_writer_that_lost_the_race(target):
    s = target.open()
    assert s.append_record("acme", "routing", "T1", {"status": "review"}, "a", expected_revision=0).revision == 1
    with pytest.raises(RevisionConflict):
        s.append_record("acme", "routing", "T1", {"status": "escalate"}, "b", expected_revision=0)
    assert s.append_record("acme", "routing", "T1", {"status": "escalate"}, "b", expected_revision=1).revision == 2
    assert [r.body["status"] for r in s.read_records("acme", "routing", "T1")] == ["review", "escalate"]


def test_concurrent_record_writers_get_distinct_revisions(target):
    stores = [target.open() for _ in range(4)]
    errors: list[BaseException] = []

    def write(store) -> None:
        try:
            for _ in range(10):
                store.append_record("acme", "verdict", "plan-1", {"verified": True}, "v")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [r.revision for r in stores[0].read_records("acme", "verdict", "plan-1")] == list(range(1, 41))


def test_the_database_refuses_to_change_or_delete_a_record(target):
    s = target.open()
    s.append_record("acme", "verdict", "plan-1", {"verified": True}, "v")
    raw = target.raw()
    with pytest.raises(target.refused, match="append-only"):
        raw.execute("UPDATE records SET body = '{\"verified\":false}'")
    with pytest.raises(target.refused, match="append-only"):
        raw.execute("DELETE FROM records")
    if target.kind == "postgres":
        with pytest.raises(target.refused, match="append-only"):
            raw.execute("TRUNCATE records")
    assert [dict(r.body) for r in s.read_records("acme", "verdict", "plan-1")] == [{"verified": True}]


# -- a page of runs, newest first (ListRuns) -----------------------------------------------------


def _runs_for_pages(target):
    """acme's r0..r6 started at these times (ties broken by insertion order), three of them
    finished; one globex run among them."""
    now = [0.0]
    s = target.open(clock=lambda: now[0])
    for name, at in (("r0", 100.0), ("r1", 101.0), ("r2", 101.0), ("g1", 101.0), ("r3", 101.0), ("r4", 102.0),
                     ("r5", 103.0), ("r6", 103.0)):
        now[0] = at
        started(s, name, "globex" if name.startswith("g") else "acme")
    now[0] = 200.0
    for name, outcome in (("r1", "completed"), ("r4", "completed"), ("r5", "cancelled"), ("g1", "completed")):
        s.append(name, "run_finished", {"outcome": outcome})
    return s


def _walk(s, size, **filters):
    pages, before = [], None
    while True:
        rows = s.run_page("acme", before=before, limit=size, **filters)
        pages.append([r.key for r in rows])
        if len(rows) < size:
            return pages
        before = rows[-1]


def test_run_page_walks_a_tenants_runs_newest_first_from_a_cursor(target):
    s = _runs_for_pages(target)
    newest_first = ["r6", "r5", "r4", "r3", "r2", "r1", "r0"]
    assert [r.key for r in s.run_page("acme", limit=100)] == newest_first
    assert _walk(s, 3) == [["r6", "r5", "r4"], ["r3", "r2", "r1"], ["r0"]]  # ties at 101 and 103 split right
    assert _walk(s, 7) == [newest_first, []]
    assert [r.key for r in s.run_page("globex", limit=10)] == ["g1"]
    assert s.run_page("nobody", limit=10) == []


def test_run_page_filters_finished_and_outcome_in_the_query(target):
    s = _runs_for_pages(target)
    assert _walk(s, 2, finished=True) == [["r5", "r4"], ["r1"]]
    assert _walk(s, 2, finished=False) == [["r6", "r3"], ["r2", "r0"], []]
    assert _walk(s, 1, outcome="completed") == [["r4"], ["r1"], []]
    assert _walk(s, 5, finished=True, outcome="cancelled") == [["r5"]]
    assert s.run_page("acme", finished=False, outcome="completed", limit=10) == []
    assert s.run_page("acme", outcome="error", limit=10) == []


def test_run_page_is_an_index_walk_not_a_sort_of_the_history(target):
    s = _runs_for_pages(target)
    cursor = s.run_page("acme", limit=2)[-1]
    raw = target.raw()
    if target.kind == "sqlite":
        plan = " ".join(str(row[-1]) for row in raw.execute(
            "EXPLAIN QUERY PLAN SELECT e.run_id, e.at, e.rowid FROM events e WHERE e.tenant = ? AND e.seq = 1 "
            "AND (e.at, e.rowid) < (?, ?) AND EXISTS (SELECT 1 FROM events f WHERE f.run_id = e.run_id AND "
            "f.type = 'run_finished') ORDER BY e.at DESC, e.rowid DESC LIMIT 3", ("acme", cursor.at, cursor.id)))
        assert "events_tenant_started" in plan and "events_run_finished" in plan, plan
        assert "TEMP B-TREE" not in plan, plan  # no sort of all the tenant's runs
    else:
        raw.execute("SET enable_seqscan = off")  # a table this small would otherwise be scanned
        plan = " ".join(row[0] for row in raw.execute(
            "EXPLAIN SELECT e.run_id, e.at, e.id FROM events e WHERE e.tenant = %s AND e.seq = 1 "
            "AND (e.at, e.id) < (%s, %s) AND EXISTS (SELECT 1 FROM events f WHERE f.run_id = e.run_id AND "
            "f.type = 'run_finished') ORDER BY e.at DESC, e.id DESC LIMIT 3", ("acme", cursor.at, cursor.id)))
        assert "events_first" in plan and "events_run_finished" in plan, plan
        assert "Sort" not in plan, plan


def test_read_takes_a_limit(target):
    s = target.open()
    started(s)
    for i in range(4):
        s.append("r1", "x", {"i": i})
    assert [e.seq for e in s.read("r1", 2, limit=2)] == [2, 3]
    assert [e.seq for e in s.read("r1", 4, limit=10)] == [4, 5]
    assert [e.seq for e in s.read("r1", limit=None)] == [1, 2, 3, 4, 5]
