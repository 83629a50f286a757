"""grpc.health.v1 checks for the tests: the status a real client sees."""

from __future__ import annotations

import threading

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def status_of(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=10).status


def wait_for(address: str, wanted: int, service: str = "") -> int:
    """The status once it is `wanted`, or the last one seen (bounded: no timing assertion)."""
    seen = None
    for _ in range(400):
        seen = status_of(address, service)
        if seen == wanted:
            return seen
        threading.Event().wait(0.025)
    return seen
