"""Execution: the admitted calls of a batch (or one approved call) handed to dispatch, and the
run ended when dispatch cannot finish them.

    deadline_passed(state)         the run's deadline, checked before anything is dispatched
    execute(state, admitted, ctx)  dispatch (ringfence_server.control.orchestration.dispatch); then, if the
                                   deadline watchdog stopped the run meanwhile, it ends here;
                                   an unexpected failure halts what was not observed and ends
                                   the run `error`

It stands apart from the batch runner because three callers share it: a new batch
(batches.py), an approved call resumed by the approval desk (approvals.py), and recovery.
The desk and the batch runner each need the other's work otherwise; with this piece on its
own, both are built on it and neither on the other.
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry import context as otel_context

from ringfence.model import Observation, ObservationStatus, RunOutcome
from ringfence_server.control.config import Limits
from ringfence_server.control.orchestration.dispatch import Admitted, Dispatcher
from ringfence_server.control.orchestration.runs import RunRepository
from ringfence_server.control.orchestration.stops import RunStops
from ringfence_server.control.state import RunState


class Execution:
    """Runs admitted calls through the dispatcher, and ends the run when that goes wrong."""

    def __init__(self, *, repo: RunRepository, dispatcher: Dispatcher, stops: RunStops, limits: Limits,
                 clock: Callable[[], float]) -> None:
        self.repo = repo
        self.dispatcher = dispatcher
        self.stops = stops
        self.limits = limits
        self._clock = clock

    def deadline_passed(self, state: RunState) -> tuple[RunOutcome, str] | None:
        """The outcome and reason to end the run with when its deadline has passed, else None."""
        if state.deadline_at is not None and self._clock() >= state.deadline_at:
            return RunOutcome.DEADLINE_EXCEEDED, f"the run deadline passed ({self.limits.run_deadline_s:g}s)"
        return None

    def execute(self, state: RunState, admitted: list[Admitted], ctx: otel_context.Context) -> dict[str, Observation]:
        """Each admitted call's observation, by call id; the run may have ended meanwhile."""
        try:
            results = self.dispatcher.execute(state, admitted, ctx)
        except Exception as e:  # noqa: BLE001 - an unexpected failure ends the run as `error`
            return self.dispatch_failed(state, admitted, e)
        self.finish_if_stopped(state)
        return results

    def finish_if_stopped(self, state: RunState) -> None:
        """The deadline watchdog stopped the run while it dispatched: it ends here, with why.
        (A cancel ends the run itself, once it holds the run's lock.)"""
        stop = self.stops.get(state)
        if stop is not None and stop.outcome is RunOutcome.DEADLINE_EXCEEDED and not state.finished:
            self.repo.finish(state, stop.outcome, stop.reason)

    def dispatch_failed(self, state: RunState, admitted: list[Admitted], error: Exception) -> dict[str, Observation]:
        """An unexpected failure in dispatch: every call of it not yet observed is halted (it
        says whether it had started), and the run ends `error`."""
        reason = f"unexpected {type(error).__name__} in dispatch: {error}"[:1000]
        results: dict[str, Observation] = {}
        for a in admitted:
            if a.call_id not in state.trajectory or (
                    state.trajectory[a.call_id].status is ObservationStatus.PENDING_APPROVAL):
                results[a.call_id] = self.repo.observe(state, Observation(
                    a.call_id, a.manifest.name, ObservationStatus.HALTED, a.call_id in state.inflight,
                    error=reason, error_class="error", verdict_path=(*a.path, "run:error"),
                    approval_id=a.approval_id))
            else:
                results[a.call_id] = state.trajectory[a.call_id]
        self.repo.finish(state, RunOutcome.ERROR, reason)
        return results
