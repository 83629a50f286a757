"""The run repository: the one writer of run logs, and where live runs are kept.

A run's state changes only through `append` (a durable store append, then ringfence_server.control.state.apply
on the cached state), so the live state is the fold of the log. Unfinished runs stay in memory
while this process serves them; a finished run leaves memory and is read from the store when
someone asks for it, so memory and start-up time do not grow with history.

Several control planes may share one store (PostgreSQL) and serve any run. Whoever writes a
run holds the store's single-writer lease on it (`writing`): a second instance waits for it (or
is refused with Unavailable after `lease_wait_s`), never interleaves sequence numbers, and an
instance that died hands its runs over when its lease expires. Before every use a cached run
catches up with the store, so what another instance appended is seen here.

Locks: `writing(state)` (a per-run re-entrant lock, then the lease) serializes batches and
decisions of one run; `append` is atomic per run (parallel reads append from several threads).
A cached run's state has a lock of its own, held only while events are applied to it or it is
read, never while the store is asked anything: a reader of a run (GetRun, catching up) waits
for its own store read and for nobody else's, so while the store is unreachable each caller
is answered after one store timeout, not after the timeouts of every caller before it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress

from ringfence.errors import FailedPrecondition, NotFound, Unavailable
from ringfence.model import (
    Approval,
    ApprovalKind,
    ApprovalStatus,
    Event,
    Observation,
    ObservationStatus,
    RunOutcome,
    RunView,
)
from ringfence_server.control.events import (
    ApprovalDecided,
    ApprovalRequested,
    CallObserved,
    EventPayload,
    EventType,
    RunFinished,
    RunStarted,
    check_event,
    event_data,
)
from ringfence_server.control.orchestration.crashpoints import crash_point
from ringfence_server.control.state import RunState, apply, fold
from ringfence_server.control.store.base import EventStore, Lease, NewEvent, RunExists
from ringfence_server.sandbox.labels import instance_id

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")


def _dead_here(owner: str) -> bool:
    """Whether a lease owner (an instance id, host:pid:nonce) is a process of this host that is
    gone. Another host's instance is never judged: its lease must expire."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class BusyElsewhere(FailedPrecondition):
    """writing(wait=False): the run is being written (here or by another instance) right now."""


