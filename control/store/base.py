"""The event store interface.

A run is a sequence of events with per-run monotonic `seq` (1, 2, 3, ...). Events are only
ever appended, never changed or removed; a run's state is the fold of its events
(control.state). `append` returns only after the event is durable.

    append(run_id, type, data, expected_seq=None, tenant=None) -> Event
        `expected_seq`: the seq the new event must get (optimistic concurrency); another value
        means somebody else appended first -> SeqConflict. The first event of a run must carry
        the run's tenant (argument, or `data["tenant"]`).
    read(run_id, from_seq=0) -> list[Event]     events with seq >= from_seq, in order
    runs(tenant) -> list[str]                   run ids of a tenant, oldest first
    all_runs() -> list[tuple[tenant, run_id]]   every run (for recovery at startup)
    tenant_of(run_id) -> str | None
    version() -> int / wait(version, timeout) -> int
        live watchers: `version()` changes on every append in this process; `wait` blocks
        until it differs from `version` (or the timeout) and returns the current one.
    subscribe(callback) -> unsubscribe            callback(event) after each durable append
    close()
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from control.errors import FailedPrecondition
from control.model import Event

SCHEMA_VERSION = 1


class StoreError(FailedPrecondition):
    pass


class SeqConflict(StoreError):
    """The run's log moved on since the caller read it."""


@runtime_checkable
class EventStore(Protocol):
    def append(self, run_id: str, type: str, data: Mapping[str, Any], expected_seq: int | None = None,
               tenant: str | None = None) -> Event: ...

    def read(self, run_id: str, from_seq: int = 0) -> list[Event]: ...

    def runs(self, tenant: str) -> list[str]: ...

    def all_runs(self) -> list[tuple[str, str]]: ...

    def tenant_of(self, run_id: str) -> str | None: ...

    def version(self) -> int: ...

    def wait(self, version: int, timeout: float) -> int: ...

    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[], None]: ...

    def close(self) -> None: ...
