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
    for _ in range(400):
        seen = status_of(address, service)
        if seen == wanted:
            return seen
        threading.Event().wait(0.025)
    return seen


class Watcher:
    """A grpc.health.v1 Watch stream read on a thread: every status the server sent, in order.
    For changes too brief to be caught by polling Check (an outage of a few seconds)."""

    def __init__(self, address: str, service: str = "") -> None:
        self.seen: list[int] = []
        self._changed = threading.Condition()
        self._channel = grpc.insecure_channel(address)
        self._call = health_pb2_grpc.HealthStub(self._channel).Watch(
            health_pb2.HealthCheckRequest(service=service), timeout=300)
        self._thread = threading.Thread(target=self._read, name="health-watch", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for response in self._call:
                with self._changed:
                    self.seen.append(response.status)
                    self._changed.notify_all()
        except grpc.RpcError:
            pass  # cancelled by close(), or the server went away

    def wait_for(self, *statuses: int, timeout: float = 60) -> list[int]:
        """What was seen once `statuses` appeared in that order (not necessarily adjacent), or all
        that was seen when `timeout` ran out first (bounded: no timing assertion)."""

        def found() -> bool:
            it = iter(self.seen)
            return all(any(s == wanted for s in it) for wanted in statuses)

        with self._changed:
            self._changed.wait_for(found, timeout)
            return list(self.seen)

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(10)
        self._channel.close()
