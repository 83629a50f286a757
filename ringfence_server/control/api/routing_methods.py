"""RoutingService: decode strictly, call `core.routing`, encode (ringfence_server.control.routing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ringfence.routing import Ticket
from ringfence.v1 import routing_pb2
from ringfence.wire.routing_convert import decision_to_proto
from ringfence_server.control.api.core import RoutingService

if TYPE_CHECKING:
    from ringfence_server.control.api.servicer import Call, Edge

__all__ = ["RoutingMethods"]


class RoutingMethods:
    def __init__(self, edge: Edge) -> None:
        self.edge = edge

    @property
    def routing(self) -> RoutingService:
        return self.edge.orchestrator.routing

    async def RouteTicket(self, request: routing_pb2.RouteTicketRequest, call: Call) -> routing_pb2.RoutingDecision:
        t = request.ticket
        ticket = Ticket(t.id, t.incident, t.service, t.symptom)
        slot = self.edge.batches.acquire(call.principal.tenant)
        decision = await call.run(self.routing.route, call.principal, ticket, request.correlation_id,
                                  request.reclassify, slot=slot)
        return decision_to_proto(decision)

    async def GetRouting(self, request: routing_pb2.GetRoutingRequest, call: Call) -> routing_pb2.RoutingHistory:
        decisions = await call.run(self.routing.history, call.principal, request.ticket_id)
        return routing_pb2.RoutingHistory(decisions=[decision_to_proto(d) for d in decisions])
