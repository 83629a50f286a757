"""Recovery: bring every unfinished run to a consistent point after a restart, from its log.

- a completion without its observation: the observation is written now;
- a call admitted (verdict `allow` in the log) whose dispatch never started: it provably never
  reached a container (dispatch_started is durable before the container exists), so it runs now,
  once, whether it reads or mutates;
- a mutating call whose dispatch started but whose completion was never recorded: the effect
  may or may not have happened. Never re-run blindly. If its tool declares a look-up by
  idempotency key (`reconcile` in its manifest), the receiver is asked: found -> recorded as
  completed with the receiver's record; not found -> safe to run once now (the same key goes
  with it, so the receiver would deduplicate anyway). Without a look-up (or when the look-up
  fails) it becomes a reconciliation task for approvers (an approval of kind `reconcile`): a
  person says whether it happened. The rest of the run goes on either way;
- a read in the same state: recorded as interrupted (reads have no effect);
- a call policy said to ASK about whose approval request was never written: requested now;
- an approved call not yet dispatched: dispatched now (the approval is in the log);
- a call whose approval was declined, withdrawn or expired but whose observation was never
  written: written now, the same observation it would have had (it never runs).
"""

from __future__ import annotations

from ringfence.model import ApprovalStatus, Observation, ObservationStatus, ProposedCall
from ringfence_server.control.events import CallCompleted, DispatchStarted
from ringfence_server.control.orchestration import spans
from ringfence_server.control.orchestration.admission import AdmissionVerdict, Decision
from ringfence_server.control.orchestration.approvals import ApprovalDesk
from ringfence_server.control.orchestration.dispatch import Admitted, completion_observation
from ringfence_server.control.orchestration.execution import Execution
from ringfence_server.control.orchestration.runs import RunRepository
from ringfence_server.control.registry import Registry
from ringfence_server.control.state import RunState

# An approval in one of these states has ended its call's wait: a call still pending under it
# was interrupted before its observation (approved: before its dispatch).
_ENDED = (ApprovalStatus.APPROVED, ApprovalStatus.USED, ApprovalStatus.DECLINED, ApprovalStatus.WITHDRAWN,
          ApprovalStatus.EXPIRED)


def needs_recovery(state: RunState) -> bool:
    """The log shows work interrupted mid-way: something recovery must finish or report."""
    ended = any(state.approvals.get(p.approval_id) is not None and state.approvals[p.approval_id].status in _ENDED
                for p in state.pending.values())
    return bool(state.unobserved or state.inflight or state.admitted or state.asked or ended)


def recover_run(state: RunState, *, repo: RunRepository, desk: ApprovalDesk, execution: Execution,
                registry: Registry) -> None:
    """Finish or report, in the order of the module's list, what the run's log shows interrupted."""
    for completion in list(state.unobserved.values()):
        repo.observe(state, completion_observation(completion, (), None))
    for call_id, started in list(state.inflight.items()):
        if started.mutates:
            reconcile(state, started, repo=repo, desk=desk, execution=execution, registry=registry)
        else:
            repo.observe(state, Observation(
                call_id, started.tool, ObservationStatus.EXECUTED, True,
                error="interrupted by a control-plane restart", error_class="interrupted",
                attempts=state.attempts.get(call_id, 0)))
        if state.finished:
            return
    desk.sweep_expired(state)
    if state.admitted:
        stop = execution.deadline_passed(state)
        if stop is not None:
            repo.finish(state, *stop)
            return
        never_started = []
        for call_id, admitted in list(state.admitted.items()):
            manifest = registry.get(admitted.tool)
            if manifest is None:
                repo.observe(state, Observation(
                    call_id, admitted.tool, ObservationStatus.HALTED, False,
                    error="the tool is no longer registered; the call was admitted before a restart and never ran",
                    error_class="unknown_tool", verdict_path=(*admitted.verdict_path, "recovery:unknown")))
                continue
            never_started.append(Admitted(call_id, manifest, dict(admitted.arguments),
                                          (*admitted.verdict_path, "recovery:resumed")))
        if never_started:
            execution.execute(state, never_started, spans.run_context(state))
    if state.finished:
        return
    for call_id, asked in list(state.asked.items()):
        # Policy said ASK before the crash, and the request was never written: write it now.
        manifest = registry.get(asked.tool)
        call = ProposedCall(call_id, asked.tool, asked.arguments, idempotency_key=asked.client_key)
        if manifest is None:
            repo.observe(state, Observation(call_id, asked.tool, ObservationStatus.HALTED, False,
                                            error="the tool is no longer registered", error_class="unknown_tool",
                                            verdict_path=(*asked.verdict_path, "recovery:unknown")))
            continue
        desk.request(state, Decision(call, AdmissionVerdict.ASK, asked.verdict_path, reason=asked.reason,
                                     manifest=manifest, arguments=dict(asked.arguments)),
                     asked.proposed_by or "")
    for pending in list(state.pending.values()):
        approval = state.approvals.get(pending.approval_id)
        if approval is None:
            continue
        if approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.USED):
            desk.resume(state, pending)
        elif (refused := desk.refusal(pending, approval)) is not None:
            repo.observe(state, refused)


def reconcile(state: RunState, started: DispatchStarted, *, repo: RunRepository, desk: ApprovalDesk,
              execution: Execution, registry: Registry) -> None:
    """A mutating call (`started`: its dispatch) interrupted between its dispatch and its
    completion (see the module)."""
    call_id = started.call_id
    manifest = registry.get(started.tool)
    path = started.verdict_path
    key = started.idempotency_key
    if manifest is None or manifest.reconcile is None or not key:
        desk.request_reconciliation(state, started, "its tool declares no look-up by idempotency key")
        return
    lookup = registry.get(manifest.reconcile.tool)
    found = execution.dispatcher.lookup(state, call_id, lookup, {manifest.reconcile.key_argument: key}) \
        if lookup is not None else None
    answer = found.content if found is not None and found.ok and isinstance(found.content, dict) else None
    if answer is not None and answer.get("found") is True:
        completion = CallCompleted(call_id=call_id, tool=manifest.name, mutates=True, idempotency_key=key, ok=True,
                                   content={"reconciled": True, **answer}, attempts=state.attempts.get(call_id, 0),
                                   cost=manifest.cost * max(state.attempts.get(call_id, 0), 1))
        repo.append(state, completion)
        repo.observe(state, completion_observation(completion, (*path, "recovery:reconciled:found"),
                                                   started.approval_id))
    elif answer is not None and answer.get("found") is False:
        # The receiver never saw it: safe to run once, with the same key.
        execution.execute(state, [Admitted(call_id, manifest, dict(started.arguments),
                                           (*path, "recovery:reconciled:absent"), approval_id=started.approval_id,
                                           client_key=started.client_key, recorded_key=key)],
                        spans.run_context(state))
    else:
        why = found.message if found is not None and not found.ok else "the look-up gave no answer"
        desk.request_reconciliation(state, started, f"the look-up failed: {why}"[:500])
