"""The store's failures and their gRPC codes (second attack review, findings 9 and 12): a full
disk is RESOURCE_EXHAUSTED (retry later), an unreachable database UNAVAILABLE (retry at once);
a reader of a run applies what it read under a lock no store call holds, and an event it
applied first is not applied again by its appender.
Fast checks beside the real-part tests in tests/integration/test_review2_full_disk.py and
test_review2_store_outage.py."""

from __future__ import annotations

import threading

import grpc

from ringfence_server.control.api.status import code_for
from ringfence_server.control.events import BatchCall, BatchStarted, RunStarted
from ringfence_server.control.orchestration.runs import RunRepository
from ringfence_server.control.state import RunState
from ringfence_server.control.store.base import StoreError, StoreFull, StoreUnavailable, WriteOutage
from ringfence_server.control.store.sqlite import SqliteEventStore


def test_store_full_is_resource_exhausted_and_still_a_store_error():
    assert code_for(StoreFull("disk full")) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert isinstance(StoreFull("disk full"), StoreError)  # dispatch's `except StoreError` still sees it
    assert code_for(StoreUnavailable("down")) is grpc.StatusCode.UNAVAILABLE


def test_write_outage_is_set_by_a_failure_and_cleared_by_a_success():
    writes = WriteOutage()
    assert writes.reason is None
    writes.failed("database or disk is full")
    assert writes.reason == "database or disk is full"
    writes.succeeded()
    assert writes.reason is None


class _ReaderBetweenCommitAndApply:
    """A real SQLite store whose append, once committed, lets a reader of the run catch up (on
    another thread, as a GetRun would) before the appender applies its own event."""

    def __init__(self, store, repo_box: list) -> None:
        self._store = store
        self._repo_box = repo_box
        self.reader_done: list[bool] = []

    def __getattr__(self, name):
        return getattr(self._store, name)

    def append_all(self, *args, **kwargs):
        events = self._store.append_all(*args, **kwargs)
        repo, state = self._repo_box
        if state.last_seq:  # not the run's first event: the run is readable
            reader = threading.Thread(target=lambda: (repo.catch_up(state), self.reader_done.append(True)))
            reader.start()
            reader.join(10)  # the reader takes no lock an append holds: it finishes
        return events


def test_an_event_a_reader_applied_before_its_appender_is_applied_once(tmp_path):
    store = SqliteEventStore(tmp_path / "events.sqlite3")
    box: list = []
    between = _ReaderBetweenCommitAndApply(store, box)
    repo = RunRepository(between)
    state = RunState(run_id="r", tenant="t", key="r")
    box[:] = [repo, state]
    try:
        repo.append(state, RunStarted(run_id="r", tenant="t", created_at=1.0))
        repo.append(state, BatchStarted(batch_id="b", calls=(BatchCall("c1"),)))
        assert between.reader_done == [True]  # the reader did not wait for the appender
        assert (state.last_seq, state.turns) == (2, 1)  # batch_started applied once, not twice
        assert [e.seq for e in store.read("r")] == [1, 2]
    finally:
        store.close()
