"""The event store interface, its values and its errors.

A run is a sequence of events with per-run monotonic `seq` (1, 2, 3, ...). Events are only
ever appended, never changed; a run's state is the fold of its events (ringfence_server.control.state). `append`
returns only after the event is committed. The only removal is `prune`, of whole finished runs,
through a path the database itself sanctions.

    append(run_id, type, data, expected_seq=None, tenant=None, lease=None, keys=()) -> Event
        `expected_seq`: the seq the new event must get (optimistic concurrency); another value
        means somebody else appended first -> SeqConflict. expected_seq=1 creates the run: if
        the run id has any event already -> RunExists (a SeqConflict naming the tenant that
        holds it), decided in the append's transaction before the lease and the tenant are
        looked at, so of several instances (or tenants) creating one run id at once exactly one
        wins. The first event of a run must carry the run's tenant (argument, or
        `data["tenant"]`). `lease`: see below. The returned event
        carries `prev_hash` and `hash` (ringfence_server.control.store.audit). `keys`: names this event claims,
        unique across all runs (an approval id, a tenant's client idempotency key); one already
        held -> KeyTaken, and nothing is appended.
    append_all(run_id, [NewEvent(type, data, keys)], expected_seq=None, tenant=None, lease=None)
        -> list[Event]
        several events of one run in one transaction, one durable write (group commit): all of
        them or none, with consecutive seqs from `expected_seq`, each by append's rules.
        `append` is append_all of one.
    lookup_key(name) -> (run_id, seq) | None    the event that holds a key
    read(run_id, from_seq=0, limit=None) -> list[Event]
                                                events with seq >= from_seq, in order (at most limit)
    runs(tenant) -> list[str]                   run ids of a tenant, oldest first
    run_page(tenant, finished=None, outcome=None, before=None, limit=50) -> list[RunRow]
        a tenant's runs, newest first (by their first event's `at`, then insertion order), at
        most `limit`, strictly after the cursor `before` (a RunRow of an earlier page): a keyset
        query on an index, so a page costs the page, not the history. `finished` True/False:
        only runs with / without run_finished; `outcome`: only runs finished with it (none
        with finished=False).
    all_runs() -> list[tuple[tenant, run_id]]   every run (for recovery at startup)
    tenant_of(run_id) -> str | None
    unfinished(tenant=None) -> list[tuple[tenant, run_id]]   runs without run_finished, oldest first
    version() -> int / wait(version, timeout) -> int
        live watchers: `version()` changes on every append in this process (and, on PostgreSQL,
        on every append another instance announces); `wait` blocks until it differs from
        `version` (or the timeout) and returns the current one.
    wait_for(run_id, after_seq, timeout) -> bool
        True as soon as the run has an event with seq > after_seq, whoever appended it; False
        after the timeout.
    acquire_lease(run_id, owner, ttl_s) -> Lease | None / renew_lease(lease) / release_lease(lease)
        a single writer per run across instances: None while another owner holds an unexpired
        lease. An append given a lease is refused (LeaseLost) unless it is still the run's
        current lease, checked inside the append's transaction; an append without a lease is
        refused while someone holds an unexpired lease on the run. Expiry is judged by the
        database's clock. lease_holder(run_id) -> owner | None; break_lease(run_id, owner) drops
        a lease whose owner is known to be dead (its process on this host is gone).
    prune(older_than_s) -> list[str]            remove finished runs older than that, return them
    store_now() -> float                        the clock leases expire by (the database's), epoch s
    acquire_worker_lease(worker_id, holder, ttl_s) -> WorkerLease
    renew_worker_lease(lease, ttl_s) -> WorkerLease | None
    worker_lease_current(worker_id, epoch) -> bool
    end_worker_lease(lease) / worker_leases() -> list[WorkerLease]
        which attachment of a sandbox worker is current, agreed by every control plane on the
        database: each acquisition gets the worker's next epoch, fencing every earlier one at
        once; a result under an epoch that is not current and unexpired is late. Expiry is
        judged by the database's clock; a lapsed or fenced epoch is never current again.
    record_late_result(late) -> bool / late_results(limit=100) -> list[LateResult]
        results that arrived late (never applied), append-only, one per (worker, envelope).
    subscribe(callback) -> unsubscribe            callback(event) after each durable append here
    close()

Run ids are the store's keys: usually the caller's run id, `tenant/run_id` when another tenant
had already taken that id (see ringfence_server.control.orchestration.runs.RunRepository.start).

Errors:

    StoreError < ringfence.errors.FailedPrecondition
    ├── SeqConflict            the run's log moved on since the caller read it
    │   └── RunExists          append(expected_seq=1) of a run id that already has events
    ├── LeaseLost              the append's lease is not (or no longer) the run's current one
    ├── KeyTaken               a key the append claims is held by another event
    ├── RevisionConflict       a record was revised since the caller read it
    ├── SchemaVersionError     the database's schema is newer than this code, or unknown
    ├── StoreUnavailable       the database cannot be reached (also a ringfence.errors.Unavailable)
    └── StoreFull              the database's disk is full: nothing can be written until space is
                               freed (also a ringfence.errors.ResourceExhausted)

`ping()` raises while the store cannot serve: StoreUnavailable when it does not answer, and
StoreFull from the moment a write failed for want of space until a write succeeds again (ping
itself tries a write that needs new space meanwhile: a server reporting NOT_SERVING gets no
writes that could tell it the disk has room again). See WriteOutage.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ringfence.errors import FailedPrecondition, ResourceExhausted, Unavailable
from ringfence.model import Event

SCHEMA_VERSION = 6
"""The store schema this code writes. 1: events only (SQLite, no meta table). 2: schema_meta,
the audit hash chain (prev_hash, hash), leases, sanctioned pruning. 3: keys. 4: records
(revisioned documents outside any run: evidence, assessments, routing decisions). 5: the
indexes of `run_page` (a tenant's runs newest first; a run's run_finished by run id). 6: sandbox
workers' leases (worker_leases) and the results that came too late (late_results). Each event
records the schema version it was written under."""

FINISHED = "run_finished"
"""The event type that ends a run: only runs whose last event has it can be pruned."""


class Subscribers:
    """The callbacks a store calls after each durable append it made (both stores share it)."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[Event], None]] = []

    def add(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        """Register `callback`; returns the function that unregisters it."""
        self._callbacks.append(callback)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(callback)

        return unsubscribe

    def notify(self, event: Event) -> None:
        for callback in list(self._callbacks):
            callback(event)


class StoreError(FailedPrecondition):
    pass


class SeqConflict(StoreError):
    """The run's log moved on since the caller read it."""


class RunExists(SeqConflict):
    """append(expected_seq=1): the run id already has events. `tenant` is the tenant they belong
    to, for the caller to tell "my run, started a moment ago" from "another tenant's id"; the
    message does not name it (it must not reach another tenant)."""

    def __init__(self, run_id: str, tenant: str) -> None:
        super().__init__(f"run {run_id} already exists")
        self.run_id = run_id
        self.tenant = tenant


def refuse_existing_run(run_id: str, head_tenant: str | None, expected_seq: int | None) -> None:
    """An append that creates a run (expected_seq=1) of a run id that has events: RunExists.

    `head_tenant`: the tenant of the run's events, None when it has none. Stores call this
    first in the append's transaction, before the lease check: a creator holds no lease, and
    a run someone is writing right now must still read as "exists", not "busy"."""
    if expected_seq == 1 and head_tenant is not None:
        raise RunExists(run_id, head_tenant)


class LeaseLost(Unavailable, StoreError):
    """The append's lease expired and was taken over, was released, or another writer holds one.
    An Unavailable too: the run moved to another instance, and the client's retry (the same
    batch id) is answered there."""


class KeyTaken(StoreError):
    """`append(keys=...)`: one of the names is already held by an event (of this run or another)."""

    def __init__(self, name: str, holder: tuple[str, int] | None) -> None:
        where = f"run {holder[0]} event {holder[1]}" if holder else "another event"
        super().__init__(f"key {name!r} is already held by {where}")
        self.name = name
        self.holder = holder


class RevisionConflict(StoreError):
    """A record's latest revision is not the one the caller expected (another writer won)."""


@dataclass(frozen=True)
class Record:
    """One revision of a keyed record. Records are append-only like events: a revision is never
    changed or deleted; a new revision supersedes it and both stay readable."""

    tenant: str
    kind: str
    """What the record is, e.g. `evidence:verifier`, `assessment`, `routing`."""
    key: str
    revision: int
    """1, 2, 3, ... per (tenant, kind, key)."""
    body: Mapping[str, Any]
    written_by: str
    at: float
    """When it was written, epoch seconds (the store's clock)."""


class SchemaVersionError(StoreError):
    """The database was written by a newer ringfence (or is not a ringfence store): not touched."""


class StoreUnavailable(Unavailable, StoreError):
    """The database cannot be reached. Unavailable first: the edge maps it to UNAVAILABLE."""


class StoreFull(ResourceExhausted, StoreError):
    """The database's disk is full (SQLite's SQLITE_FULL, PostgreSQL's SQLSTATE 53100): nothing
    was written. ResourceExhausted first: the edge maps it to RESOURCE_EXHAUSTED, which a client
    may retry later (once space is freed), never at once like UNAVAILABLE."""


class WriteOutage:
    """Whether a store's writes fail for want of space: set by a write that failed that way,
    cleared by the next one that succeeds. The store's `ping` reads it, so the server's health
    says NOT_SERVING while nothing can be written, though every read still answers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None

    @property
    def reason(self) -> str | None:
        """Why the last write failed, while no write has succeeded since; None otherwise."""
        with self._lock:
            return self._reason

    def failed(self, reason: str) -> None:
        with self._lock:
            self._reason = reason

    def succeeded(self) -> None:
        with self._lock:
            self._reason = None


@dataclass(frozen=True)
class Lease:
    """The right to be the only writer of one run until `expires_at` (by the database's clock)."""

    run_id: str
    """The run (store key) this lease covers."""
    owner: str
    """Who holds it: e.g. one control-plane instance's id."""
    token: int
    """Fencing token: every acquisition in a database gets a larger one than any before it
    (renewals keep it), so a newer holder always outranks an older one."""
    ttl_s: float
    """How long an acquisition or a renewal lasts."""
    expires_at: float
    """Epoch seconds, by the database's clock, when it lapses unless renewed. Informational:
    the client's clock may differ; the store alone decides expiry."""

    def __post_init__(self) -> None:
        check_lease_args(self.owner, self.ttl_s)


def check_lease_args(owner: str, ttl_s: float) -> None:
    if not isinstance(owner, str) or not owner:
        raise ValueError("a lease owner is a non-empty string")
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not math.isfinite(ttl_s) or ttl_s <= 0:
        raise ValueError(f"a lease ttl is a positive number of seconds, not {ttl_s!r}")


@dataclass(frozen=True)
class WorkerLease:
    """One attachment of a sandbox worker to a control plane: the worker's current epoch while
    it is the latest acquisition and `expires_at` is still ahead (by the database's clock)."""

    worker_id: str
    epoch: int
    """1 for a worker's first attachment, one more for each later one, on any control plane:
    an epoch is never given twice for one worker (the database refuses to lower it), so a
    result carrying an older one is told apart from a current one."""
    holder: str
    """The control plane that holds the worker's stream (like a run lease's `owner`)."""
    expires_at: float
    """Epoch seconds, by the database's clock, when it lapses unless renewed. Informational:
    compare it with the store's `store_now()`, never with this host's clock."""

    def __post_init__(self) -> None:
        check_worker_lease_args(self.worker_id, self.holder)
        check_epoch(self.epoch)
        at = self.expires_at
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
            raise ValueError(f"expires_at is a finite number of seconds, not {at!r}")


def check_worker_lease_args(worker_id: str, holder: str, ttl_s: float | None = None) -> None:
    """ValueError unless the worker id and the holder are non-empty strings (and `ttl_s`, when
    given, a positive number of seconds)."""
    check_worker_id(worker_id)
    if not isinstance(holder, str) or not holder:
        raise ValueError(f"a worker lease holder is a non-empty string, not {holder!r}")
    if ttl_s is not None:
        check_lease_args(holder, ttl_s)


def check_worker_id(worker_id: str) -> None:
    if not isinstance(worker_id, str) or not worker_id:
        raise ValueError(f"a worker id is a non-empty string, not {worker_id!r}")


def check_epoch(epoch: int) -> None:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise ValueError(f"a worker lease epoch is an integer from 1, not {epoch!r}")


LATE_REASONS = frozenset({"fenced", "run_ended", "unknown_envelope", "lease_lapsed"})
"""Why a result was not applied. fenced: its epoch is not the worker's current one (the worker
attached again, or its dispatch was taken back); run_ended: the run finished first;
unknown_envelope: no dispatch of that envelope is known; lease_lapsed: its epoch expired before
the result came (its calls were already treated as lost)."""

_SHA256_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class LateResult:
    """A result a worker sent that was not applied, kept as evidence (append-only): what came,
    from whom, under which epoch, and why it was refused. The result itself is not kept, only
    its digest: it may hold a tenant's data that no run will ever own."""

    worker_id: str
    epoch: int
    envelope_id: str
    tenant: str
    run_id: str
    call_id: str
    """tenant, run_id, call_id: as the worker reported them, unchecked (a late result is the
    evidence of what a worker sent, which may be wrong or missing: empty is kept as empty)."""
    attempt: int
    """Which try of the call the result answers, from 1; 0 when unknown (an unknown envelope)."""
    reason: str
    """One of LATE_REASONS."""
    result_sha256: str
    """sha256 of the result's bytes, 64 lowercase hex digits."""
    recorded_at: float | None = None
    """Epoch seconds by the store's clock (that of events' and records' `at`). None in a value
    about to be recorded: the store stamps it; what `late_results` returns always has it."""

    def __post_init__(self) -> None:
        for name in ("worker_id", "envelope_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"a late result's {name} is a non-empty string, not {value!r}")
        check_epoch(self.epoch)
        if self.reason not in LATE_REASONS:
            raise ValueError(f"a late result's reason is one of {sorted(LATE_REASONS)}, not {self.reason!r}")
        for name in ("tenant", "run_id", "call_id"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ValueError(f"a late result's {name} is a string, not {value!r}")
        if isinstance(self.attempt, bool) or not isinstance(self.attempt, int) or self.attempt < 0:
            raise ValueError(f"a late result's attempt is a non-negative integer, not {self.attempt!r}")
        digest = self.result_sha256
        if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _SHA256_HEX:
            raise ValueError(f"result_sha256 is 64 lowercase hex digits, not {digest!r}")
        at = self.recorded_at
        if at is not None and (isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at)):
            raise ValueError(f"recorded_at is a finite number of seconds or None, not {at!r}")


def check_late_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"a limit is a positive integer, not {limit!r}")


def next_event(run_id: str, head: tuple[int, str] | None, data: Mapping[str, Any], expected_seq: int | None,
               tenant: str | None) -> tuple[int, str]:
    """The seq and tenant of a run's next event, by the rules every store shares.

    `head`: (last seq, tenant) of the run, or None for a new run.
    """
    if head is None:
        seq = 1
        tenant = tenant or (data.get("tenant") if isinstance(data, Mapping) else None)
        if not tenant:
            raise StoreError(f"the first event of run {run_id} must name its tenant")
    else:
        seq = head[0] + 1
        if tenant and tenant != head[1]:
            raise StoreError(f"run {run_id} belongs to another tenant")
        tenant = head[1]
    if expected_seq is not None and expected_seq != seq:
        raise SeqConflict(f"run {run_id}: expected seq {expected_seq}, next is {seq}")
    return seq, tenant


def check_lease(run_id: str, lease: Lease | None, current: tuple[str, int, bool] | None) -> None:
    """Refuse an append unless `lease` is the run's current lease (or, without one, nobody holds one).

    `current`: (owner, token, unexpired) of the run's lease row, or None.
    """
    if lease is None:
        if current is not None and current[2]:
            raise LeaseLost(f"run {run_id} is leased to {current[0]!r}: append with that lease")
        return
    if lease.run_id != run_id:
        raise LeaseLost(f"the lease is for run {lease.run_id}, not {run_id}")
    if current is None or (current[0], current[1]) != (lease.owner, lease.token):
        raise LeaseLost(f"run {run_id}: lease {lease.token} of {lease.owner!r} was released or taken over")
    if not current[2]:
        raise LeaseLost(f"run {run_id}: lease {lease.token} of {lease.owner!r} has expired")


def next_revision(tenant: str, kind: str, key: str, latest: int, expected: int | None) -> int:
    """The revision an append_record writes after `latest` (0: none), or RevisionConflict."""
    if expected is not None and expected != latest:
        raise RevisionConflict(f"{kind} {key!r} of tenant {tenant!r} is at revision {latest}, not {expected}")
    return latest + 1


@dataclass(frozen=True)
class RunRow:
    """One run of a `run_page`: its store key and its place in the newest-first order, which a
    later page is asked to continue after (`before`)."""

    key: str
    at: float
    """Its first event's `at`."""
    id: int
    """Its first event's row (SQLite's rowid, PostgreSQL's id): orders runs started at one `at`."""


@dataclass(frozen=True)
class NewEvent:
    """One event of an append_all, before the store gave it a seq and a hash."""

    type: str
    data: Mapping[str, Any]
    keys: Sequence[str] = ()
    """Names the event claims (see append's `keys`)."""


@runtime_checkable
class EventStore(Protocol):
    def append(self, run_id: str, type: str, data: Mapping[str, Any], expected_seq: int | None = None,
               tenant: str | None = None, lease: Lease | None = None, keys: Sequence[str] = ()) -> Event: ...

    def append_all(self, run_id: str, events: Sequence[NewEvent], expected_seq: int | None = None,
                   tenant: str | None = None, lease: Lease | None = None) -> list[Event]: ...

    def lookup_key(self, name: str) -> tuple[str, int] | None: ...

    def read(self, run_id: str, from_seq: int = 0, limit: int | None = None) -> list[Event]: ...

    def runs(self, tenant: str) -> list[str]: ...

    def run_page(self, tenant: str, *, finished: bool | None = None, outcome: str | None = None,
                 before: RunRow | None = None, limit: int = 50) -> list[RunRow]: ...

    def all_runs(self) -> list[tuple[str, str]]: ...

    def tenant_of(self, run_id: str) -> str | None: ...

    def unfinished(self, tenant: str | None = None) -> list[tuple[str, str]]: ...

    def version(self) -> int: ...

    def wait(self, version: int, timeout: float) -> int: ...

    def wait_for(self, run_id: str, after_seq: int, timeout: float) -> bool: ...

    def acquire_lease(self, run_id: str, owner: str, ttl_s: float) -> Lease | None: ...

    def renew_lease(self, lease: Lease) -> Lease | None: ...

    def lease_holder(self, run_id: str) -> str | None: ...

    def break_lease(self, run_id: str, owner: str) -> bool: ...

    def release_lease(self, lease: Lease) -> None: ...

    def prune(self, older_than_s: float) -> list[str]: ...

    def store_now(self) -> float:
        """The clock every lease's expiry is judged by (the database's), as epoch seconds: what
        a caller compares a lease's `expires_at` with."""
        ...

    def acquire_worker_lease(self, worker_id: str, holder: str, ttl_s: float) -> WorkerLease:
        """Make `holder`'s attachment the worker's current one for `ttl_s` seconds. Always
        succeeds, with the worker's previous epoch + 1 (1 for a new worker), which fences every
        earlier epoch at once; of concurrent acquisitions each gets its own epoch, and the last
        to commit (the highest) is current. ValueError for an empty id or holder, a ttl <= 0."""
        ...

    def renew_worker_lease(self, lease: WorkerLease, ttl_s: float) -> WorkerLease | None:
        """Move the lease's expiry to `ttl_s` seconds from now, if its epoch is still the
        worker's current one and has not expired (by the database's clock); None otherwise: a
        fenced or lapsed epoch is never revived."""
        ...

    def worker_lease_current(self, worker_id: str, epoch: int) -> bool:
        """Whether `epoch` is the worker's current epoch and unexpired, by the database's clock
        now (a result under any other epoch is late)."""
        ...

    def end_worker_lease(self, lease: WorkerLease) -> None:
        """The worker's stream ended: its epoch expires now, if it is still the current one (an
        older epoch's end never touches a newer one). The epoch is not given again."""
        ...

    def worker_leases(self) -> list[WorkerLease]:
        """Every worker's current (latest) lease, expired ones included, by worker id."""
        ...

    def record_late_result(self, late: LateResult) -> bool:
        """Durably record a result that was not applied (committed before it returns), stamped
        with the store's clock unless `late.recorded_at` is given. True when recorded; False
        when (worker_id, envelope_id) was recorded before: the first stays as it was."""
        ...

    def late_results(self, limit: int = 100) -> list[LateResult]:
        """The most recent late results, newest first (by recorded_at, then by the order they
        were recorded), at most `limit` (a positive integer)."""
        ...

    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[], None]: ...

    def append_record(self, tenant: str, kind: str, key: str, body: Mapping[str, Any], written_by: str,
                      expected_revision: int | None = None) -> Record:
        """Write the next revision of (tenant, kind, key). With `expected_revision` (0: none yet)
        raise RevisionConflict unless that is still the latest."""
        ...

    def read_records(self, tenant: str, kind: str, key: str) -> list[Record]:
        """Every revision of (tenant, kind, key), oldest first; [] when there is none."""
        ...

    def ping(self) -> None:
        """Raise StoreUnavailable unless the store answers now, StoreFull while its writes fail
        for want of space (the server's health checks)."""
        ...

    def close(self) -> None: ...
