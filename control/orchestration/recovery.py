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
- an approved call not yet dispatched: dispatched now (the approval is in the log).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context as otel_context

from control.model import ApprovalStatus, Observation, ObservationStatus, ProposedCall
from control.orchestration.admission import AdmissionVerdict, Decision
from control.orchestration.approvals import ApprovalDesk
from control.orchestration.batches import BatchRunner
from control.orchestration.dispatch import Admitted, completion_observation
from control.orchestration.runs import RunRepository
from control.registry import Registry
from control.state import EventType, RunState


def needs_recovery(state: RunState) -> bool:
    """The log shows work interrupted mid-way: something recovery must finish or report."""
    approved = any(state.approvals.get(p.approval_id) is not None
                   and state.approvals[p.approval_id].status in (ApprovalStatus.APPROVED, ApprovalStatus.USED)
                   for p in state.pending.values())
    return bool(state.unobserved or state.inflight or state.admitted or state.asked or approved)


def recover_run(state: RunState, *, repo: RunRepository, desk: ApprovalDesk, batches: BatchRunner,
                registry: Registry, run_context: Callable[[RunState], otel_context.Context]) -> None:
    for call_id, data in list(state.unobserved.items()):
        repo.observe(state, completion_observation(call_id, data["tool"], data, (), None))
    for call_id, data in list(state.inflight.items()):
        if data.get("mutates"):
            reconcile(state, call_id, data, repo=repo, desk=desk, batches=batches, registry=registry,
                      run_context=run_context)
        else:
            repo.observe(state, Observation(
                call_id, data["tool"], ObservationStatus.EXECUTED, True,
                error="interrupted by a control-plane restart", error_class="interrupted",
                attempts=state.attempts.get(call_id, 0)))
        if state.finished:
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
                    error_class="unknown_tool",
                    verdict_path=tuple(data.get("verdict_path") or ()) + ("recovery:unknown",)))
                continue
            never_started.append(Admitted(call_id, manifest, dict(data["arguments"]),
                                          tuple(data.get("verdict_path") or ()) + ("recovery:resumed",)))
        if never_started:
            batches.execute(state, never_started, run_context(state))
    if state.finished:
        return
    for call_id, data in list(state.asked.items()):
        # Policy said ASK before the crash, and the request was never written: write it now.
        manifest = registry.get(data["tool"])
        call = ProposedCall(call_id, data["tool"], data.get("arguments") or {}, idempotency_key=data.get("client_key"))
        if manifest is None:
            repo.observe(state, Observation(call_id, data["tool"], ObservationStatus.HALTED, False,
                                            error="the tool is no longer registered", error_class="unknown_tool",
                                            verdict_path=tuple(data.get("verdict_path") or ()) + ("recovery:unknown",)))
            continue
        desk.request(state, Decision(call, AdmissionVerdict.ASK, tuple(data.get("verdict_path") or ()),
                                     reason=data.get("reason", ""), manifest=manifest,
                                     arguments=dict(data.get("arguments") or {})),
                     data.get("proposed_by") or "")
    for pending in list(state.pending.values()):
        approval = state.approvals.get(pending.approval_id)
        if approval is not None and approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.USED):
            desk.resume(state, pending)


def reconcile(state: RunState, call_id: str, data: Mapping[str, Any], *, repo: RunRepository, desk: ApprovalDesk,
              batches: BatchRunner, registry: Registry,
              run_context: Callable[[RunState], otel_context.Context]) -> None:
    """A mutating call interrupted between its dispatch and its completion (see the module)."""
    manifest = registry.get(data["tool"])
    arguments = data.get("arguments")
    path = tuple(data.get("verdict_path") or ())
    key = data.get("idempotency_key")
    if manifest is None or arguments is None or manifest.reconcile is None or not key:
        desk.request_reconciliation(state, call_id, data, "its tool declares no look-up by idempotency key")
        return
    lookup = registry.get(manifest.reconcile.tool)
    found = batches.dispatcher.lookup(state, call_id, lookup, {manifest.reconcile.key_argument: key}) \
        if lookup is not None else None
    answer = found.content if found is not None and found.ok and isinstance(found.content, dict) else None
    if answer is not None and answer.get("found") is True:
        completion = {"call_id": call_id, "tool": manifest.name, "mutates": True, "idempotency_key": key,
                      "ok": True, "content": {"reconciled": True, **answer}, "guard": None, "error": None,
                      "error_class": None, "attempts": state.attempts.get(call_id, 0),
                      "cost": manifest.cost * max(state.attempts.get(call_id, 0), 1)}
        repo.append(state, EventType.CALL_COMPLETED, completion)
        repo.observe(state, completion_observation(call_id, manifest.name, completion,
                                                   path + ("recovery:reconciled:found",), data.get("approval_id")))
    elif answer is not None and answer.get("found") is False:
        # The receiver never saw it: safe to run once, with the same key.
        batches.execute(state, [Admitted(call_id, manifest, dict(arguments), path + ("recovery:reconciled:absent",),
                                         approval_id=data.get("approval_id"), client_key=data.get("client_key"),
                                         recorded_key=key)],
                        run_context(state))
    else:
        why = found.message if found is not None and not found.ok else "the look-up gave no answer"
        desk.request_reconciliation(state, call_id, data, f"the look-up failed: {why}"[:500])
