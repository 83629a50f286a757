"""One turn's batch: the whole proposal is vetted before any call of it runs.

    shape check -> run ceilings -> admission of EVERY call (control.orchestration.admission)
    -> the batch and every verdict in the log -> halts end the run; refusals are observed;
    ASK calls wait for approval -> the admitted subset is dispatched

A batch carries an id: the client's (so a client that lost the response can send the same
batch again and get the recorded observations instead of a refusal) or one of ours.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace

from control import guardrails
from control.config import Limits
from control.errors import FieldViolation, InvalidArgument, ResourceExhausted
from control.model import Observation, ObservationStatus, ProposedCall, RunOutcome
from control.orchestration.admission import AdmissionContext, AdmissionVerdict, admit_batch
from control.orchestration.approvals import ApprovalDesk
from control.orchestration.crashpoints import crash_point
from control.orchestration.dispatch import Admitted, Dispatcher
from control.orchestration.runs import RUN_ID, RunRepository
from control.orchestration.stops import RunStops
from control.state import EventType, RunState
from control.validation import sha256_hex
from control.values import plain

_tracer = trace.get_tracer("ringfence.control")


def batch_fingerprint(calls: Sequence[ProposedCall]) -> str:
    """What makes a resent batch the same batch: its calls, in order, with their arguments."""
    # Plain JSON, not canonical_json: a batch whose arguments validation will refuse (too deep,
    # a lone surrogate) still has a fingerprint, and `plain` already made it JSON.
    return sha256_hex("batch/v1", json.dumps([
        {"call_id": c.call_id, "tool": c.tool, "arguments": plain(c.arguments),
         "idempotency_key": getattr(c, "idempotency_key", None)} for c in calls],
        sort_keys=True, separators=(",", ":"), ensure_ascii=False))


class BatchRunner:
    def __init__(self, *, repo: RunRepository, desk: ApprovalDesk, dispatcher: Dispatcher, limits: Limits,
                 admission: Callable[[RunState], AdmissionContext], clock: Callable[[], float],
                 run_context: Callable[[RunState], otel_context.Context], stops: RunStops) -> None:
        self.repo = repo
        self.desk = desk
        self.dispatcher = dispatcher
        self.limits = limits
        self._admission = admission
        self._clock = clock
        self._run_context = run_context
        self.stops = stops

    # -- checks ------------------------------------------------------------------------

    def check_shape(self, state: RunState, calls: list[ProposedCall]) -> None:
        violations = []
        if not calls:
            violations.append(FieldViolation("calls", "a batch needs at least one call"))
        if len(calls) > self.limits.max_batch_calls:
            raise ResourceExhausted(f"{len(calls)} calls is over the {self.limits.max_batch_calls}-call batch cap")
        seen: set[str] = set()
        for i, call in enumerate(calls):
            if not isinstance(call.call_id, str) or not RUN_ID.fullmatch(call.call_id):
                violations.append(FieldViolation(f"calls[{i}].call_id", "1-100 characters of [A-Za-z0-9_.:-]"))
            elif call.call_id in seen:
                violations.append(FieldViolation(f"calls[{i}].call_id", f"duplicate call id {call.call_id!r}"))
            elif call.call_id in state.call_ids:
                violations.append(FieldViolation(f"calls[{i}].call_id",
                                                 f"call id {call.call_id!r} was already used in this run"))
            seen.add(call.call_id)
            if not isinstance(call.tool, str) or not call.tool:
                violations.append(FieldViolation(f"calls[{i}].tool", "must be a non-empty string"))
        if violations:
            raise InvalidArgument("the batch is malformed", violations)

    @staticmethod
    def check_batch_id(batch_id: str) -> None:
        if not isinstance(batch_id, str) or not RUN_ID.fullmatch(batch_id):
            raise InvalidArgument("bad batch id", [FieldViolation("batch_id", "1-100 characters of [A-Za-z0-9_.:-]")])

    def recorded(self, state: RunState, batch_id: str, calls: list[ProposedCall]) -> list[Observation] | None:
        """The observations of a batch this run already holds under `batch_id` (None: new id).
        The same id for a different batch is refused: never run, never merged."""
        known = state.batches.get(batch_id)
        if known is None:
            return None
        if known["fingerprint"] != batch_fingerprint(calls):
            raise InvalidArgument("batch id reused", [FieldViolation(
                "batch_id", f"batch id {batch_id!r} was already used in this run for a different batch")])
        return [state.trajectory[c] for c in known["call_ids"] if c in state.trajectory]

    def ceilings(self, state: RunState) -> tuple[RunOutcome, str] | None:
        """Run ceilings, checked at batch boundaries."""
        stop = self.deadline_passed(state)
        if stop is not None:
            return stop
        if state.turns + 1 > self.limits.max_turns:
            return RunOutcome.BUDGET_EXHAUSTED, f"turn ceiling reached ({self.limits.max_turns})"
        if state.cost >= self.limits.max_cost:
            return RunOutcome.BUDGET_EXHAUSTED, f"cost ceiling reached ({state.cost:g} >= {self.limits.max_cost:g})"
        return None

    def deadline_passed(self, state: RunState) -> tuple[RunOutcome, str] | None:
        if state.deadline_at is not None and self._clock() >= state.deadline_at:
            return RunOutcome.DEADLINE_EXCEEDED, f"the run deadline passed ({self.limits.run_deadline_s:g}s)"
        return None

    # -- running -----------------------------------------------------------------------

    def halt_all(self, state: RunState, calls: list[ProposedCall], outcome: RunOutcome, reason: str,
                 paths: Mapping[str, Sequence[str]] | None = None) -> list[Observation]:
        observations = [
            self.repo.observe(state, Observation(c.call_id, c.tool, ObservationStatus.HALTED, False, error=reason,
                                                 error_class=outcome.value,
                                                 verdict_path=tuple((paths or {}).get(c.call_id, ()))
                                                 + ("run:halted",)))
            for c in calls
        ]
        self.repo.finish(state, outcome, reason)
        return observations

    def run(self, state: RunState, calls: list[ProposedCall], *, proposed_by: str,
            batch_id: str | None = None) -> list[Observation]:
        self.desk.sweep_expired(state)
        stop = self.ceilings(state)
        if stop is not None:
            return self.halt_all(state, calls, *stop)
        batch_id = batch_id or "b-" + uuid.uuid4().hex[:12]
        with _tracer.start_as_current_span(
                "batch", context=self._run_context(state),
                attributes={"ringfence.run_id": state.run_id, "ringfence.batch_id": batch_id,
                            "ringfence.calls": len(calls)}):
            batch_ctx = otel_context.get_current()
            with _tracer.start_as_current_span("admission", context=batch_ctx,
                                               attributes={"ringfence.calls": len(calls)}) as admission:
                # Steps 1-6 for EVERY call before any runs (a pure function of the run's state).
                decisions = admit_batch(calls, self._admission(state))
                # The log never keeps a secret the scanner found: arguments are recorded redacted
                # (a no-op for clean ones; only clean calls go further than the log).
                self.repo.append(state, EventType.BATCH_STARTED, {
                    "batch_id": batch_id, "turn": state.turns + 1, "fingerprint": batch_fingerprint(calls),
                    "calls": [{"call_id": c.call_id, "tool": c.tool,
                               "arguments": guardrails.redact(plain(c.arguments))} for c in calls]})
                for d in decisions:
                    self.repo.append(state, EventType.CALL_DECIDED, {
                        "call_id": d.call.call_id, "tool": d.call.tool,
                        "arguments": guardrails.redact(plain(d.arguments if d.arguments is not None
                                                             else d.call.arguments)),
                        "signature": d.signature, "verdict": d.verdict.value, "verdict_path": list(d.path),
                        "reason": d.reason, "proposed_by": proposed_by,
                        "client_key": d.call.idempotency_key})
                verdicts = Counter(d.verdict.value for d in decisions)
                for verdict, n in sorted(verdicts.items()):
                    admission.set_attribute(f"ringfence.verdicts.{verdict}", n)
            crash_point("after_batch_admitted")
            halts = [d for d in decisions if d.verdict is AdmissionVerdict.HALT]
            if halts:
                first = halts[0]
                outcome = RunOutcome.LOOP_DETECTED if first.halt_kind == "loop" else RunOutcome.GUARDRAIL_STOP
                return self.halt_all(state, calls, outcome, f"{first.call.call_id}: {first.reason}",
                                     {d.call.call_id: d.path for d in decisions})
            results: dict[str, Observation] = {}
            admitted: list[Admitted] = []
            for d in decisions:
                if d.status is not None:
                    results[d.call.call_id] = self.repo.observe(state, Observation(
                        d.call.call_id, d.call.tool, d.status, False, error=d.reason, error_class=d.error_class,
                        verdict_path=d.path))
                elif d.verdict is AdmissionVerdict.ASK:
                    results[d.call.call_id] = self.desk.request(state, d, proposed_by)
                else:
                    assert d.manifest is not None and d.arguments is not None
                    admitted.append(Admitted(d.call.call_id, d.manifest, d.arguments, d.path,
                                             client_key=d.call.idempotency_key if d.manifest.mutates else None))
            # Step 7: total admission is done; the admitted subset runs.
            if admitted:
                results.update(self.execute(state, admitted, batch_ctx))
            return [results.get(c.call_id) or state.trajectory[c.call_id] for c in calls]

    def execute(self, state: RunState, admitted: list[Admitted], ctx: otel_context.Context) -> dict[str, Observation]:
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
                    error=reason, error_class="error", verdict_path=a.path + ("run:error",),
                    approval_id=a.approval_id))
            else:
                results[a.call_id] = state.trajectory[a.call_id]
        self.repo.finish(state, RunOutcome.ERROR, reason)
        return results
