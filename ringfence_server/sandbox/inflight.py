"""The calls running now, by run: what kill_run and kill_all find, and how far each call got.

A kill comes from another thread (a run's cancel or deadline, the process's SIGTERM) while the
call's own thread creates, starts and reads its container; the call's `Progress` is where the
two meet. Once the backend is stopping, a call that registers is marked killed at once, so
nothing starts after a kill_all; likewise a call of a run that was killed (a call that was
still creating its container, or waiting for the pool, when the kill came), until the run ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Progress:
    """How far one call got: once its start request is issued, the tool may have run; a
    `killed_reason` says we killed it on purpose (cancel, run deadline), not the kernel."""

    start_issued: bool = False
    killed_reason: str | None = None
    on_started: Callable[[], None] | None = None
    """Told once the engine answered the start (the backend's count of cold starts)."""

    def started(self) -> None:
        if self.on_started is not None:
            self.on_started()

    def killed(self) -> bool:
        """Whether a kill came: kill_run and kill_all set `killed_reason` from other threads."""
        return self.killed_reason is not None


class Inflight:
    """run id -> {container id: Progress} of the calls running now; thread-safe."""

    def __init__(self) -> None:
        self._calls: dict[str, dict[str, Progress]] = {}
        self._mutex = threading.Lock()
        self._stopping: str | None = None
        self._killed_runs: dict[str, str] = {}  # run id -> why it was killed, until it ends

    @property
    def stopping(self) -> str | None:
        """Why every call is being killed (kill_all's reason), or None."""
        return self._stopping

    def track(self, run_id: str, container_id: str, progress: Progress) -> None:
        """A call's container, running now: kill_run and kill_all find it here."""
        with self._mutex:
            self._calls.setdefault(run_id, {})[container_id] = progress
            if self._stopping is not None:
                progress.killed_reason = self._stopping
            elif run_id in self._killed_runs:
                progress.killed_reason = self._killed_runs[run_id]

    def untrack(self, run_id: str, container_id: str) -> None:
        with self._mutex:
            calls = self._calls.get(run_id, {})
            calls.pop(container_id, None)
            if not calls:
                self._calls.pop(run_id, None)

    def running(self) -> int:
        """How many calls run now."""
        with self._mutex:
            return sum(len(calls) for calls in self._calls.values())

    def stop(self, reason: str) -> list[tuple[str, Progress]]:
        """From now on every call is killed for `reason`; the calls running now, to kill."""
        with self._mutex:
            self._stopping = reason
            return [(cid, p) for calls in self._calls.values() for cid, p in calls.items()]

    def current(self, reason: str) -> list[tuple[str, Progress]]:
        """The calls running now, each marked killed for `reason` (their containers by the
        caller); unlike `stop`, later calls start as usual."""
        with self._mutex:
            found = [(cid, p) for calls in self._calls.values() for cid, p in calls.items()]
            for _cid, progress in found:
                progress.killed_reason = reason
            return found

    def mark_run(self, run_id: str, reason: str) -> None:
        """The run's calls running now are killed for `reason` (their containers by the caller),
        and so is any of its calls that registers later, until `end_run`."""
        with self._mutex:
            self._killed_runs[run_id] = reason
            while len(self._killed_runs) > _KILLED_RUNS_KEPT:  # runs that never ended here
                self._killed_runs.pop(next(iter(self._killed_runs)))
            for progress in self._calls.get(run_id, {}).values():
                progress.killed_reason = reason

    def end_run(self, run_id: str) -> None:
        """The run ended: forget that it was killed."""
        with self._mutex:
            self._killed_runs.pop(run_id, None)


# Killed runs remembered at most (a run that ended on another instance is never ended here).
_KILLED_RUNS_KEPT = 10_000
