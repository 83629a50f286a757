"""PlanService and EvidenceService messages <-> ringfence.plans (both the server and the SDK)."""

from __future__ import annotations

from ringfence.plans import Claim, EvidenceRecord, Mismatch, PlanView, Report, Step, Verdict
from ringfence.v1 import plans_pb2
from ringfence.wire import convert

__all__ = [
    "claim_from_proto",
    "claim_to_proto",
    "evidence_from_proto",
    "plan_from_proto",
    "plan_to_proto",
    "record_to_proto",
    "report_from_proto",
    "report_to_proto",
    "verdict_from_proto",
    "verdict_to_proto",
]


def claim_to_proto(c: Claim) -> plans_pb2.Claim:
    return plans_pb2.Claim(key=c.key, evidence_ref=c.evidence_ref, claim=c.claim, revision=c.revision,
                           retrieved_at=convert.to_timestamp(c.retrieved_at), call_id=c.call_id)


def claim_from_proto(m: plans_pb2.Claim) -> Claim:
    return Claim(m.key, m.evidence_ref, m.claim, m.revision, convert.from_timestamp(m.retrieved_at), m.call_id)


def report_to_proto(r: Report) -> plans_pb2.EvidenceReport:
    return plans_pb2.EvidenceReport(plan_id=r.plan_id, run_id=r.run_id, claims=[claim_to_proto(c) for c in r.claims])


def _mismatch_to_proto(m: Mismatch) -> plans_pb2.Mismatch:
    return plans_pb2.Mismatch(
        key=m.key, evidence_ref=m.evidence_ref, claim=m.claim, verifier_value=m.verifier_value,
        verifier_revision=m.verifier_revision, executor_revision=m.executor_revision,
        executor_retrieved_at=convert.to_timestamp(m.executor_retrieved_at),
        verifier_retrieved_at=convert.to_timestamp(m.verifier_retrieved_at), reason=m.reason)


def verdict_to_proto(v: Verdict) -> plans_pb2.Verdict:
    return plans_pb2.Verdict(
        plan_id=v.plan_id, assessment=v.assessment, verified=v.verified, remediation=v.remediation,
        reason=v.reason, mismatches=[_mismatch_to_proto(m) for m in v.mismatches],
        verifier_revisions=dict(v.verifier_revisions), run_id=v.run_id, at=convert.to_timestamp(v.at))


def plan_to_proto(p: PlanView) -> plans_pb2.PlanRecord:
    msg = plans_pb2.PlanRecord(
        plan_id=p.plan_id, max_steps=p.max_steps,
        steps=[plans_pb2.EvidenceStep(key=s.key, evidence_ref=s.evidence_ref) for s in p.steps],
        verdicts=[verdict_to_proto(v) for v in p.verdicts])
    if p.report is not None:
        msg.report.CopyFrom(report_to_proto(p.report))
    return msg


def record_to_proto(r: EvidenceRecord) -> plans_pb2.EvidenceRecord:
    return plans_pb2.EvidenceRecord(store=r.store, evidence_ref=r.evidence_ref, value=r.value, revision=r.revision,
                                    written_by=r.written_by, written_at=convert.to_timestamp(r.written_at))


# -- proto -> values (the client side) ---------------------------------------------------------


def report_from_proto(m: plans_pb2.EvidenceReport) -> Report:
    return Report(m.plan_id, m.run_id, tuple(claim_from_proto(c) for c in m.claims))


def verdict_from_proto(m: plans_pb2.Verdict) -> Verdict:
    mismatches = tuple(Mismatch(
        x.key, x.evidence_ref, x.claim, x.reason, x.verifier_value, x.verifier_revision, x.executor_revision,
        convert.from_timestamp(x.executor_retrieved_at), convert.from_timestamp(x.verifier_retrieved_at))
        for x in m.mismatches)
    return Verdict(m.plan_id, m.assessment, m.verified, m.reason, mismatches, dict(m.verifier_revisions),
                   m.run_id, convert.from_timestamp(m.at), m.remediation)


def plan_from_proto(m: plans_pb2.PlanRecord) -> PlanView:
    return PlanView(m.plan_id, m.max_steps, tuple(Step(s.key, s.evidence_ref) for s in m.steps),
                    report_from_proto(m.report) if m.HasField("report") else None,
                    tuple(verdict_from_proto(v) for v in m.verdicts))


def evidence_from_proto(m: plans_pb2.EvidenceRecord) -> EvidenceRecord:
    return EvidenceRecord(m.store, m.evidence_ref, m.value, m.revision, m.written_by,
                          convert.from_timestamp(m.written_at))