class RunRepository:
    def __init__(self, store: EventStore, *, owner: str = "", lease_ttl_s: float = 15.0,
                 lease_wait_s: float | None = None) -> None:
        self.store = store
        self.owner = owner or instance_id()
        self.lease_ttl_s = lease_ttl_s
        # Long enough for a dead owner's lease to expire; past it the caller is told to retry.
        self.lease_wait_s = lease_ttl_s + 5.0 if lease_wait_s is None else lease_wait_s
        self._leases: dict[str, Lease] = {}  # store key -> the lease this process holds
        self._depth: dict[str, int] = {}  # store key -> nesting of writing() in this process
        self._renewer: threading.Thread | None = None
        self._closed = threading.Event()
        self._live: dict[tuple[str, str], RunState] = {}  # (tenant, run id) -> unfinished run
        self._approval_runs: dict[str, tuple[str, str]] = {}  # approval id -> (tenant, run id)
        self._lock = threading.Lock()  # guards the dicts above and the lock tables below
        self._run_locks: dict[str, threading.RLock] = {}
        self._append_locks: dict[str, threading.Lock] = {}  # held across a store append
        self._state_locks: dict[str, threading.Lock] = {}  # held across no store call
        # Called with (state, event) after every append is applied (metrics, tests).
        self.on_event: Callable[[RunState, Event], None] | None = None
        # Called by finish() with (state, final outcome) just before run_finished is appended:
        # whatever must end with the run (its workspace, ringfence_server.control.orchestration.workspaces).
        self.before_finish: Callable[[RunState, RunOutcome], None] | None = None

    # -- loading -----------------------------------------------------------------------

    def load_unfinished(self) -> list[RunState]:
        """Fold every unfinished run into memory (start-up); the finished history is not read."""
        loaded = []
        for _tenant, key in self.store.unfinished():
            state = fold(self.store.read(key))
            if not state.finished:
                self._remember(state)
                loaded.append(state)
        return loaded

    def unfinished(self, tenant: str) -> list[RunState]:
        """A tenant's unfinished runs, whichever instance started them (caught up)."""
        out = []
        for _tenant, key in self.store.unfinished(tenant):
            state = self.by_key(tenant, key)
            if state is not None and not state.finished:
                out.append(state)
        return out

    def catch_up(self, state: RunState) -> RunState:
        """Apply what the store holds past this cached state (another instance's appends). The
        store is read with no lock held (see the module's docstring)."""
        events = self.store.read(state.key, state.last_seq + 1)
        with self._state_lock(state.key):
            for event in events:
                if event.seq <= state.last_seq:
                    continue  # applied while we read: by the append that wrote it, or another reader
                apply(state, event)
                if event.type == EventType.RUN_FINISHED:
                    self._forget(state)
        return state

    def _remember(self, state: RunState) -> None:
        with self._lock:
            self._live[(state.tenant, state.run_id)] = state
            for approval_id in state.approvals:
                self._approval_runs[approval_id] = (state.tenant, state.run_id)

    def _key_of(self, tenant: str, run_id: str) -> str | None:
        """The store key of a tenant's run: its id, or tenant/id when another tenant had the id."""
        for key in (run_id, f"{tenant}/{run_id}"):
            if self.store.tenant_of(key) == tenant:
                return key
        return None

    def get(self, tenant: str, run_id: str) -> RunState:
        """A tenant's run, live or folded from the store; another tenant's is NotFound."""
        with self._lock:
            state = self._live.get((tenant, run_id))
        if state is not None:
            return self.catch_up(state)
        key = self._key_of(tenant, run_id) if isinstance(run_id, str) and RUN_ID.fullmatch(run_id) else None
        if key is None:
            raise NotFound(f"run {run_id!r} not found")
        state = fold(self.store.read(key))
        if not state.finished:
            # Unfinished but not in memory: another instance's, or appended before this process
            # started; serve it from here from now on.
            with self._lock:
                state = self._live.setdefault((tenant, run_id), state)
        return state

    def by_key(self, tenant: str, key: str) -> RunState | None:
        """A run by its store key, if it is the tenant's (live from memory, else from the store)."""
        if self.store.tenant_of(key) != tenant:
            return None
        with self._lock:
            live = next((s for s in self._live.values() if s.key == key), None)
        if live is not None:
            return self.catch_up(live)
        state = fold(self.store.read(key))
        return self.get(tenant, state.run_id) if not state.finished else state

    def live(self, tenant: str | None = None) -> list[RunState]:
        with self._lock:
            return [s for s in self._live.values() if tenant is None or s.tenant == tenant]

    def views(self, tenant: str) -> list[RunView]:
        """Every run of a tenant, oldest first: live ones from memory, the rest from the store."""
        live = {s.key: s for s in self.live(tenant)}
        return [self.view(live.get(key) or fold(self.store.read(key))) for key in self.store.runs(tenant)]

    def approval_run(self, tenant: str, approval_id: str) -> RunState | None:
        with self._lock:
            where = self._approval_runs.get(approval_id)
        if where is None or where[0] != tenant:
            return None
        return self.get(*where)

    # -- locks -------------------------------------------------------------------------

    def run_lock(self, key: str) -> threading.RLock:
        with self._lock:
            return self._run_locks.setdefault(key, threading.RLock())

    @contextmanager
    def writing(self, state: RunState, *, wait: bool = True) -> Iterator[RunState]:
        """Hold the run for writing: its local lock, then its store lease (waiting for another
        instance's to expire, up to `lease_wait_s`; Unavailable after that, or at once with
        wait=False: BusyElsewhere), then catch up with the store. Re-entrant."""
        lock = self.run_lock(state.key)
        if not lock.acquire(timeout=-1 if wait else 0):
            raise BusyElsewhere(f"run {state.run_id} is busy")
        try:
            if self._depth.get(state.key, 0) == 0:
                self._leases[state.key] = self._acquire(state, wait)
            self._depth[state.key] = self._depth.get(state.key, 0) + 1
            try:
                yield self.catch_up(state)
            finally:
                self._depth[state.key] -= 1
                if self._depth[state.key] == 0:
                    del self._depth[state.key]
                    lease = self._leases.pop(state.key, None)
                    if lease is not None:
                        with suppress(Exception):  # it expires by itself; nothing else to do
                            self.store.release_lease(lease)
        finally:
            lock.release()

    def outermost(self, state: RunState) -> bool:
        """Inside writing(): this is the outermost writer of the run (not a nested one)."""
        return self._depth.get(state.key, 0) == 1

    def _acquire(self, state: RunState, wait: bool) -> Lease:
        deadline = time.monotonic() + (self.lease_wait_s if wait else 0)
        while True:
            lease = self.store.acquire_lease(state.key, self.owner, self.lease_ttl_s)
            if lease is not None:
                self._start_renewer()
                return lease
            holder = self.store.lease_holder(state.key)
            if holder is not None and _dead_here(holder):
                # Our own predecessor on this host (killed): no need to wait out its lease.
                self.store.break_lease(state.key, holder)
                continue
            if time.monotonic() >= deadline or self._closed.is_set():
                if not wait:
                    raise BusyElsewhere(f"run {state.run_id} is being written by another control-plane instance")
                raise Unavailable(f"run {state.run_id} is being written by another control-plane instance; "
                                  "retry (the same batch id is safe to send again)")
            time.sleep(0.05)

    def _start_renewer(self) -> None:
        with self._lock:
            if self._renewer is None:
                self._renewer = threading.Thread(target=self._renew_loop, name="rf-lease-renewer", daemon=True)
                self._renewer.start()

    def _renew_loop(self) -> None:
        """Keep the leases of long batches: renewed every third of their time to live."""
        while not self._closed.wait(self.lease_ttl_s / 3):
            for key, lease in list(self._leases.items()):
                try:
                    renewed = self.store.renew_lease(lease)
                except Exception:  # noqa: BLE001 - the store may be down now; the next round retries
                    continue
                if renewed is not None and self._leases.get(key) is lease:
                    self._leases[key] = renewed

    def close(self) -> None:
        self._closed.set()

    def _append_lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._append_locks.setdefault(key, threading.Lock())

    def _state_lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._state_locks.setdefault(key, threading.Lock())

    def view(self, state: RunState) -> RunView:
        # Under the state lock: parallel dispatch threads may be applying events right now.
        with self._state_lock(state.key):
            return state.view()

    def approvals_of(self, state: RunState) -> list[Approval]:
        with self._state_lock(state.key):
            return list(state.approvals.values())

    def approval_of(self, state: RunState, approval_id: str) -> Approval:
        with self._state_lock(state.key):
            return state.approvals[approval_id]

    # -- writing -----------------------------------------------------------------------

    def start(self, tenant: str, run_id: str, started: RunStarted) -> RunState | None:
        """Create a tenant's run: append its `run_started` (`started`) as the first event of a store
        key. Returns the new run, or None when this tenant's run with that id exists already
        (another thread or instance started it a moment before: the caller answers with it).

        The key is decided by the store, atomically: an append with expected_seq=1 is refused
        (RunExists, naming the holder's tenant) once the key has any event, whichever instance
        or tenant wrote it, so of several starts exactly one writes `run_started` and nobody
        ever folds another's event into a run of their own. No lease is taken for it: the
        insert-if-absent is the single-writer rule of a run that has no events yet.

        The key is the run id, or `tenant/run_id` when another tenant holds the id: each
        tenant gets a run of its own, and starting an id another tenant uses looks exactly like
        starting a fresh one (a refusal would tell a tenant that somebody else uses the id).
        "/" is not allowed in run ids, so the namespaced form never collides with a caller's
        id, nor one tenant's namespaced key with another's."""
        for key in (run_id, f"{tenant}/{run_id}"):
            state = RunState(run_id=run_id, tenant=tenant, key=key)
            try:
                self.append(state, started)
            except RunExists as e:
                if e.tenant == tenant:
                    return None
                continue  # another tenant's run: this tenant's goes under its own namespace
            self._remember(state)
            return state
        # Only this tenant ever creates `tenant/run_id`; reaching here is a bug, not a race.
        raise RuntimeError(f"run key {tenant}/{run_id} is held by another tenant")

    def append(self, state: RunState, payload: EventPayload, keys: Sequence[str] = ()) -> Event:
        """Durably append one event and apply it. An event the fold would reject is refused
        (ValueError) before it reaches the store: nothing durable can make a run unreadable.
        The JSON the store will keep is parsed back first, so a value the type admits but the
        fold does not (an empty volume name, a stream that is not one) is caught too."""
        return self.append_all(state, [(payload, keys)])[0]

    def append_all(self, state: RunState, items: Sequence[tuple[EventPayload, Sequence[str]]]) -> list[Event]:
        """Durably append several events of the run in one write (group commit: all of them or
        none, one fsync), then apply them in order; each checked as `append` checks one. For
        events that are settled together, such as a batch and its verdicts: an acknowledged
        event is as durable as before, and there are fewer writes to wait for."""
        new: list[NewEvent] = []
        for payload, keys in items:
            data = event_data(payload)
            check_event(payload.TYPE, data)
            new.append(NewEvent(payload.TYPE.value, data, tuple(keys)))
        with self._append_lock(state.key):
            events = self.store.append_all(state.key, new, expected_seq=state.last_seq + 1,
                                           tenant=state.tenant, lease=self._leases.get(state.key))
            for (payload, _keys), event in zip(items, events, strict=True):
                with self._state_lock(state.key):
                    if event.seq > state.last_seq:  # else a reader's catch_up applied it already
                        apply(state, event)
                match payload:
                    case ApprovalRequested(approval_id=approval_id):
                        with self._lock:
                            self._approval_runs[approval_id] = (state.tenant, state.run_id)
                    case RunFinished():
                        self._forget(state)
                        crash_point("during_run_finished")
                    case RunStarted():
                        crash_point("after_run_started")
                if self.on_event is not None:
                    self.on_event(state, event)
        return events

    def _forget(self, state: RunState) -> None:
        """A finished run leaves memory: later reads fold it from the store. Its approvals stay
        indexed (a few bytes each) so that deciding one says "the run is finished", not "not
        found"; after a restart only unfinished runs' approvals are indexed."""
        with self._lock:
            if self._live.get((state.tenant, state.run_id)) is state:
                del self._live[(state.tenant, state.run_id)]

    def observe(self, state: RunState, obs: Observation) -> Observation:
        self.append(state, CallObserved.of(obs))
        return state.trajectory[obs.call_id]

    def finish(self, state: RunState, outcome: RunOutcome, reason: str) -> None:
        if state.finished:
            return
        # Pending approvals die with the run: their calls are declined, durably.
        for call_id, pending in list(state.pending.items()):
            approval = state.approvals.get(pending.approval_id)
            if approval is not None and approval.status is ApprovalStatus.PENDING:
                self.append(state, ApprovalDecided(approval_id=pending.approval_id, approved=False, by="system",
                                                   reason=f"run ended: {outcome}"))
            if pending.kind is ApprovalKind.RECONCILE:
                # It may have run (it was interrupted mid-effect): never "declined, never ran".
                self.observe(state, Observation(call_id, pending.tool, ObservationStatus.EXECUTED, True,
                                                error=f"run ended ({outcome}) before anyone reconciled it",
                                                error_class="uncertain",
                                                verdict_path=(*pending.verdict_path, "run:ended"),
                                                approval_id=pending.approval_id))
                continue
            self.observe(state, Observation(call_id, pending.tool, ObservationStatus.DECLINED, False,
                                            error=f"run ended ({outcome}) before this call ran",
                                            verdict_path=(*pending.verdict_path, "run:ended"),
                                            approval_id=pending.approval_id))
        unsure = [o.call_id for o in state.trajectory.values() if o.error_class == "uncertain"]
        if outcome is RunOutcome.COMPLETED and unsure:
            # A run with a call whose effect nobody could confirm did not simply complete.
            outcome = RunOutcome.UNCERTAIN
            reason = f"{reason}; whether these took effect is unknown: {', '.join(unsure)}"
        if self.before_finish is not None:
            self.before_finish(state, outcome)
        self.append(state, RunFinished(outcome=outcome, reason=reason))

    @staticmethod
    def public(state: RunState, event: Event) -> Event:
        """Events as the caller knows them: under its run id, not the store key."""
        if event.run_id == state.run_id:
            return event
        return dataclasses.replace(event, run_id=state.run_id)
