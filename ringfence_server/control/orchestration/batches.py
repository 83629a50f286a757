"""One turn's batch: the whole proposal is vetted before any call of it runs.

    shape check -> run ceilings -> admission of EVERY call (ringfence_server.control.orchestration.admission)
    -> the batch and every verdict in the log -> halts end the run; refusals are observed;
    ASK calls wait for approval -> the admitted subset is dispatched

A batch carries an id: the client's (so a client that lost the response can send the same
batch again and get the recorded observations instead of a refusal) or one of ours.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Container, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace

from ringfence.errors import FieldViolation, InvalidArgument, ResourceExhausted
from ringfence.model import Observation, ObservationStatus, PlanStep, ProposedCall, RunOutcome
from ringfence_server.control import guardrails
from ringfence_server.control.config import Limits
from ringfence_server.control.events import BatchCall, BatchStarted, CallDecided, EventPayload
from ringfence_server.control.orchestration import spans
from ringfence_server.control.orchestration.admission import AdmissionRules, AdmissionVerdict, Decision, admit_batch
from ringfence_server.control.orchestration.crashpoints import crash_point
from ringfence_server.control.orchestration.dispatch import Admitted
from ringfence_server.control.orchestration.execution import Execution
from ringfence_server.control.orchestration.runs import RUN_ID, RunRepository
from ringfence_server.control.state import RunState
from ringfence_server.control.validation import sha256_hex, validate_arguments
from ringfence_server.control.values import plain

_tracer = trace.get_tracer("ringfence.control")


def batch_fingerprint(calls: Sequence[ProposedCall]) -> str:
    """What makes a resent batch the same batch: its calls, in order, with their arguments."""
    # Plain JSON, not canonical_json: a batch whose arguments validation will refuse (too deep,
    # a lone surrogate) still has a fingerprint, and `plain` already made it JSON.
    return sha256_hex("batch/v1", json.dumps([
        {"call_id": c.call_id, "tool": c.tool, "arguments": plain(c.arguments),
         "idempotency_key": getattr(c, "idempotency_key", None)} for c in calls],
        sort_keys=True, separators=(",", ":"), ensure_ascii=False))


def _id_problem(value: str, seen: set[str], label: str, used: Container[str] = frozenset()) -> str | None:
    """Why a batch's call id or a plan's step key is refused, or None: not 1-100 characters of
    [A-Za-z0-9_.:-], the same as an earlier one (`seen`, which this adds it to), or in `used`."""
    problem = None
    if not isinstance(value, str) or not RUN_ID.fullmatch(value):
        problem = "1-100 characters of [A-Za-z0-9_.:-]"
    elif value in seen:
        problem = f"duplicate {label} {value!r}"
    elif value in used:
        problem = f"{label} {value!r} was already used in this run"
    seen.add(value)
    return problem


class TenantBatchSlots:
    """At most `per_tenant` batches of one tenant at a time, on this server: past it a batch is
    refused (ResourceExhausted), never queued, so one tenant cannot hold every worker."""

    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = per_tenant
        self._lock = threading.Lock()
        self._slots: dict[str, threading.BoundedSemaphore] = {}

    @contextmanager
    def hold(self, tenant: str) -> Iterator[None]:
        """One of the tenant's slots for the length of the block."""
        with self._lock:
            sem = self._slots.setdefault(tenant, threading.BoundedSemaphore(self.per_tenant))
        if not sem.acquire(blocking=False):
            raise ResourceExhausted(f"tenant {tenant} already has {self.per_tenant} batches running")
        try:
            yield
        finally:
            sem.release()


class ApprovalRequests(Protocol):
    """What a batch needs of the approval desk (ringfence_server.control.orchestration.approvals.ApprovalDesk)."""

    def sweep_expired(self, state: RunState) -> None:
        """Expire the run's approvals whose time is up, before the batch is judged."""
        ...

    def request(self, state: RunState, d: Decision, proposed_by: str) -> Observation:
        """A durable approval request for an ASK verdict; the call's pending observation."""
        ...


