"""RoutingService messages <-> ringfence.routing (both the server and the SDK)."""

from __future__ import annotations

from ringfence.routing import Decision
from ringfence.v1 import routing_pb2
from ringfence.wire import convert

__all__ = ["decision_from_proto", "decision_to_proto"]


def decision_to_proto(d: Decision) -> routing_pb2.RoutingDecision:
    return routing_pb2.RoutingDecision(
        ticket_id=d.ticket_id, correlation_id=d.correlation_id, status=d.status, route=d.route,
        evidence=d.evidence, reason=d.reason, version=d.version, scope_digest=d.scope_digest,
        taxonomy_version=d.taxonomy_version, router_version=d.router_version,
        specialist_version=d.specialist_version, run_id=d.run_id, decided_at=convert.to_timestamp(d.decided_at),
        replayed=d.replayed)


def decision_from_proto(m: routing_pb2.RoutingDecision) -> Decision:
    return Decision(m.ticket_id, m.correlation_id, m.status, m.route, m.evidence, m.reason, m.version,
                    m.scope_digest, m.taxonomy_version, m.router_version, m.specialist_version, m.run_id,
                    convert.from_timestamp(m.decided_at), m.replayed)
