"""PlanVerification: an evidence plan run by the executor, checked by an independent verifier.

    run_plan(p, plan_id, max_steps, steps)   validate the WHOLE plan first (every violation, before
                                             any read); then, as records of kind `plan` (revision 1
                                             accepted, 2 evidence retrieved, 3 reported), read each
                                             step's executor evidence and have the sandboxed
                                             `assess_evidence` tool turn it into a claim
    verify(p, plan_id, claims)               a new assessment (records of kind `verdict`, one
                                             revision each, never changed): every claim must be
                                             `degraded`, match the executor's report, and be
                                             supported by the verifier's OWN store, read by the
                                             sandboxed `check_evidence` tool

Why the stages are records: a crash between any two leaves the plan at a known stage, and a
resend of the same plan id resumes from it. The evidence retrieved is pinned in stage 2 (store
revision and retrieval time), so the resumed batch carries the same arguments and the run's
batch id returns the calls already made instead of making them twice.

Both runs are ordinary runs (events, traces, policy, sandbox): the executor's run is owned by
the caller; the verifier's run is the server's own on the verifier's behalf, holding only
`check_evidence` calls. Neither run may start a remediation: the plan's tool list is fixed here.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ringfence.errors import AlreadyExists, FieldViolation, InvalidArgument, NotFound, PermissionDenied
from ringfence.model import Observation, ObservationStatus, Principal, ProposedCall, Role, RunView
from ringfence.plans import REMEDIATION, Claim, Mismatch, PlanView, Report, Step, Verdict
from ringfence_server.control.plans.evidence import EXECUTOR, VERIFIER, EvidenceReading, EvidenceStores, check_ref
from ringfence_server.control.store.base import EventStore, Record, RevisionConflict

__all__ = ["MAX_PLAN_STEPS", "PlanVerification"]

MAX_PLAN_STEPS = 10
"""A plan's max_steps is an integer 1..MAX_PLAN_STEPS: plans are short, linear lists of checks."""

ASSESS_TOOL = "assess_evidence"
CHECK_TOOL = "check_evidence"
DEGRADED, UNKNOWN = "degraded", "unknown"
CLAIMS = (DEGRADED, UNKNOWN)
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,80}")


class PlanRuns(Protocol):
    """What plan verification needs of the orchestrator (ringfence_server.control.orchestration.Orchestrator):
    the executor's and the verifier's runs, each started, given one batch, and finished."""

    def start_run(self, p: Principal, goal: str, run_id: str | None = None) -> RunView:
        """Start the run (or find it: a resend starts nothing new)."""
        ...

    def submit_batch(self, p: Principal, run_id: str, calls: Sequence[ProposedCall],
                     batch_id: str | None = None) -> list[Observation]:
        """One batch through admission and the sandbox; a batch id sent again returns the
        observations recorded for it."""
        ...

    def finish_run(self, p: Principal, run_id: str) -> RunView:
        """End the run as completed (a finished run stays as it ended)."""
        ...


