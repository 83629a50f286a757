"""Recovery: bring every unfinished run to a consistent point after a restart, from its log.

- a completion without its observation: the observation is written now;
- a call admitted (verdict `allow` in the log) whose dispatch never started: it provably never
  reached a container (dispatch_started is durable before the container exists), so it runs now,
  once, whether it reads or mutates;
- a mutating call whose dispatch started but whose completion was never recorded: the effect
  may or may not have happened; it is NOT re-run, and the run ends `uncertain`;
- a read in the same state: recorded as interrupted (reads have no effect);
- an approved call not yet dispatched: dispatched now (the approval is in the log).
"""

from __future__ import annotations

from typing import Callable

from opentelemetry import context as otel_context

from control.model import Observation, ObservationStatus, RunOutcome
from control.orchestration.approvals import ApprovalDesk
from control.orchestration.batches import BatchRunner
from control.orchestration.dispatch import Admitted, completion_observation
from control.orchestration.runs import RunRepository
from control.model import ApprovalStatus
from control.registry import Registry
from control.state import RunState


def recover_run(state: RunState, *, repo: RunRepository, desk: ApprovalDesk, batches: BatchRunner,
                registry: Registry, run_context: Callable[[RunState], otel_context.Context]) -> None:
    for call_id, data in list(state.unobserved.items()):
        repo.observe(state, completion_observation(call_id, data["tool"], data, (), None))
    uncertain = []
    for call_id, data in list(state.inflight.items()):
        if data.get("mutates"):
            uncertain.append(call_id)
            repo.observe(state, Observation(
                call_id, data["tool"], ObservationStatus.EXECUTED, True,
                error="the control plane stopped while this call ran; whether it took effect is unknown, "
                      "and it is not re-run", error_class="uncertain",
                attempts=state.attempts.get(call_id, 0)))
        else:
            repo.observe(state, Observation(
                call_id, data["tool"], ObservationStatus.EXECUTED, True,
                error="interrupted by a control-plane restart", error_class="interrupted",
                attempts=state.attempts.get(call_id, 0)))
    if uncertain:
        repo.finish(state, RunOutcome.UNCERTAIN, "mutating call(s) without a recorded completion: "
                    + ", ".join(uncertain))
        return
    desk.sweep_expired(state)
    if state.admitted:
        stop = batches.deadline_passed(state)
        if stop is not None:
            repo.finish(state, *stop)
            return
        never_started = []
        for call_id, data in list(state.admitted.items()):
            manifest = registry.get(data["tool"])
            if manifest is None:
                repo.observe(state, Observation(
                    call_id, data["tool"], ObservationStatus.HALTED, False,
                    error="the tool is no longer registered; the call was admitted before a restart and never ran",
                    error_class="unknown_tool", verdict_path=tuple(data.get("verdict_path") or ()) + ("recovery:unknown",)))
                continue
            never_started.append(Admitted(call_id, manifest, dict(data["arguments"]),
                                          tuple(data.get("verdict_path") or ()) + ("recovery:resumed",)))
        if never_started:
            batches.execute(state, never_started, run_context(state))
    if state.finished:
        return
    for pending in list(state.pending.values()):
        approval = state.approvals.get(pending.approval_id)
        if approval is not None and approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.USED):
            desk.resume(state, pending)