class BatchRunner:
    """One turn's batch, from its shape check to the observations of all its calls."""

    def __init__(self, *, repo: RunRepository, desk: ApprovalRequests, execution: Execution, limits: Limits,
                 admission: AdmissionRules) -> None:
        self.repo = repo
        self.desk = desk
        self.execution = execution
        self.limits = limits
        self._admission = admission

    # -- checks ------------------------------------------------------------------------

    def check_shape(self, state: RunState, calls: list[ProposedCall]) -> None:
        violations = []
        if not calls:
            violations.append(FieldViolation("calls", "a batch needs at least one call"))
        if len(calls) > self.limits.max_batch_calls:
            raise ResourceExhausted(f"{len(calls)} calls is over the {self.limits.max_batch_calls}-call batch cap")
        seen: set[str] = set()
        for i, call in enumerate(calls):
            problem = _id_problem(call.call_id, seen, "call id", used=state.call_ids)
            if problem:
                violations.append(FieldViolation(f"calls[{i}].call_id", problem))
            if not isinstance(call.tool, str) or not call.tool:
                violations.append(FieldViolation(f"calls[{i}].tool", "must be a non-empty string"))
        if violations:
            raise InvalidArgument("the batch is malformed", violations)

    def check_plan(self, steps: Sequence[PlanStep], max_steps: int | None) -> None:
        """Raise InvalidArgument listing every problem of a plan (ExecutePlan, ValidatePlan), or
        return: its step count within max_steps (the server's default when None or 0, never past
        the hard cap), unique keys, known tools, valid arguments."""
        violations: list[FieldViolation] = []
        cap = self.limits.max_plan_steps
        limit = self.limits.max_steps if max_steps in (None, 0) else max_steps
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            violations.append(FieldViolation("max_steps", "must be a positive integer"))
            limit = self.limits.max_steps
        elif limit > cap:
            violations.append(FieldViolation("max_steps", f"{limit} is over the hard cap of {cap}"))
            limit = cap
        if not steps:
            violations.append(FieldViolation("steps", "a plan needs at least one step"))
        if len(steps) > limit:
            violations.append(FieldViolation("steps", f"{len(steps)} steps is over max_steps {limit}"))
        seen: set[str] = set()
        for i, step in enumerate(steps):
            problem = _id_problem(step.key, seen, "key")
            if problem:
                violations.append(FieldViolation(f"steps[{i}].key", problem))
            manifest = self._admission.registry.get(step.tool)
            if manifest is None:
                violations.append(FieldViolation(f"steps[{i}].tool", f"unknown tool {step.tool!r}"))
                continue
            _, errs = validate_arguments(manifest, step.arguments, max_bytes=self.limits.max_argument_bytes,
                                         field_prefix=f"steps[{i}].arguments")
            violations.extend(errs)
        if violations:
            raise InvalidArgument(f"the plan has {len(violations)} problem(s)", violations)

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
        stop = self.execution.deadline_passed(state)
        if stop is not None:
            return stop
        if state.turns + 1 > self.limits.max_turns:
            return RunOutcome.BUDGET_EXHAUSTED, f"turn ceiling reached ({self.limits.max_turns})"
        if state.cost >= self.limits.max_cost:
            return RunOutcome.BUDGET_EXHAUSTED, f"cost ceiling reached ({state.cost:g} >= {self.limits.max_cost:g})"
        return None

    # -- running -----------------------------------------------------------------------

    def halt_all(self, state: RunState, calls: list[ProposedCall], outcome: RunOutcome, reason: str,
                 paths: Mapping[str, Sequence[str]] | None = None) -> list[Observation]:
        observations = [
            self.repo.observe(state, Observation(c.call_id, c.tool, ObservationStatus.HALTED, False, error=reason,
                                                 error_class=outcome.value,
                                                 verdict_path=(*tuple((paths or {}).get(c.call_id, ())), "run:halted")))
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
                "batch", context=spans.run_context(state),
                attributes={"ringfence.run_id": state.run_id, "ringfence.batch_id": batch_id,
                            "ringfence.calls": len(calls)}):
            batch_ctx = otel_context.get_current()
            with _tracer.start_as_current_span("admission", context=batch_ctx,
                                               attributes={"ringfence.calls": len(calls)}) as admission:
                # Steps 1-6 for EVERY call before any runs (a pure function of the run's state).
                decisions = admit_batch(calls, self._admission.context_for(state))
                # The log never keeps a secret the scanner found: arguments are recorded redacted
                # (a no-op for clean ones; only clean calls go further than the log).
                # The batch and every verdict settle together: one durable write (group commit).
                admitted_events: list[tuple[EventPayload, tuple[str, ...]]] = [(BatchStarted(
                    batch_id=batch_id, turn=state.turns + 1, fingerprint=batch_fingerprint(calls),
                    calls=tuple(BatchCall(call_id=c.call_id, tool=c.tool,
                                          arguments=guardrails.redact(plain(c.arguments))) for c in calls)), ())]
                for d in decisions:
                    admitted_events.append((CallDecided(
                        call_id=d.call.call_id, tool=d.call.tool,
                        arguments=guardrails.redact(plain(d.arguments if d.arguments is not None
                                                          else d.call.arguments)),
                        signature=d.signature, verdict=d.verdict, verdict_path=d.path,
                        reason=d.reason, proposed_by=proposed_by, client_key=d.call.idempotency_key), ()))
                self.repo.append_all(state, admitted_events)
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
                results.update(self.execution.execute(state, admitted, batch_ctx))
            return [results.get(c.call_id) or state.trajectory[c.call_id] for c in calls]