class PlanVerification:
    """The two sides of a plan over an Orchestrator (runs and sandboxed calls) and its store."""

    def __init__(self, orchestrator: PlanRuns, store: EventStore, clock: Callable[[], float]) -> None:
        self._core = orchestrator
        self._store = store
        self._clock = clock
        self.evidence = EvidenceStores(store, clock)

    # ------------------------------------------------------------------ validation

    @staticmethod
    def validate(max_steps: int, steps: Sequence[object], plan_id: str = "") -> None:
        """Raise InvalidArgument listing every violation of the plan, or return."""
        v: list[FieldViolation] = []
        if plan_id and not _ID.fullmatch(plan_id):
            v.append(FieldViolation("plan_id", "must be 1-80 characters of [A-Za-z0-9_.:-]"))
        limit_ok = isinstance(max_steps, int) and not isinstance(max_steps, bool) and 1 <= max_steps <= MAX_PLAN_STEPS
        if not limit_ok:
            v.append(FieldViolation("max_steps", f"must be an integer 1..{MAX_PLAN_STEPS}, not {max_steps!r}"))
        if not steps:
            v.append(FieldViolation("steps", "must not be empty"))
        elif limit_ok and len(steps) > max_steps:
            v.append(FieldViolation("steps", f"{len(steps)} steps is more than max_steps ({max_steps})"))
        seen: dict[str, int] = {}
        for i, step in enumerate(steps):
            if not isinstance(step, Step):
                v.append(FieldViolation(f"steps[{i}]", "must be a step with a key and an evidence_ref"))
                continue
            if not step.key:
                v.append(FieldViolation(f"steps[{i}].key", "is required"))
            elif not _ID.fullmatch(step.key):
                v.append(FieldViolation(f"steps[{i}].key", "must be 1-80 characters of [A-Za-z0-9_.:-]"))
            elif step.key in seen:
                v.append(FieldViolation(f"steps[{i}].key", f"{step.key!r} is also the key of steps[{seen[step.key]}]"))
            else:
                seen[step.key] = i
            check_ref(step.evidence_ref, f"steps[{i}].evidence_ref", v)
        if v:
            raise InvalidArgument("the plan is invalid; nothing was read", v)

    # ------------------------------------------------------------------ executor

    def run_plan(self, p: Principal, plan_id: str, max_steps: int, steps: Sequence[Step]) -> Report:
        if p.role not in (Role.AGENT, Role.ADMIN):
            raise PermissionDenied("only an agent runs a plan")
        self.validate(max_steps, steps, plan_id)
        plan_id = plan_id or "plan-" + uuid.uuid4().hex[:20]
        accepted = {"stage": "accepted", "max_steps": max_steps, "run_id": f"{plan_id}.exec",
                    "steps": [{"key": s.key, "evidence_ref": s.evidence_ref} for s in steps]}
        stages = self._plan_stages(p.tenant, plan_id)
        if not stages:
            try:
                stages = [self._store.append_record(p.tenant, "plan", plan_id, accepted, p.subject, 0)]
            except RevisionConflict:  # the same id sent twice at once: the first write is the plan
                stages = self._plan_stages(p.tenant, plan_id)
        first = dict(stages[0].body)
        if first["steps"] != accepted["steps"] or first["max_steps"] != max_steps:
            raise AlreadyExists(f"plan {plan_id} exists with other steps; use a new plan id")
        run_id = first["run_id"]
        if stages[-1].body["stage"] == "reported":
            return _report_from(plan_id, run_id, stages[-1].body)
        self._core.start_run(p, f"evidence plan {plan_id}: {len(steps)} step(s)", run_id)
        readings = self._pinned_readings(p, plan_id, stages, steps)
        calls = [ProposedCall(f"step-{i + 1}", ASSESS_TOOL,
                              {"ref": r.ref, "record": r.as_tool_argument()})
                 for i, r in enumerate(readings)]
        observations = self._core.submit_batch(p, run_id, calls, f"{plan_id}.read")
        claims = tuple(
            Claim(step.key, step.evidence_ref, _claim_of(obs, reading.ref), reading.revision,
                  reading.retrieved_at, obs.call_id)
            # Not strict: the readings may be the pinned ones of an earlier send, and the observations are
            # the orchestrator's; pairing stops at the shortest, as it always has.
            for step, reading, obs in zip(steps, readings, observations, strict=False))
        # Finished before the report is written: a crash in between resumes into the recorded
        # batch (returned by its id even from a finished run) and writes the same report.
        self._core.finish_run(p, run_id)
        body = {"stage": "reported", "claims": [c.as_dict() for c in claims]}
        try:
            self._store.append_record(p.tenant, "plan", plan_id, body, p.subject, 2)
        except RevisionConflict:  # a concurrent resend reported first: the same calls, the same report
            return _report_from(plan_id, run_id, self._plan_stages(p.tenant, plan_id)[-1].body)
        return Report(plan_id, run_id, claims)

    def _pinned_readings(self, p: Principal, plan_id: str, stages: list[Record],
                         steps: Sequence[Step]) -> list[EvidenceReading]:
        """Stage 2: the evidence read for each step, pinned by revision (so a resumed plan sends
        the same calls), written once."""
        if len(stages) < 2:
            readings = [self.evidence.read(p.tenant, EXECUTOR, s.evidence_ref) for s in steps]
            body = {"stage": "retrieved", "evidence": [
                {"evidence_ref": r.ref, "revision": r.revision, "retrieved_at": r.retrieved_at} for r in readings]}
            try:
                self._store.append_record(p.tenant, "plan", plan_id, body, p.subject, 1)
                return readings
            except RevisionConflict:
                stages = self._plan_stages(p.tenant, plan_id)
        pinned = stages[1].body["evidence"]
        return [self.evidence.at_revision(p.tenant, EXECUTOR, e["evidence_ref"], e["revision"], e["retrieved_at"])
                for e in pinned]

    def _plan_stages(self, tenant: str, plan_id: str) -> list[Record]:
        return self._store.read_records(tenant, "plan", plan_id)

    # ------------------------------------------------------------------ verifier

    def verify(self, p: Principal, plan_id: str, claims: Sequence[Claim]) -> Verdict:
        if p.role not in (Role.VERIFIER, Role.ADMIN):
            raise PermissionDenied("only a verifier verifies a report")
        v: list[FieldViolation] = []
        if not plan_id:
            v.append(FieldViolation("plan_id", "is required"))
        for i, c in enumerate(claims):
            if not c.key:
                v.append(FieldViolation(f"claims[{i}].key", "is required"))
            check_ref(c.evidence_ref, f"claims[{i}].evidence_ref", v)
            if not c.claim:
                v.append(FieldViolation(f"claims[{i}].claim", "is required"))
        if v:
            raise InvalidArgument("the report is malformed; nothing was verified", v)
        stages = self._plan_stages(p.tenant, plan_id)
        if not stages:
            raise NotFound(f"plan {plan_id} not found")
        executor = {c.key: c for c in (_report_from(plan_id, "", stages[-1].body).claims
                                       if stages[-1].body["stage"] == "reported" else ())}
        run_id = f"{plan_id}.verify-{uuid.uuid4().hex[:12]}"
        mismatches: list[Mismatch] = []
        revisions: dict[str, int] = {}
        if not claims:
            reason = "the report is empty: there is nothing to verify"
        else:
            # The verifier's own run, on its behalf: its calls and their events are in that run's log.
            acting = Principal(p.tenant, Role.AGENT, f"verifier:{p.subject}")
            self._core.start_run(acting, f"verify plan {plan_id}", run_id)
            readings = [self.evidence.read(p.tenant, VERIFIER, c.evidence_ref) for c in claims]
            calls = [ProposedCall(f"check-{i + 1}", CHECK_TOOL,
                                  {"ref": c.evidence_ref, "claim": c.claim, "record": r.as_tool_argument()})
                     for i, (c, r) in enumerate(zip(claims, readings, strict=True))]  # one reading per claim
            observations = self._core.submit_batch(acting, run_id, calls, f"{run_id}.check")
            self._core.finish_run(acting, run_id)
            # Not strict: the observations are the orchestrator's; pairing stops at the shortest, as it always has.
            for c, r, obs in zip(claims, readings, observations, strict=False):
                revisions[c.key] = r.revision
                problem = _disagreement(c, executor.get(c.key), r, obs)
                if problem:
                    ex = executor.get(c.key)
                    mismatches.append(Mismatch(
                        c.key, c.evidence_ref, c.claim, problem, r.value, r.revision,
                        ex.revision if ex else 0, ex.retrieved_at if ex else 0.0, r.retrieved_at))
            reason = (f"{len(mismatches)} of {len(claims)} claim(s) not supported" if mismatches
                      else f"all {len(claims)} claim(s) supported by the verifier's evidence")
        verified = bool(claims) and not mismatches
        body = {"verified": verified, "reason": reason, "run_id": run_id if claims else "",
                "remediation": REMEDIATION, "verifier_revisions": revisions,
                "claims": [c.as_dict() for c in claims],
                "mismatches": [m.__dict__ for m in mismatches]}
        record = self._store.append_record(p.tenant, "verdict", plan_id, body, p.subject)
        return _verdict_from(plan_id, record)

    # ------------------------------------------------------------------ reading

    def get_plan(self, p: Principal, plan_id: str) -> PlanView:
        stages = self._plan_stages(p.tenant, plan_id)
        if not stages:
            raise NotFound(f"plan {plan_id} not found")
        first = stages[0].body
        report = (_report_from(plan_id, first["run_id"], stages[-1].body)
                  if stages[-1].body["stage"] == "reported" else None)
        verdicts = tuple(_verdict_from(plan_id, r) for r in self._store.read_records(p.tenant, "verdict", plan_id))
        steps = tuple(Step(s["key"], s["evidence_ref"]) for s in first["steps"])
        return PlanView(plan_id, int(first["max_steps"]), steps, report, verdicts)


