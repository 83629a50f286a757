"""Why a run must stop dispatching now: cancelled by a person, or past its deadline.

A stop is set from outside the run's lock (cancel_run, the deadline watchdog): the dispatcher
checks it before every call, and the run's sandboxes are killed at once through the backend
(by label, so setsid children die too). The run's terminal event is written by whoever holds
the run's lock next.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ringfence.model import RunOutcome
from ringfence_server.control.state import RunState, sandbox_run_id
from ringfence_server.sandbox.backend import SandboxBackend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stop:
    outcome: RunOutcome
    reason: str


class RunStops:
    def __init__(self, backend: SandboxBackend, clock: Callable[[], float]) -> None:
        self._backend = backend
        self._clock = clock
        self._stops: dict[str, Stop] = {}
        self._lock = threading.Lock()

    def get(self, state: RunState) -> Stop | None:
        with self._lock:
            return self._stops.get(state.key)

    def stop(self, state: RunState, outcome: RunOutcome, reason: str) -> None:
        """Record the stop (the first one wins), then kill whatever of the run is running."""
        with self._lock:
            self._stops.setdefault(state.key, Stop(outcome, reason))
        try:
            killed = self._backend.kill_run(sandbox_run_id(state), reason)
        except Exception as e:  # noqa: BLE001 - the stop stands; the calls end at their own deadline
            log.warning("could not kill the sandboxes of run %s (%s): %s", state.run_id, reason, e)
            return
        if killed:
            log.info("killed %d sandbox(es) of run %s: %s", killed, state.run_id, reason)

    @contextmanager
    def deadline_watch(self, state: RunState) -> Iterator[None]:
        """While dispatching: at the run's deadline, stop it (kill its sandboxes at once)."""
        if state.deadline_at is None:
            yield
            return
        remaining = state.deadline_at - self._clock()
        reason = "the run deadline passed"
        if remaining <= 0:
            self.stop(state, RunOutcome.DEADLINE_EXCEEDED, reason)
            yield
            return
        timer = threading.Timer(remaining, self.stop, args=(state, RunOutcome.DEADLINE_EXCEEDED, reason))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
