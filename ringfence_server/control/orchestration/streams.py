"""Streams of a run's events and of a tenant's approvals, read from the store as they are
appended (the store wakes its waiters; nothing here polls faster than its timeout)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from ringfence.model import Approval, ApprovalStatus, Event
from ringfence_server.control.orchestration.runs import RunRepository
from ringfence_server.control.state import EventType, RunState


def watch_run(repo: RunRepository, state: RunState, from_seq: int, stop: threading.Event,
              closed: Callable[[], bool]) -> Iterator[Event]:
    """The run's events from `from_seq` on, live, until the run finishes or `stop` is set."""
    store = repo.store
    while not stop.is_set():
        finished = state.finished
        for event in store.read(state.key, from_seq):
            from_seq = event.seq + 1
            yield repo.public(state, event)
            if event.type == EventType.RUN_FINISHED:
                return
        # A finished run (read before the events, so nothing is missed) ends the watch even
        # when the caller asked to start past its last event.
        if finished or closed():
            return
        # Woken by the store when THIS run gets an event (on PostgreSQL: NOTIFY from whichever
        # instance appended it), not by every append of every tenant.
        store.wait_for(state.key, from_seq - 1, 0.5)


def stream_batch(repo: RunRepository, state: RunState, submit: Callable[[], object]) -> Iterator[Event]:
    """Run `submit` (one batch of the run) on a thread of its own and yield each event the run
    gets while it runs, as it is appended; once it is done, its exception (if any) is raised
    here, in the consumer's thread."""
    from_seq = state.last_seq + 1
    done = threading.Event()
    failure: list[BaseException] = []

    def work() -> None:
        try:
            submit()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            failure.append(e)
        finally:
            done.set()

    worker = threading.Thread(target=work, name=f"rf-plan-{state.run_id}", daemon=True)
    worker.start()
    yield from follow_batch(repo, state, from_seq, done)
    worker.join()
    if failure:
        raise failure[0]


def follow_batch(repo: RunRepository, state: RunState, from_seq: int, done: threading.Event) -> Iterator[Event]:
    """The run's events from `from_seq` on while a batch runs in another thread, then the rest."""
    store = repo.store
    while True:
        finished = done.is_set()
        for event in store.read(state.key, from_seq):
            from_seq = event.seq + 1
            yield repo.public(state, event)
        if finished:
            return
        store.wait_for(state.key, from_seq - 1, 0.1)


def watch_approvals(list_approvals: Callable[[], list[Approval]], store_version: Callable[[], int],
                    store_wait: Callable[[int, float], int], stop: threading.Event,
                    closed: Callable[[], bool]) -> Iterator[Approval]:
    """At start the pending approvals; then every new one as it is requested."""
    seen: set[str] = set()
    first = True
    while not stop.is_set():
        version = store_version()
        for approval in list_approvals():
            if approval.approval_id in seen:
                continue
            seen.add(approval.approval_id)
            if first and approval.status is not ApprovalStatus.PENDING:
                continue  # at start only the pending ones matter; later every new one
            yield approval
        first = False
        if closed():
            return
        store_wait(version, 0.25)