def _claim_of(obs: Observation, ref: str) -> str:
    """The sandboxed tool's claim, or `unknown` for anything else: a call that did not run, failed,
    or answered outside the contract never becomes a claim of its own."""
    content = obs.content
    if obs.status != ObservationStatus.EXECUTED or obs.error or not isinstance(content, Mapping):
        return UNKNOWN
    if content.get("ref") != ref or content.get("claim") not in CLAIMS:
        return UNKNOWN
    return str(content["claim"])


def _disagreement(claim: Claim, executor: Claim | None, reading: EvidenceReading, obs: Observation) -> str:
    """Why the verifier does not accept one claim, or "" when it does."""
    if executor is None:
        return "the executor's report has no claim with this key"
    if (executor.evidence_ref, executor.claim) != (claim.evidence_ref, claim.claim):
        return "the claim differs from the executor's report"
    if claim.claim != DEGRADED:
        return f"the claim is {claim.claim!r}, not 'degraded'"
    if reading.record is None:
        return "the verifier's evidence store has no record for this reference"
    content = obs.content
    if obs.status != ObservationStatus.EXECUTED or obs.error or not isinstance(content, Mapping):
        return f"the verifier's check did not complete ({obs.status}: {obs.error or 'no result'})"
    if content.get("ref") != claim.evidence_ref or content.get("supported") is not True:
        return f"the verifier's evidence reads {reading.value!r} at revision {reading.revision}, not 'high'"
    return ""


def _report_from(plan_id: str, run_id: str, body: Mapping[str, Any]) -> Report:
    return Report(plan_id, run_id, tuple(Claim(**c) for c in body.get("claims", ())))


def _verdict_from(plan_id: str, record: Record) -> Verdict:
    b = record.body
    return Verdict(plan_id, record.revision, bool(b["verified"]), b["reason"],
                   tuple(Mismatch(**m) for m in b["mismatches"]), dict(b["verifier_revisions"]),
                   b["run_id"], record.at, b["remediation"])
