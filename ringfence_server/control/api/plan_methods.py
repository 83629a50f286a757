"""PlanService and EvidenceService: decode strictly, call `core.plans`, encode (ringfence_server.control.plans)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ringfence.plans import Step
from ringfence.v1 import plans_pb2
from ringfence.wire import convert
from ringfence.wire.plans_convert import (
    claim_from_proto,
    plan_to_proto,
    record_to_proto,
    report_to_proto,
    verdict_to_proto,
)
from ringfence_server.control.api.core import PlanService

if TYPE_CHECKING:
    from ringfence_server.control.api.servicer import Call, Edge

__all__ = ["PlanMethods"]

_MAX_CLAIMS = 100


class PlanMethods:
    def __init__(self, edge: Edge) -> None:
        self.edge = edge

    @property
    def plans(self) -> PlanService:
        return self.edge.orchestrator.plans

    async def RunEvidencePlan(self, request: plans_pb2.RunEvidencePlanRequest, call: Call) -> plans_pb2.EvidenceReport:
        steps = [Step(s.key, s.evidence_ref) for s in request.steps]
        # All of the plan's violations in one answer, before any evidence is read.
        self.plans.validate(request.max_steps, steps, request.plan_id)
        slot = self.edge.batches.acquire(call.principal.tenant)
        report = await call.run(self.plans.run_plan, call.principal, request.plan_id, request.max_steps, steps,
                                slot=slot)
        return report_to_proto(report)

    async def VerifyReport(self, request: plans_pb2.VerifyReportRequest, call: Call) -> plans_pb2.Verdict:
        v = convert.Violations()
        convert.check_id(request.plan_id, "plan_id", v)
        if len(request.claims) > _MAX_CLAIMS:
            v.add("claims", f"{len(request.claims)} claims is over the limit of {_MAX_CLAIMS}")
        v.raise_if_any("the report is malformed; nothing was verified")
        claims = [claim_from_proto(c) for c in request.claims]
        slot = self.edge.batches.acquire(call.principal.tenant)
        verdict = await call.run(self.plans.verify, call.principal, request.plan_id, claims, slot=slot)
        return verdict_to_proto(verdict)

    async def GetPlan(self, request: plans_pb2.GetPlanRequest, call: Call) -> plans_pb2.PlanRecord:
        v = convert.Violations()
        convert.check_id(request.plan_id, "plan_id", v)
        v.raise_if_any()
        return plan_to_proto(await call.run(self.plans.get_plan, call.principal, request.plan_id))

    async def PutEvidence(self, request: plans_pb2.PutEvidenceRequest, call: Call) -> plans_pb2.EvidenceRecord:
        record = await call.run(self.plans.evidence.put, call.principal, request.store, request.evidence_ref,
                                request.value)
        return record_to_proto(record)

    async def GetEvidence(self, request: plans_pb2.GetEvidenceRequest, call: Call) -> plans_pb2.EvidenceHistory:
        records = await call.run(self.plans.evidence.history, call.principal, request.store, request.evidence_ref)
        return plans_pb2.EvidenceHistory(revisions=[record_to_proto(r) for r in records])
